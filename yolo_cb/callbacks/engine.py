"""Callbacks: the string-keyed event dispatcher held by every trainer, validator, predictor and exporter."""

from __future__ import annotations

import time
import types
from collections import defaultdict
from collections.abc import Callable, Iterator, MutableSequence
from dataclasses import dataclass, field
from typing import Any

from yolo_cb.callbacks.events import EVENTS, FOREIGN_EVENTS, event_hint
from yolo_cb.callbacks.signature import REGISTER_HOOK, check_signature, run_on_register
from yolo_cb.utils.log import LOGGER

ON_ERROR = ("raise", "warn", "disable")
# Events fired while an error is already propagating: a callback failing there is logged, the others still run,
# and the original error is the one raised (it would otherwise be replaced by the callback's).
NEVER_RAISE = ("on_exception",)
# Registration groups, run in this order for one event: built-in defaults, integrations, the user's.
GROUPS = ("default", "integration", "user")


class CallbackError(RuntimeError):
    """A callback raised; the message names the callback and the event, the cause is chained."""

    def __init__(self, callback_name: str, event: str, error: BaseException):
        self.callback_name, self.event, self.error = callback_name, event, error
        super().__init__(f"callback '{callback_name}' failed in event '{event}': {type(error).__name__}: {error}")


def callback_name(fn: Any) -> str:
    """A readable qualified name for a function, bound method, lambda or callable object."""
    owner = getattr(fn, "__self__", None)
    if owner is not None and hasattr(fn, "__name__") and not isinstance(owner, types.ModuleType):
        return f"{type(owner).__module__}.{type(owner).__qualname__}.{fn.__name__}"
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None) or type(fn).__module__
    return f"{module}.{qualname}"


def check_event(event: str) -> str:
    if event not in EVENTS:
        raise ValueError(f"unknown callback event '{event}'.{event_hint(event)} Valid events: see `yolo_cb.callbacks.events.EVENTS`")
    return event


@dataclass
class Entry:
    """One registered callback: the function, its group, error policy and timing."""

    fn: Callable
    name: str
    group: str = "user"
    on_error: str = "raise"
    owner: Any = None          # the object the method came from (for state_dict), if any
    enabled: bool = True
    calls: int = 0
    seconds: float = 0.0
    errors: list = field(default_factory=list)


