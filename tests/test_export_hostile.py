"""Export under hostile conditions: kill -9 mid-export, unwritable folders, impossible settings, broken .onnx files.

Every kill is a real SIGKILL of a real export subprocess, at the moment it opens a file for writing in the target
folder or renames into it (a Python audit hook in the child picks the moment; nothing in yolo-cb is replaced).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort
import pytest
import torch

from yolo_cb.checkpoints.checkpoint import Checkpoint, save_checkpoint
from yolo_cb.export.exporter import Exporter
from yolo_cb.nn import build_model

ROOT = Path(__file__).resolve().parents[1]

# The child exports `weights` at imgsz 64 and SIGKILLs itself at the N-th write-open in the target folder, or at the
# rename onto the target: the moments where a kill can hurt the file that is already there.
KILL_CHILD = r"""
import os, signal, sys
weights, folder, point = sys.argv[1], os.path.realpath(sys.argv[2]), sys.argv[3]
opens = 0

def in_folder(path):
    return isinstance(path, (str, bytes, os.PathLike)) and os.path.dirname(os.path.realpath(os.fsdecode(path))) == folder

def hook(event, args):
    global opens
    if event == "open" and in_folder(args[0]):
        mode, flags = args[1], args[2]
        writing = any(c in (mode or "") for c in "wax+") if mode else bool(flags & (os.O_WRONLY | os.O_RDWR))
        if writing:
            opens += 1
            if point == f"open{opens}":
                os.kill(os.getpid(), signal.SIGKILL)
    if event == "os.rename" and point == "rename" and in_folder(args[1]):
        os.kill(os.getpid(), signal.SIGKILL)

