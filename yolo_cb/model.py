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
                  "cache", "mode", "exist_ok", "amp", "deterministic", "val", "datasets_dir", "weights_dir"}


class _DefaultModel(str):
    """The model YOLO() trains when none is named; a resume tells it apart from a model the user named."""


DEFAULT_MODEL = _DefaultModel("yolox-nano.yaml")


class YOLO:
    """Train / val / predict / export a YOLOX detector; `add_callback` and friends register user callbacks."""

    def __init__(self, model: str | Path | None = DEFAULT_MODEL):
        self.source = str(model) if model is not None else None
        self.model_named = model is not None and not isinstance(model, _DefaultModel)  # resume refuses a named model not its own
        self.callbacks = Callbacks()
        self.trainer = None
        self.metrics: dict | None = None
        self.overrides: dict[str, Any] = {}
        from yolo_cb.weights import is_weights_name

        if self.source and self.source.endswith((".pt", ".pth")) and not is_weights_name(self.source):  # a name: fetched on first use
            self._read_overrides()

    def _read_overrides(self) -> None:
        from yolo_cb.utils.checkpoint import load_checkpoint

        self.overrides = {k: v for k, v in (load_checkpoint(self.source).get("train_args") or {}).items()
                          if k in ("data", "imgsz", "datasets_dir")}

    def _fetch_named_weights(self, kwargs: dict) -> dict:
        """Official weights named as the model (yolox-s.pt, not a file here): fetched into the weights folder (weights_dir=),
        verified and converted (yolo_cb.weights), then used as the model; returns kwargs with model= resolved."""
        from yolo_cb.weights import is_weights_name, resolve_weights

        named = kwargs.get("model", self.source)
        if not is_weights_name(named):
            return kwargs
        path = str(resolve_weights(named, get_config({k: v for k, v in kwargs.items() if k in ("cfg", "weights_dir")}).weights_dir))
        if "model" in kwargs:
            return {**kwargs, "model": path}
        self.source = path
        self._read_overrides()
        return kwargs

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

        kwargs = dict(kwargs)
        named = kwargs.pop("model", None)  # train(model=...) names the model as YOLO(...) does
        if named is not None and self.model_named and str(named) != self.source:
            from yolo_cb.errors import ConfigError

            raise ConfigError(f"YOLO('{self.source}') already names the model, and train(model='{named}') names another: "
                              f"give one (YOLO('{named}').train(...) or drop model= from train())")
        source, model_named = (str(named), True) if named is not None else (self.source, self.model_named)
        resume_ckpt, resume_path = None, None
        if kwargs.get("resume") not in (None, False, "False", "false"):
            args, resume_ckpt, resume_path = prepare_resume(kwargs, model=source if model_named else None)
            from yolo_cb.utils.checkpoint import is_finished

            if is_finished(resume_ckpt):
                setup_logging(args.verbose)
                return self._finished_run(args, resume_ckpt, resume_path, kwargs)
        else:
            args = get_config({**kwargs, **({"model": source} if source else {}), "mode": "train"})  # args.yaml records the model
            from yolo_cb.weights import resolve_weights

            resolved = resolve_weights(source, args.weights_dir)  # official weights by name: fetched here, once, before DDP workers
            if resolved is not source:
                source = args.model = str(resolved)
            args.pretrained = resolve_weights(args.pretrained, args.weights_dir)
            if isinstance(source, (str, Path)) and not str(source).endswith((".pt", ".pth")):
                from yolo_cb.nn.model import load_model_cfg

                load_model_cfg(source)  # a model= that is no model YAML fails here, before a run folder is made
        setup_logging(args.verbose)
        from yolo_cb.engine.ddp import world_size_for

        if "LOCAL_RANK" not in os.environ and world_size_for(args) > 1:  # under torchrun the workers already exist
            from yolo_cb.engine.ddp import launch_ddp

            self.metrics = launch_ddp(args, self.callbacks, model=source if not resume_ckpt else None, resume=str(resume_path) if resume_path else None)
            self.source = str(self.metrics.pop("_best_pt", self.source))
            self.overrides = {k: getattr(args, k) for k in ("data", "imgsz", "datasets_dir")}
            return self.metrics
        trainer = Trainer(args, callbacks=build_trainer_callbacks(args, self.callbacks), model=source if not resume_ckpt else None)
        if resume_ckpt is not None:
            trainer.resume_ckpt = resume_ckpt  # the trainer verifies the run folder it belongs to (args.resume is its path)
        self.trainer = trainer
        self.metrics = trainer.train()
        best = trainer.wdir / "best.pt"
        if best.is_file():
            self.source = str(best)
        self.overrides = {k: getattr(args, k) for k in ("data", "imgsz", "datasets_dir")}  # val()/predict() after train() use them
        return self.metrics

    def tune(self, **kwargs) -> dict:
        """Search hyperparameters with Optuna (docs/tune.md): `iterations` trials, each a training of `epochs` epochs with
        settings sampled from `space=`, pruned through trainer.stop; returns the best trial's summary (settings, fitness,
        folder). Needs the tune extra: pip install 'yolo-cb[tune]'."""
        from yolo_cb.tune import tune

        return tune(self, **kwargs)

    def _finished_run(self, args, ckpt: dict, path: Path, overrides: dict) -> dict:
        """resume= of a run that ended: nothing to train and nothing written; say how to train further."""
        from yolo_cb.utils.checkpoint import ResumeError
        from yolo_cb.utils.log import LOGGER

        done, total = int(ckpt.get("epoch", -1)) + 1, int(ckpt.get("epochs") or 0)
        how = f"all {total} epochs trained" if done >= total else f"stopped early after epoch {done} of {total}"
        best = path.parent / "best.pt"
        weights = best if best.is_file() else path
        hint = f"start a new run from its weights: yolo-cb train model={weights} data={args.data} epochs=N (YOLO('{weights}').train(data=..., epochs=N))"
        if "epochs" in overrides and args.epochs > total:
            raise ResumeError(f"{path} is from a finished run ({how}); resume cannot extend it to epochs={args.epochs} "
                              f"(its optimizer state was dropped at the end). To train further, {hint}")
        LOGGER.info(f"{path} is from a finished run ({how}); there is nothing to resume and nothing was changed. "
                    f"To train further (fine-tune), {hint}")
        self.trainer = None
        self.metrics = {k: float(v) for k, v in (ckpt.get("metrics") or {}).items()}
        self.source = str(weights)
        self.overrides = {k: getattr(args, k) for k in ("data", "imgsz", "datasets_dir")}
        return self.metrics

    def val(self, **kwargs) -> dict:
        from yolo_cb.engine.validator import Validator

        kwargs = self._fetch_named_weights(kwargs)
        args = get_config({**self.overrides, **kwargs, "mode": "val", "model": kwargs.get("model", self.source)})
        self._require_weights("val", args.model)
        setup_logging(args.verbose)
        validator = Validator(args, callbacks=self._engine_callbacks(args))
        self.metrics = validator(model=args.model)
        return self.metrics

    def predict(self, source: Any = None, stream: bool = False, **kwargs):
        from yolo_cb.engine.predictor import Predictor

        kwargs = self._fetch_named_weights(kwargs)
        args = get_config({**{k: v for k, v in self.overrides.items() if k == "imgsz"}, **kwargs, "mode": "predict", "model": kwargs.get("model", self.source)})
        self._require_weights("predict", args.model)
        setup_logging(args.verbose)
        predictor = Predictor(args, callbacks=self._engine_callbacks(args))
        return predictor(source=source if source is not None else args.source, model=args.model, stream=stream)

    def export(self, **kwargs) -> str:
        from yolo_cb.engine.exporter import Exporter

        kwargs = self._fetch_named_weights(kwargs)
        # export batch defaults to 1 (the training default of 16 would make a static batch-16 model)
        args = get_config({"batch": 1, **{k: v for k, v in self.overrides.items() if k == "imgsz"}, **kwargs, "mode": "export",
                           "model": kwargs.get("model", self.source)})
        self._require_weights("export", args.model)
        setup_logging(args.verbose)
        exporter = Exporter(args, callbacks=self._engine_callbacks(args))
        return exporter(model=args.model)

    def _require_weights(self, mode: str, model: Any) -> None:
        """val/predict/export need trained weights, not an architecture YAML."""
        if model is None or model == "":
            raise ConfigError(f"{mode} needs model=: trained weights (.pt, .onnx or .torchscript), e.g. "
                              f"yolo-cb {mode} model=runs/train/exp/weights/best.pt")
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


