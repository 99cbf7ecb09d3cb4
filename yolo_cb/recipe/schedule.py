"""The learning-rate schedule: a part of the training recipe the loop calls by name. It owns every parameter group's LR
(and SGD momentum during warmup).

`lr_scheduler=` picks the schedule after warmup (see cfg/default.yaml and docs/callbacks.md):

    linear | cosine | step | multistep | exponential | polynomial | constant   built-ins: a multiplier of lr0 per epoch
    module:function                                                         your function epoch -> multiplier of lr0
    module:Class                                                            your callback class sets the LR instead
    ReduceLROnPlateau, StepLR, ... (any torch.optim.lr_scheduler class)     wrapped, stepped once per epoch
    none                                                                    no schedule: only your callbacks write the LR

Parameters come as a mapping, `{step: {step_size: 10, gamma: 0.5}}` (YAML, or the same text on the CLI), and are checked
strictly. Every schedule takes `warmup_by` (batch | epoch) and the built-ins `cooldown_epochs` (the last N epochs stay at
the final LR). With the defaults the LRs are those of the trainer before the schedule was its own part, bit for bit.

The loop calls `start` once the optimizer (and a resumed state) exists, `warmup_batch` before each batch, `next_epoch`
after each epoch's validation (before the checkpoint, which so holds the next epoch's schedule).

A change of LR by a callback sticks: `trainer.set_lr(lr)` (the documented control), or Ultralytics' habit of writing
`group["lr"]` directly — before each of its own writes (and before its state is saved) the schedule compares every
group's LR with the one it wrote last. The group's schedule is rescaled by the written LR over the one the schedule
had set; a write during the per-batch warmup ends that group's warmup ramp (the written LR is used for each following
batch, and the schedule continues from it). The schedule keeps the optimizer, not its group dicts: a callback's
`optimizer.load_state_dict(...)` replaces them, and the schedule goes on writing the optimizer's current groups.

The late groups of layers that were frozen (unfreeze_warmup, yolo_cb/recipe/optim.py) are not the schedule's: before
each optimizer step they take the LR of the group they follow, times their own warmup ramp.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

from yolo_cb.recipe.optim import FOLLOWS
from yolo_cb.settings.lr_settings import parsed
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


class Warmup(NamedTuple):
    """A run's warmup, decided once (`Warmup.of`, when the optimizer is planned): over its first `iters` batches the LR
    schedule ramps each group's LR (biases from `bias_lr`, the others from 0) and SGD's momentum (from `momentum_start`
    to `momentum`), and the step ramps gradient accumulation from 1 batch up to the nominal batch (`accumulate`)."""

    iters: int = -1  # batches of warmup over the run (-1: none): warmup_epochs of batches, at least 100
    bias_lr: float = 0.0  # where group 0 (the biases) starts (every optimizer's, as Ultralytics; BENCHMARKS.md)
    momentum_start: float = 0.0  # warmup_momentum: where the momentum ramp starts
    momentum: float = 0.0  # the optimizer's momentum once warmed up

    @classmethod
    def of(cls, args: Any, num_batches: int, momentum: float) -> Warmup:
        iters = max(round(args.warmup_epochs * num_batches), 100) if args.warmup_epochs > 0 else -1
        return cls(iters, float(args.warmup_bias_lr), float(args.warmup_momentum), float(momentum))

    def accumulate(self, ni: int, nbs: int, global_batch: int) -> int | None:
        """Batches per optimizer step at batch `ni` of the run: from 1 up to nbs / global_batch during warmup; None after."""
        if ni > self.iters:
            return None
        return max(1, int(np.interp(ni, [0, self.iters], [1, nbs / global_batch]).round()))


class LRSchedule:
    """Sets each group's LR: per-batch (or per-epoch) warmup, then the chosen schedule once per epoch. See the module docstring."""

    @staticmethod
    def wanted(args: Any) -> bool:
        """Whether `args.lr_scheduler` is a schedule this class runs (none and module:Class are not)."""
        return parsed(args).kind not in ("none", "class")

    def __init__(self):
        self.base: list[float] | None = None  # per group: lr0, rescaled by callbacks' changes
        self.target: list[float] | None = None  # per group: the scheduled LR of the current epoch (warmup ramps towards it)
        self.written: list[float] | None = None  # per group: the LR the group has (set by the schedule or adopted)
        self.torch_state: dict | None = None
        self.scheduler = None
        self.factor: Callable[[float], float] | None = None
        self.held: set[int] = set()  # groups whose warmup ramp a callback's write ended: their LR is that write's
        self.optimizer: torch.optim.Optimizer | None = None  # its groups are looked up at each write, never kept
        self.epoch, self.ni = 0, -1  # where the run is: the epoch the LR is set for, the last batch warmed up
        self.warmup = Warmup()  # the run's warmup (start)

    # --- setup ----------------------------------------------------------------------------
    def start(self, optimizer: torch.optim.Optimizer, args: Any, epochs: int, start_epoch: int, warmup: Warmup) -> None:
        """Own `optimizer`'s scheduled groups (after a resume restored it) and set `start_epoch`'s LR."""
        kind, self.name, params, target = parsed(args)  # args.lr_scheduler as the settings parsed it (declarations folded in)
        self.kind, self.args, self.warmup = kind, args, warmup
        self.warmup_by = params.pop("warmup_by", "batch")
        self.cooldown = int(params.pop("cooldown_epochs", 0))
        if kind == "builtin" and args.cos_lr and self.name == "linear":
            self.name = "cosine"  # cos_lr=True: Ultralytics' switch for the cosine schedule
        self.optimizer = optimizer
        if self.base is None:
            self.base = [group["initial_lr"] for group in self.groups()]
        span = max(epochs - self.cooldown, 1)
        if kind == "builtin":
            raw = builtin_factor(self.name, params, span, args.lrf)
            self.factor = raw if not self.cooldown else (lambda x: raw(min(x, span)))
        elif kind == "function":
            self.factor = target if not self.cooldown else (lambda x: target(min(x, span)))
        elif kind == "torch":
            self._start_torch(optimizer, target, params)
        self.epoch = start_epoch
        self._set_epoch(start_epoch)

    @property
    def started(self) -> bool:
        return self.optimizer is not None

    def groups(self) -> list[dict]:
        """The optimizer's groups the schedule owns, as it holds them now (every group but the late ones, which follow)."""
        return [group for group in self.optimizer.param_groups if FOLLOWS not in group]

    def _start_torch(self, optimizer, scheduler_class, params: dict) -> None:
        self.monitor = params.pop("monitor", None)
        for group, lr in zip(self.groups(), self.base, strict=True):
            group["lr"] = lr
        self.scheduler = scheduler_class(optimizer, **params)
        if self.torch_state is not None:
            self.scheduler.load_state_dict(self.torch_state)
        if self.target is None:
            self.target = [group["lr"] for group in self.groups()]

    # --- changes by callbacks -------------------------------------------------------------------
    def set_lr(self, lr: float, group: int | None = None) -> None:
        """The control: from now on group `group` (every scheduled group when None) has LR `lr`, and its schedule
        continues from it."""
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr >= 0 or not math.isfinite(lr):
            raise ValueError(f"set_lr({lr!r}): expected a finite number >= 0")
        if not self.started:
            raise RuntimeError("set_lr(): the LR schedule starts once the optimizer exists (from on_pretrain_routine_end on)")
        groups = self.groups()
        if group is not None and not (isinstance(group, int) and 0 <= group < len(groups)):
            raise ValueError(f"set_lr(group={group!r}): expected a scheduled group from 0 to {len(groups) - 1}")
        for i in range(len(groups)) if group is None else (group,):
            groups[i]["lr"] = float(lr)
        self._notice()

    def _notice(self) -> None:
        """Adopt every group's LR that someone else wrote since the schedule's last write (called before each write of
        the schedule and before its state is read, so nothing written in between is lost)."""
        if self.written is None:
            return
        for i, group in enumerate(self.groups()):
            if group["lr"] != self.written[i]:
                self._adopt(i, group["lr"])

    def _adopt(self, i: int, now: float) -> None:
        """Group i's LR was set to `now` by a callback: it sticks (the group's schedule is rescaled by it)."""
        mine = self.written[i]
        warming = self.warmup_by == "batch" and 0 <= self.ni <= self.warmup.iters
        if self.kind == "torch":
            self.target[i] = now
        elif mine and not warming:
            self.base[i] *= now / mine
        else:  # a ramp value is no measure of the schedule
            factor = self.factor(self.epoch) if self.factor else 1.0
            self.base[i] = now / factor if factor else now
        if warming:
            self.held.add(i)
        self.written[i] = now
        LOGGER.info(f"lr schedule: lr/pg{i} was set to {now:.6g} by a callback (the schedule had {mine:.6g}); "
                    + ("it ends this group's warmup ramp: each next batch uses it, and " if warming else "")
                    + "the schedule continues from it")

    # --- the schedule ---------------------------------------------------------------------
    def _scheduled(self, i: int, epoch: int) -> float:
        if self.kind == "torch":
            return self.target[i]
        return self.base[i] * self.factor(epoch)

    def _write(self, values: list[float], momenta: list[float] | None = None) -> None:
        for i, (group, value) in enumerate(zip(self.groups(), values, strict=True)):
            group["lr"] = value
            if momenta is not None and "momentum" in group:
                group["momentum"] = momenta[i]
        self.written = list(values)

    def _set_epoch(self, epoch: int) -> None:
        """The LR of every group for `epoch` (warmup by epoch included)."""
        values = [self._scheduled(i, epoch) for i in range(len(self.base))]
        warmup, momenta = float(self.args.warmup_epochs), None
        if self.warmup_by == "epoch" and warmup > 0 and epoch < math.ceil(warmup):
            fraction = (epoch + 1) / (math.ceil(warmup) + 1)
            starts = [self.warmup.bias_lr if i == 0 else 0.0 for i in range(len(values))]
            values = [s + fraction * (v - s) for s, v in zip(starts, values, strict=True)]
            momenta = [self.warmup.momentum_start + fraction * (self.warmup.momentum - self.warmup.momentum_start)] * len(values)
        elif self.warmup_by == "epoch" and warmup > 0 and epoch == math.ceil(warmup):
            momenta = [self.warmup.momentum] * len(values)
        self._write(values, momenta)

    def warmup_batch(self, epoch: int, ni: int) -> None:
        """Per-batch warmup at batch `ni` of the run (of `epoch`): LR from the warmup's bias_lr (biases) / 0 (others) to
        the epoch's scheduled LR; momentum too."""
        self._notice()  # before ni moves on: a write during the last batch's warmup ends that ramp
        self.ni = ni
        if self.warmup_by != "batch" or ni > self.warmup.iters:
            return
        xi, values = [0, self.warmup.iters], []
        for j in range(len(self.base)):
            start = self.warmup.bias_lr if j == 0 else 0.0  # group 0 holds the biases
            ramp = float(np.interp(ni, xi, [start, self._scheduled(j, epoch)]))
            values.append(self._scheduled(j, epoch) if j in self.held else ramp)
        momentum = float(np.interp(ni, xi, [self.warmup.momentum_start, self.warmup.momentum]))
        self._write(values, [momentum] * len(values))

    def next_epoch(self, epoch: int, metrics: dict, validated: bool) -> None:
        """After epoch `epoch` (validated or not): step to the next epoch's LR."""
        self._notice()
        if self.kind == "torch":
            for group, lr in zip(self.groups(), self.target, strict=True):
                group["lr"] = lr  # the scheduler steps from its own value, not from a warmup value
            if self.monitor is None:
                self.scheduler.step()
            elif validated:  # only an epoch that validated
                self.scheduler.step(self._monitored(metrics))
            self.target = [group["lr"] for group in self.groups()]
            self.torch_state = self.scheduler.state_dict()
        self.epoch = epoch + 1
        self._set_epoch(epoch + 1)

    def _monitored(self, metrics: dict) -> float:
        if self.monitor not in metrics:
            raise KeyError(f"lr_scheduler ReduceLROnPlateau monitors '{self.monitor}', which the metrics do not have; "
                           f"metric keys: {', '.join(sorted(metrics))}")
        return float(metrics[self.monitor])

    # --- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        if self.started:
            self._notice()  # a write after the last step (in on_fit_epoch_end) is part of the saved schedule
        return {"base": self.base, "target": self.target, "torch": self.torch_state, "held": sorted(self.held)}

    def load_state_dict(self, state: dict) -> None:
        self.base = list(state["base"]) if state.get("base") is not None else None
        self.target = list(state["target"]) if state.get("target") is not None else None
        self.torch_state = state.get("torch")
        self.held = set(state.get("held") or ())
