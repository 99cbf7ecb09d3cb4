"""The YOLO facade: one object to train, validate, predict and export, and to register callbacks on.

    model = YOLO()                             # yolocb-n.yaml; or "yolox-nano.yaml", "runs/detect/train/weights/best.pt", "best.onnx"
    model.add_callback("on_fit_epoch_end", fn)  # or model.callbacks["on_fit_epoch_end"].append(fn)
    metrics = model.train(data="shapes.yaml", epochs=10, imgsz=320)   # metrics.box.map == metrics["metrics/mAP50-95(B)"]
    results = model("image.jpg")               # = model.predict("image.jpg"): saves nothing unless save=True

Callbacks added here reach every engine object the facade creates: the trainer (and its
in-training validator), val, predict and export.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from yolo_cb.assembly.assemble import apply_declarations, build_trainer_callbacks
from yolo_cb.assembly.builtin import LOOP_STEPS
from yolo_cb.callbacks.dispatch import Callbacks
from yolo_cb.callbacks.registry import REGISTRY
from yolo_cb.checkpoints.checkpoint import load_checkpoint, model_from_checkpoint
from yolo_cb.checkpoints.weights import is_weights_name, refuse_ultralytics_weights, resolve_weights
from yolo_cb.data.resolve import require_local
from yolo_cb.evaluation.val_metrics import DetectionMetrics
from yolo_cb.evaluation.validator import Validator
from yolo_cb.export.exporter import Exporter
from yolo_cb.model_habits import ModelHabits
from yolo_cb.nn import build_model
from yolo_cb.prediction.backend import load_backend
from yolo_cb.prediction.predictor import PREDICT_BATCH
from yolo_cb.prediction.tracking import TRACK_CONF
from yolo_cb.settings.config import Config, ConfigError, callback_declarations, coerce, get_config
from yolo_cb.training.launch import launch_ddp
from yolo_cb.training.plan import plan_run
from yolo_cb.training.trainer import Trainer
from yolo_cb.tune import tune
from yolo_cb.utils import paths
from yolo_cb.utils.log import LOGGER, setup_logging


class _DefaultModel(str):
    """The model YOLO() trains when none is named; a resume tells it apart from a model the user named."""


DEFAULT_MODEL = _DefaultModel(paths.DEFAULT_MODEL)


def checkpoint_defaults(source: str) -> dict[str, Any]:
    """data and imgsz from a checkpoint's saved settings, as val()'s defaults (never a place to write, such as datasets_dir).
    A file we did not write may hold any value: one the settings refuse (a crafted imgsz=32768) is dropped with one warning."""
    saved, kept = load_checkpoint(source).train_args or {}, {}
    for key in ("data", "imgsz", "single_cls"):  # single_cls: as Ultralytics, a single-class run's checkpoint validates so
        if key in saved:
            try:
                kept[key] = coerce(key, saved[key])
            except ConfigError as error:
                LOGGER.warning(f"WARNING {source}: its saved {key} is not used ({error}); the default {key} applies")
    return kept


class YOLO(ModelHabits):
    """Train / val / predict / export a YOLOX detector; `add_callback` and friends register user callbacks."""

    def __init__(self, model: str | Path | None = DEFAULT_MODEL, task: str | None = None):
        """task=: Ultralytics' argument; "detect" (or None) is the only task here, any other is refused in one line."""
        if task not in (None, "detect"):
            raise ConfigError(f"task={task!r}: yolo-cb only detects (task='detect'); {task} models are Ultralytics'")
        self.source = str(model) if model is not None else None
        self.model_named = model is not None and not isinstance(model, _DefaultModel)  # resume refuses a named model not its own
        self.callbacks = Callbacks()
        self.trainer = None
        self.metrics: DetectionMetrics | None = None
        self._module: tuple[str | None, Any] | None = None  # (source, the loaded model) behind `model.model`
        self.overrides: dict[str, Any] = {}

        refuse_ultralytics_weights(self.source)  # YOLO("yolo11n.pt"): another architecture, said at once
        if self.source and self.source.endswith((".pt", ".pth")) and not is_weights_name(self.source):  # a name: fetched on first use
            self._read_overrides()

    def _read_overrides(self, path: str | None = None) -> None:
        self.overrides = checkpoint_defaults(path or self.source)

    def _fetch_named_weights(self, kwargs: dict) -> dict:
        """Official weights named as the model (yolox-s.pt, not a file here): fetched into the weights folder (weights_dir=),
        verified and converted (yolo_cb.checkpoints.weights), then used as the model; returns kwargs with model= resolved."""

        named = kwargs.get("model", self.source)
        if not is_weights_name(named):
            resolve_weights(named)  # refuses an Ultralytics weights name
            return kwargs
        path = str(resolve_weights(named, get_config({k: v for k, v in kwargs.items() if k in ("cfg", "weights_dir")}).weights_dir))
        if "model" in kwargs:
            return {**kwargs, "model": path}
        self.source = path
        self._read_overrides()
        return kwargs

    # --- callbacks ------------------------------------------------------------------------
    def add_callback(self, event: str, fn: Callable, on_error: str = "raise", *, name: str | None = None, after=None, before=None) -> YOLO:
        """Register `fn(obj)` on `event`; `name` (default: the function's), `after` / `before` (callback names) place it."""
        self.callbacks.add_callback(event, fn, on_error=on_error, name=name, after=after, before=before)
        return self

    def add_callbacks(self, obj: Any, on_error: str = "raise", *, name: str | None = None, after=None, before=None) -> YOLO:
        self.callbacks.add_callbacks(obj, on_error=on_error, name=name, after=after, before=before)
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

    def training_callbacks(self, **kwargs) -> Callbacks:
        """The callbacks a fresh `train(**kwargs)` runs (the defaults, the integrations its settings switch on, this
        model's and `callbacks=`), placed: `.describe()` gives each one's name, origin, error policy and ranks per event
        in firing order, `.table()` the same as text (`yolo-cb callbacks` prints it)."""
        return build_trainer_callbacks(get_config({"model": self.source, **kwargs, "mode": "train"}), self.callbacks)

    def _engine_callbacks(self, args) -> Callbacks:
        callbacks = self.callbacks.copy()
        apply_declarations(callbacks, callback_declarations(args))
        callbacks.check_names((*REGISTRY, *LOOP_STEPS))
        return callbacks

    # --- what Ultralytics' Model exposes -----------------------------------------------------
    task = "detect"  # the only task: object detection

    def __call__(self, source: Any = None, stream: bool = False, **kwargs):
        """`model(source, **kw)` is `model.predict(source, **kw)`."""
        return self.predict(source, stream=stream, **kwargs)

    @property
    def model(self):
        """The model as an object: the nn.Module of a .pt checkpoint or a model YAML (80 classes until trained, as
        Ultralytics), or the loaded Backend of an .onnx / .torchscript file. Loaded on first use, again after train()."""
        if self._module is None or self._module[0] != self.source:
            self._module = (self.source, self._load_module())
        return self._module[1]

    def _load_module(self):
        source = self.source or str(DEFAULT_MODEL)
        if source.endswith((".yaml", ".yml")):
            return build_model(source, nc=80, verbose=False)
        if source.endswith((".pt", ".pth")):
            return model_from_checkpoint(resolve_weights(source, get_config({}).weights_dir))

        return load_backend(source)

    @property
    def names(self) -> dict[int, str]:
        """Class id -> name of the model (after train(): of its dataset)."""
        if self.trainer is not None and self.trainer.data:
            return {int(k): str(v) for k, v in self.trainer.data["names"].items()}
        return {int(k): str(v) for k, v in self.model.names.items()}

    # --- modes ----------------------------------------------------------------------------
    def train(self, **kwargs) -> DetectionMetrics:
        """Train (or resume, with resume=True / resume=path); returns the final metrics (a dict with Ultralytics'
        attributes). trainer= takes a subclass of yolo_cb.training.trainer.Trainer to train with."""
        kwargs = dict(kwargs)
        resolved = kwargs.pop("_resolved", None)  # the CLI's Config of exactly these kwargs: not resolved a second time
        trainer_class = kwargs.pop("trainer", None)
        source, model_named = self._train_source(kwargs.pop("model", None))
        loaded = self.loaded_module if source == self.source else None  # after load(): a fresh run starts from it
        plan = plan_run(kwargs, source, model_named, self.callbacks, resolved, loaded, trainer_class)
        self.overrides = plan.mode_overrides()  # val()/predict() after train() use them
        weights = None
        if plan.finished is not None:  # resume= of a run that ended: nothing to train
            self.trainer, self.metrics, weights = None, plan.finished.metrics, plan.finished.weights
        elif plan.launches_workers:  # several processes, and no torchrun made them
            self.metrics, weights = launch_ddp(plan, self.callbacks)
        else:
            self.trainer = trainer = plan.trainer()
            trainer.train()
            self.metrics, weights = trainer.final_metrics(), trainer.final_weights()
        if weights is not None:
            self.source = str(weights)  # absolute: val()/predict() later work from any working directory
        return self.metrics

    def _train_source(self, named: Any) -> tuple[str | None, bool]:
        """(the model to train, whether the user named it): train(model=...) names the model as YOLO(...) does."""
        if named is not None and self.model_named and str(named) != self.source:
            raise ConfigError(f"YOLO('{self.source}') already names the model, and train(model='{named}') names another: "
                              f"give one (YOLO('{named}').train(...) or drop model= from train())")
        return (str(named), True) if named is not None else (self.source, self.model_named)

    def tune(self, **kwargs) -> dict:
        """Search hyperparameters with Optuna (docs/tune.md): `iterations` trials, each a training of `epochs` epochs with
        settings sampled from `space=`, pruned through trainer.stop; returns the best trial's summary (settings, fitness,
        folder). Needs the tune extra: pip install 'yolo-cb[tune]'."""

        return tune(self, **kwargs)

    def val(self, **kwargs) -> DetectionMetrics:
        kwargs = self._fetch_named_weights(kwargs)
        args = get_config({**self.overrides, **kwargs, "mode": "val", "model": kwargs.get("model", self.source)})
        model = self._mode_model(args, kwargs)  # after load(): the in-memory model, else the file
        self._require_weights("val", model)
        if "data" not in kwargs and self.overrides.get("data") is not None and self.trainer is None:  # the checkpoint's own
            require_local(args.data, args.datasets_dir, self.source)
        setup_logging(args.verbose)
        validator = Validator(args, callbacks=self._engine_callbacks(args))
        self.metrics = validator(model=model)
        return self.metrics

    def predict(self, source: Any = None, stream: bool = False, **kwargs):
        """Results for `source`; as in Ultralytics, Python saves annotated images only with save=True (the CLI saves)."""
        return self.run_predict(source, stream, kwargs, save=False)

    def run_predict(self, source: Any, stream: bool, kwargs: dict, save: bool):
        """predict() with `save` as the default of save= (False from Python, True from the CLI)."""

        kwargs = self._fetch_named_weights(kwargs)
        mode = kwargs.pop("mode", "predict")  # "track" from track() and `yolo-cb track`
        overrides = {**{k: v for k, v in self.overrides.items() if k == "imgsz"}, **kwargs, "mode": mode, "model": kwargs.get("model", self.source)}
        args = self._call_settings(overrides, lambda: get_config(overrides, base={"save": save, "batch": PREDICT_BATCH,
                                                                                  **({"conf": TRACK_CONF} if mode == "track" else {})}), save)
        setup_logging(args.verbose)
        predictor, model = self._reused_predictor(args, kwargs, self._engine_callbacks(args))
        if model is not None:
            self._require_weights(mode, model)
        return predictor(source=source if source is not None else args.source, model=model, stream=stream)

    def export(self, **kwargs) -> str:
        kwargs = self._fetch_named_weights(kwargs)
        # export batch defaults to 1 (the training default of 16 would make a static batch-16 model)
        args = get_config({"batch": 1, **{k: v for k, v in self.overrides.items() if k == "imgsz"}, **kwargs, "mode": "export",
                           "model": kwargs.get("model", self.source)})
        model = self._mode_model(args, kwargs, backend=False)
        self._require_weights("export", model)
        setup_logging(args.verbose)
        exporter = Exporter(args, callbacks=self._engine_callbacks(args))
        return exporter(model=model)

    def _require_weights(self, mode: str, model: Any) -> None:
        """val/predict/export need trained weights, not an architecture YAML."""
        if model is None or model == "":
            raise ConfigError(f"{mode} needs model=: trained weights (.pt, .onnx or .torchscript), e.g. "
                              f"yolo-cb {mode} model=runs/detect/train/weights/best.pt")
        if isinstance(model, (str, Path)) and str(model).endswith((".yaml", ".yml")):
            raise FileNotFoundError(f"{mode} needs trained weights (.pt, .onnx or .torchscript), but model is the config '{model}'. "
                                    f"Train first (model.train(...) then model.{mode}(...)), or pass model=path/to/best.pt")

    def __repr__(self) -> str:
        return f"YOLO({self.source!r})"