def prepare_resume(overrides: dict[str, Any], model: str | None = None):
    """(args, checkpoint, path) for a resume: the checkpoint's settings, with only RESUME_MUTABLE overrides allowed.

    `model` is a model the user named (None: not named); one other than the checkpoint's is refused, and so is a
    dataset other than the one the checkpoint was trained on. A finished run's checkpoint is returned unchecked:
    nothing will be trained (the caller says so)."""
    from yolo_cb.utils.checkpoint import is_finished, load_checkpoint

    value = overrides["resume"]
    path = find_last_checkpoint(overrides.get("project")) if value in (True, "True", "true") else Path(str(value)).expanduser()
    ckpt = load_checkpoint(path)
    path = path.resolve()
    saved = dict(ckpt.get("train_args") or {})
    requested = get_config({**saved, **{k: v for k, v in overrides.items() if k != "resume"}, "mode": "train"})
    requested.resume = str(path)
    if is_finished(ckpt):
        return requested, ckpt, path
    if "data" in overrides and "data" in saved and _same_data_yaml(requested.data, saved["data"]):
        requested.data = saved["data"]  # the same YAML named another way (relative, bundled name)
    changed = sorted(k for k in overrides if k not in RESUME_MUTABLE and k in saved and getattr(requested, k) != saved[k])
    if changed:
        raise ConfigError(f"cannot change {', '.join(f'{k}={overrides[k]!r} (was {saved[k]!r})' for k in changed)} when resuming {path}: "
                          f"that would change what is being trained. Settings that may change on resume: {', '.join(sorted(RESUME_MUTABLE - {'resume', 'mode'}))}")
    if requested.epochs < int(ckpt.get("epochs", requested.epochs)):
        raise ConfigError(f"epochs={requested.epochs} is smaller than the checkpoint's {ckpt.get('epochs')}; only a larger epochs may be given on resume")
    check_resume_model(model, ckpt, path)
    check_resume_data(requested, ckpt, path)
    requested.exist_ok = True
    return requested, ckpt, path


