"""The `lr_scheduler=` setting, parsed and checked: which schedule, with which parameters (no training code here).

The loop's schedule that applies it is yolo_cb/recipe/schedule.py (a module:Class value is a callback instead,
yolo_cb/assembly/assemble.py); the settings (yolo_cb/settings/config.py) and the resume checks (yolo_cb/settings/resume.py)
read the setting through this module.
"""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple

import yaml

from yolo_cb.callbacks.registry import import_object
from yolo_cb.errors import ConfigError, short_repr
from yolo_cb.utils.suggest import did_you_mean
from yolo_cb.utils.yaml_safe import yaml_loads

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


class LrScheduler(NamedTuple):
    """lr_scheduler= parsed: kind builtin | function | class | torch | none, the schedule's name, its parameters (with
    warmup_by / cooldown_epochs), and the function or class it names (None for builtin and none)."""

    kind: str
    name: str
    params: dict
    target: Any


def _bad(value: Any, reason: str) -> ConfigError:
    return ConfigError(f"invalid value for 'lr_scheduler': {short_repr(value)}: {reason}; expected {FORMS}")


def parse_lr_scheduler(value: Any) -> tuple[str, dict]:
    """'cosine' | {'step': {'step_size': 5}} | the same as YAML text -> (name, parameters). Raises ConfigError."""
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


def parsed(args: Any, resolved: LrScheduler | None = None) -> LrScheduler:
    """`args.lr_scheduler` as parsed once, when the settings were resolved (yolo_cb.settings.config.get_config keeps it on the
    Config); parsed again only where lr_scheduler, cos_lr or warmup_epochs changed since, or `args` is no Config. The
    parameters are a fresh dict each time (readers pop from them)."""
    inputs = (repr(args.lr_scheduler), getattr(args, "cos_lr", False), getattr(args, "warmup_epochs", 0))
    cached = getattr(args, "_lr_scheduler", None)
    if resolved is not None or cached is None or cached[0] != inputs:  # resolved: what get_config parsed, kept
        cached = (inputs, resolved or resolve(args.lr_scheduler, args))
        if hasattr(type(args), "_lr_scheduler"):  # a Config: a slot, so the parsed value is no setting (not in vars(args))
            args._lr_scheduler = cached
    kind, name, params, target = cached[1]
    return LrScheduler(kind, name, dict(params), target)


def resolve(value: Any, args: Any = None) -> LrScheduler:
    """Check the setting fully: (kind, name, parameters, target) with kind builtin | function | class | torch | none."""
    name, params = parse_lr_scheduler(value)
    common = _common_params(value, params)
    if name == "none":
        kind, target = _check_none(value, params, common, args)
    elif name in BUILTIN:
        _check_builtin(value, name, params)
        kind, target = "builtin", None
    elif _torch_class(name) is not None:
        kind, target, params = _check_torch(value, name, params, common)
    elif ":" in name:
        kind, target, params = _check_import(value, name, params, common)
    else:
        import torch.optim.lr_scheduler as torch_schedulers

        names = [*BUILTIN, "none", *[n for n in dir(torch_schedulers) if _torch_class(n) is not None]]
        raise _bad(value, f"unknown schedule '{name}'.{did_you_mean(name, names)}")
    if bool(getattr(args, "cos_lr", False)) and not (kind == "builtin" and name in ("linear", "cosine")):
        raise _bad(value, "cos_lr=True asks for the cosine schedule; give lr_scheduler=cosine (or drop cos_lr) instead of both")
    return LrScheduler(kind, name, {**params, **common}, target)


def _common_params(value: Any, params: dict) -> dict:
    """The parameters every schedule takes (warmup_by, cooldown_epochs), taken out of `params` and checked."""
    common = {k: params.pop(k) for k in list(params) if k in COMMON}
    if "warmup_by" in common and common["warmup_by"] not in COMMON["warmup_by"]:
        raise _bad(value, f"warmup_by={common['warmup_by']!r}, expected batch or epoch")
    cooldown = common.get("cooldown_epochs", 0)
    if isinstance(cooldown, bool) or not isinstance(cooldown, int) or cooldown < 0:
        raise _bad(value, f"cooldown_epochs={common['cooldown_epochs']!r}, expected an integer >= 0")
    return common


def _check_none(value: Any, params: dict, common: dict, args: Any) -> tuple[str, None]:
    if params or common:
        raise _bad(value, "none takes no parameters")
    if args is not None and float(getattr(args, "warmup_epochs", 0) or 0) > 0:
        raise _bad(value, f"none leaves the LR to your callbacks, so warmup_epochs={args.warmup_epochs} would be ignored; set warmup_epochs=0")
    return "none", None


def _check_builtin(value: Any, name: str, params: dict) -> None:
    allowed = PARAMS[name]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise _bad(value, f"'{name}' has no parameter {', '.join(unknown)} (it takes: {', '.join([*allowed, *COMMON]) or 'none'})")
    missing = [k for k, default in allowed.items() if default is None and k not in params]
    if missing:
        raise _bad(value, f"'{name}' needs {', '.join(missing)}, e.g. {{{name}: {{{missing[0]}: {'[30, 60]' if missing[0] == 'milestones' else 10}}}}}")
    _check_builtin_params(value, name, params)


def _check_torch(value: Any, name: str, params: dict, common: dict) -> tuple[str, Any, dict]:
    """A torch.optim.lr_scheduler class: its parameters checked against its signature (ReduceLROnPlateau gets a monitor)."""
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
    return "torch", target, params


def _check_import(value: Any, name: str, params: dict, common: dict) -> tuple[str, Any, dict]:
    """module:function or module:Class, imported (the user's own setting: a checkpoint's is never resolved)."""
    try:
        target = import_object(name)
    except ValueError as error:
        raise _bad(value, str(error)) from None
    if isinstance(target, type):
        if common:
            raise _bad(value, "a callback class gets its parameters as keyword arguments, not warmup_by/cooldown_epochs")
        return "class", target, {**params}
    if callable(target):
        if params:
            raise _bad(value, f"a function takes only warmup_by and cooldown_epochs, not {', '.join(sorted(params))}")
        return "function", target, params
    raise _bad(value, f"{name} is a {type(target).__name__}, not a function or a class")


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
