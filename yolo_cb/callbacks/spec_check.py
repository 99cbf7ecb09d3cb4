"""`callbacks=` checked before any work starts: each item's form, event, registered name, import path and arguments."""

from __future__ import annotations

import inspect
from typing import Any

from yolo_cb.callbacks.engine import event_methods
from yolo_cb.callbacks.events import EVENTS, event_hint
from yolo_cb.callbacks.registry import REGISTRY, import_object, parse_specs, registered_names, resolve_alias
from yolo_cb.errors import ConfigError, short_repr
from yolo_cb.utils.suggest import did_you_mean

CALLBACK_FORMS = "NAME (registered), EVENT=module:function, or module:Class"
PLACEMENT = ("name", "after", "before")  # keys that place a declared callback (callbacks/order.py), never passed to it


def _placement(item: Any, arg: Any, bad) -> Any:
    """`arg` without its name / after / before (each checked: a name is a string, after / before names or lists of names)."""
    if not isinstance(arg, dict):
        return arg
    for key in PLACEMENT:
        value = arg.get(key)
        names = [value] if isinstance(value, str) else value
        if key in arg and not (isinstance(names, list) and names and all(isinstance(n, str) and n for n in names)) or \
                (key == "name" and key in arg and not isinstance(value, str)):
            raise bad(item, f"'{key}' must be a callback name{'' if key == 'name' else ' or a list of names'}, got {short_repr(value)}")
    return {k: v for k, v in arg.items() if k not in PLACEMENT}


def check_callbacks(value: Any) -> None:
    """Raise ConfigError for a `callbacks` declaration that cannot work, before any work starts: a malformed item,
    an unknown event or registered name, a module that does not import, a missing attribute, a non-callable.

    Nothing is instantiated here (a class's constructor runs once, when the callbacks are built)."""

    def bad(item: Any, reason: str) -> ConfigError:
        return ConfigError(f"invalid value for 'callbacks': item {short_repr(item)}: {reason.rstrip('.')}; expected {CALLBACK_FORMS}")

    try:
        items = parse_specs(value)
    except ValueError as error:
        raise ConfigError(f"invalid value for 'callbacks': {error}; expected {CALLBACK_FORMS}") from None
    for item in items:
        if isinstance(item, dict):
            pairs = [(k, v, k in EVENTS) for k, v in item.items()]
        elif isinstance(item, str):
            event, eq, path = item.partition("=")
            pairs = [(event.strip(), path.strip(), True)] if eq else [(item.strip(), None, False)]
        else:
            raise bad(item, f"a {type(item).__name__}, not a string or a mapping")
        for key, arg, is_event in pairs:
            if not isinstance(key, str) or not key:
                raise bad(item, "no event or callback name before '='" if is_event else "an empty name")
            arg = _placement(item, arg, bad)
            (_check_event_item if is_event else _check_named_item)(item, key, arg, bad)


def _check_event_item(item: Any, key: str, arg: Any, bad) -> None:
    """`event=module:function` (or `{event: {call: ...}}`): a known event and a function that imports."""
    if key not in EVENTS:
        raise bad(item, f"unknown event '{key}'.{event_hint(key)}")
    if isinstance(arg, dict):
        if set(arg) != {"call"}:
            raise bad(item, f"'{key}: {{...}}' takes call: module:function (and name / after / before), got keys {sorted(arg)}")
        arg = arg["call"]
    if isinstance(arg, str):
        if not arg:
            raise bad(item, f"no function after '{key}='; write {key}=module:function")
        try:
            arg = import_object(arg)
        except ValueError as error:
            raise bad(item, str(error)) from None
    if not callable(arg):
        raise bad(item, f"{item.partition('=')[2].strip() if isinstance(item, str) else short_repr(arg)} is a {type(arg).__name__}, "
                        f"not callable; point to a function fn(obj)")


def _check_named_item(item: Any, key: str, arg: Any, bad) -> None:
    """A registered name (with keyword arguments) or an import path to a class / an object with on_* methods."""
    if arg is None or isinstance(arg, dict):
        try:
            key, arg = resolve_alias(key, arg)  # SuperGradients' class names: ours, or one line naming ours
        except ValueError as error:
            raise bad(item, str(error)) from None
    if key in registered_names():
        if arg is not None and not isinstance(arg, dict):
            raise bad(item, f"the arguments of '{key}' must be a mapping of keyword arguments, got {short_repr(arg)}")
        _check_arguments(item, key, arg or {}, bad)
        return
    if ":" not in key and "." not in key:
        raise bad(item, f"'{key}' is not a registered callback.{did_you_mean(key, registered_names())} "
                        f"Registered: {', '.join(registered_names())}")
    try:
        obj = import_object(key)
        if not isinstance(obj, type):
            event_methods(obj)  # an object must have on_* methods naming events
    except ValueError as error:
        raise bad(item, str(error)) from None


def _check_arguments(item: Any, name: str, kwargs: dict, bad) -> None:
    """The keyword arguments of a registered callback fit its constructor (named in the error, with what it takes)."""
    try:
        signature = inspect.signature(REGISTRY[name])
    except (TypeError, ValueError):
        return
    try:
        signature.bind(**kwargs)
    except TypeError as error:
        takes = ", ".join(p for p in signature.parameters if p != "self") or "no arguments"
        raise bad(item, f"'{name}' {error} (it takes: {takes})") from None
