"""The torch device a `device=` setting names."""

from __future__ import annotations

from typing import Any

import torch

from yolo_cb.errors import ConfigError


def select_device(device: Any = "cpu") -> torch.device:
    """'cpu' | '' | None | 0 | '0' | '0,1' | 'cuda:0' | torch.device -> a torch.device (first listed GPU)."""
    if isinstance(device, torch.device):
        return device
    text = "" if device is None else str(device).strip().lower()
    if text in ("", "auto"):
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if text == "cpu":
        return torch.device(text)
    if text == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise ConfigError(f"device={device!r} requested but Apple MPS is not available here; use device=cpu")
        return torch.device(text)
    ids = text.replace("cuda:", "").replace("cuda", "0").split(",")
    if all(i.strip().isdigit() for i in ids):
        if not torch.cuda.is_available():
            raise ConfigError(f"device={device!r} requested but CUDA is not available (torch {torch.__version__}, "
                              f"{'built without CUDA' if torch.version.cuda is None else 'no CUDA GPU visible'}); use device=cpu")
        first = int(ids[0])
        if first >= torch.cuda.device_count():
            raise ConfigError(f"device={device!r}: there is no CUDA device {first} ({torch.cuda.device_count()} visible: "
                              f"{', '.join(map(str, range(torch.cuda.device_count())))})")
        return torch.device(f"cuda:{first}")
    raise ConfigError(f"device={device!r} is not a device; use cpu, a CUDA index (0, 0,1, cuda:0) or mps")


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA), so that a timing covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_flags(module: torch.nn.Module) -> dict:
    """Each submodule's train/eval flag, to restore exactly after an evaluation."""
    return {m: m.training for m in module.modules()}


def restore_train_flags(flags: dict) -> None:
    for m, training in flags.items():
        m.training = training
