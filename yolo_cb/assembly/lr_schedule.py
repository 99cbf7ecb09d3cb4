"""The learning-rate schedule: a default callback that owns every parameter group's LR (and SGD momentum during warmup).

`lr_scheduler=` picks the schedule after warmup (see cfg/default.yaml and docs/callbacks.md):

    linear | cosine | step | multistep | exponential | polynomial | constant   built-ins: a multiplier of lr0 per epoch
    module:function                                                         your function epoch -> multiplier of lr0
    module:Class                                                            your callback class replaces this one
    ReduceLROnPlateau, StepLR, ... (any torch.optim.lr_scheduler class)     wrapped, stepped once per epoch
    none                                                                    no schedule: only your callbacks write the LR

Parameters come as a mapping, `{step: {step_size: 10, gamma: 0.5}}` (YAML, or the same text on the CLI), and are checked
strictly. Every schedule takes `warmup_by` (batch | epoch) and the built-ins `cooldown_epochs` (the last N epochs stay at
the final LR). With the defaults the LRs are those of the trainer before this callback existed, bit for bit.

A write to `group["lr"]` by any other callback sticks: before each of its own writes the schedule compares the LR with
what it wrote last, and a difference rescales that group's schedule by the same factor (logged once per change). A write
during the per-batch warmup ends that group's warmup ramp: the written LR is used for each following batch, and the
schedule continues from it (this epoch's scheduled LR becomes the written one).

The late groups of layers that were frozen (unfreeze_warmup, yolo_cb/recipe/optim.py) are not this callback's: before
each optimizer step they take the LR of the group they follow, times their own warmup ramp.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from yolo_cb.callbacks.lr_settings import parsed, resolve
from yolo_cb.callbacks.registry import register_callback
from yolo_cb.recipe.optim import scheduled_groups
from yolo_cb.utils.log import LOGGER


def builtin_factor(name: str, params: dict, epochs: int, lrf: float) -> Callable[[float], float]:
    """Epoch -> multiplier of lr0 for a built-in schedule (linear and cosine are the trainer's historical formulas)."""
    if name == "linear":
        return lambda x: max(1 - x / epochs, 0) * (1.0 - lrf) + lrf
    if name == "cosine":
        return lambda x: ((1 - math.cos(x * math.pi / epochs)) / 2) * (lrf - 1) + 1
    if name == "constant":
        return lambda x: 1.0
    if name == "step":
        size, gamma = int(params["step_size"]), float(params.get("gamma", 0.1))
        return lambda x: gamma ** (int(x) // size)
    if name == "multistep":
        milestones, gamma = [int(m) for m in params["milestones"]], float(params.get("gamma", 0.1))
        return lambda x: gamma ** bisect.bisect_right(milestones, int(x))
    if name == "exponential":
        gamma = float(params["gamma"]) if "gamma" in params else lrf ** (1 / epochs)
        return lambda x: gamma ** x
    if name == "polynomial":
        power = float(params.get("power", 2.0))
        return lambda x: max(1 - x / epochs, 0) ** power * (1.0 - lrf) + lrf
    raise KeyError(name)


@register_callback("lr_schedule")
class LRSchedule:
    """Sets each group's LR: per-batch (or per-epoch) warmup, then the chosen schedule once per epoch. See the module docstring."""

    def __init__(self, lr_scheduler: Any = None):
        self.setting = lr_scheduler  # None: read trainer.args.lr_scheduler at the start of training
        self.base: list[float] | None = None  # per group: lr0, rescaled by other callbacks' writes
        self.target: list[float] | None = None  # per group: the scheduled LR of the current epoch (warmup ramps towards it)
        self.written: list[float] | None = None  # per group: the LR this callback wrote last
        self.torch_state: dict | None = None
        self.scheduler = None
        self.factor: Callable[[float], float] | None = None
        self.held: set[int] = set()  # groups whose warmup ramp a write by another callback ended: their LR is that write's

    # --- setup ----------------------------------------------------------------------------
    def on_pretrain_routine_end(self, trainer):
        args = trainer.args
        kind, self.name, params, target = resolve(self.setting, args) if self.setting is not None else parsed(args)
        self.kind = kind
        self.warmup_by = params.pop("warmup_by", "batch")
        self.cooldown = int(params.pop("cooldown_epochs", 0))
        if kind == "builtin" and args.cos_lr and self.name == "linear":
            self.name = "cosine"  # cos_lr=True: Ultralytics' switch for the cosine schedule
        optimizer = trainer.optimizer
        if self.base is None:
            self.base = [group["initial_lr"] for group in scheduled_groups(optimizer)]
        span = max(trainer.epochs - self.cooldown, 1)
        if kind == "builtin":
            raw = builtin_factor(self.name, params, span, args.lrf)
            self.factor = raw if not self.cooldown else (lambda x: raw(min(x, span)))
        elif kind == "function":
            self.factor = target if not self.cooldown else (lambda x: target(min(x, span)))
        elif kind == "torch":
            self.monitor = params.pop("monitor", None)
            for group, lr in zip(scheduled_groups(optimizer), self.base, strict=True):
                group["lr"] = lr
            self.scheduler = target(optimizer, **params)
            if self.torch_state is not None:
                self.scheduler.load_state_dict(self.torch_state)
            if self.target is None:
                self.target = [group["lr"] for group in scheduled_groups(optimizer)]
        trainer.lr_schedule = self
        self._set_epoch(trainer, trainer.start_epoch, adopt=False)

    # --- the schedule ---------------------------------------------------------------------
    def _adopt_foreign_writes(self, trainer) -> None:
        """An LR another callback wrote since our last write rescales that group's schedule: it sticks. Written over a
        per-batch warmup value, it also ends the group's ramp (its LR stays the written one)."""
        if self.written is None:
            return
        warming = self.warmup_by == "batch" and trainer.batch_i + trainer.num_batches * trainer.epoch <= trainer.warmup_iters
        for i, (group, mine) in enumerate(zip(scheduled_groups(trainer.optimizer), self.written, strict=True)):
            now = group["lr"]
            if now == mine:
                continue
            ratio = now / mine if mine and not warming else None  # a ramp value is no measure of the schedule
            if self.kind == "torch":
                self.target[i] = now
            elif ratio is not None:
                self.base[i] *= ratio
            else:
                factor = self.factor(trainer.epoch) if self.factor else 1.0
                self.base[i] = now / factor if factor else now
            if warming:
                self.held.add(i)
            LOGGER.info(f"lr_schedule: lr/pg{i} was set to {now:.6g} by another callback (the schedule had {mine:.6g}); "
                        + ("it ends this group's warmup ramp: each next batch uses it, and " if warming else "")
                        + "the schedule continues from it")

    def _scheduled(self, i: int, epoch: int) -> float:
        if self.kind == "torch":
            return self.target[i]
        return self.base[i] * self.factor(epoch)

    def _write(self, trainer, values: list[float]) -> None:
        for group, value in zip(scheduled_groups(trainer.optimizer), values, strict=True):
            group["lr"] = value
        self.written = list(values)

    def _set_epoch(self, trainer, epoch: int, adopt: bool = True) -> None:
        """The LR of every group for `epoch` (warmup by epoch included)."""
        if adopt:
            self._adopt_foreign_writes(trainer)
        groups = scheduled_groups(trainer.optimizer)
        values = [self._scheduled(i, epoch) for i in range(len(groups))]
        warmup = float(trainer.args.warmup_epochs)
        if self.warmup_by == "epoch" and warmup > 0 and epoch < math.ceil(warmup):
            fraction = (epoch + 1) / (math.ceil(warmup) + 1)
            starts = [trainer.warmup_bias_lr if i == 0 else 0.0 for i in range(len(groups))]
            values = [s + fraction * (v - s) for s, v in zip(starts, values, strict=True)]
            for group in groups:
                if "momentum" in group:
                    group["momentum"] = trainer.args.warmup_momentum + fraction * (trainer.momentum - trainer.args.warmup_momentum)
        elif self.warmup_by == "epoch" and warmup > 0 and epoch == math.ceil(warmup):
            for group in groups:
                if "momentum" in group:
                    group["momentum"] = trainer.momentum
        self._write(trainer, values)

    def on_train_batch_start(self, trainer):
        """Per-batch warmup: LR from warmup_bias_lr (biases) / 0 (others) to the epoch's scheduled LR; momentum too."""
        if self.warmup_by != "batch":
            return
        ni = trainer.batch_i + trainer.num_batches * trainer.epoch
        if ni > trainer.warmup_iters:
            return
        self._adopt_foreign_writes(trainer)
        xi = [0, trainer.warmup_iters]
        values = []
        for j, group in enumerate(scheduled_groups(trainer.optimizer)):
            start = trainer.warmup_bias_lr if j == 0 else 0.0  # group 0 holds the biases
            ramp = float(np.interp(ni, xi, [start, self._scheduled(j, trainer.epoch)]))
            values.append(self._scheduled(j, trainer.epoch) if j in self.held else ramp)
            if "momentum" in group:
                group["momentum"] = float(np.interp(ni, xi, [trainer.args.warmup_momentum, trainer.momentum]))
        self._write(trainer, values)

    def on_model_save(self, trainer):
        """After each epoch (before the checkpoint is written, so it holds the next epoch's schedule): step to the next epoch."""
        if self.kind == "torch":
            self._adopt_foreign_writes(trainer)
            for group, lr in zip(scheduled_groups(trainer.optimizer), self.target, strict=True):
                group["lr"] = lr  # the scheduler steps from its own value, not from a warmup value
            if self.monitor is not None:
                if getattr(trainer, "metrics_epoch", None) == trainer.epoch:  # only an epoch that validated
                    self.scheduler.step(self._monitored(trainer))
            else:
                self.scheduler.step()
            self.target = [group["lr"] for group in scheduled_groups(trainer.optimizer)]
            self.torch_state = self.scheduler.state_dict()
            self.written = None  # the scheduler wrote; _set_epoch writes the same values again
        self._set_epoch(trainer, trainer.epoch + 1)

    def _monitored(self, trainer) -> float:
        if self.monitor not in trainer.metrics:
            raise KeyError(f"lr_scheduler ReduceLROnPlateau monitors '{self.monitor}', which the metrics do not have; "
                           f"metric keys: {', '.join(sorted(trainer.metrics))}")
        return float(trainer.metrics[self.monitor])

    # --- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"base": self.base, "target": self.target, "torch": self.torch_state, "held": sorted(self.held)}

    def load_state_dict(self, state: dict) -> None:
        self.base = list(state["base"]) if state.get("base") is not None else None
        self.target = list(state["target"]) if state.get("target") is not None else None
        self.torch_state = state.get("torch")
        self.held = set(state.get("held") or ())


def schedule_callback(args: Any) -> Any:
    """The default LR callback for `args.lr_scheduler`: LRSchedule, your class (module:Class) instead, or None for `none`."""
    kind, _, params, target = parsed(args)  # lr_scheduler= as parsed when the settings were resolved
    if kind == "none":
        return None
    if kind == "class":
        return target(**params)
    return LRSchedule()
