"""Every command README.md and docs/*.md show, run as the first thing a new process does (a real subprocess each).

The suite's own process has imported half the world: `export nms=True` passed there and failed as a user's first
command (torchvision's extension first loaded inside the ONNX trace). Each case here is one `python -m yolo_cb ...`
in a fresh interpreter, on one small model trained by the first case (itself a fresh-process `train`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("openvino")
pytest.importorskip("onnxruntime")

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ("model=yolox-nano.yaml imgsz=64 epochs=1 batch=8 workers=0 mosaic=0 warmup_epochs=0 mlflow=False tensorboard=False "
         "onnx_check=False plots=False no_aug_epochs=0").split()


def fresh(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """`yolo-cb ARGS` in a new interpreter (the user's settings file kept out: YOLO_CB_CONFIG_DIR under cwd)."""
    env = {**os.environ, "YOLO_CB_CONFIG_DIR": str(cwd / "user-settings")}
    return subprocess.run([sys.executable, "-m", "yolo_cb", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, (proc.stdout[-2000:] + proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def trained(tmp_path_factory, shapes_small_yaml) -> tuple[Path, Path]:
    """(best.pt, data YAML) from `yolo-cb train ...` as a process's first command."""
    folder = tmp_path_factory.mktemp("fresh")
    ok(fresh("train", f"data={shapes_small_yaml}", *TRAIN, f"project={folder / 'runs'}", "name=train", cwd=folder))
    best = folder / "runs" / "train" / "weights" / "best.pt"
    assert best.is_file()
    return best, shapes_small_yaml


def own_copy(best: Path, tmp_path: Path) -> Path:
    """A copy of best.pt in the test's folder, so each export writes beside its own model."""
    model = tmp_path / "best.pt"
    shutil.copyfile(best, model)
    return model


# (the options after `format=`, the file or folder the export writes beside best.pt); data= is added where int8 needs it
EXPORTS = [
    ("onnx", "best.onnx"),
    ("onnx dynamic=True", "best.onnx"),
    ("onnx half=True", "best_half.onnx"),
    ("onnx int8=True", "best_int8.onnx"),
    ("onnx nms=True", "best_nms.onnx"),
    ("openvino", "best_openvino_model"),
    ("openvino half=True", "best_half_openvino_model"),
    ("openvino int8=True", "best_int8_openvino_model"),
    ("torchscript", "best.torchscript"),
]


@pytest.mark.parametrize("options, written", EXPORTS, ids=[o.replace(" ", "-").replace("=True", "") for o, _ in EXPORTS])
def test_export_as_a_first_command(options, written, trained, tmp_path):
    best, data = trained
    model = own_copy(best, tmp_path)
    fmt, *flags = options.split()
    extra = [f"data={data}"] if "int8=True" in flags else []
    ok(fresh("export", f"model={model}", f"format={fmt}", "imgsz=64", *flags, *extra, cwd=tmp_path))
    assert (tmp_path / written).exists(), sorted(p.name for p in tmp_path.iterdir())


def test_val_predict_of_an_onnx_export_as_first_commands(trained, tmp_path):
    """The README's val (.pt, save_json) and predict (.onnx, a folder, save_txt) each as a process's first command."""
    best, data = trained
    model = own_copy(best, tmp_path)
    out = ok(fresh("val", f"model={model}", f"data={data}", "imgsz=64", "save_json=True", f"project={tmp_path}", "name=val",
                   cwd=tmp_path))
    assert "mAP50-95" in out or "all" in out
    ok(fresh("export", f"model={model}", "format=onnx", "imgsz=64", cwd=tmp_path))
    images = tmp_path / "images"
    images.mkdir()
    for line in (Path(data).parent / "val.txt").read_text().split()[:3]:
        shutil.copyfile(line, images / Path(line).name)
    ok(fresh("predict", f"model={tmp_path / 'best.onnx'}", f"source={images}", "conf=0.01", "save_txt=True", "imgsz=64",
             f"project={tmp_path}", "name=pred", cwd=tmp_path))
    assert (tmp_path / "pred").is_dir()


def test_benchmark_as_a_first_command(trained, tmp_path):
    best, data = trained
    model = own_copy(best, tmp_path)
    out = ok(fresh("benchmark", f"model={model}", f"data={data}", "imgsz=64", "formats=onnx,onnx_int8,openvino", "threads=1",
                   cwd=tmp_path))
    assert "onnx_int8" in out


@pytest.mark.parametrize("args", [["cfg"], ["help"], ["version"], ["settings"], ["callbacks", "mlflow=False"]],
                         ids=["cfg", "help", "version", "settings", "callbacks"])
def test_info_modes_as_first_commands(args, tmp_path):
    ok(fresh(*args, cwd=tmp_path))
