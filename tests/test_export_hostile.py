"""Export under hostile conditions: kill -9 mid-export, unwritable folders, impossible settings, broken .onnx files.

Every kill is a real SIGKILL of a real export subprocess, at the moment it opens a file for writing in the target
folder or renames into it (a Python audit hook in the child picks the moment; nothing in yolo-cb is replaced).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest
import torch

from yolo_cb.engine.checkpoint import save_checkpoint
from yolo_cb.engine.exporter import Exporter
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
from yolo_cb.engine.exporter import Exporter
Exporter({"imgsz": 64, "format": "onnx"})(weights)
"""


def tiny_checkpoint(path: Path) -> Path:
    """A valid yolo-cb checkpoint of a random yolox-nano (nc=2): the cheapest model that exports."""
    torch.manual_seed(0)
    model = build_model("yolox-nano", nc=2, verbose=False)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return save_checkpoint({"model": state, "ema": state, "model_cfg": dict(model.cfg), "names": {0: "a", 1: "b"},
                            "train_args": {"imgsz": 64}, "epoch": 0, "best_fitness": 0.0, "version": "0.1.0",
                            "date": "2026-01-01T00:00:00"}, path)


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
    from yolo_cb.engine.export_formats import clean_stale_temps

    live = good_export["folder"] / f".m.onnx.{os.getppid()}.0123abcd.tmp"
    live.write_bytes(b"in progress")
    try:
        assert clean_stale_temps(good_export["onnx"]) == []
        assert live.exists()
    finally:
        live.unlink()
