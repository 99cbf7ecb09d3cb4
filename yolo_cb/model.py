"""The YOLO facade: one object to train, validate, predict and export, and to register callbacks on.

    model = YOLO("yolox-nano.yaml")            # or "runs/detect/train/weights/best.pt" / "best.onnx"
    model.add_callback("on_fit_epoch_end", fn)  # or model.callbacks["on_fit_epoch_end"].append(fn)
    metrics = model.train(data="shapes.yaml", epochs=10, imgsz=320)   # metrics.box.map == metrics["metrics/mAP50-95(B)"]
    results = model("image.jpg")               # = model.predict("image.jpg"): saves nothing unless save=True

Callbacks added here reach every engine object the facade creates: the trainer (and its
in-training validator), val, predict and export.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from yolo_cb import paths
from yolo_cb.callbacks.engine import Callbacks
from yolo_cb.config import ConfigError, get_config, settings_to_resume
from yolo_cb.engine.checkpoint_settings import RESUME_MUTABLE
from yolo_cb.utils.log import setup_logging

if TYPE_CHECKING:
    from yolo_cb.engine.val_metrics import DetectionMetrics


class _DefaultModel(str):
    """The model YOLO() trains when none is named; a resume tells it apart from a model the user named."""


DEFAULT_MODEL = _DefaultModel(paths.DEFAULT_MODEL)


class YOLO:
    """Train / val / predict / export a YOLOX detector; `add_callback` and friends register user callbacks."""

    def __init__(self, model: str | Path | None = DEFAULT_MODEL):
        self.source = str(model) if model is not None else None
        self.model_named = model is not None and not isinstance(model, _DefaultModel)  # resume refuses a named model not its own
        self.callbacks = Callbacks()
        self.trainer = None
        self.metrics: DetectionMetrics | None = None
        self._module: tuple[str | None, Any] | None = None  # (source, the loaded model) behind `model.model`
        self.overrides: dict[str, Any] = {}
        from yolo_cb.weights import is_weights_name

        if self.source and self.source.endswith((".pt", ".pth")) and not is_weights_name(self.source):  # a name: fetched on first use
            self._read_overrides()

    def _read_overrides(self) -> None:
        from yolo_cb.engine.checkpoint import load_checkpoint

        self.overrides = {k: v for k, v in (load_checkpoint(self.source).get("train_args") or {}).items()
                          if k in ("data", "imgsz")}  # never a place to write (datasets_dir): the user's, else the default

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
        from yolo_cb.callbacks.assemble import apply_specs

        callbacks = self.callbacks.copy()
        apply_specs(callbacks, args.callbacks)
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
            from yolo_cb.nn import build_model

            return build_model(source, nc=80, verbose=False)
        if source.endswith((".pt", ".pth")):
            from yolo_cb.engine.checkpoint import model_from_checkpoint
            from yolo_cb.weights import resolve_weights

            return model_from_checkpoint(resolve_weights(source, get_config({}).weights_dir))
        from yolo_cb.engine.backend import load_backend

        return load_backend(source)

    @property
    def names(self) -> dict[int, str]:
        """Class id -> name of the model (after train(): of its dataset)."""
        if self.trainer is not None and self.trainer.data:
            return {int(k): str(v) for k, v in self.trainer.data["names"].items()}
        return {int(k): str(v) for k, v in self.model.names.items()}

    def info(self, verbose: bool = True, imgsz: int = 640) -> tuple[int, int, int, float]:
        """(layers, parameters, trainable parameters, GFLOPs at imgsz), as Ultralytics' model.info(); verbose logs one line."""
        from torch import nn

        from yolo_cb.nn.summary import log_summary, model_info

        module = self.model
        if not isinstance(module, nn.Module):
            raise TypeError(f"info() needs a PyTorch model; {self.source} is an exported file ({type(module).__name__})")
        info = log_summary(module, imgsz) if verbose else model_info(module, imgsz)
        gradients = sum(p.numel() for p in module.parameters() if p.requires_grad)
        return info["layers"], info["params"], gradients, info["gflops"]

    # --- modes ----------------------------------------------------------------------------
    def train(self, **kwargs) -> DetectionMetrics:
        """Train (or resume, with resume=True / resume=path); returns the final metrics (a dict with Ultralytics'
        attributes). trainer= takes a subclass of yolo_cb.engine.trainer.Trainer to train with."""
        from yolo_cb.callbacks.assemble import build_trainer_callbacks
        from yolo_cb.engine.trainer import Trainer

        kwargs = dict(kwargs)
        trainer_class = kwargs.pop("trainer", None) or Trainer
        if not (isinstance(trainer_class, type) and issubclass(trainer_class, Trainer)):
            raise ConfigError(f"trainer={trainer_class!r} is not a Trainer class; pass a subclass of yolo_cb.engine.trainer.Trainer "
                              f"(the class itself, not an instance)")
        named = kwargs.pop("model", None)  # train(model=...) names the model as YOLO(...) does
        if named is not None and self.model_named and str(named) != self.source:
            raise ConfigError(f"YOLO('{self.source}') already names the model, and train(model='{named}') names another: "
                              f"give one (YOLO('{named}').train(...) or drop model= from train())")
        source, model_named = (str(named), True) if named is not None else (self.source, self.model_named)
        resume_ckpt, resume_path = None, None
        if str(kwargs.get("resume")).lower() == "auto":
            kwargs = resolve_auto_resume(kwargs, model=source if model_named else None)
        elif int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) and kwargs.get("resume") in (None, False, "False", "false"):
            from yolo_cb.utils.dist import rank
            from yolo_cb.utils.log import LOGGER

            if rank() in (-1, 0):
                LOGGER.warning(f"WARNING torchrun restarted the workers (restart {os.environ['TORCHELASTIC_RESTART_COUNT']}) and resume= "
                               f"is not set: training starts over. Pass resume=auto (and a fixed name=) so that a restart continues")
        if kwargs.get("resume") not in (None, False, "False", "false"):
            args, resume_ckpt, resume_path = prepare_resume(kwargs, model=source if model_named else None)
            from yolo_cb.engine.checkpoint import is_finished

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

            if trainer_class is not Trainer:
                raise ConfigError(f"trainer={trainer_class.__name__} cannot be used with a self-launched DDP run (nproc/device list "
                                  f"> 1): its workers build the standard Trainer. Run under torchrun with your own script instead")
            values = launch_ddp(args, self.callbacks, model=source if not resume_ckpt else None, resume=str(resume_path) if resume_path else None)
            self.source = str(values.pop("_best_pt", self.source))
            self.overrides = {k: getattr(args, k) for k in ("data", "imgsz", "datasets_dir")}
            from yolo_cb.engine.val_metrics import DetectionMetrics

            self.metrics = DetectionMetrics(values)
            return self.metrics
        trainer = trainer_class(args, callbacks=build_trainer_callbacks(args, self.callbacks), model=source if not resume_ckpt else None)
        if resume_ckpt is not None:
            trainer.resume_ckpt = resume_ckpt  # the trainer verifies the run folder it belongs to (args.resume is its path)
        self.trainer = trainer
        self.metrics = final_metrics(trainer.train(), trainer.validator)
        best = trainer.wdir / "best.pt"
        if best.is_file():
            self.source = str(best.resolve())  # absolute: val()/predict() later work from any working directory
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
        from yolo_cb.engine.checkpoint import ResumeError
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
        from yolo_cb.engine.val_metrics import DetectionMetrics

        self.trainer = None
        self.metrics = DetectionMetrics({k: float(v) for k, v in (ckpt.get("metrics") or {}).items()}, names=ckpt.get("names"))
        self.source = str(weights)
        self.overrides = {k: getattr(args, k) for k in ("data", "imgsz", "datasets_dir")}
        return self.metrics

    def val(self, **kwargs) -> DetectionMetrics:
        from yolo_cb.engine.validator import Validator

        kwargs = self._fetch_named_weights(kwargs)
        args = get_config({**self.overrides, **kwargs, "mode": "val", "model": kwargs.get("model", self.source)})
        self._require_weights("val", args.model)
        setup_logging(args.verbose)
        validator = Validator(args, callbacks=self._engine_callbacks(args))
        self.metrics = validator(model=args.model)
        return self.metrics

    def predict(self, source: Any = None, stream: bool = False, **kwargs):
        """Results for `source`; as in Ultralytics, Python saves annotated images only with save=True (the CLI saves)."""
        return self.run_predict(source, stream, kwargs, save=False)

    def run_predict(self, source: Any, stream: bool, kwargs: dict, save: bool):
        """predict() with `save` as the default of save= (False from Python, True from the CLI)."""
        from yolo_cb.engine.predictor import Predictor

        kwargs = self._fetch_named_weights(kwargs)
        args = get_config({**{k: v for k, v in self.overrides.items() if k == "imgsz"}, **kwargs, "mode": "predict", "model": kwargs.get("model", self.source)},
                          base={"save": save})
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
                              f"yolo-cb {mode} model=runs/detect/train/weights/best.pt")
        if isinstance(model, (str, Path)) and str(model).endswith((".yaml", ".yml")):
            raise FileNotFoundError(f"{mode} needs trained weights (.pt, .onnx or .torchscript), but model is the config '{model}'. "
                                    f"Train first (model.train(...) then model.{mode}(...)), or pass model=path/to/best.pt")

    def __repr__(self) -> str:
        return f"YOLO({self.source!r})"


