"""`yolo-cb checks` (what this machine and install have) and `yolo-cb copy-cfg` (the default settings as a file to
edit), Ultralytics' `yolo checks` and `yolo copy-cfg`."""

from __future__ import annotations

import platform
import shutil
import sys
from importlib import metadata
from pathlib import Path

from yolo_cb.errors import UserError
from yolo_cb.settings.schema import usable_cpus
from yolo_cb.utils.paths import DEFAULT_CFG
from yolo_cb.version import __version__

COPY_NAME = "default_copy.yaml"  # what copy-cfg writes in the working directory (Ultralytics' name)
# the packages behind yolo-cb's optional features, shown with their versions (or "not installed")
OPTIONAL = ("onnx", "onnxruntime", "openvino", "mlflow", "tensorboard", "wandb", "comet_ml", "optuna", "ray", "pycocotools")


def _version(package: str) -> str:
    try:
        return metadata.version(package.replace("_", "-"))
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def checks() -> None:
    """Print the versions and the hardware a run here would use."""
    import torch

    from yolo_cb.training.step import cpu_has_native_bf16  # local: it loads torch, and `yolo-cb copy-cfg` answers without it

    cuda = f"{torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "no GPU"
    rows = [("yolo-cb", __version__), ("python", sys.version.split()[0]), ("os", platform.platform()), ("torch", torch.__version__),
            ("torchvision", _version("torchvision")), ("cpu", f"{_cpu_name()}, {usable_cpus()} usable core(s)"),
            ("bf16 (CPU)", "native: amp=True trains in bf16" if cpu_has_native_bf16() else "not native: amp=True trains in fp32"),
            ("cuda", cuda), *((package, _version(package)) for package in OPTIONAL)]
    for name, value in rows:
        print(f"{name:<12} {value}")


def copy_cfg(folder: Path | None = None) -> Path:
    """Copy cfg/default.yaml to <folder>/default_copy.yaml (never over an existing file) and say how to use it."""
    target = Path(folder or Path.cwd()) / COPY_NAME
    if target.exists() or target.is_symlink():
        raise UserError(f"{target} exists; copy-cfg does not overwrite it: move it away or edit it (yolo-cb train cfg={target.name})")
    shutil.copyfile(DEFAULT_CFG, target)
    print(f"{DEFAULT_CFG} copied to {target}: edit it, then yolo-cb train cfg={target.name}")
    return target
