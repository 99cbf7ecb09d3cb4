"""`callbacks=` read once into declarations, and their form checked before any work starts.

`declarations(value)` turns the setting (a CLI string, a YAML list or mapping) into `Declaration`s: an event with the
function it calls, or a callback named by its registered name or its import path, each with its placement (name /
after / before, callbacks/order.py) taken apart from the arguments. `check_callbacks` (used by config) checks every
declaration's form: a known event, an importable callable, an object with on_* methods, arguments given as a mapping.
Whether a bare name is registered (or another framework's class name that stands for one of ours) is checked one level
up, by yolo_cb/assembly/catalog.py (the built-in callbacks live above the engine); yolo_cb/assembly/assemble.py builds
the callbacks from the same declarations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from yolo_cb.callbacks.dispatch import event_methods
from yolo_cb.callbacks.events import EVENTS, event_hint
from yolo_cb.callbacks.registry import import_object, parse_specs
from yolo_cb.errors import ConfigError, short_repr

CALLBACK_FORMS = "NAME (registered), EVENT=module:function, or module:Class"
PLACEMENT = ("name", "after", "before")  # keys that place a declared callback (callbacks/order.py), never passed to it


@dataclass(frozen=True)
class Declaration:
    """One declared callback: `item` as written, `key` (an event or a callback's name / import path), `arg` (the event's
    function, or the callback's keyword arguments), `place` (name / after / before)."""

    item: Any
    key: str
    arg: Any
    is_event: bool
    place: dict = field(default_factory=dict)

    @property
    def is_import_path(self) -> bool:
        return not self.is_event and (":" in self.key or "." in self.key)


def bad_item(item: Any, reason: str) -> ConfigError:
    return ConfigError(f"invalid value for 'callbacks': item {short_repr(item)}: {reason.rstrip('.')}; expected {CALLBACK_FORMS}")


def declarations(value: Any) -> list[Declaration]:
    """`callbacks=` as declarations; ConfigError (one line naming the item) for one whose form is wrong."""
    try:
        items = parse_specs(value)
    except ValueError as error:
        raise ConfigError(f"invalid value for 'callbacks': {error}; expected {CALLBACK_FORMS}") from None
    found = []
    for item in items:
        if isinstance(item, dict):
            pairs = [(k, v, k in EVENTS) for k, v in item.items()]
        elif isinstance(item, str):
            event, eq, path = item.partition("=")
            pairs = [(event.strip(), path.strip(), True)] if eq else [(item.strip(), None, False)]
        else:
            raise bad_item(item, f"a {type(item).__name__}, not a string or a mapping")
        for key, arg, is_event in pairs:
            if not isinstance(key, str) or not key:
                raise bad_item(item, "no event or callback name before '='" if is_event else "an empty name")
            arg, place = _placement(item, arg)
            found.append(_event(item, key, arg, place) if is_event else _named(item, key, arg, place))
    return found


def _placement(item: Any, arg: Any) -> tuple[Any, dict]:
    """(`arg` without name / after / before, those three) — each checked: a name is a string, after / before names."""
    if not isinstance(arg, dict):
        return arg, {}
    for key in PLACEMENT:
        value = arg.get(key)
        names = [value] if isinstance(value, str) else value
        if key in arg and not (isinstance(names, list) and names and all(isinstance(n, str) and n for n in names)) or \
                (key == "name" and key in arg and not isinstance(value, str)):
            raise bad_item(item, f"'{key}' must be a callback name{'' if key == 'name' else ' or a list of names'}, got {short_repr(value)}")
    return {k: v for k, v in arg.items() if k not in PLACEMENT}, {k: arg[k] for k in PLACEMENT if k in arg}


def _event(item: Any, key: str, arg: Any, place: dict) -> Declaration:
    """`event=module:function` (or `{event: {call: ...}}`): a known event and its function (an import path or a callable)."""
    if key not in EVENTS:
        raise bad_item(item, f"unknown event '{key}'.{event_hint(key)}")
    if isinstance(arg, dict):
        if set(arg) != {"call"}:
            raise bad_item(item, f"'{key}: {{...}}' takes call: module:function (and name / after / before), got keys {sorted(arg)}")
        arg = arg["call"]
    if isinstance(arg, str) and not arg:
        raise bad_item(item, f"no function after '{key}='; write {key}=module:function")
    return Declaration(item, key, arg, True, place)


def _named(item: Any, key: str, arg: Any, place: dict) -> Declaration:
    """A registered name or an import path to a class / an object with on_* methods, with keyword arguments."""
    if arg is not None and not isinstance(arg, dict):
        raise bad_item(item, f"the arguments of '{key}' must be a mapping of keyword arguments, got {short_repr(arg)}")
    return Declaration(item, key, arg, False, place)


def check_callbacks(value: Any) -> list[Declaration]:
    """`value`'s declarations, checked: ConfigError for one whose form cannot work, before any work starts (a malformed
    item, an unknown event, a module that does not import, a missing attribute, a non-callable). Nothing is
    instantiated here (a class's constructor runs once, when the callbacks are built)."""
    found = declarations(value)
    for declared in found:
        try:
            if declared.is_event:
                fn = import_object(declared.arg) if isinstance(declared.arg, str) else declared.arg
                if not callable(fn):
                    raise bad_item(declared.item, f"{short_repr(declared.arg)} is a {type(fn).__name__}, not callable; point to a function fn(obj)")
            elif declared.is_import_path:
                obj = import_object(declared.key)
                if not isinstance(obj, type):
                    event_methods(obj)  # an object must have on_* methods naming events
        except ValueError as error:
            raise bad_item(declared.item, str(error)) from None
    return found