def final_metrics(values: dict, validator) -> DetectionMetrics:
    """The metrics train() returns: the trainer's final values, with the per-class detail of the validation that produced
    them (none when the last validation is not theirs, e.g. val=False)."""
    from yolo_cb.engine.val_metrics import DetectionMetrics

    last = getattr(validator, "metrics", None)
    if isinstance(last, DetectionMetrics) and all(last.get(k) == values.get(k) for k in ("metrics/mAP50-95(B)", "metrics/mAP50(B)")):
        return DetectionMetrics(values, det=last.det_metrics, speed=last.speed, names=last.names)
    return DetectionMetrics(values, names=getattr(validator, "names", None) or None)


def find_last_checkpoint(project: str | None) -> Path:
    from yolo_cb.utils.files import default_project

    root = Path(project) if project else default_project()
    candidates = sorted(root.glob("*/weights/last.pt"), key=lambda p: p.stat().st_mtime)
    if not candidates:
        raise FileNotFoundError(f"resume=True: no last.pt found under {root}/*/weights/; pass resume=path/to/last.pt")
    return candidates[-1]


def resolve_auto_resume(overrides: dict[str, Any], model: str | None = None) -> dict[str, Any]:
    """resume=auto: the overrides with resume= the last.pt of the run folder project/name when it holds one (a run of the
    same settings: any other is refused by prepare_resume, naming what differs), else resume=False and exist_ok=True,
    so a fresh run starts in exactly that folder and the next start of the same command finds it. Says which in the log."""
    from yolo_cb.engine.checkpoint import is_finished
    from yolo_cb.utils.dist import rank
    from yolo_cb.utils.files import default_project
    from yolo_cb.utils.log import LOGGER

    settings = get_config({**overrides, "resume": False, "mode": "train"})
    folder = (Path(settings.project) if settings.project else default_project(settings)) / (settings.name or "train")
    last = folder / "weights" / "last.pt"
    say = LOGGER.info if rank() in (-1, 0) else (lambda message: None)  # under torchrun: rank 0 speaks
    if not last.is_file():
        say(f"resume=auto: no {last} yet; starting a fresh run in {folder}")
        return {**overrides, "resume": False, "exist_ok": True}
    try:
        _, ckpt, _ = prepare_resume({**overrides, "resume": str(last)}, model=model)
    except ConfigError as error:
        raise type(error)(f"resume=auto: {last} is not a run of these settings, so it is neither continued nor overwritten: {error}. "
                          f"Use another name= for a new run, or the settings it was started with") from None
    if not is_finished(ckpt):
        say(f"resume=auto: continuing the run in {folder} from {last}")
    return {**overrides, "resume": str(last)}


