"""Bad input on the CLI: one clear line on stderr (`yolo-cb: error: ...`), exit status 2, never a traceback.

Each case runs the real CLI as a subprocess. The unwritable `project=` cases need a filesystem that refuses
writes even to root (who ignores permission bits): they run the CLI inside a private mount namespace
(`unshare --mount --map-root-user`) with a small tmpfs mounted there, either read-only or filled up;
they are skipped where unprivileged namespaces are unavailable.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
# what a tiny training needs besides the case's own faulty setting
QUICK = ["imgsz=64", "batch=2", "epochs=1", "workers=0", "plots=false", "mlflow=false", "tensorboard=false", "onnx_check=false"]
# the cases that train until the error: the smallest model (the default, yolocb-n, costs 3x the CPU and tests nothing more)
QUICK_RUN = [*QUICK, "model=yolox-nano.yaml"]
PROGRESS = re.compile(r"\d+%\|.*\| *\d+/\d+ \[")
EVIL_TAG = "!!python/object/apply:os.system ['echo pwned > /tmp/yolo_cb_pwned']"


def cli(args: list[str], cwd: Path, wrap: list[str] | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]), "HOME": str(cwd), "YOLO_CB_DATASETS": str(cwd / "datasets"),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}  # one thread, as the test processes (tests/conftest.py)
    cmd = [*(wrap or []), sys.executable, "-m", "yolo_cb", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def write_yaml(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False) if not isinstance(data, str) else data)
    return path


def data_yaml(tmp: Path, shapes_small_yaml: Path, **changes) -> Path:
    """A copy of the small shapes data YAML with `changes` applied (a None value removes the key)."""
    cfg = yaml.safe_load(shapes_small_yaml.read_text())
    cfg["path"] = str(shapes_small_yaml.parent)
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    return write_yaml(tmp / "data.yaml", cfg)


def namespace_with_tmpfs(mountpoint: Path, options: str, fill: bool = False) -> list[str]:
    """A command prefix that runs the rest in a private mount namespace with a tmpfs at `mountpoint`."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is not installed")
    mountpoint.mkdir(parents=True, exist_ok=True)
    filler = f' && (dd if=/dev/zero of="{mountpoint}/filler" bs=4096 2>/dev/null; true)' if fill else ""
    setup = f'mount -t tmpfs -o {options} tmpfs "{mountpoint}"{filler} && exec "$0" "$@"'
    probe = subprocess.run(["unshare", "--mount", "--map-root-user", "sh", "-c", setup, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a private namespace here: {probe.stderr.strip()}")
    return ["unshare", "--mount", "--map-root-user", "sh", "-c", setup]


def case_setup(name: str, tmp: Path, shapes_small_yaml: Path):
    """(argv, command prefix or None, substrings the one error line must contain) for each bad input."""
    data = lambda **kw: str(data_yaml(tmp, shapes_small_yaml, **kw))  # noqa: E731
    train = lambda *extra: ["train", f"data={data()}", f"project={tmp / 'runs'}", *QUICK, *extra]  # noqa: E731
    if name == "data_missing_val":
        f = data(val=None)
        return ["train", f"data={f}", *QUICK], None, [f, "'val'"]
    if name == "names_gap":
        f = data(names={0: "a", 2: "b"})
        return ["train", f"data={f}", *QUICK], None, [f, "names", "0..1"]
    if name == "python_tag_data":
        f = tmp / "data.yaml"
        f.write_text(f"path: {shapes_small_yaml.parent}\ntrain: train.txt\nval: val.txt\nnames: {EVIL_TAG}\n")
        return ["train", f"data={f}", *QUICK], None, [str(f), "!!python/object/apply:os.system", "line 4"]
    if name == "python_tag_cfg":
        f = tmp / "my_cfg.yaml"
        f.write_text(f"epochs: 1\nlr0: {EVIL_TAG}\n")
        return train(f"cfg={f}"), None, [str(f), "!!python/object/apply:os.system", "line 2"]
    if name == "python_tag_model":
        f = tmp / "my_model.yaml"
        f.write_text(f"depth: 0.33\nwidth: {EVIL_TAG}\n")
        return train(f"model={f}"), None, [str(f), "!!python/object/apply:os.system", "line 2"]
    if name.startswith("callbacks_"):
        value = {"callbacks_malformed": "on_fit_epoch_end=", "callbacks_unknown_event": "on_fit_epoch_endd=cbpkg:log_epoch",
                 "callbacks_no_module": "on_fit_epoch_end=nope_pkg_xyz:fn", "callbacks_missing_attr": "on_fit_epoch_end=cbpkg:nope_attr",
                 "callbacks_not_callable": "on_fit_epoch_end=os:sep", "callbacks_unknown_name": "early_stop_att",
                 "callbacks_empty_item": "on_fit_epoch_end=cbpkg:log_epoch,=cbpkg:log_epoch"}[name]
        expect = {"callbacks_malformed": ["callbacks", "on_fit_epoch_end="], "callbacks_unknown_event": ["on_fit_epoch_endd", "on_fit_epoch_end'"],
                  "callbacks_no_module": ["nope_pkg_xyz"], "callbacks_missing_attr": ["nope_attr", "cbpkg"],
                  "callbacks_not_callable": ["os:sep", "callable"], "callbacks_unknown_name": ["early_stop_att", "early_stopping"],
                  "callbacks_empty_item": ["callbacks", "=cbpkg:log_epoch"]}[name]
        return train(f"callbacks={value}"), None, expect
    if name in ("val_without_model", "predict_without_model", "export_without_model"):
        mode = name.split("_")[0]
        extra = {"val": [f"data={data()}"], "predict": [f"source={tmp}"], "export": []}[mode]
        return [mode, *extra], None, [f"{mode} needs model="]
    if name == "cuda_without_cuda":
        if torch.cuda.is_available():
            pytest.skip("CUDA is available here")
        return train("device=cuda:0"), None, ["device='cuda:0'", "device=cpu"]
    if name == "project_is_a_file":
        f = tmp / "a_file"
        f.write_text("not a folder\n")
        return ["train", f"data={data()}", f"project={f}", *QUICK_RUN], None, [f"project={f}", "not a folder"]
    if name == "project_read_only":
        mnt = tmp / "ro"
        wrap = namespace_with_tmpfs(mnt, "ro,size=1m")
        return ["train", f"data={data()}", f"project={mnt / 'runs'}", *QUICK_RUN], wrap, [f"project={mnt / 'runs'}", "read-only"]
    if name == "project_disk_full":
        mnt = tmp / "full"
        wrap = namespace_with_tmpfs(mnt, "size=64k", fill=True)
        return ["train", f"data={data()}", f"project={mnt / 'runs'}", *QUICK_RUN], wrap, [str(mnt / "runs"), "no space left"]
    if name == "project_disk_full_mid_run":  # room for args.yaml and results.csv, not for the first checkpoint
        mnt = tmp / "small"
        wrap = namespace_with_tmpfs(mnt, "size=128k")
        return ["train", f"data={data()}", f"project={mnt / 'runs'}", *QUICK_RUN], wrap, [str(mnt / "runs" / "train" / "weights"), "no space left",
                                                                                        "last.pt"]
    if name == "unsafe_checkpoint":
        import argparse

        f = tmp / "evil.pt"
        torch.save({"model": {}, "train_args": argparse.Namespace(data="x")}, f)
        return ["val", f"model={f}", f"data={data()}"], None, [str(f), "refused"]
    if name == "model_pth_not_ours":
        f = tmp / "x.pth"
        torch.save({"state_dict": {"w": torch.zeros(2)}}, f)
        return train(f"model={f}"), None, [str(f), ".pt", ".yaml"]
    raise AssertionError(name)


CASES = ["data_missing_val", "names_gap", "python_tag_data", "python_tag_cfg", "python_tag_model", "callbacks_malformed",
         "callbacks_unknown_event", "callbacks_no_module", "callbacks_missing_attr", "callbacks_not_callable", "callbacks_unknown_name",
         "callbacks_empty_item", "val_without_model", "predict_without_model", "export_without_model", "cuda_without_cuda",
         "project_is_a_file", "project_read_only", "project_disk_full", "project_disk_full_mid_run", "unsafe_checkpoint", "model_pth_not_ours"]


@pytest.mark.parametrize("name", CASES)
def test_bad_input_gives_one_line_and_exit_2(name, tmp_path, shapes_small_yaml):
    argv, wrap, expected = case_setup(name, tmp_path, shapes_small_yaml)
    proc = cli(argv, tmp_path, wrap)
    # progress bars (tqdm, on stderr) may come before the error in the cases that get as far as the data
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not PROGRESS.search(line)]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert len(lines) == 1, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.strip()][-1] == lines[0], proc.stderr  # the error line comes last
    assert lines[0].startswith("yolo-cb: error: "), lines[0]
    for text in expected:
        assert str(text) in lines[0], (text, lines[0])
    assert not Path("/tmp/yolo_cb_pwned").exists()
    assert not list(tmp_path.glob("runs/*/weights/*.pt"))  # no case gets as far as a checkpoint
