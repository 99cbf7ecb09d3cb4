"""The command line's modes that load torch: `yolo-cb train | val | predict | track | export | tune | benchmark`, a resume,
`yolo-cb checks` (Ultralytics' `yolo checks`: this machine's versions and hardware) and `yolo-cb callbacks` of a
checkpoint named as the model.

A module of its own because importing it loads torch and the YOLO facade: yolo_cb/cli.py answers everything the command
line and the files it names decide (help, cfg, settings, a bad key, value or data YAML, `copy-cfg`, the callbacks of a
training from a YAML) before it imports this module, in one place (tests/test_cli_no_torch.py).
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import torch

from yolo_cb.export.benchmark import benchmark
from yolo_cb.model import DEFAULT_MODEL, YOLO
from yolo_cb.settings.config import Config
from yolo_cb.settings.schema import usable_cpus
from yolo_cb.training.step import cpu_has_native_bf16
from yolo_cb.version import __version__

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
    cuda = f"{torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "no GPU"
    rows = [("yolo-cb", __version__), ("python", sys.version.split()[0]), ("os", platform.platform()), ("torch", torch.__version__),
            ("torchvision", _version("torchvision")), ("cpu", f"{_cpu_name()}, {usable_cpus()} usable core(s)"),
            ("bf16 (CPU)", "native: amp=True trains in bf16" if cpu_has_native_bf16() else "not native: amp=True trains in fp32"),
            ("cuda", cuda), *((package, _version(package)) for package in OPTIONAL)]
    for name, value in rows:
        print(f"{name:<12} {value}")


def resume(overrides: dict[str, str]) -> object:
    """`yolo-cb train resume=...`, its keys and values already checked by cli.py: the run's settings (the checkpoint's,
    under these) are resolved once, by the resume's plan in train()."""
    return YOLO(overrides.get("model") or DEFAULT_MODEL).train(**{k: v for k, v in overrides.items() if k != "model"})


def checkpoint_callbacks(args: Config, overrides: dict[str, str]) -> str:
    """`yolo-cb callbacks model=x.pt`: the table of a training from that checkpoint, which the facade reads (and refuses)."""
    return YOLO(args.model).training_callbacks(**{k: v for k, v in overrides.items() if k != "model"}).table()


def drain(results: Iterator[object]) -> int:
    """Consume a predict stream without keeping its Results (each holds its decoded image): memory stays flat in
    the number of images and video frames. Returns how many there were."""
    count = 0
    try:
        for _ in results:
            count += 1
    finally:  # an interrupt between two results still closes the stream (its videos are finalised)
        close = getattr(results, "close", None)
        if close is not None:
            close()
    return count


def run_mode(mode: str, args: Config | None, overrides: dict[str, str]) -> object:
    """Run `mode` with the settings cli.run resolved and checked (`args`) and the key=value strings given (`overrides`).
    `args` is None where cli.run resolves none: for `checks`, and for a resume (its plan resolves them from the checkpoint)."""
    if mode == "checks":
        return checks()
    if args is None:  # train resume= a path, true or auto
        return resume(overrides)
    if mode == "callbacks":  # a checkpoint named as the model (cli.py answers the rest)
        print(checkpoint_callbacks(args, overrides))
        return None
    model = YOLO(args.model or (DEFAULT_MODEL if mode in ("train", "tune") else None))  # DEFAULT_MODEL: no model named (resume keeps its own)
    kwargs = {k: v for k, v in overrides.items() if k != "model"}
    if mode == "benchmark":
        return benchmark(args, format=overrides.get("format"))  # format= as given (args.format holds the export default)
    if mode in ("predict", "track"):  # the CLI saves annotated images unless save=False (Python's predict() saves only with save=True)
        return drain(model.run_predict(kwargs.pop("source", None), True, {**kwargs, "mode": mode}, save=True))
    if mode == "train" and not args.resume:  # a fresh run trains with the settings resolved above (a resume plans its own)
        return model.train(**kwargs, _resolved=args)
    call = {"train": model.train, "val": model.val, "export": model.export, "tune": model.tune}[args.mode]
    return call(**kwargs)
