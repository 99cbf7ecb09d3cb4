"""Callbacks: the string-keyed event dispatcher held by every trainer, validator, predictor and exporter.

Order comes from one rule (callbacks/order.py): each callback's name, `after=` and `before=`, registration order
between free ones. Every call is counted and timed per callback and event: `record()` is what callbacks.json holds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from yolo_cb.callbacks.callback_error import CallbackError
from yolo_cb.callbacks.event_list import EventCallbacks
from yolo_cb.callbacks.events import EVENTS, FOREIGN_EVENTS, event_hint
from yolo_cb.callbacks.order import EVERY, ORIGINS, Entry, callback_name, names_of, resolve, short_name
from yolo_cb.callbacks.signature import REGISTER_HOOK, check_signature, run_on_register
from yolo_cb.errors import ConfigError
from yolo_cb.utils.log import LOGGER
from yolo_cb.utils.suggest import did_you_mean

__all__ = ["NEVER_RAISE", "ON_ERROR", "CallbackError", "Callbacks", "Entry", "EventCallbacks", "callback_name", "check_event",
           "event_methods", "rank_zero_only"]

ON_ERROR = ("raise", "warn", "disable")
# Events fired while an error is already propagating: a callback failing there is logged, the others still run,
# and the original error is the one raised (it would otherwise be replaced by the callback's).
NEVER_RAISE = ("on_exception",)


def check_event(event: str) -> str:
    if event not in EVENTS:
        raise ValueError(f"unknown callback event '{event}'.{event_hint(event)} Valid events: see `yolo_cb.callbacks.events.EVENTS`")
    return event


def check_registration(event: str, fn: Any, on_error: str, origin: str) -> None:
    """What every registration must satisfy (one place to extend: signatures, on_register)."""
    check_event(event)
    if not callable(fn):
        raise TypeError(f"callback for '{event}' must be callable, got {type(fn).__name__}: {fn!r}")
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got '{on_error}'")
    if origin not in ORIGINS:
        raise ValueError(f"origin must be one of {ORIGINS}, got '{origin}'")


def declared(obj: Any, attr: str) -> tuple[str, ...]:
    """A callback class's own `after` / `before` declaration (a name or a tuple of names; a method is no declaration)."""
    value = getattr(obj, attr, None)
    return names_of(value) if isinstance(value, (str, tuple, list)) else ()