def prepare_resume(overrides: dict[str, Any], model: str | None = None):
    """(args, checkpoint, path) for a resume: the checkpoint's settings, with only RESUME_MUTABLE overrides allowed.

    `model` is a model the user named (None: not named); one other than the checkpoint's is refused, and so is a
    dataset other than the one the checkpoint was trained on. A finished run's checkpoint is returned unchecked:
    nothing will be trained (the caller says so)."""
    from yolo_cb.engine.checkpoint import is_finished, load_checkpoint
    from yolo_cb.engine.checkpoint_settings import resumable_settings

    value = overrides["resume"]
    path = find_last_checkpoint(overrides.get("project")) if value in (True, "True", "true") else Path(str(value)).expanduser()
    ckpt = load_checkpoint(path)
    path = path.resolve()
    given = {k: v for k, v in overrides.items() if k != "resume"}
    finished = is_finished(ckpt)
    saved = resumable_settings(dict(ckpt.get("train_args") or {}), given, path, trains=not finished)  # no code, no place to write
    requested = get_config({**settings_to_resume(saved, given), **given, "mode": "train"})
    requested.resume = str(path)
    if finished:
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
    from yolo_cb.engine.checkpoint import ResumeError

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
    from yolo_cb.engine.checkpoint import check_same_dataset, dataset_fingerprint

    check_same_dataset(ckpt, dataset_fingerprint(check_data(args.data or "shapes.yaml", args.datasets_dir)), path)