def _same_data_yaml(a: Any, b: Any) -> bool:
    from yolo_cb.paths import find_dataset_cfg

    try:
        return find_dataset_cfg(str(a)).resolve() == find_dataset_cfg(str(b)).resolve()
    except (FileNotFoundError, OSError):
        return False


def check_resume_model(model: str | None, ckpt: dict, path: Path) -> None:
    """Refuse a model= on resume that is not the checkpoint's: the same architecture YAML, the checkpoint itself, or the
    weights the run started from are fine; anything else would be silently ignored, so it is an error."""
    from yolo_cb.utils.checkpoint import ResumeError

    if model is None:
        return
    recorded = (ckpt.get("train_args") or {}).get("model")
    was = recorded or f"the architecture {ckpt.get('model_cfg')}"
    refuse = ResumeError(f"cannot change model={model} (was {was}) when resuming {path}: resume continues the checkpoint's own "
                         f"model and weights. Resume without model=, or start a new run: yolo-cb train model={model} data=...")
    if str(model).endswith(".pt"):
        own = {path} | ({Path(str(recorded)).expanduser().resolve()} if recorded and str(recorded).endswith(".pt") else set())
        if Path(str(model)).expanduser().resolve() not in own:
            raise refuse
        return
    from yolo_cb.nn.model import load_model_cfg

    arch, _ = load_model_cfg(str(model))
    stored = ckpt.get("model_cfg") or {}
    if any(arch.get(k) != stored.get(k) for k in ("depth", "width", "depthwise", "act")):
        raise refuse


def check_resume_data(args, ckpt: dict, path: Path) -> None:
    """Refuse to resume on a dataset other than the checkpoint's (its data YAML, image counts and names), naming both."""
    from yolo_cb.data.resolve import check_data
    from yolo_cb.utils.checkpoint import check_same_dataset, dataset_fingerprint

    check_same_dataset(ckpt, dataset_fingerprint(check_data(args.data or "shapes.yaml", args.datasets_dir)), path)