class Callbacks:
    """Event name -> ordered callbacks, with error policy, timing and state for checkpoints."""

    def __init__(self):
        self._entries: dict[str, list[Entry]] = defaultdict(list)
        self._defaults: list[tuple[str, Entry]] = []

    # --- registration -------------------------------------------------------------------
    def add_callback(self, event: str, fn: Callable, *, on_error: str = "raise", group: str = "user", name: str | None = None, owner: Any = None) -> Entry:
        """Append `fn(obj)` to `event` (after the defaults and integrations already there)."""
        check_event(event)
        if not callable(fn):
            raise TypeError(f"callback for '{event}' must be callable, got {type(fn).__name__}: {fn!r}")
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got '{on_error}'")
        if group not in GROUPS:
            raise ValueError(f"group must be one of {GROUPS}, got '{group}'")
        entry = Entry(fn=fn, name=name or callback_name(fn), group=group, on_error=on_error, owner=owner)
        check_signature(event, fn, entry.name)  # Lightning's (trainer, pl_module) fails here, not at its first call
        entries = self._entries[event]
        # keep groups in order: insert after the last entry of the same or an earlier group
        rank = GROUPS.index(group)
        position = len(entries)
        while position > 0 and GROUPS.index(entries[position - 1].group) > rank:
            position -= 1
        entries.insert(position, entry)
        return entry

    def add_callbacks(self, obj: Any, *, on_error: str = "raise", group: str = "user", name: str | None = None) -> list[Entry]:
        """Register every `on_*`/event-named method of `obj`; an `on_*` method naming no event is an error."""
        methods = event_methods(obj)
        base = name or f"{type(obj).__module__}.{type(obj).__qualname__}"
        entries = [self.add_callback(event, fn, on_error=on_error, group=group, name=f"{base}.{event}", owner=obj) for event, fn in methods.items()]
        run_on_register(obj, self)  # wall_e's on_register(self, callbacks): once, when added
        return entries

    def set_callback(self, event: str, fn: Callable, **kwargs) -> Entry:
        """Replace every callback of `event` with `fn`."""
        self.clear_callback(event)
        return self.add_callback(event, fn, **kwargs)

    def clear_callback(self, event: str) -> None:
        self._entries[check_event(event)] = []

    def remove(self, name: str) -> int:
        """Remove every entry registered under `name` (a registry name); returns how many."""
        removed = 0
        for event, entries in self._entries.items():
            keep = [e for e in entries if getattr(e.owner, "registry_name", None) != name and not e.name.startswith(f"{name}.")]
            removed += len(entries) - len(keep)
            self._entries[event] = keep
        return removed

    def mark_defaults(self) -> None:
        """Remember the current registrations as the defaults that reset_callbacks() returns to."""
        self._defaults = [(event, entry) for event, entries in self._entries.items() for entry in entries]

    def reset_callbacks(self) -> None:
        """Back to the defaults (drops integrations and user callbacks added since mark_defaults)."""
        self._entries = defaultdict(list)
        for event, entry in self._defaults:
            self._entries[event].append(entry)

    def extend(self, other: Callbacks) -> None:
        """Add every entry of `other` (keeping its group and policy) after ours of the same group."""
        for event, entries in other._entries.items():
            for e in entries:
                self.add_callback(event, e.fn, on_error=e.on_error, group=e.group, name=e.name, owner=e.owner)

    def copy(self) -> Callbacks:
        new = Callbacks()
        new.extend(self)
        return new

    # --- dispatch -----------------------------------------------------------------------
    def run(self, event: str, obj: Any) -> None:
        """Call every enabled callback of `event` with `obj`, applying each one's error policy."""
        entries = self._entries.get(event)
        if not entries:
            if event not in EVENTS:
                check_event(event)
            return
        for entry in list(entries):  # callbacks added or removed while this event runs take effect from its next firing
            if not entry.enabled:
                continue
            start = time.perf_counter()
            try:
                entry.fn(obj)
            except Exception as error:
                if event in NEVER_RAISE and entry.on_error == "raise":
                    entry.errors.append(f"{event}: {type(error).__name__}: {error}")
                    LOGGER.error(f"ERROR callback '{entry.name}' failed in '{event}' ({type(error).__name__}: {error}); "
                                 f"the error being handled is kept and re-raised")
                else:
                    self._handle_error(entry, event, error)
            finally:
                entry.calls += 1
                entry.seconds += time.perf_counter() - start

    def _handle_error(self, entry: Entry, event: str, error: Exception) -> None:
        if entry.on_error == "raise":
            raise CallbackError(entry.name, event, error) from error
        entry.errors.append(f"{event}: {type(error).__name__}: {error}")
        if entry.on_error == "disable":
            self.disable(entry)
            LOGGER.warning(f"WARNING callback '{entry.name}' failed in '{event}' ({type(error).__name__}: {error}); it is switched off, training goes on")
        elif len(entry.errors) == 1:
            LOGGER.warning(f"WARNING callback '{entry.name}' failed in '{event}' ({type(error).__name__}: {error}); continuing (further failures are counted)")

    def disable(self, entry: Entry) -> None:
        """Switch off `entry` and every other entry of the same owner object (one integration)."""
        for entries in self._entries.values():
            for e in entries:
                if e is entry or (entry.owner is not None and e.owner is entry.owner):
                    e.enabled = False

    # --- introspection ------------------------------------------------------------------
    def get(self, event: str, default: Any = None) -> EventCallbacks:
        """`callbacks.get(event)`: the live list (every event has one, so `default` is never used); an unknown event
        raises with a suggestion rather than returning a list that registers nothing."""
        return self[event]

    def setdefault(self, event: str, default: Any = None) -> EventCallbacks:
        """`callbacks.setdefault(event, []).append(fn)` (Ultralytics' dict habit): every event has its live list already."""
        return self[event]

    def entries(self, event: str | None = None) -> list[Entry]:
        if event is not None:
            return list(self._entries.get(check_event(event), []))
        return [e for entries in self._entries.values() for e in entries]

    # --- the dict-of-lists view Ultralytics code uses: callbacks[event] is a live list -------------
    def __getitem__(self, event: str) -> EventCallbacks:
        """The live list of `event`'s callbacks: append/extend/insert/remove/del/+= register and unregister here."""
        return EventCallbacks(self, check_event(event))

    def __setitem__(self, event: str, fns) -> None:
        """`callbacks[event] = [fn, ...]` replaces every callback of `event` (like set_callback)."""
        check_event(event)
        if isinstance(fns, EventCallbacks) and fns.registry is self and fns.event == event:
            return  # `callbacks[event] += [fn]` assigns the live list back to itself: already done
        new = list(fns)
        self.clear_callback(event)
        for fn in new:
            self.add_callback(event, fn)

    def __delitem__(self, event: str) -> None:
        self.clear_callback(event)

    def __contains__(self, event: object) -> bool:
        return event in EVENTS

    def __iter__(self) -> Iterator[str]:
        return iter(EVENTS)

    def __len__(self) -> int:
        return len(EVENTS)

    def keys(self):
        """Every event name (each one always has a list, possibly empty), as in Ultralytics' callbacks dict."""
        return EVENTS.keys()

    def values(self) -> list[EventCallbacks]:
        return [self[event] for event in EVENTS]

    def items(self) -> list[tuple[str, EventCallbacks]]:
        return [(event, self[event]) for event in EVENTS]

    def table(self) -> str:
        """The resolved event -> callbacks table, in firing order."""
        lines = []
        for event in EVENTS:
            for i, e in enumerate(self._entries.get(event, [])):
                lines.append(f"{event if i == 0 else '':<28} {e.group:<12} {e.on_error:<8} {e.name}")
        return "\n".join(lines)

    def stats(self) -> list[dict]:
        """Per-callback timing, slowest total first."""
        rows = [{"event": event, "callback": e.name, "calls": e.calls, "total_s": e.seconds,
                 "per_call_ms": 1000 * e.seconds / e.calls if e.calls else 0.0, "enabled": e.enabled}
                for event, entries in self._entries.items() for e in entries]
        return sorted(rows, key=lambda r: r["total_s"], reverse=True)

    # --- state for checkpoints ----------------------------------------------------------
    def stateful(self) -> dict[str, Any]:
        """Stable key -> owner object, for every registered object with state_dict()/load_state_dict()."""
        found: dict[str, Any] = {}
        for e in self.entries():
            owner = e.owner
            if owner is not None and hasattr(owner, "state_dict") and hasattr(owner, "load_state_dict"):
                key = getattr(owner, "registry_name", None) or f"{type(owner).__module__}.{type(owner).__qualname__}"
                found.setdefault(key, owner)
        return found

    def state_dict(self) -> dict[str, Any]:
        return {key: owner.state_dict() for key, owner in self.stateful().items()}

    def load_state_dict(self, states: dict[str, Any]) -> None:
        owners = self.stateful()
        for key, state in (states or {}).items():
            if key in owners:
                owners[key].load_state_dict(state)
            else:
                LOGGER.warning(f"WARNING checkpoint holds state for callback '{key}' but no registered callback claims it; ignored")