sys.addaudithook(hook)
from yolo_cb.export.exporter import Exporter
Exporter({"imgsz": 64, "format": "onnx"})(weights)
"""


def tiny_checkpoint(path: Path) -> Path:
    """A valid yolo-cb checkpoint of a random yolox-nano (nc=2): the cheapest model that exports."""
    torch.manual_seed(0)
    model = build_model("yolox-nano", nc=2, verbose=False)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return save_checkpoint(Checkpoint(model=state, ema=state, model_cfg=dict(model.cfg), names={0: "a", 1: "b"},
                                      train_args={"imgsz": 64}, epoch=0, best_fitness=0.0, version="0.1.0",
                                      date="2026-01-01T00:00:00"), path)


@pytest.fixture(scope="module")
def good_export(tmp_path_factory) -> dict:
    """m.pt and a verified m.onnx from it at imgsz 96 (so any later imgsz-64 export differs in bytes)."""
    folder = tmp_path_factory.mktemp("hostile_export")
    weights = tiny_checkpoint(folder / "m.pt")
    onnx_file = Path(Exporter({"imgsz": 96, "format": "onnx"})(str(weights)))
    return {"folder": folder, "weights": weights, "onnx": onnx_file, "bytes": onnx_file.read_bytes()}


def child_env(tmpdir: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmpdir), "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONWARNINGS", None)
    return env


@pytest.fixture(scope="module")
def library_leftovers(good_export, tmp_path_factory) -> set[str]:
    """What a complete export leaves in an empty TMPDIR: the libraries' own files (onnxruntime's .ses, torch's empty
    inductor cache folder), none of ours."""
    systmp = tmp_path_factory.mktemp("systmp_complete")
    target = tmp_path_factory.mktemp("complete") / "m.pt"
    target.write_bytes(good_export["weights"].read_bytes())
    child = subprocess.run([sys.executable, "-c", KILL_CHILD, str(target), str(target.parent), "none"], env=child_env(systmp),
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    return set(os.listdir(systmp))


def ours_beside(target: Path) -> list[str]:
    return sorted(p.name for p in target.parent.iterdir() if p.name.startswith(f".{target.name}."))


@pytest.mark.parametrize("point", ["open1", "open2", "rename"])
def test_kill_during_export_keeps_the_previous_export(good_export, library_leftovers, tmp_path, point):
    """The reported failure: kill -9 during export left the previous m.onnx at 0 bytes and a raw.onnx in the system temp."""
    target, systmp = good_export["onnx"], tmp_path / "systmp"
    systmp.mkdir()
    child = subprocess.run([sys.executable, "-c", KILL_CHILD, str(good_export["weights"]), str(target.parent), point],
                           env=child_env(systmp), capture_output=True, text=True, timeout=300)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    assert target.read_bytes() == good_export["bytes"]  # byte-identical ...
    session = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])  # ... and still a model
    assert session.get_inputs()[0].shape == [1, 3, 96, 96]
    assert set(os.listdir(systmp)) <= library_leftovers  # nothing of ours in the system temp folder
    assert [p for p in systmp.rglob("*") if p.suffix in (".onnx", ".torchscript", ".tmp")] == []
    # the next export removes what the killed one left beside the target, and replaces the file
    Path(Exporter({"imgsz": 96, "format": "onnx"})(str(good_export["weights"])))
    assert ours_beside(target) == []
    ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    good_export["bytes"] = target.read_bytes()


def test_a_live_exports_temp_file_is_not_removed(good_export):
    """Only temp files of dead processes are stale: one named with a live pid (this test's) stays."""
    from yolo_cb.export.formats import clean_stale_temps

    live = good_export["folder"] / f".m.onnx.{os.getppid()}.0123abcd.tmp"
    live.write_bytes(b"in progress")
    try:
        assert clean_stale_temps(good_export["onnx"]) == []
        assert live.exists()
    finally:
        live.unlink()


# --- one line where a traceback was: the real CLI, exit status 2 ----------------------------------------------------
def cli(args: list[str], cwd: Path, wrap: list[str] | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(cwd), "OMP_NUM_THREADS": "1", "TMPDIR": str(cwd)}
    return subprocess.run([*(wrap or []), sys.executable, "-m", "yolo_cb", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def assert_one_line(result: subprocess.CompletedProcess, *expected: str) -> str:
    """Exit 2, no traceback, and a 'yolo-cb: error:' line holding every expected piece."""
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == 2, result.stderr[-3000:]
    line = next(x for x in result.stderr.splitlines() if x.startswith("yolo-cb: error: "))
    for piece in expected:
        assert piece in line, line
    return line


def read_only_mount(mountpoint: Path, copy_in: Path) -> list[str]:
    """A command prefix running the rest in a private mount namespace where `mountpoint` is a read-only tmpfs
    holding a copy of `copy_in` (root ignores permission bits, a read-only filesystem it cannot)."""
    import shutil

    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is not installed")
    mountpoint.mkdir(parents=True, exist_ok=True)
    setup = (f'mount -t tmpfs -o size=8m tmpfs "{mountpoint}" && cp "{copy_in}" "{mountpoint}/" && '
             f'mount -o remount,ro "{mountpoint}" && exec "$0" "$@"')
    probe = subprocess.run(["unshare", "--mount", "--map-root-user", "sh", "-c", setup, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a private namespace here: {probe.stderr.strip()}")
    return ["unshare", "--mount", "--map-root-user", "sh", "-c", setup]


def test_export_into_a_read_only_folder_is_one_line(good_export, tmp_path):
    mnt = tmp_path / "ro"
    wrap = read_only_mount(mnt, good_export["weights"])
    result = cli(["export", f"model={mnt / 'm.pt'}", "imgsz=64"], tmp_path, wrap)
    assert_one_line(result, str(mnt / "m.onnx"), "read-only", "copy")


@pytest.mark.parametrize("opset", ["7", "9", "99"])
def test_opset_the_exporter_cannot_write_is_one_line(good_export, tmp_path, opset):
    from torch.onnx import _constants

    result = cli(["export", f"model={good_export['weights']}", "imgsz=64", f"opset={opset}"], tmp_path)
    assert_one_line(result, f"opset={opset}", f"10 to {_constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET}")


def test_opset_range_is_what_the_exporter_writes(good_export, tmp_path):
    """The range's ends are real: the lowest and highest accepted opsets export and load (dynamic needs 11)."""
    from yolo_cb.export.formats import OPSET_MIN_DYNAMIC, OPSET_MIN_STATIC, ExportSettingError, max_opset

    weights = tmp_path / "ends.pt"
    weights.write_bytes(good_export["weights"].read_bytes())
    for opset, dynamic in ((OPSET_MIN_STATIC, False), (max_opset(), False), (OPSET_MIN_DYNAMIC, True)):
        path = Exporter({"imgsz": 64, "opset": opset, "dynamic": dynamic, "simplify": False})(str(weights))
        ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    with pytest.raises(ExportSettingError, match="opset=10 .* 11 to"):
        Exporter({"imgsz": 64, "opset": 10, "dynamic": True})(str(weights))


def test_half_without_cuda_is_one_line(good_export, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: half=True exports")
    result = cli(["export", f"model={good_export['weights']}", "imgsz=64", "half=True", "format=torchscript"], tmp_path)
    assert_one_line(result, "half=True", "CUDA", "format=onnx")


@pytest.mark.parametrize("kind", ["empty", "truncated", "text"])
@pytest.mark.parametrize("mode", ["predict", "val"])
def test_broken_onnx_file_is_one_line(good_export, tmp_path, kind, mode):
    bad = tmp_path / f"{kind}.onnx"
    good = good_export["onnx"].read_bytes()
    bad.write_bytes({"empty": b"", "truncated": good[: len(good) // 2], "text": b"this is not a model\n" * 20}[kind])
    image = tmp_path / "img.jpg"
    cv2.imwrite(str(image), np.full((64, 64, 3), 127, np.uint8))
    data = tmp_path / "data.yaml"  # a well-formed YAML: the CLI refuses a missing or malformed one first, before any model loads
    data.write_text(f"path: {tmp_path}\ntrain: images\nval: images\nnames: [a, b]\n")
    extra = [f"source={image}"] if mode == "predict" else [f"data={data}"]
    result = cli([mode, f"model={bad}", *extra, f"project={tmp_path / 'runs'}"], tmp_path)
    assert_one_line(result, f"model={bad}", "ONNX", "export it again")


ROUNDTRIP_CHILD = r"""
import torch
from yolo_cb.export.checks import onnx_roundtrip
from yolo_cb.nn import build_model
model = build_model("yolox-nano", nc=2, verbose=False)
for _ in range(3):
    onnx_roundtrip(model, torch.rand(1, 3, 64, 64), simplify=False)
"""


def test_kill_during_the_training_onnx_check_leaves_nothing_in_the_system_temp(library_leftovers, tmp_path):
    """The training callback onnx_check exported to a folder in the system temp (removed only if the process lived on):
    now it checks in memory. The child is SIGKILLed the moment anything new in its TMPDIR is still there 50 ms later (an
    export folder lives for the whole export; Python's tempfile.gettempdir() writes and deletes a probe file in TMPDIR
    within microseconds, which a poll on a busy machine can catch)."""
    systmp = tmp_path / "systmp"
    systmp.mkdir()
    child = subprocess.Popen([sys.executable, "-c", ROUNDTRIP_CHILD], env=child_env(systmp), stderr=subprocess.PIPE, text=True)

    def new_entries() -> set[str]:
        return set(os.listdir(systmp)) - library_leftovers

    try:
        while child.poll() is None:
            seen = new_entries()
            if seen:
                threading.Event().wait(0.05)
                if seen & new_entries():
                    break
            threading.Event().wait(0.005)
        child.kill()
        _, stderr = child.communicate(timeout=60)
    finally:
        child.kill()
    assert set(os.listdir(systmp)) <= library_leftovers, stderr[-2000:]
    assert child.returncode == 0, stderr[-2000:]  # it ran to the end: nothing appeared that would have stopped it
