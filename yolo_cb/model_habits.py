"""What an Ultralytics user reaches for on a model object beyond the modes: its device, the checkpoint behind it, fusing,
moving it, loading weights into it (`model.load(weights)`, then used by every mode), the engine of the last predict
(`model.predictor`, built once and reused by later calls: `_reused_predictor`), `track()` and `embed()`. A mixin of the
YOLO facade (yolo_cb/model.py)."""

from __future__ import annotations

import copy
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from torch import nn

from yolo_cb.checkpoints.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from yolo_cb.checkpoints.weights import resolve_weights
from yolo_cb.nn import build_model
from yolo_cb.nn.blocks import ConvBNAct
from yolo_cb.nn.summary import layer_table, log_summary, model_info, parameter_table
from yolo_cb.prediction.backend import PyTorchBackend
from yolo_cb.prediction.embed import default_layer
from yolo_cb.prediction.predictor import Predictor
from yolo_cb.settings.config import get_config
from yolo_cb.settings.user import settings_path
from yolo_cb.utils.device import select_device
from yolo_cb.utils.log import LOGGER, setup_logging
from yolo_cb.version import __version__

# Settings the loaded model depends on: predict / track reuse the predictor of the last call, and its loaded model, while
# these (and the model file's size and modification time, or after load() the loaded module) stay the same; a change of
# one builds a new predictor. Every other setting (conf, imgsz, classes, save, ...) applies to the call as given.
PREDICTOR_SETUP_KEYS = ("model", "device", "half", "trust")


def file_stamp(path: Any) -> tuple | None:
    """(size, modification time, inode) of a model file: a file rewritten in place (a new best.pt) is loaded again."""
    try:
        st = os.stat(str(path))
    except (OSError, ValueError):
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