class EventCallbacks(MutableSequence):
    """The callbacks of one event as a list of functions, live on its registry (`callbacks[event]`).

    Appending, extending, inserting or assigning registers `fn` as a user callback (error policy "raise"); removing or
    deleting unregisters it. Reading gives the functions in firing order (defaults, integrations, the user's)."""

    def __init__(self, registry: Callbacks, event: str):
        self.registry, self.event = registry, event

    @property
    def _entries(self) -> list[Entry]:
        return self.registry._entries[self.event]

    def _entry(self, fn: Callable) -> Entry:
        if not callable(fn):
            raise TypeError(f"callback for '{self.event}' must be callable, got {type(fn).__name__}: {fn!r}")
        check_signature(self.event, fn, callback_name(fn))
        return Entry(fn=fn, name=callback_name(fn))

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [e.fn for e in self._entries[index]]
        return self._entries[index].fn

    def __setitem__(self, index, fn) -> None:
        if isinstance(index, slice):
            self._entries[index] = [self._entry(f) for f in fn]
        else:
            self._entries[index] = self._entry(fn)

    def __delitem__(self, index) -> None:
        del self._entries[index]

    def insert(self, index: int, fn: Callable) -> None:
        self._entries.insert(index, self._entry(fn))

    def append(self, fn: Callable) -> None:
        self.registry.add_callback(self.event, fn)

    def __contains__(self, fn: object) -> bool:
        return any(e.fn is fn or e.fn == fn for e in self._entries)

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, (list, tuple, EventCallbacks)) else NotImplemented

    def __repr__(self) -> str:
        return repr(list(self))


def event_methods(obj: Any) -> dict[str, Callable]:
    """{event: bound method} for each method of `obj` named after an event; unknown on_* names are errors."""
    found = {}
    for attr in dir(obj):
        if attr.startswith("__"):
            continue
        if attr in EVENTS:
            fn = getattr(obj, attr)
            if callable(fn):
                found[attr] = fn
        elif (attr.startswith(("on_", "before_", "after_")) or attr in FOREIGN_EVENTS) and attr not in ("setup", REGISTER_HOOK) and \
                callable(getattr(type(obj), attr, None)):
            raise ValueError(f"{type(obj).__qualname__}.{attr} looks like a callback but names no event.{event_hint(attr)}")
    if not found:
        raise ValueError(f"{type(obj).__qualname__} has no method named after an event (e.g. on_fit_epoch_end)")
    return found


def rank_zero_only(fn: Callable) -> Callable:
    """Mark a callback to run on the main process (rank 0) only under DDP."""
    import functools
    import os

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if int(os.environ.get("RANK", "0")) == 0:
            return fn(*args, **kwargs)
        return None

    wrapper.rank_zero_only = True
    return wrapper


multi_process_safe = rank_zero_only  # SuperGradients' name for the same decorator