class Callbacks:
    """Event name -> ordered callbacks, with error policy, the record of calls and timing, and state for checkpoints."""

    def __init__(self):
        self._entries: dict[str, list[Entry]] = {}  # event -> entries in firing order
        self._run: dict[str, tuple[Entry, ...]] = {}  # event -> the same, as dispatched (rebuilt on every change)
        self._defaults: list[tuple[str, Entry]] = []
        self._seq = 0

    # --- registration -------------------------------------------------------------------
    def add_callback(self, event: str, fn: Callable, *, on_error: str = "raise", name: str | None = None,
                     after: str | Iterable[str] | None = None, before: str | Iterable[str] | None = None,
                     origin: str = "user", owner: Any = None) -> Entry:
        """Register `fn(obj)` on `event`, placed after the callbacks named in `after` and before those in `before`
        (registration order otherwise)."""
        check_registration(event, fn, on_error, origin)
        identity = owner if owner is not None else fn
        self._seq += 1
        entry = Entry(fn=fn, name=self._unique_name(name or short_name(fn), identity), where=callback_name(fn), origin=origin,
                      on_error=on_error, owner=owner, after=names_of(after), before=names_of(before), seq=self._seq,
                      rank_zero=bool(getattr(fn, "rank_zero_only", False) or getattr(owner, "rank_zero_only", False)))
        check_signature(event, fn, entry.name)  # Lightning's (trainer, pl_module) fails here, not at its first call
        self._place(event, entry)
        return entry

    def add_callbacks(self, obj: Any, *, on_error: str = "raise", name: str | None = None, after: str | Iterable[str] | None = None,
                      before: str | Iterable[str] | None = None, origin: str = "user") -> list[Entry]:
        """Register every `on_*`/event-named method of `obj` under one name (default: its registry name, else its class's
        name) and place; the class's own `after` / `before` attributes count too. An `on_*` naming no event is an error."""
        methods = event_methods(obj)
        base = name or getattr(obj, "registry_name", None) or type(obj).__name__
        after, before = declared(obj, "after") + names_of(after), declared(obj, "before") + names_of(before)
        entries = [self.add_callback(event, fn, on_error=on_error, name=base, after=after, before=before, origin=origin, owner=obj)
                   for event, fn in methods.items()]
        run_on_register(obj, self)  # wall_e's on_register(self, callbacks): once, when added
        return entries

    def _unique_name(self, name: str, identity: Any) -> str:
        """`name`, or `name#2`, ... when another callback (another object or function) already has it."""
        taken = {e.name for e in self.entries() if e.identity is not identity}
        candidate, n = name, 1
        while candidate in taken:
            n += 1
            candidate = f"{name}#{n}"
        return candidate

    def _place(self, event: str, entry: Entry) -> None:
        self._set(event, [*self._entries.get(event, []), entry])

    def _set(self, event: str, entries: list[Entry]) -> None:
        """Store `event`'s entries in their resolved order (a cycle raises and leaves the event as it was)."""
        ordered = resolve(event, entries)
        self._entries[event] = ordered
        self._run[event] = tuple(e for e in ordered if e.enabled)

    def check_names(self, elsewhere: Iterable[str] = ()) -> None:
        """Every name in an after= / before= is a callback of this set, or in `elsewhere` (the registered names: a built-in
        this run leaves out, e.g. lr_schedule with lr_scheduler=none, is no error)."""
        here, elsewhere = {e.name for e in self.entries()}, set(elsewhere)
        for event, entries in self._entries.items():
            for e in entries:
                for other in (*e.after, *e.before):
                    if other not in here and other not in elsewhere and other != EVERY:
                        side = "after" if other in e.after else "before"
                        raise ConfigError(f"callback '{e.name}' ({event}) is declared {side}='{other}', but no callback has that "
                                          f"name.{did_you_mean(other, here | elsewhere)} Callbacks of this run: {', '.join(sorted(here))}")

    def set_callback(self, event: str, fn: Callable, **kwargs) -> Entry:
        """Replace every callback of `event` with `fn`."""
        self.clear_callback(event)
        return self.add_callback(event, fn, **kwargs)

    def clear_callback(self, event: str) -> None:
        self._set(check_event(event), [])

    def remove(self, name: str) -> int:
        """Remove every entry registered under `name`; returns how many."""
        removed = 0
        for event, entries in list(self._entries.items()):
            keep = [e for e in entries if e.name != name and getattr(e.owner, "registry_name", None) != name]
            removed += len(entries) - len(keep)
            self._set(event, keep)
        return removed  # declarations naming it stay: a declared built-in replaces it under the same name

    def remove_entry(self, event: str, entry: Entry) -> None:
        self._set(event, [e for e in self._entries.get(event, []) if e is not entry])
        self._forget({entry.name})

    def _forget(self, names: set[str]) -> None:
        """Drop after= / before= references to callbacks that were removed (a place relative to nothing is no place)."""
        gone = names - {e.name for e in self.entries()}
        if not gone:
            return
        for e in self.entries():
            e.after, e.before = tuple(n for n in e.after if n not in gone), tuple(n for n in e.before if n not in gone)

    def mark_defaults(self) -> None:
        """Remember the current registrations as the defaults that reset_callbacks() returns to."""
        self._defaults = [(event, entry) for event, entries in self._entries.items() for entry in entries]

    def reset_callbacks(self) -> None:
        """Back to the defaults (drops integrations and user callbacks added since mark_defaults)."""
        by_event: dict[str, list[Entry]] = {}
        for event, entry in self._defaults:
            by_event.setdefault(event, []).append(entry)
        for event in list(self._entries):
            self._set(event, by_event.get(event, []))

    def extend(self, other: Callbacks) -> None:
        """Add every entry of `other` (its name, place, origin and policy), in its registration order, after ours. A name
        ours already has is given a `#n` suffix, and `other`'s own after= / before= follow the rename (a user callback
        named `checkpoint`, placed by a list insert, stays placed among the user's, not beside the built-in)."""
        renamed: dict[str, str] = {}
        added: list[tuple[str, Entry, Entry]] = []  # (event, our new entry, the entry of `other` it copies)
        for event, e in sorted(((ev, e) for ev, es in other._entries.items() for e in es), key=lambda item: item[1].seq):
            new = self.add_callback(event, e.fn, on_error=e.on_error, name=e.name, origin=e.origin, owner=e.owner)
            renamed[e.name] = new.name
            added.append((event, new, e))
        for _, new, source in added:
            new.after = tuple(renamed.get(n, n) for n in source.after)
            new.before = tuple(renamed.get(n, n) for n in source.before)
        for event in {event for event, _, _ in added}:
            self._set(event, self._entries[event])

    def copy(self) -> Callbacks:
        new = Callbacks()
        new.extend(self)
        return new

    # --- dispatch -----------------------------------------------------------------------
    def run(self, event: str, obj: Any) -> None:
        """Call every enabled callback of `event` with `obj`, applying each one's error policy; count and time each."""
        entries = self._run.get(event)
        if not entries:
            if event not in EVENTS:
                check_event(event)
            return
        clock, main = time.perf_counter, None
        for entry in entries:  # a snapshot of the enabled ones: changes made while this event runs apply from its next firing
            if entry.rank_zero:  # rank_zero_only (the callback's or its method's): not called on a rank > 0
                main = on_main_process(obj) if main is None else main
                if not main:
                    continue
            start = clock()
            try:
                entry.fn(obj)
            except Exception as error:
                entry.calls += 1
                entry.seconds += clock() - start
                self._handle_error(entry, event, error)
                continue
            spent = clock() - start
            entry.calls += 1
            entry.seconds += spent
            if spent > entry.max_seconds:
                entry.max_seconds = spent

    def _handle_error(self, entry: Entry, event: str, error: Exception) -> None:
        message = f"{type(error).__name__}: {error}"
        entry.errors.append(f"{event}: {message}")
        if event in NEVER_RAISE and entry.on_error == "raise":
            LOGGER.error(f"ERROR callback '{entry.name}' failed in '{event}' ({message}); the error being handled is kept and re-raised")
            return
        if entry.on_error == "raise":
            raise CallbackError.of(entry.name, event, error, entry.where) from error
        if entry.on_error == "disable":
            self.disable(entry, f"failed in {event}: {message}")
            LOGGER.warning(f"WARNING callback '{entry.name}' failed in '{event}' ({message}); it is switched off, training goes on")
        elif len(entry.errors) == 1:
            LOGGER.warning(f"WARNING callback '{entry.name}' failed in '{event}' ({message}); continuing (further failures are counted)")

    def disable(self, entry: Entry, why: str = "disabled") -> None:
        """Switch off `entry` and every other entry of the same owner object (one integration), saying why."""
        for event, entries in self._entries.items():
            if any(e is entry or (entry.owner is not None and e.owner is entry.owner) for e in entries):
                for e in entries:
                    if e is entry or (entry.owner is not None and e.owner is entry.owner):
                        e.enabled, e.disabled_why = False, e.disabled_why or why
                self._run[event] = tuple(e for e in entries if e.enabled)

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
        return [e for event in EVENTS for e in self._entries.get(event, [])]

    def describe(self) -> list[dict[str, str]]:
        """Per event, in firing order: each callback's name, origin, error policy, ranks, and where it is defined."""
        return [{"event": event, "name": e.name, "origin": e.origin, "on_error": e.on_error,
                 "rank": "rank 0" if e.rank_zero else "all ranks", "where": e.where}
                for event in EVENTS for e in self._entries.get(event, [])]

    def table(self) -> str:
        """describe() as text: one line per callback, the event named on its first."""
        lines, last = [f"{'event':<28} {'callback':<22} {'origin':<12} {'on_error':<9} rank"], None
        for row in self.describe():
            shown = row["event"] if row["event"] != last else ""
            last = row["event"]
            lines.append(f"{shown:<28} {row['name']:<22} {row['origin']:<12} {row['on_error']:<9} {row['rank']}")
        return "\n".join(lines)

    def record(self) -> list[dict]:
        """What ran: per callback and event, calls, total / mean / max seconds, errors, whether it is off and why."""
        return [{"event": event, "name": e.name, "origin": e.origin, "where": e.where, "rank": "rank 0" if e.rank_zero else "all ranks",
                 "calls": e.calls, "total_s": e.seconds, "mean_s": e.seconds / e.calls if e.calls else 0.0, "max_s": e.max_seconds,
                 "errors": len(e.errors), "first_errors": e.errors[:3], "enabled": e.enabled, "disabled_why": e.disabled_why}
                for event in EVENTS for e in self._entries.get(event, [])]

    def closing_line(self, wall: float, record=None, top: int = 5) -> str:
        """What yolo-cb's own callbacks (defaults and integrations) cost against `wall` seconds, yours, the slowest."""
        spent = self.seconds_by_origin()
        builtin, yours = spent["default"] + spent["integration"], spent["user"] + spent["yaml"]
        share = f"{100 * builtin / wall:.1f}%" if wall > 0 else "-"
        rows = [r for r in self.stats() if r["calls"]][:top]
        return (f"callbacks: yolo-cb's own (defaults and integrations) {builtin:.2f}s = {share} of the training's {wall:.1f}s "
                f"wall time, yours {yours:.2f}s; slowest: "
                + "; ".join(f"{r['callback']} ({r['event']}) {r['total_s']:.2f}s/{r['calls']} calls" for r in rows)
                + (f"; every callback's calls, times and errors, on every rank: {record}" if record else ""))

    def seconds_by_origin(self) -> dict[str, float]:
        """Seconds spent in the callbacks so far, summed per origin ("default", "integration", "user", "yaml")."""
        totals = dict.fromkeys(ORIGINS, 0.0)
        for entry in self.entries():
            totals[entry.origin] += entry.seconds
        return totals

    def stats(self) -> list[dict]:
        """Per-callback timing, slowest total first."""
        rows = [{"event": r["event"], "callback": r["name"], "calls": r["calls"], "total_s": r["total_s"],
                 "per_call_ms": 1000 * r["mean_s"], "enabled": r["enabled"]} for r in self.record()]
        return sorted(rows, key=lambda r: r["total_s"], reverse=True)

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

    # --- state for checkpoints, under each callback's declared name ----------------------
    def stateful(self) -> dict[str, Any]:
        """Declared name -> owner object, for every registered object with state_dict()/load_state_dict()."""
        found: dict[str, Any] = {}
        for e in self.entries():
            if e.owner is not None and hasattr(e.owner, "state_dict") and hasattr(e.owner, "load_state_dict"):
                found.setdefault(e.name, e.owner)
        return found

    def state_dict(self) -> dict[str, Any]:
        return {key: owner.state_dict() for key, owner in self.stateful().items()}

    def load_state_dict(self, states: dict[str, Any]) -> None:
        owners = self.stateful()
        legacy = {f"{type(o).__module__}.{type(o).__qualname__}": o for o in owners.values()}  # keys of checkpoints before names
        for key, state in (states or {}).items():
            owner = owners.get(key) or legacy.get(key)
            if owner is not None:
                owner.load_state_dict(state)
            else:
                LOGGER.warning(f"WARNING the checkpoint holds state for callback '{key}', but no callback of this run has that name "
                               f"(renamed or not registered?{did_you_mean(key, owners)} Register it with name='{key}' to restore it); "
                               f"the state is not used")


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


def on_main_process(obj: Any) -> bool:
    """Whether `obj` (a trainer: its `rank`; else this process's RANK) is on the main process (rank -1 or 0)."""
    rank = getattr(obj, "rank", None)
    if not isinstance(rank, int) or isinstance(rank, bool):
        rank = int(os.environ.get("RANK", "-1") or -1)
    return rank in (-1, 0)


def rank_zero_only(fn: Callable) -> Callable:
    """Mark a callback (a function, or one method of a callback class) to run on the main process (rank 0) only under
    DDP: the dispatcher does not call it on other ranks (a class says the same of all its methods with
    `rank_zero_only = True`); called directly, it returns None on other ranks."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if int(os.environ.get("RANK", "0")) == 0:
            return fn(*args, **kwargs)
        return None

    wrapper.rank_zero_only = True
    return wrapper


multi_process_safe = rank_zero_only  # SuperGradients' name for the same decorator
