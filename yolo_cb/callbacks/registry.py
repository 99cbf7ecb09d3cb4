"""Names for callbacks: `@register_callback` for a callback class or factory, `@integration` for one that a setting
switches on; `callbacks=` declarations parsed into items. It imports only the engine, errors and utils: the modules
that register import it, and yolo_cb/assembly/catalog.py imports every one of them (so that a registered name can be
checked), see yolo_cb/assembly/assemble.py for building callbacks from names and the trainer's set.

An integration is one file in yolo_cb/integrations/ that declares everything about itself where it registers:

    @integration("mylogger", enabled=lambda args: bool(args.mylogger), requires={"mylogger": "pip install mylogger"})
    class MyLogger: ...

plus its setting's line in cfg/default.yaml. Nothing else names it.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from yolo_cb.callbacks.dispatch import ON_ERROR
from yolo_cb.errors import short_repr
from yolo_cb.utils.suggest import did_you_mean
from yolo_cb.utils.yaml_safe import yaml_loads

REGISTRY: dict[str, Callable[..., Any]] = {}
INTEGRATIONS: dict[str, Integration] = {}


@dataclass(frozen=True)
class Integration:
    """How the trainer's callback set includes one integration."""

    name: str
    enabled: Callable[[Any], bool]  # settings -> whether this run uses it
    # what a failing callback of it does: a policy, or settings -> policy. Loggers "disable" (the run goes on without
    # them); anything that changes the recipe must "raise", or the run would silently train something else.
    on_error: str | Callable[[Any], str] = "disable"
    requires: Mapping[str, str] = field(default_factory=dict)  # importable module -> the install hint when missing

    def policy(self, args: Any) -> str:
        return self.on_error(args) if callable(self.on_error) else self.on_error


def register_callback(name: str | None = None):
    """Decorator: register a callback class or factory under `name` (default: the class's name); it builds an object
    with on_* methods. `@register_callback` without parentheses works too."""
    if callable(name):  # used bare: @register_callback
        return register_callback(None)(name)

    def decorate(factory):
        key = name or factory.__name__
        if key in REGISTRY and REGISTRY[key] is not factory:
            raise ValueError(f"callback name '{key}' is already registered by {REGISTRY[key]!r}")
        REGISTRY[key] = factory
        try:
            factory.registry_name = key
        except (AttributeError, TypeError):
            pass
        return factory

    return decorate


def callback_alias(foreign: str, renames: Mapping[str, str] | None = None):
    """Decorator (above @register_callback / @integration): `foreign`, another framework's class name, declared in callbacks=
    builds this callback, with its parameters renamed by `renames` (their name -> ours; any other is refused)."""

    def decorate(factory):
        CALLBACK_ALIASES[foreign] = (factory.registry_name, dict(renames or {}))
        return factory

    return decorate


def integration(name: str, *, enabled: Callable[[Any], bool], on_error: str | Callable[[Any], str] = "disable",
                requires: Mapping[str, str] | None = None):
    """Decorator: register an integration's callback class under `name` and declare when the trainer includes it."""
    if not callable(on_error) and on_error not in ON_ERROR:
        raise ValueError(f"integration '{name}': on_error must be one of {ON_ERROR}, got {on_error!r}")

    def decorate(factory):
        register_callback(name)(factory)
        INTEGRATIONS[name] = Integration(name, enabled, on_error, dict(requires or {}))
        return factory

    return decorate


# Other frameworks' callback classes (SuperGradients') named in callbacks=: foreign name -> (our registered name, their
# parameter -> ours). Each of ours declares its own with @callback_alias where it registers.
CALLBACK_ALIASES: dict[str, tuple[str, dict[str, str]]] = {}
# ... or refused with one line naming what does their job here (`{name}` is replaced by the class named)
FOREIGN_CALLBACKS: dict[str, str] = {
    "PPYoloETrainingStageSwitchCallback": "it switches PP-YOLOE's assigner, which yolo-cb's models do not have; YOLOX's stage switch "
                                          "is close_mosaic= (or the stage_switch callback)",
    "TimerCallback": "timing is built in: each epoch's time in the progress line and trainer.epoch_time, the slowest callbacks at the end",
    "EarlyStop": "early stopping is built in: the settings patience=, monitor=, monitor_mode= (their mode), min_delta=",
    "LRCallbackBase": "the LR is the lr_scheduler= setting (module:Class for your own callback class)",
    "WarmupLRCallback": "warmup is the setting warmup_epochs= (lr_scheduler={NAME: {warmup_by: epoch}} for epoch steps)",
    "LinearEpochLRWarmup": "warmup is the setting warmup_epochs= with lr_scheduler={linear: {warmup_by: epoch}}",
    "LinearBatchLRWarmup": "warmup is the setting warmup_epochs= (per batch by default)",
    "EpochStepWarmupLRCallback": "warmup is the setting warmup_epochs= with lr_scheduler={linear: {warmup_by: epoch}}",
    "CosineLRCallback": "the setting lr_scheduler=cosine (lrf= the final fraction of lr0)",
    "StepLRCallback": "the setting lr_scheduler={multistep: {milestones: [...], gamma: ...}}",
    "StepLRScheduler": "the setting lr_scheduler={multistep: {milestones: [...], gamma: ...}}",
    "PolyLRCallback": "the setting lr_scheduler=polynomial (or {polynomial: {power: ...}})",
    "ExponentialLRCallback": "the setting lr_scheduler={exponential: {gamma: ...}}",
    "FunctionLRCallback": "the setting lr_scheduler=module:function (epoch -> multiplier of lr0)",
    "LRSchedulerCallback": "the setting lr_scheduler={TorchSchedulerClass: {...}} (any torch.optim.lr_scheduler class)",
}