class ModelHabits:
    """Ultralytics' Model attributes; the facade provides `source`, `model` (the loaded module), `_module`, `overrides` and
    `_read_overrides(path)`."""

    predictor: Any = None  # the Predictor of the last predict() / __call__ / track() (Ultralytics' model.predictor)
    _predictor_key: tuple | None = None  # what `predictor` was built for (PREDICTOR_SETUP_KEYS and the model's identity)
    _last_settings: tuple | None = None  # (what the last predict / track call asked for, its resolved settings)
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

    @property
    def ckpt(self) -> dict:
        """The checkpoint the model was loaded from, as the verified dict (model, ema, train_args, names, ...), as
        Ultralytics' model.ckpt; {} for a YAML or an export (Ultralytics' too). Read once per source."""
        path = self.ckpt_path
        if path is None:
            return {}
        if getattr(self, "_ckpt", (None,))[0] != path:
            self._ckpt = (path, load_checkpoint(path).to_dict())
        return self._ckpt[1]

    def parameters(self, recurse: bool = True):
        """The PyTorch model's parameters (Ultralytics' Model is an nn.Module: model.parameters() is its model's)."""
        return self._pytorch_module("parameters").parameters(recurse)

    def reset_weights(self):
        """Every layer's weights drawn afresh (each module's reset_parameters()) and trainable, as Ultralytics'
        reset_weights(); returns the facade. The in-memory model: later modes run it, as after load()."""
        module = self._pytorch_module("reset_weights")
        for layer in module.modules():
            if hasattr(layer, "reset_parameters"):
                layer.reset_parameters()
        for p in module.parameters():
            p.requires_grad = True
        self._loaded_from = "reset_weights()"
        return self

    def fuse(self):
        """Fold every BatchNorm into its convolution, in place (faster inference; training such a model is not possible),
        as Ultralytics' model.fuse(); returns the facade. Needs a PyTorch model."""
        self._pytorch_module("fuse").fuse()
        self.predictor = None  # as Ultralytics: the next predict builds its model anew
        return self

    def info(self, detailed: bool = False, verbose: bool = True, imgsz: int = 640) -> tuple[int, int, int, float]:
        """(layers, parameters, trainable parameters, GFLOPs at imgsz), as Ultralytics' model.info(); verbose logs the
        layer table and the summary line, detailed=True a row per parameter tensor first."""
        module = self._pytorch_module("info")
        if verbose:
            setup_logging()
            LOGGER.info(parameter_table(module) if detailed else layer_table(module))
        info = log_summary(module, imgsz) if verbose else model_info(module, imgsz)
        gradients = sum(p.numel() for p in module.parameters() if p.requires_grad)
        return info["layers"], info["params"], gradients, info["gflops"]

    def to(self, *args, **kwargs):
        """Move the loaded PyTorch model (`model.to("cpu")`, `model.to(torch.device(...))`); returns the facade, as
        Ultralytics. Later val / predict / export still choose their device with device= (default: the best available)."""
        self._pytorch_module("to").to(*args, **kwargs)
        self.predictor = None
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
        self.predictor = None  # the next predict runs the loaded weights
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

    def _call_settings(self, overrides: dict, resolve, *extra) -> Any:
        """The resolved settings of a predict / track call: a copy of the last call's when it asked for the same (equal
        arguments, and neither the user settings file nor a cfg= file changed since), else resolve(). Resolving them
        costs milliseconds, a real share of a small model's frame."""
        try:
            key = (copy.deepcopy(overrides), extra, file_stamp(settings_path()), file_stamp(overrides.get("cfg") or ""))
            same = self._last_settings is not None and bool(self._last_settings[0] == key)
        except Exception:  # an argument that cannot be copied or compared (an array): resolved every time
            key, same = None, False
        if key is None:
            return resolve()
        if not same:
            self._last_settings = (key, resolve())
        return copy.copy(self._last_settings[1])

    def _reused_predictor(self, args, kwargs: dict, callbacks) -> tuple[Predictor, Any]:
        """(the predictor to run, the model to hand it): the last call's predictor with these settings and callbacks, and
        None (it keeps its loaded model), while what it was built for is the same (PREDICTOR_SETUP_KEYS); else a new one
        and the model to load (`_mode_model`). One-time set-up (reading the checkpoint, building and fusing the model,
        NMS's import) happens once, not in each call of `for frame in frames: model(frame)`."""
        module = None if "model" in kwargs else self.loaded_module
        identity = ("loaded", id(module)) if module is not None else ("file", file_stamp(args.model))
        key = (identity, *(getattr(args, k) for k in PREDICTOR_SETUP_KEYS))
        if self.predictor is not None and self._predictor_key == key:
            self.predictor.args, self.predictor.callbacks = args, callbacks
            return self.predictor, None
        self.predictor, self._predictor_key = Predictor(args, callbacks=callbacks), key
        return self.predictor, self._mode_model(args, kwargs)

    def track(self, source: Any = None, stream: bool = False, persist: bool = False, **kwargs):
        """Predict, then follow each object from frame to frame: every Results' boxes carry track ids (`boxes.id`), as
        Ultralytics' model.track(). persist=True keeps the tracks between calls (`for frame in frames: model.track(frame,
        persist=True)`); conf= defaults to 0.1 (the tracker sees low-score boxes), tracker= botsort.yaml | bytetrack.yaml.
        Needs the track extra: pip install 'yolo-cb[track]'."""
        return self.run_predict(source, stream, {**kwargs, "persist": persist, "mode": "track"}, save=False)

    def embed(self, source: Any = None, stream: bool = False, **kwargs):
        """One feature vector (a 1-D tensor) per image, as Ultralytics' model.embed(): the pooled output of the layer
        before the head, or of the layers embed=[...] lists (yolo_cb/prediction/embed.py). Needs a PyTorch model."""
        if not kwargs.get("embed"):
            kwargs["embed"] = [default_layer(self._pytorch_module("embed"))]
        return self.run_predict(source, stream, kwargs, save=False)

    def _pytorch_module(self, what: str) -> nn.Module:
        module = self.model
        if not isinstance(module, nn.Module):
            raise TypeError(f"{what}() needs a PyTorch model (a .pt checkpoint or a model YAML); {self.source} is an exported "
                            f"file run by {type(module).__name__}")
        return module
