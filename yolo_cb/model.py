"""The YOLO facade: one object to train, validate, predict and export, and to register callbacks on.

    model = YOLO("yolox-nano.yaml")            # or "runs/train/exp/weights/best.pt" / "best.onnx"
    model.add_callback("on_fit_epoch_end", fn)
    model.train(data="shapes.yaml", epochs=10, imgsz=320)

Callbacks added here reach every engine object the facade creates: the trainer (and its
in-training validator), val, predict and export.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from yolo_cb.callbacks.engine import Callbacks
from yolo_cb.config import ConfigError, get_config
from yolo_cb.utils.log import setup_logging

# Settings that may differ from the checkpoint's when resuming; anything else would change what is trained.
RESUME_MUTABLE = {"device", "workers", "batch", "epochs", "time", "patience", "resume", "nproc", "verbose", "plots", "save_period",
                  "save_topk", "mlflow", "tensorboard", "onnx_check", "onnx_check_tol", "callbacks", "val_period", "plot_period",
                  "cache", "mode", "exist_ok", "amp", "deterministic", "val", "datasets_dir"}


class YOLO:
    """Train / val / predict / export a YOLOX detector; `add_callback` and friends register user callbacks."""

    def __init__(self, model: str | Path | None = "yolox-nano.yaml"):
        self.source = str(model) if model is not None else None
        self.callbacks = Callbacks()
        self.trainer = None
        self.metrics: dict | None = None
        self.overrides: dict[str, Any] = {}
        if self.source and self.source.endswith(".pt"):
            from yolo_cb.utils.checkpoint import load_checkpoint

            self.overrides = {k: v for k, v in (load_checkpoint(self.source).get("train_args") or {}).items()
                              if k in ("data", "imgsz", "datasets_dir")}

    # --- callbacks ------------------------------------------------------------------------
    def add_callback(self, event: str, fn: Callable, on_error: str = "raise") -> YOLO:
        self.callbacks.add_callback(event, fn, on_error=on_error)
        return self

    def add_callbacks(self, obj: Any, on_error: str = "raise") -> YOLO:
        self.callbacks.add_callbacks(obj, on_error=on_error)
        return self

    def set_callback(self, event: str, fn: Callable, on_error: str = "raise") -> YOLO:
        self.callbacks.set_callback(event, fn, on_error=on_error)
        return self

    def clear_callback(self, event: str) -> YOLO:
        self.callbacks.clear_callback(event)
        return self

    def reset_callbacks(self) -> YOLO:
        """Drop every callback added on this object (engines keep their built-in defaults)."""
        self.callbacks = Callbacks()
        return self

    def _engine_callbacks(self, args) -> Callbacks:
        from yolo_cb.callbacks.registry import apply_specs

        callbacks = self.callbacks.copy()
        apply_specs(callbacks, args.callbacks)
        return callbacks

    # --- modes ----------------------------------------------------------------------------
    def train(self, **kwargs) -> dict:
        """Train (or resume, with resume=True / resume=path); returns the final metrics dict."""
        from yolo_cb.callbacks.registry import build_trainer_callbacks
        from yolo_cb.engine.trainer import Trainer

        resume_ckpt, resume_path = None, None
        if kwargs.get("resume") not in (None, False, "False", "false"):
            args, resume_ckpt, resume_path = prepare_resume(kwargs)
        else:
            args = get_config({**kwargs, "mode": "train"})
        setup_logging(args.verbose)
        from yolo_cb.engine.ddp import world_size_for

        if "LOCAL_RANK" not in os.environ and world_size_for(args) > 1:  # under torchrun the workers already exist
            from yolo_cb.engine.ddp import launch_ddp

            self.metrics = launch_ddp(args, self.callbacks, model=self.source if not resume_ckpt else None, resume=str(resume_path) if resume_path else None)
            self.source = str(self.metrics.pop("_best_pt", self.source))
            self.overrides = {k: getattr(args, k) for k in ("data", "imgsz", "datasets_dir")}
            return self.metrics
        trainer = Trainer(args, callbacks=build_trainer_callbacks(args, self.callbacks), model=self.source if not resume_ckpt else None)
        if resume_ckpt is not None:
            trainer.resume_ckpt = resume_ckpt
            trainer.save_dir = resume_path.parent.parent
        self.trainer = trainer
        self.metrics = trainer.train()
        best = trainer.wdir / "best.pt"
        if best.is_file():
            self.source = str(best)
        self.overrides = {k: getattr(args, k) for k in ("data", "imgsz", "datasets_dir")}  # val()/predict() after train() use them
        return self.metrics

    def val(self, **kwargs) -> dict:
        from yolo_cb.engine.validator import Validator

        args = get_config({**self.overrides, **kwargs, "mode": "val", "model": kwargs.get("model", self.source)})
        self._require_weights("val", args.model)
        setup_logging(args.verbose)
        validator = Validator(args, callbacks=self._engine_callbacks(args))
        self.metrics = validator(model=args.model)
        return self.metrics

    def predict(self, source: Any = None, stream: bool = False, **kwargs):
        from yolo_cb.engine.predictor import Predictor

        args = get_config({**{k: v for k, v in self.overrides.items() if k == "imgsz"}, **kwargs, "mode": "predict", "model": kwargs.get("model", self.source)})
        self._require_weights("predict", args.model)
        setup_logging(args.verbose)
        predictor = Predictor(args, callbacks=self._engine_callbacks(args))
        return predictor(source=source if source is not None else args.source, model=args.model, stream=stream)

    def export(self, **kwargs) -> str:
        from yolo_cb.engine.exporter import Exporter

        # export batch defaults to 1 (the training default of 16 would make a static batch-16 model)
        args = get_config({"batch": 1, **{k: v for k, v in self.overrides.items() if k == "imgsz"}, **kwargs, "mode": "export",
                           "model": kwargs.get("model", self.source)})
        self._require_weights("export", args.model)
        setup_logging(args.verbose)
        exporter = Exporter(args, callbacks=self._engine_callbacks(args))
        return exporter(model=args.model)

    def _require_weights(self, mode: str, model: Any) -> None:
        """val/predict/export need trained weights, not an architecture YAML."""
        if isinstance(model, (str, Path)) and str(model).endswith((".yaml", ".yml")):
            raise FileNotFoundError(f"{mode} needs trained weights (.pt, .onnx or .torchscript), but model is the config '{model}'. "
                                    f"Train first (model.train(...) then model.{mode}(...)), or pass model=path/to/best.pt")

    def __repr__(self) -> str:
        return f"YOLO({self.source!r})"


def find_last_checkpoint(project: str | None) -> Path:
    root = Path(project) if project else Path("runs") / "train"
    candidates = sorted(root.glob("*/weights/last.pt"), key=lambda p: p.stat().st_mtime)
    if not candidates:
        raise FileNotFoundError(f"resume=True: no last.pt found under {root}/*/weights/; pass resume=path/to/last.pt")
    return candidates[-1]


def prepare_resume(overrides: dict[str, Any]):
    """(args, checkpoint, path) for a resume: the checkpoint's settings, with only RESUME_MUTABLE overrides allowed."""
    from yolo_cb.utils.checkpoint import load_checkpoint

    value = overrides["resume"]
    path = find_last_checkpoint(overrides.get("project")) if value in (True, "True", "true") else Path(str(value))
    ckpt = load_checkpoint(path)
    saved = dict(ckpt.get("train_args") or {})
    requested = get_config({**saved, **{k: v for k, v in overrides.items() if k != "resume"}, "mode": "train"})
    changed = sorted(k for k in overrides if k not in RESUME_MUTABLE and k in saved and getattr(requested, k) != saved[k])
    if changed:
        raise ConfigError(f"cannot change {', '.join(f'{k}={overrides[k]!r} (was {saved[k]!r})' for k in changed)} when resuming {path}: "
                          f"that would change what is being trained. Settings that may change on resume: {', '.join(sorted(RESUME_MUTABLE - {'resume', 'mode'}))}")
    if requested.epochs < int(ckpt.get("epochs", requested.epochs)):
        raise ConfigError(f"epochs={requested.epochs} is smaller than the checkpoint's {ckpt.get('epochs')}; only a larger epochs may be given on resume")
    requested.resume = str(path)
    requested.exist_ok = True
    return requested, ckpt, path
