"""What an Ultralytics user reaches for on a model object beyond the modes: its device, the checkpoint behind it, fusing,
moving it, loading weights into it (`model.load(weights)`, then used by every mode), and the engine of the last predict
(`model.predictor`). A mixin of the YOLO facade (yolo_cb/model.py)."""

from __future__ import annotations

import copy
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from torch import nn

from yolo_cb.checkpoints.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from yolo_cb.checkpoints.weights import resolve_weights
from yolo_cb.nn import build_model
from yolo_cb.nn.blocks import ConvBNAct
from yolo_cb.prediction.backend import PyTorchBackend
from yolo_cb.settings.config import get_config
from yolo_cb.utils.device import select_device
from yolo_cb.utils.log import LOGGER
from yolo_cb.version import __version__


class ModelHabits:
    """Ultralytics' Model attributes; the facade provides `source`, `model` (the loaded module), `_module`, `overrides` and
    `_read_overrides(path)`."""

    predictor: Any = None  # the Predictor of the last predict() / __call__ (Ultralytics' model.predictor)
    _loaded_from: str | None = None  # what load() transferred weights from into the module of `source` (None: nothing)

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
        module = self._pytorch_module("save")
        if any(isinstance(m, ConvBNAct) and isinstance(m.bn, nn.Identity) for m in module.modules()):
            raise ValueError("save() needs an unfused model: fuse() folded its BatchNorms into the convolutions; save before fuse()")
        weights = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
        ckpt = Checkpoint(model=weights, model_cfg=dict(module.cfg), names={int(k): str(v) for k, v in module.names.items()},
                          finished=True, version=__version__, date=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        return save_checkpoint(ckpt, Path(filename))

    def load(self, weights: str | Path | nn.Module) -> Any:
        """Transfer into the model every tensor of `weights` (a .pt checkpoint, official weights by name, or an nn.Module)
        whose name and shape match, as Ultralytics' model.load(); logs "Transferred N/M items"; returns the facade. The
        model takes the weights' classes (names and count) first, so that their class head transfers too (Ultralytics keeps
        the YAML's 80 and leaves it out). From then on val / predict / export run, and train() starts from, this in-memory
        model (until a training replaces it with its best.pt)."""
        module = self._pytorch_module("load")
        if isinstance(weights, nn.Module):
            state, names, origin = weights.state_dict(), getattr(weights, "names", None), type(weights).__name__
        else:
            path = resolve_weights(str(weights), get_config({}).weights_dir)
            ckpt = load_checkpoint(path)
            state, names, origin = ckpt.ema or ckpt.model, ckpt.names, str(path)
            if not self.overrides:  # val() then finds the weights' dataset and size, as after YOLO(weights)
                self._read_overrides(str(path))
        if names and len(names) != module.nc:
            module = build_model(dict(module.cfg), nc=len(names), verbose=False)
        own = module.state_dict()
        matching = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
        module.load_state_dict({k: v.to(own[k].dtype) for k, v in matching.items()}, strict=False)
        if names:
            module.names = {int(k): str(v) for k, v in names.items()}
        LOGGER.info(f"Transferred {len(matching)}/{len(own)} items from {origin}")
        self._module, self._loaded_from = (self.source, module), origin
        return self

    @property
    def loaded_module(self) -> nn.Module | None:
        """The in-memory model load() filled, while it is the model of `source` (None otherwise: modes read the file)."""
        current = self._module is not None and self._module[0] == self.source
        return self._module[1] if current and self._loaded_from is not None else None

    def _mode_model(self, args, kwargs: dict, backend: bool = True) -> Any:
        """What a mode runs: model= when given, else after load() a copy of the in-memory model (a Backend that fuses it and
        places it on device= as a file's would; export: the module), else the file args.model."""
        module = None if "model" in kwargs else self.loaded_module
        if module is None:
            return args.model
        if not backend:
            return module
        device = select_device(args.device)
        return PyTorchBackend(copy.deepcopy(module), owned=True, device=device, fp16=bool(args.half) and device.type == "cuda")

    def _pytorch_module(self, what: str) -> nn.Module:
        module = self.model
        if not isinstance(module, nn.Module):
            raise TypeError(f"{what}() needs a PyTorch model (a .pt checkpoint or a model YAML); {self.source} is an exported "
                            f"file run by {type(module).__name__}")
        return module
