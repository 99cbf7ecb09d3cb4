"""What an Ultralytics user reaches for on a model object beyond the modes: its device, the checkpoint behind it, fusing,
moving it, and the engine of the last predict (`model.predictor`). A mixin of the YOLO facade (yolo_cb/model.py)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
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

    def save(self, filename: str | Path = "saved_model.pt") -> Path:
        """Write the loaded PyTorch model as a yolo-cb checkpoint that YOLO(filename) loads back, as Ultralytics'
        model.save(): its weights, architecture and class names, marked finished (a start for training, not a run to
        resume). Written atomically; a fused model is refused (its BatchNorms are gone, so no model could load it)."""
        from yolo_cb.checkpoints.checkpoint import Checkpoint, save_checkpoint
        from yolo_cb.nn.blocks import ConvBNAct
        from yolo_cb.version import __version__

        module = self._pytorch_module("save")
        if any(isinstance(m, ConvBNAct) and isinstance(m.bn, nn.Identity) for m in module.modules()):
            raise ValueError("save() needs an unfused model: fuse() folded its BatchNorms into the convolutions; save before fuse()")
        weights = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
        ckpt = Checkpoint(model=weights, model_cfg=dict(module.cfg), names={int(k): str(v) for k, v in module.names.items()},
                          finished=True, version=__version__, date=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        return save_checkpoint(ckpt, Path(filename))

    def _pytorch_module(self, what: str) -> nn.Module:
        module = self.model
        if not isinstance(module, nn.Module):
            raise TypeError(f"{what}() needs a PyTorch model (a .pt checkpoint or a model YAML); {self.source} is an exported "
                            f"file run by {type(module).__name__}")
        return module
