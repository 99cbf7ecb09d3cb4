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
what it wrote last, and a difference rescales that group's schedule by the same factor (logged once per change).
"""

from __future__ import annotations

import bisect
import inspect
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from yolo_cb.callbacks.registry import register_callback
from yolo_cb.errors import ConfigError, short_repr
from yolo_cb.utils.log import LOGGER

BUILTIN = ("linear", "cosine", "step", "multistep", "exponential", "polynomial", "constant")
COMMON = {"warmup_by": ("batch", "epoch"), "cooldown_epochs": int}
PARAMS: dict[str, dict[str, Any]] = {  # schedule -> {parameter: default}; a default of None means required
    "linear": {}, "cosine": {}, "constant": {},
    "step": {"step_size": None, "gamma": 0.1},
    "multistep": {"milestones": None, "gamma": 0.1},
    "exponential": {"gamma": "lrf ** (1 / epochs)"},
    "polynomial": {"power": 2.0},
}
FORMS = ("linear | cosine | step | multistep | exponential | polynomial | constant | none | module:function | module:Class | "
         "a torch.optim.lr_scheduler class name, optionally as a mapping {name: {parameter: value}}")


def _bad(value: Any, reason: str) -> ConfigError:
    return ConfigError(f"invalid value for 'lr_scheduler': {short_repr(value)}: {reason}; expected {FORMS}")


def parse_lr_scheduler(value: Any) -> tuple[str, dict]:
    """'cosine' | {'step': {'step_size': 5}} | the same as YAML text -> (name, parameters). Raises ConfigError."""
    import yaml

    from yolo_cb.utils.yaml_safe import yaml_loads

    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            value = yaml_loads(value)
        except yaml.YAMLError as error:
            raise _bad(value, f"not a YAML mapping ({error})") from None
    if isinstance(value, dict):
        if len(value) != 1:
            raise _bad(value, "a mapping must have exactly one key, the schedule's name")
        (name, params), = value.items()
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise _bad(value, f"the parameters of '{name}' must be a mapping, got {short_repr(params)}")
        return str(name), dict(params)
    if value is None or value is False:
        return "none", {}
    if not isinstance(value, str) or not value.strip():
        raise _bad(value, "not a name")
    return value.strip(), {}


def _torch_class(name: str):
    import torch.optim.lr_scheduler as torch_schedulers

    short = name.rpartition(".")[2]
    cls = getattr(torch_schedulers, short, None)
    if isinstance(cls, type) and short[:1].isupper() and (name == short or name == f"torch.optim.lr_scheduler.{short}"):
        return cls
    return None


def names_code(value: Any) -> bool:
    """Whether an lr_scheduler value names code to import (module:function, module:Class): anything but a built-in
    schedule, none, or a torch scheduler class. Parsed only, never imported; a malformed value counts as code."""
    try:
        name, _ = parse_lr_scheduler(value)
    except ValueError:
        return True
    return not (name == "none" or name in BUILTIN or _torch_class(name) is not None)


def resolve(value: Any, args: Any = None) -> tuple[str, str, dict, Any]:
    """Check the setting fully: (kind, name, parameters, target) with kind builtin | function | class | torch | none."""
    name, params = parse_lr_scheduler(value)
    common = {k: params.pop(k) for k in list(params) if k in COMMON}
    if "warmup_by" in common and common["warmup_by"] not in COMMON["warmup_by"]:
        raise _bad(value, f"warmup_by={common['warmup_by']!r}, expected batch or epoch")
    if "cooldown_epochs" in common and (isinstance(common["cooldown_epochs"], bool) or not isinstance(common["cooldown_epochs"], int)
                                        or common["cooldown_epochs"] < 0):
        raise _bad(value, f"cooldown_epochs={common['cooldown_epochs']!r}, expected an integer >= 0")
    cos_lr = bool(getattr(args, "cos_lr", False))
    if name == "none":
        if params or common:
            raise _bad(value, "none takes no parameters")
        if args is not None and float(getattr(args, "warmup_epochs", 0) or 0) > 0:
            raise _bad(value, f"none leaves the LR to your callbacks, so warmup_epochs={args.warmup_epochs} would be ignored; set warmup_epochs=0")
        kind, target = "none", None
    elif name in BUILTIN:
        allowed = PARAMS[name]
        unknown = sorted(set(params) - set(allowed))
        if unknown:
            raise _bad(value, f"'{name}' has no parameter {', '.join(unknown)} (it takes: {', '.join([*allowed, *COMMON]) or 'none'})")
        missing = [k for k, default in allowed.items() if default is None and k not in params]
        if missing:
            raise _bad(value, f"'{name}' needs {', '.join(missing)}, e.g. {{{name}: {{{missing[0]}: {'[30, 60]' if missing[0] == 'milestones' else 10}}}}}")
        _check_builtin_params(value, name, params)
        kind, target = "builtin", None
    elif _torch_class(name) is not None:
        target = _torch_class(name)
        if "cooldown_epochs" in common:
            raise _bad(value, "cooldown_epochs applies to the built-in schedules only")
        monitor = params.pop("monitor", "fitness") if name.endswith("ReduceLROnPlateau") else None
        signature = inspect.signature(target.__init__)
        accepted = [p for p in signature.parameters if p not in ("self", "optimizer", "last_epoch", "verbose")]
        unknown = sorted(set(params) - set(accepted))
        if unknown:
            raise _bad(value, f"torch's {target.__name__} has no parameter {', '.join(unknown)} (it takes: {', '.join(accepted)}"
                              f"{', monitor' if monitor is not None else ''}; and warmup_by)")
        required = [p.name for p in signature.parameters.values() if p.name in accepted and p.default is inspect.Parameter.empty
                    and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        missing = [p for p in required if p not in params]
        if missing:
            raise _bad(value, f"torch's {target.__name__} needs {', '.join(missing)}")
        if monitor is not None:
            params["monitor"] = monitor
            params.setdefault("mode", "min" if "loss" in str(monitor) else "max")  # fitness and mAP grow, losses shrink
        kind = "torch"
    elif ":" in name:
        from yolo_cb.callbacks.registry import import_object

        try:
            target = import_object(name)
        except ValueError as error:
            raise _bad(value, str(error)) from None
        if isinstance(target, type):
            kind = "class"
            if common:
                raise _bad(value, "a callback class gets its parameters as keyword arguments, not warmup_by/cooldown_epochs")
            params = {**params}
        elif callable(target):
            kind = "function"
            if params:
                raise _bad(value, f"a function takes only warmup_by and cooldown_epochs, not {', '.join(sorted(params))}")
        else:
            raise _bad(value, f"{name} is a {type(target).__name__}, not a function or a class")
    else:
        import torch.optim.lr_scheduler as torch_schedulers

        from yolo_cb.utils.suggest import did_you_mean

        names = [*BUILTIN, "none", *[n for n in dir(torch_schedulers) if _torch_class(n) is not None]]
        raise _bad(value, f"unknown schedule '{name}'.{did_you_mean(name, names)}")
    if cos_lr and not (kind == "builtin" and name in ("linear", "cosine")):
        raise _bad(value, "cos_lr=True asks for the cosine schedule; give lr_scheduler=cosine (or drop cos_lr) instead of both")
    return kind, name, {**params, **common}, target


def _check_builtin_params(value: Any, name: str, params: dict) -> None:
    def number(key, low, high=None, integer=False):
        v = params[key]
        ok = not isinstance(v, bool) and isinstance(v, (int, float)) and (not integer or float(v).is_integer()) and v >= low \
            and (high is None or v <= high)
        if not ok:
            raise _bad(value, f"{key}={v!r}, expected {'an integer' if integer else 'a number'} >= {low}" + (f" and <= {high}" if high else ""))

    if "step_size" in params:
        number("step_size", 1, integer=True)
    if "gamma" in params:
        number("gamma", 0.0, 1.0)
    if "power" in params:
        number("power", 0.0)
    if "milestones" in params:
        m = params["milestones"]
        if not isinstance(m, list) or not m or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in m) or m != sorted(m):
            raise _bad(value, f"milestones={m!r}, expected an increasing list of epochs >= 1, e.g. [30, 60]")


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

    # --- setup ----------------------------------------------------------------------------
    def on_pretrain_routine_end(self, trainer):
        args = trainer.args
        kind, self.name, params, target = resolve(self.setting if self.setting is not None else args.lr_scheduler, args)
        self.kind = kind
        self.warmup_by = params.pop("warmup_by", "batch")
        self.cooldown = int(params.pop("cooldown_epochs", 0))
        if kind == "builtin" and args.cos_lr and self.name == "linear":
            self.name = "cosine"  # cos_lr=True: Ultralytics' switch for the cosine schedule
        optimizer = trainer.optimizer
        if self.base is None:
            self.base = [group["initial_lr"] for group in optimizer.param_groups]
        span = max(trainer.epochs - self.cooldown, 1)
        if kind == "builtin":
            raw = builtin_factor(self.name, params, span, args.lrf)
            self.factor = raw if not self.cooldown else (lambda x: raw(min(x, span)))
        elif kind == "function":
            self.factor = target if not self.cooldown else (lambda x: target(min(x, span)))
        elif kind == "torch":
            self.monitor = params.pop("monitor", None)
            for group, lr in zip(optimizer.param_groups, self.base, strict=True):
                group["lr"] = lr
            self.scheduler = target(optimizer, **params)
            if self.torch_state is not None:
                self.scheduler.load_state_dict(self.torch_state)
            if self.target is None:
                self.target = [group["lr"] for group in optimizer.param_groups]
        trainer.lr_schedule = self
        self._set_epoch(trainer, trainer.start_epoch, adopt=False)

    # --- the schedule ---------------------------------------------------------------------
    def _adopt_foreign_writes(self, trainer) -> None:
        """An LR another callback wrote since our last write rescales that group's schedule: it sticks."""
        if self.written is None:
            return
        for i, (group, mine) in enumerate(zip(trainer.optimizer.param_groups, self.written, strict=True)):
            now = group["lr"]
            if now == mine:
                continue
            ratio = now / mine if mine else None
            if self.kind == "torch":
                self.target[i] = now
            elif ratio is not None:
                self.base[i] *= ratio
            else:
                factor = self.factor(trainer.epoch) if self.factor else 1.0
                self.base[i] = now / factor if factor else now
            LOGGER.info(f"lr_schedule: lr/pg{i} was set to {now:.6g} by another callback (the schedule had {mine:.6g}); "
                        f"the schedule continues from it")

    def _scheduled(self, i: int, epoch: int) -> float:
        if self.kind == "torch":
            return self.target[i]
        return self.base[i] * self.factor(epoch)

    def _write(self, trainer, values: list[float]) -> None:
        for group, value in zip(trainer.optimizer.param_groups, values, strict=True):
            group["lr"] = value
        self.written = list(values)

    def _set_epoch(self, trainer, epoch: int, adopt: bool = True) -> None:
        """The LR of every group for `epoch` (warmup by epoch included)."""
        if adopt:
            self._adopt_foreign_writes(trainer)
        groups = trainer.optimizer.param_groups
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
        for j, group in enumerate(trainer.optimizer.param_groups):
            start = trainer.warmup_bias_lr if j == 0 else 0.0  # group 0 holds the biases
            values.append(float(np.interp(ni, xi, [start, self._scheduled(j, trainer.epoch)])))
            if "momentum" in group:
                group["momentum"] = float(np.interp(ni, xi, [trainer.args.warmup_momentum, trainer.momentum]))
        self._write(trainer, values)

    def on_model_save(self, trainer):
        """After each epoch (before the checkpoint is written, so it holds the next epoch's schedule): step to the next epoch."""
        if self.kind == "torch":
            self._adopt_foreign_writes(trainer)
            for group, lr in zip(trainer.optimizer.param_groups, self.target, strict=True):
                group["lr"] = lr  # the scheduler steps from its own value, not from a warmup value
            if self.monitor is not None:
                if getattr(trainer, "metrics_epoch", None) == trainer.epoch:  # only an epoch that validated
                    self.scheduler.step(self._monitored(trainer))
            else:
                self.scheduler.step()
            self.target = [group["lr"] for group in trainer.optimizer.param_groups]
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
        return {"base": self.base, "target": self.target, "torch": self.torch_state}

    def load_state_dict(self, state: dict) -> None:
        self.base = list(state["base"]) if state.get("base") is not None else None
        self.target = list(state["target"]) if state.get("target") is not None else None
        self.torch_state = state.get("torch")


def schedule_callback(args: Any) -> Any:
    """The default LR callback for `args.lr_scheduler`: LRSchedule, your class (module:Class) instead, or None for `none`."""
    kind, _, params, target = resolve(args.lr_scheduler, args)
    if kind == "none":
        return None
    if kind == "class":
        return target(**params)
    return LRSchedule()
