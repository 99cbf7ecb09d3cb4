"""One plan per training run: `plan_run` decides, once and in this module, everything a run is before it starts.

The settings (resolved once, completed and sealed here: `Config.settle`), the model it starts from, the checkpoint a resume continues, the
number of processes, and the callbacks — for `YOLO.train`, the CLI (which hands its resolved settings in), `resume=`
paths, `resume=auto`, `DetectionTrainer(overrides=...)`, tune trials (each a `YOLO.train`) and DDP workers
(`plan_worker`, from the launcher's payload). The trainer is made from the plan (`RunPlan.trainer`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from yolo_cb.assembly.assemble import build_trainer_callbacks
from yolo_cb.assembly.catalog import registered
from yolo_cb.callbacks.dispatch import Callbacks
from yolo_cb.checkpoints.checkpoint import Checkpoint, load_checkpoint
from yolo_cb.checkpoints.weights import resolve_weights
from yolo_cb.errors import ConfigError
from yolo_cb.nn.build import load_model_cfg
from yolo_cb.settings.config import Config, callback_declarations, get_config
from yolo_cb.training import resume
from yolo_cb.training.resume import FinishedRun
from yolo_cb.training.trainer import Trainer
from yolo_cb.training.trainer_hooks import refuse_unread_hooks
from yolo_cb.utils.log import setup_logging


@dataclass(frozen=True)
class RunPlan:
    """A training run, decided. `finished`: a resume of a run that ended (nothing to train: `resume.finished_run`)."""

    args: Config  # the settings, resolved once and sealed (nothing writes them after the plan)
    start: Any  # what the model starts from: a model YAML, weights, a module load()ed in memory; None on resume
    checkpoint: Checkpoint | None  # the checkpoint a resume continues (its run folder is verified by the trainer)
    resume_path: Path | None  # that checkpoint's file
    finished: FinishedRun | None  # resume= of a run that ended: its metrics and weights, nothing to train
    world_size: int  # processes to train in (> 1: this process launches DDP workers, unless torchrun did)
    callbacks: Callbacks | None  # this process's callbacks, placed (None for a finished run, or a DDP launcher)
    trainer_class: type = Trainer  # the Trainer (sub)class that trains it

    @property
    def launches_workers(self) -> bool:
        return self.finished is None and self.callbacks is None

    def trainer(self) -> Any:
        """The trainer of this plan."""
        return self.trainer_class(self.args, callbacks=self.callbacks, model=self.start, resume=self.checkpoint)

    def mode_overrides(self) -> dict[str, Any]:
        """The settings val() and predict() after this training inherit (Ultralytics' model.overrides)."""
        return {k: getattr(self.args, k) for k in ("data", "imgsz", "datasets_dir", "single_cls")}


def checked_trainer_class(trainer_class: Any) -> type:
    """trainer= (None: the Trainer): a Trainer subclass that overrides no Ultralytics method the loop never calls."""
    trainer_class = trainer_class or Trainer
    if not (isinstance(trainer_class, type) and issubclass(trainer_class, Trainer)):
        raise ConfigError(f"trainer={trainer_class!r} is not a Trainer class; pass a subclass of yolo_cb.training.trainer.Trainer "
                          f"(the class itself, not an instance)")
    refuse_unread_hooks(trainer_class, Trainer)
    return trainer_class


def check_workers_can_start(start: Any, trainer_class: type) -> None:
    """A self-launched DDP run's workers start from files and build the standard Trainer: refuse anything else, before any
    work."""
    if isinstance(start, nn.Module):
        raise ConfigError("a self-launched DDP run (nproc/device list > 1) cannot start from weights load()ed in memory: its "
                          "workers read files. model.save('start.pt'), then YOLO('start.pt').train(...)")
    if trainer_class is not Trainer:
        raise ConfigError(f"trainer={trainer_class.__name__} cannot be used with a self-launched DDP run (nproc/device list "
                          f"> 1): its workers build the standard Trainer. Run under torchrun with your own script instead")


def world_size_for(args: Config) -> int:
    """Processes to start: the GPU list's length for device=0,1,...; else nproc."""
    devices = [d for d in str(args.device or "").split(",") if d.strip()]
    return len(devices) if len(devices) > 1 else int(args.nproc)


def plan_run(overrides: dict[str, Any], model: Any = None, model_named: bool = False, user: Callbacks | None = None,
             resolved: Config | None = None, loaded: Any = None, trainer_class: Any = None) -> RunPlan:
    """The plan of train(**overrides) of `model` (`model_named`: the user named it, so resume=True may mean it);
    `user`: the facade's callbacks; `resolved`: the CLI's settings of exactly these overrides (not resolved again);
    `loaded`: a module load()ed in memory, which a fresh run of `model` starts from; `trainer_class`: train(trainer=...)."""
    trainer_class = checked_trainer_class(trainer_class)
    overrides, resuming, cfg_values = resume.plan(dict(overrides), model=model if model_named else None)
    if resuming is not None and resuming.finished is not None:
        return RunPlan(resuming.args, None, resuming.ckpt, resuming.path, resuming.finished, 1, None, trainer_class)
    if resuming is not None:
        args, start = resuming.args.settle(), None
    else:
        args, start = fresh_train_args(overrides, model, resolved, loaded, cfg_values)
    setup_logging(args.verbose)
    world = world_size_for(args)
    launcher = world > 1 and "LOCAL_RANK" not in os.environ  # its workers build their callbacks (plan_worker)
    if launcher:
        check_workers_can_start(start, trainer_class)
        registered(callback_declarations(args))  # a registered name in callbacks= that is wrong: one line, before any work
    return RunPlan(args, start, resuming.ckpt if resuming else None, resuming.path if resuming else None, None, world,
                   None if launcher else build_trainer_callbacks(args, user), trainer_class)


def plan_worker(settings: dict[str, Any], user: Callbacks, model: Any, resume_path: str | None) -> RunPlan:
    """A DDP worker's plan, from the launcher's payload: the launcher's settings (resolved in this new process once),
    its callbacks built here, the checkpoint read here."""
    args = get_config(settings).settle(model)
    setup_logging(args.verbose)
    ckpt = load_checkpoint(resume_path) if resume_path else None
    return RunPlan(args, model, ckpt, Path(resume_path) if resume_path else None, None, 1, build_trainer_callbacks(args, user))


def fresh_train_args(overrides: dict[str, Any], source: Any, resolved: Config | None = None, loaded: Any = None,
                     cfg_values: dict[str, Any] | None = None) -> tuple[Config, Any]:
    """(settings, model source) of a new run, settled: args.yaml records the model; official weights named by name are
    fetched here, once, before DDP workers (the trainer builds from these files); a model= that is no model YAML fails
    here, before a run folder is made. `resolved`: these overrides' settings as the CLI resolved them (their model is
    `source` or none), used as they are; `loaded`: a module load()ed in memory, which the run starts from instead of
    `source`; `cfg_values`: the cfg= file's settings when resume=auto already read them."""
    args = resolved if resolved is not None else get_config({**overrides, **({"model": source} if source else {}), "mode": "train"},
                                                            cfg_values=cfg_values)
    weights = resolve_weights(source, args.weights_dir)
    if weights is not source:
        source = args.model = str(weights)
    args.pretrained = resolve_weights(args.pretrained, args.weights_dir)
    if isinstance(source, (str, Path)) and not str(source).endswith((".pt", ".pth")):
        load_model_cfg(source)
    start = loaded if loaded is not None else source
    return args.settle(start), start
