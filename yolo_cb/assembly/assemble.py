"""Building callbacks: from registered names, CLI strings and YAML lists, and the trainer's whole set.

Accepted declarations (CLI `callbacks=` comma-separated, or a YAML `callbacks:` list):
  early_stop_at                       a registered name (built with no arguments)
  {early_stop_at: {target: 0.5}}      a registered name with keyword arguments (YAML)
  on_fit_epoch_end=mypkg.cbs:fn       an event and an import path to a function fn(obj)
  {on_fit_epoch_end: mypkg.cbs:fn}    the same, YAML style
  mypkg.cbs:MyCallback                an import path to a class (instantiated) or an object with on_* methods
Each YAML form places the callback with `name`, `after` and `before` (callbacks/order.py):
  {on_fit_epoch_end: {call: mypkg.cbs:fn, name: notify, after: checkpoint}}
  {early_stop_at: {target: 0.5, after: [checkpoint]}}    (after / before / name are not passed to the class)
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from yolo_cb.assembly.builtin import DEFAULTS, LOOP_STEPS
from yolo_cb.assembly.catalog import load_integrations, not_registered, registered
from yolo_cb.callbacks.dispatch import Callbacks
from yolo_cb.callbacks.record import warn_foreign_events
from yolo_cb.callbacks.registry import INTEGRATIONS, REGISTRY, import_object, parse_specs
from yolo_cb.callbacks.spec_check import Declaration, check_callbacks
from yolo_cb.errors import ConfigError
from yolo_cb.settings.config import callback_declarations, get_config
from yolo_cb.settings.declared import is_recipe_declaration
from yolo_cb.settings.lr_settings import parsed
from yolo_cb.settings.schema import load_defaults
from yolo_cb.settings.user import load_user_settings
from yolo_cb.utils.log import LOGGER

__all__ = ["add_integration_callbacks", "apply_declarations", "apply_specs", "build_registered", "build_trainer_callbacks", "get_default_callbacks", "importable",
           "parse_specs"]


def build_registered(name: str, kwargs: dict | None = None) -> Any:
    load_integrations()
    if name not in REGISTRY:
        raise ValueError(f"callback {not_registered(name)}")
    obj = REGISTRY[name](**(kwargs or {}))
    if getattr(obj, "registry_name", None) != name:
        try:
            obj.registry_name = name
        except AttributeError:
            pass
    return obj


def apply_specs(callbacks: Callbacks, value: Any) -> None:
    """Register every declared callback in `value` (a `callbacks=` value) on `callbacks` (origin "yaml"); a declaration
    that cannot work is a ConfigError naming it, raised before any of them is built."""
    apply_declarations(callbacks, check_callbacks(value))


def apply_declarations(callbacks: Callbacks, declared_items: list[Declaration]) -> None:
    """Register declarations already read and checked (the settings keep them: callback_declarations) on `callbacks`; the
    recipe's declarations are no callbacks: the settings folded them in (yolo_cb/settings/declared.py)."""
    for declared in registered(declared_items):
        if not is_recipe_declaration(declared):
            (_add_function if declared.is_event else _add_object)(callbacks, declared)


def _add_function(callbacks: Callbacks, declared: Declaration) -> None:
    fn = import_object(declared.arg) if isinstance(declared.arg, str) else declared.arg
    callbacks.add_callback(declared.key, fn, origin="yaml", **declared.place)


def _add_object(callbacks: Callbacks, declared: Declaration) -> None:
    if declared.is_import_path:
        obj = import_object(declared.key)
        if isinstance(obj, type):
            obj = obj(**(declared.arg or {}))
    else:
        obj = build_registered(declared.key, declared.arg)
        callbacks.remove(declared.key)  # a declared built-in (with its parameters) replaces the one the settings registered
    name = declared.place.get("name") or getattr(obj, "registry_name", None)
    callbacks.add_callbacks(obj, name=name, origin="yaml", **{k: v for k, v in declared.place.items() if k != "name"})


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: sys.modules[module] is None, the standard way to block an import
        return False


def _asked_for(name: str, args: Any) -> bool:
    """Whether the integration's setting is off by default, also in the user's settings file, and this run turned it on
    (one on by default or switched on in that file only warns when its package is missing)."""
    defaults = {**load_defaults(), **load_user_settings()}
    return defaults.get(name) in (False, None) and bool(getattr(args, name, None))


def add_integration_callbacks(instance: Any, args: Any = None) -> None:
    """Ultralytics' add_integration_callbacks(trainer): register the integrations `args` (default: instance.args) switch on
    onto instance.callbacks (or onto `instance`, a Callbacks), each once, in name order (never the order modules were
    imported in). A missing package warns for an integration on by default or switched on in the user's settings file
    (`yolo-cb settings comet=True`), and is an error for one this run's settings turned on (wandb=True)."""
    load_integrations()
    callbacks = instance if isinstance(instance, Callbacks) else instance.callbacks
    args = args if args is not None else instance.args
    present = {getattr(e.owner, "registry_name", None) for e in callbacks.entries()}
    for name, spec in sorted(INTEGRATIONS.items()):
        if not spec.enabled(args) or name in present:
            continue
        missing = [hint for module, hint in spec.requires.items() if not importable(module)]
        if missing and _asked_for(name, args):  # wandb=True given: the run must not start without it
            raise ConfigError(f"{name}=True needs {', '.join(spec.requires)}, which is not installed: {'; '.join(missing)} (or {name}=False)")
        if missing:
            LOGGER.warning(f"WARNING integration '{name}' is off: it needs {', '.join(spec.requires)} ({'; '.join(missing)})")
            continue
        callbacks.add_callbacks(build_registered(name, {}), origin="integration", on_error=spec.policy(args), name=name)


def schedule_callback(args: Any) -> Any:
    """lr_scheduler=module:Class: an instance of your class, a callback that sets the LR instead of the loop's schedule."""
    kind, _, params, target = parsed(args)  # lr_scheduler= as parsed when the settings were resolved
    return target(**params) if kind == "class" else None


def get_default_callbacks(args: Any = None) -> Callbacks:
    """Ultralytics' get_default_callbacks(): a Callbacks (a dict of live lists) holding the built-in defaults a trainer of
    `args` has (default: the default settings), without integrations or the user's."""
    args = args if args is not None else get_config({"mode": "train"})
    callbacks = Callbacks()
    for name in DEFAULTS:
        obj = schedule_callback(args) if name == "lr_schedule" else build_registered(name)
        if obj is not None:  # the loop's schedule, or none: no callback owns the LR
            callbacks.add_callbacks(obj, origin="default", name=name)
    return callbacks


def build_trainer_callbacks(args: Any, user: Callbacks | None = None) -> Callbacks:
    """Defaults, then enabled integrations ('disable' on error), then the user's (Python, then `callbacks=`), in that
    registration order, each placed by its name / after / before."""
    callbacks = get_default_callbacks(args)
    add_integration_callbacks(callbacks, args)
    callbacks.mark_defaults()
    if user is not None:
        callbacks.extend(user)
    apply_declarations(callbacks, callback_declarations(args))
    callbacks.check_names((*REGISTRY, *LOOP_STEPS))
    if getattr(args, "strict_callbacks", False):
        warn_foreign_events(callbacks)
    return callbacks
