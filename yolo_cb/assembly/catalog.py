"""Every registered callback name, and the `callbacks=` names checked against them before any work starts.

A name registers when its module is imported (`@register_callback`, `@integration`). This module imports all of them:
the built-in callbacks, the LR schedule, the callback record and every module of `yolo_cb/integrations/` (found by
listing that package, so a new integration is one file that nothing else names). `yolo_cb.settings.config` checks the form of
`callbacks=` (events, import paths, arguments' shape); the registered names are checked here, one level above the
engine that the built-in callbacks use.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from typing import Any

from yolo_cb import integrations
from yolo_cb.assembly import builtin  # noqa: F401  (registers every trainer's callbacks and the recipe's declarations)
from yolo_cb.callbacks import record  # noqa: F401  (registers callbacks_record)
from yolo_cb.callbacks.registry import REGISTRY, resolve_alias
from yolo_cb.callbacks.spec_check import Declaration, bad_item, declarations
from yolo_cb.utils.suggest import did_you_mean

__all__ = ["check_callback_names", "load_integrations", "registered", "registered_declarations", "registered_names"]


def load_integrations() -> None:
    """Import every module of yolo_cb/integrations/ (each registers itself with @integration); idempotent."""
    for module in pkgutil.iter_modules(integrations.__path__):
        importlib.import_module(f"{integrations.__name__}.{module.name}")


def registered_names() -> list[str]:
    load_integrations()
    return sorted(REGISTRY)


def not_registered(name: str) -> str:
    """The one line for a name that is neither registered nor an import path."""
    names = registered_names()
    return (f"'{name}' is not a registered callback.{did_you_mean(name, names)} Registered: {', '.join(names)}. A name your "
            f"own module registers (@register_callback) needs that module imported first: callback_modules=mypkg.cbs, or give "
            f"the import path (mypkg.cbs:MyCallback)")


def registered_declarations(value: Any) -> list[Declaration]:
    """`callbacks=` as declarations, another framework's class names (SuperGradients') turned into ours with their
    parameters renamed; ConfigError (one line naming the item) for a name neither registered nor an import path, a
    foreign class refused, or arguments a registered callback's constructor does not take."""
    return registered(declarations(value))


def registered(declared_items: list[Declaration]) -> list[Declaration]:
    """Declarations (as read from `callbacks=`) with their registered names checked and other frameworks' names turned
    into ours: see registered_declarations."""
    load_integrations()  # the integrations declare their aliases where they register
    found = []
    for declared in declared_items:
        if not (declared.is_event or declared.is_import_path):
            declared = _registered(declared)
        found.append(declared)
    return found


def check_callback_names(value: Any) -> None:
    """Raise ConfigError for a registered-name item of `callbacks=` that cannot be built (see registered_declarations)."""
    registered_declarations(value)


def _registered(declared: Declaration) -> Declaration:
    try:
        key, arg = resolve_alias(declared.key, declared.arg)
    except ValueError as error:
        raise bad_item(declared.item, str(error)) from None
    if key not in REGISTRY:
        raise bad_item(declared.item, not_registered(key))
    _check_arguments(declared.item, key, REGISTRY[key], arg or {})
    return dataclasses.replace(declared, key=key, arg=arg)


def _check_arguments(item: Any, name: str, factory: Any, kwargs: dict) -> None:
    """The keyword arguments of a registered callback fit its constructor (named in the error, with what it takes)."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(**kwargs)
    except TypeError as error:
        takes = ", ".join(p for p in signature.parameters if p != "self") or "no arguments"
        raise bad_item(item, f"'{name}' {error} (it takes: {takes})") from None