class DetectionTrainer(Trainer):
    """Ultralytics' `DetectionTrainer(overrides={...}).train()`: `overrides` are the settings YOLO().train(**overrides) takes
    (model= included; resume= too), `_callbacks` a Callbacks or a mapping event -> functions. Built by train(trainer=...),
    it is a Trainer like any other."""

    def __init__(self, cfg: Any = None, overrides: dict | None = None, _callbacks: Any = None, *, callbacks: Any = None, model: Any = None,
                 resume: Any = None):
        if isinstance(cfg, Config):  # YOLO().train(trainer=DetectionTrainer subclass): the facade planned the run
            super().__init__(cfg, callbacks=callbacks, model=model, resume=resume)
            return
        user = Callbacks()
        for event, fns in (_callbacks.items() if _callbacks is not None else ()):
            for fn in fns:
                user.add_callback(event, fn)
        given = {**({"cfg": str(cfg)} if cfg else {}), **(overrides or {})}
        named = given.pop("model", None)
        plan = plan_run(given, named or str(DEFAULT_MODEL), named is not None, user, trainer_class=type(self))
        if plan.finished is not None:
            raise ConfigError(f"{plan.resume_path} is from a finished run: there is nothing to resume. YOLO('{plan.resume_path}')"
                              f".train(resume=True) says what it holds; to train further start a new run from it (model={plan.resume_path})")
        # a self-launched DDP run is refused by the plan: its workers build the standard Trainer, not this class
        super().__init__(plan.args, callbacks=plan.callbacks, model=plan.start, resume=plan.checkpoint)


