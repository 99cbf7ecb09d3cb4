"""Every command README.md and docs/*.md show runs somewhere in the suite as the first thing a new process does.

The suite's own process has imported half the world: `export nms=True` passed there and failed as a user's first
command (torchvision's extension first loaded inside the ONNX trace). Where each documented command runs in a fresh
`python -m yolo_cb ...`:
  train, val (plots, a .pt), export onnx dynamic=True, val of the .onnx, predict save_txt -- tests/test_cli_journey.py
  export onnx / half / int8 / nms, openvino / half / int8, torchscript, ncnn / mnn / tflite / executorch / coreml (each where
  its extra is installed), val of a mobile export; benchmark -- tests/test_export_formats.py
  train resume=..., resume=auto -- tests/test_resume_and_checkpoints.py, tests/test_fault_tolerance.py
  tune, tune resume= -- tests/test_tune.py, tests/test_tune_resume.py; torchrun / nproc= -- tests/test_ddp.py
  train callbacks=..., the features page's commands -- tests/test_callback_order_as_listed.py, tests/test_features_doc.py
  convert (coco, voc, labelme, labelstudio), data check -- tests/test_data_formats.py
and the modes that only print, here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def fresh(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`yolo-cb ARGS` in a new interpreter (the user's settings file kept out: YOLO_CB_CONFIG_DIR under cwd)."""
    env = {**os.environ, "YOLO_CB_CONFIG_DIR": str(cwd / "user-settings")}
    return subprocess.run([sys.executable, "-m", "yolo_cb", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


@pytest.mark.parametrize("args, says", [(["cfg"], "imgsz"), (["help"], "train"), (["version"], "."), (["settings"], "mlflow"),
                                        (["callbacks", "mlflow=False"], "progress"), (["checks"], "torch")],
                         ids=["cfg", "help", "version", "settings", "callbacks", "checks"])
def test_info_modes_as_first_commands(args, says, tmp_path):
    proc = fresh(*args, cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert says in proc.stdout + proc.stderr


def test_copy_cfg_writes_default_copy_once(tmp_path):
    """Ultralytics' `yolo copy-cfg`: default.yaml copied into the working directory; a second copy is refused (exit 2)."""
    from yolo_cb.utils.paths import DEFAULT_CFG

    proc = fresh("copy-cfg", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "default_copy.yaml").read_bytes() == DEFAULT_CFG.read_bytes()
    again = fresh("copy-cfg", cwd=tmp_path)
    assert again.returncode == 2 and "does not overwrite" in again.stderr, again.stderr[-2000:]


def test_cfg_without_a_mode_word_trains(tmp_path):
    """`yolo-cb cfg=custom.yaml` with no mode word trains, as Ultralytics: here its data= (missing) is what stops it."""
    (tmp_path / "custom.yaml").write_text("data: no_such_data.yaml\nepochs: 1\n")
    proc = fresh("cfg=custom.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and "no_such_data.yaml" in proc.stderr and "is not a mode" not in proc.stderr, proc.stderr[-2000:]
