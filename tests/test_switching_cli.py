"""Ultralytics' CLI habits (issue 29): each wrong one is one line on stderr and exit status 2, in a real `yolo-cb` process;
Ultralytics' empty defaults are accepted. The cases that need no checkpoint run before torch is imported (fast)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def run(args: list[str], cwd: Path, code: str | None = None) -> tuple[int, str]:
    """(exit status, stdout + stderr) of `python -m yolo_cb ARGS`, or of `python -c CODE ARGS` when `code` is given."""
    command = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "yolo_cb", *args]
    done = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=ENV, timeout=300)
    return done.returncode, (done.stdout + done.stderr).strip()


def one_line_error(result: tuple[int, str], *parts: str) -> None:
    status, said = result
    assert status == 2 and said.count("\n") == 0 and said.startswith("yolo-cb: error:"), said[-1500:]
    for part in parts:
        assert part in said, said


def test_usage_habits_are_one_line_each(tmp_path):
    one_line_error(run(["train", "dfl=1.5"], tmp_path), "'dfl' is an Ultralytics setting yolo-cb does not have")
    one_line_error(run(["train", "copy_paste=0.5"], tmp_path), "'copy_paste' is an Ultralytics setting yolo-cb does not have")
    one_line_error(run(["train", "mdoel=x.yaml"], tmp_path), "not a valid yolo-cb argument. Did you mean 'model'")
    one_line_error(run(["detect", "train", "data=shapes.yaml"], tmp_path), "task word", "drop it: yolo-cb train data=shapes.yaml")
    one_line_error(run(["train", "resume", "model=runs/detect/x/weights/last.pt", "epochs=5"], tmp_path),
                   "write `yolo-cb train resume=runs/detect/x/weights/last.pt epochs=5`")
    one_line_error(run(["predict", "model=best.pt"], tmp_path), "predict needs source=", "yolo-cb predict model=best.pt source=")
    for flag in ("-h", "--help"):
        status, said = run([flag], tmp_path)
        assert status == 0 and said.startswith("yolo-cb: train, validate"), said
    assert list(tmp_path.iterdir()) == []


def test_val_without_model_answers_before_torch_is_imported(tmp_path):
    code = ("import atexit, sys; atexit.register(lambda: print('torch imported' if 'torch' in sys.modules else 'no torch')); "
            "from yolo_cb.cli import entrypoint; entrypoint(sys.argv[1:])")
    status, said = run(["val"], tmp_path, code)
    assert status == 2 and said.splitlines() == ["no torch", said.splitlines()[1]], said  # stdout, then stderr's one line
    assert said.splitlines()[1].startswith("yolo-cb: error: val needs model=")


def test_wandb_asked_for_without_the_package_is_one_line_before_any_work(tiny, tmp_path):
    code = "import sys; sys.modules['wandb'] = None; from yolo_cb.cli import entrypoint; entrypoint(sys.argv[1:])"  # not installed
    args = [f"{k}={v}" for k, v in {**tiny, "wandb": True}.items()]
    one_line_error(run(["train", *args], tmp_path, code), "wandb=True needs wandb", "pip install 'yolo-cb[wandb]'")
    assert not (tmp_path / "runs").exists()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, trained_copy) -> Path:
    return trained_copy(tmp_path_factory.mktemp("cli_run"), name="exp") / "weights" / "best.pt"  # TINY, trained once per test run


@pytest.mark.slow
def test_model_and_export_habits(checkpoint, tmp_path):
    one_line_error(run(["train", "model=yolo11n.pt"], tmp_path), "'yolo11n.pt' names Ultralytics weights", "yolox-nano.pt", "yolox-s.pt")
    # half=True on the CPU: ONNX makes an fp16 model (issue 30); TorchScript cannot, one line
    one_line_error(run(["export", f"model={checkpoint}", "format=torchscript", "half=True", "device=cpu"], tmp_path), "half=True", "CUDA")
    one_line_error(run(["export", f"model={checkpoint}", "opset=99"], tmp_path), "opset=99 cannot be exported here")
    status, said = run(["export", f"model={checkpoint}", "format=onnx", "opset=", "channels_last=", "nms=", "imgsz=64", "simplify=False"],
                       tmp_path)
    assert status == 0 and checkpoint.with_suffix(".onnx").is_file(), said[-2000:]
    assert "nms=False" in said, said[-2000:]  # `nms=`: the default (Ultralytics' empty nms), not an error
    assert "opset 17" in said, said[-2000:]  # `opset=`: the default
