"""Callbacks by name: @register_callback, and building callbacks from CLI strings and YAML lists.

Accepted declarations (CLI `callbacks=` comma-separated, or a YAML `callbacks:` list):
  early_stop_at                       a registered name (built with no arguments)
  {early_stop_at: {target: 0.5}}      a registered name with keyword arguments (YAML)
  on_fit_epoch_end=mypkg.cbs:fn       an event and an import path to a function fn(obj)
  {on_fit_epoch_end: mypkg.cbs:fn}    the same, YAML style
  mypkg.cbs:MyCallback                an import path to a class (instantiated) or an object with on_* methods
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from yolo_cb.callbacks.engine import Callbacks
from yolo_cb.callbacks.events import EVENTS, event_hint
from yolo_cb.utils.suggest import did_you_mean

REGISTRY: dict[str, Callable[..., Any]] = {}
# modules whose import registers the built-in callbacks and integrations
_BUILTIN_MODULES = (
    "yolo_cb.callbacks.builtin",
    "yolo_cb.callbacks.lr_schedule",
    "yolo_cb.integrations.mlflow",
    "yolo_cb.integrations.tensorboard",
    "yolo_cb.integrations.onnx_check",
    "yolo_cb.integrations.visualize",
    "yolo_cb.integrations.stage_switch",
)


def register_callback(name: str | None = None):
    """Decorator: register a callback class or factory under `name` (default: its own __name__); it builds an object with
    on_* methods. `@register_callback()`, `@register_callback` and `@register_callback("name")` all work."""
    if callable(name):  # used bare, without parentheses
        return register_callback()(name)

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


def load_builtins() -> None:
    """Import the modules that register built-in callbacks and integrations (idempotent)."""
    for module in _BUILTIN_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name != module:  # a missing optional dependency is handled by the integration itself
                raise


def registered_names() -> list[str]:
    load_builtins()
    return sorted(REGISTRY)


def import_object(path: str) -> Any:
    """'package.module:attr' (or 'package.module.attr') -> the attribute."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"callback '{path}' is neither a registered name nor an import path 'module:attr'.{did_you_mean(path, registered_names())}"
                         f" Registered: {', '.join(registered_names())}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"callback '{path}': cannot import module '{module_name}' ({error}).{did_you_mean(path, registered_names())}") from error
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"callback '{path}': module '{module_name}' has no attribute '{attr}'")
        obj = getattr(obj, part)
    return obj


def build_registered(name: str, kwargs: dict | None = None) -> Any:
    load_builtins()
    if name not in REGISTRY:
        raise ValueError(f"callback '{name}' is not registered.{did_you_mean(name, REGISTRY)} Registered: {', '.join(sorted(REGISTRY))}")
    obj = REGISTRY[name](**(kwargs or {}))
    if getattr(obj, "registry_name", None) != name:
        try:
            obj.registry_name = name
        except AttributeError:
            pass
    return obj


def parse_specs(value: Any) -> list:
    """Normalise the `callbacks` setting (None, a comma-separated string, or a list) into a list of items."""
    if value in (None, "", [], False):
        return []
    if isinstance(value, str) and value.strip()[:1] in "[{":  # YAML flow on the CLI: callbacks="[{stage_switch: {close_mosaic: 3}}]"
        import yaml

        try:
            return parse_specs(yaml.safe_load(value))
        except yaml.YAMLError as error:
            raise ValueError(f"callbacks {value!r} is not valid YAML ({error})") from None
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, dict):
        return [{k: v} for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        items = []
        for item in value:
            items.extend(parse_specs(item) if isinstance(item, str) else [item])
        return items
    raise ValueError(f"callbacks must be a string, a list or a mapping, got {type(value).__name__}: {value!r}")


def apply_specs(callbacks: Callbacks, value: Any) -> None:
    """Register every declared callback in `value` on `callbacks` (user group)."""
    for item in parse_specs(value):
        if isinstance(item, dict):
            for key, arg in item.items():
                if key in EVENTS:
                    _add_function(callbacks, key, arg)
                else:
                    _add_object(callbacks, key, arg if isinstance(arg, dict) else None)
        elif "=" in item:
            event, _, path = item.partition("=")
            _add_function(callbacks, event.strip(), path.strip())
        else:
            _add_object(callbacks, item, None)


def _add_function(callbacks: Callbacks, event: str, path: Any) -> None:
    if event not in EVENTS:
        raise ValueError(f"callbacks: unknown event '{event}'.{event_hint(event)}")
    fn = import_object(path) if isinstance(path, str) else path
    callbacks.add_callback(event, fn)


def _add_object(callbacks: Callbacks, name: str, kwargs: dict | None) -> None:
    load_builtins()
    if name in REGISTRY:
        obj = build_registered(name, kwargs)
        callbacks.remove(name)  # a declared built-in (with its parameters) replaces the one the settings registered
    else:
        if ":" not in name and "." not in name:
            raise ValueError(f"callback '{name}' is not registered.{did_you_mean(name, REGISTRY)} Registered: {', '.join(sorted(REGISTRY))}")
        obj = import_object(name)
        if isinstance(obj, type):
            obj = obj(**(kwargs or {}))
    callbacks.add_callbacks(obj, name=getattr(obj, "registry_name", None))


# integration name -> the setting that switches it on
INTEGRATIONS = {
    "tensorboard": lambda args: bool(args.tensorboard),
    "mlflow": lambda args: bool(args.mlflow),
    "onnx_check": lambda args: args.onnx_check in (True, "strict"),
    "visualize": lambda args: bool(args.plots),
    "stage_switch": lambda args: bool(args.close_mosaic or args.next_stage_start_epoch is not None),
}


def build_trainer_callbacks(args: Any, user: Callbacks | None = None) -> Callbacks:
    """Defaults, then enabled integrations ('disable' on error), then the user's (Python, then `callbacks=`)."""
    from yolo_cb.callbacks.builtin import DEFAULTS
    from yolo_cb.callbacks.lr_schedule import schedule_callback
    from yolo_cb.utils.log import LOGGER

    callbacks = Callbacks()
    for name in DEFAULTS:
        obj = schedule_callback(args) if name == "lr_schedule" else build_registered(name)
        if obj is not None:  # lr_scheduler=none: no callback owns the LR
            callbacks.add_callbacks(obj, group="default", name=name)
    for name, enabled in INTEGRATIONS.items():
        if not enabled(args):
            continue
        try:
            obj = build_registered(name, {})
        except ImportError as error:
            LOGGER.warning(f"WARNING integration '{name}' is off: {error}")
            continue
        except ValueError:  # not written / not registered in this build
            continue
        # integrations switch themselves off on error; a strict ONNX check must fail the run instead
        on_error = "raise" if name == "onnx_check" and args.onnx_check == "strict" else "disable"
        callbacks.add_callbacks(obj, group="integration", on_error=on_error, name=name)
    callbacks.mark_defaults()
    if user is not None:
        callbacks.extend(user)
    apply_specs(callbacks, getattr(args, "callbacks", None))
    return callbacks
