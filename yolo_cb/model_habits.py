"""What an Ultralytics user reaches for on a model object beyond the modes: its device, the checkpoint behind it, fusing,
moving it, and the engine of the last predict (`model.predictor`). A mixin of the YOLO facade (yolo_cb/model.py)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class ModelHabits:
    """Ultralytics' Model attributes; the facade provides `source`, `model` (the loaded module) and `_module`."""

    predictor: Any = None  # the Predictor of the last predict() / __call__ (Ultralytics' model.predictor)

    @property
    def ckpt_path(self) -> str | None:
        """The .pt checkpoint the model was loaded from (after train(): its best.pt); None for a YAML or an export."""
        source = str(self.source or "")
        return source if source.endswith((".pt", ".pth")) else None

    @property
    def device(self) -> torch.device | None:
        """Where the model's parameters are (None for an exported file, whose runtime decides)."""
        module = self.model
        if not isinstance(module, nn.Module):
            return None
        first = next(module.parameters(), None)
        return first.device if first is not None else torch.device("cpu")

    def fuse(self) -> None:
        """Fold every BatchNorm into its convolution, in place (faster inference; training such a model is not possible),
        as Ultralytics' model.fuse(). Needs a PyTorch model."""
        self._pytorch_module("fuse").fuse()

    def to(self, *args, **kwargs):
        """Move the loaded PyTorch model (`model.to("cpu")`, `model.to(torch.device(...))`); returns the facade, as
        Ultralytics. Later val / predict / export still choose their device with device= (default: the best available)."""
        self._pytorch_module("to").to(*args, **kwargs)
        return self

    def _pytorch_module(self, what: str) -> nn.Module:
        module = self.model
        if not isinstance(module, nn.Module):
            raise TypeError(f"{what}() needs a PyTorch model (a .pt checkpoint or a model YAML); {self.source} is an exported "
                            f"file run by {type(module).__name__}")
        return module