# SuperGradients' EarlyStop parameter -> the yolo-cb setting that does its job
EARLY_STOP_SETTINGS = {"monitor": "monitor", "mode": "monitor_mode", "min_delta": "min_delta", "patience": "patience"}


def resolve_alias(name: str, kwargs: dict | None) -> tuple[str, dict | None]:
    """(the registered name, its keyword arguments) for a callback declared by another framework's class name; the same
    pair for any other name. ValueError (one line, naming ours) for a class refused or a parameter ours does not take.
    The aliases are declared where their callbacks register: yolo_cb/assembly/catalog.py loads them all first."""
    if name in FOREIGN_CALLBACKS:
        given = " ".join(f"{EARLY_STOP_SETTINGS[k]}={v}" for k, v in (kwargs or {}).items() if k in EARLY_STOP_SETTINGS)
        here = f" (here: {given})" if name == "EarlyStop" and given else ""
        raise ValueError(f"'{name}' is a SuperGradients callback yolo-cb does not build: {FOREIGN_CALLBACKS[name]}{here}")
    if name not in CALLBACK_ALIASES:
        return name, kwargs
    ours, renames = CALLBACK_ALIASES[name]
    unknown = sorted(set(kwargs or {}) - set(renames))
    if unknown:
        raise ValueError(f"'{name}' is built here as '{ours}', which has no counterpart of {', '.join(unknown)} (it takes "
                         f"{', '.join(renames) or 'no parameters'} of {name}'s); drop {', '.join(unknown)} or declare '{ours}'")
    return ours, {renames[k]: v for k, v in (kwargs or {}).items()}


def import_user_module(name: str) -> Any:
    """importlib.import_module(name) for a module the user named (callbacks=, modules=), with the working directory on the
    import path, as `python -m` and `python -c` have it and the `yolo-cb` script does not: `yolo-cb train
    callbacks=mypkg.cbs:fn` run beside mypkg/ finds it. The directory is appended (installed packages keep precedence) and
    stays, so that the module's own later imports work too."""
    here = os.getcwd()
    if not any(os.path.abspath(p or os.curdir) == here for p in sys.path):
        sys.path.append(here)
    return importlib.import_module(name)


def import_object(path: str) -> Any:
    """'package.module:attr' (or 'package.module.attr') -> the attribute; ValueError naming what is wrong (with the
    registered names that look alike, of those registered so far)."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"callback '{path}' is neither a registered name nor an import path 'module:attr'.{did_you_mean(path, REGISTRY)}"
                         f" Registered: {', '.join(sorted(REGISTRY))}")
    try:
        module = import_user_module(module_name)
    except ImportError as error:
        raise ValueError(f"callback '{path}': cannot import module '{module_name}' ({error}).{did_you_mean(path, REGISTRY)}") from error
    except Exception as error:  # the module itself fails (SyntaxError, an error raised at import): the user's code, named
        where = f" ({error.filename}, line {error.lineno})" if isinstance(error, SyntaxError) else ""
        first = (str(error).splitlines() or [""])[0][:200]
        raise ValueError(f"callback '{path}': importing module '{module_name}' raised {type(error).__name__}{where}: {first}; "
                         f"fix that module") from error
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"callback '{path}': module '{module_name}' has no attribute '{attr}'")
        obj = getattr(obj, part)
    return obj


def parse_specs(value: Any) -> list:
    """Normalise the `callbacks` setting (None, a comma-separated string, or a list) into a list of items."""
    if value in (None, "", [], False):
        return []
    if isinstance(value, str) and value.strip()[:1] in "[{":  # YAML flow on the CLI: callbacks="[{stage_switch: {close_mosaic: 3}}]"
        try:
            return parse_specs(yaml_loads(value))
        except yaml.YAMLError as error:
            raise ValueError(f"callbacks {short_repr(value)} is not valid YAML ({error})") from None
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, dict):
        return [{k: v} for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        items = []
        for item in value:
            items.extend(parse_specs(item) if isinstance(item, str) else [item])
        return items
    raise ValueError(f"callbacks must be a string, a list or a mapping, got {type(value).__name__}: {short_repr(value)}")
