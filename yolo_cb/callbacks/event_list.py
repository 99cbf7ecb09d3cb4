"""`callbacks[event]`: the callbacks of one event as a live list of functions (the dict-of-lists habit of Ultralytics)."""

from __future__ import annotations

from collections.abc import Callable, MutableSequence
from typing import Any


class EventCallbacks(MutableSequence):
    """The callbacks of one event as a list of functions, live on its registry (`callbacks[event]`).

    Appending, extending or assigning registers `fn` as a user callback (error policy "raise"); removing or deleting
    unregisters it. `insert(i, fn)` declares `fn` before the callback now at i (and after the one before it), so the
    position holds as more callbacks arrive. Reading gives the functions in firing order."""

    def __init__(self, registry: Any, event: str):
        self.registry, self.event = registry, event

    @property
    def _entries(self) -> list:
        return self.registry.entries(self.event)

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [e.fn for e in self._entries[index]]
        return self._entries[index].fn

    def __setitem__(self, index, fn) -> None:
        if isinstance(index, slice):
            for entry in self._entries[index]:
                self.registry.remove_entry(self.event, entry)
            for f in fn:
                self.append(f)
            return
        old = self._entries[index]
        self.insert(index, fn)
        self.registry.remove_entry(self.event, old)

    def __delitem__(self, index) -> None:
        targets = self._entries[index] if isinstance(index, slice) else [self._entries[index]]
        for entry in targets:
            self.registry.remove_entry(self.event, entry)

    def insert(self, index: int, fn: Callable) -> None:
        entries = self._entries
        index = max(0, min(len(entries), index if index >= 0 else len(entries) + index))
        before = (entries[index].name,) if index < len(entries) else ()
        after = (entries[index - 1].name,) if index > 0 else ()
        self.registry.add_callback(self.event, fn, after=after, before=before)

    def append(self, fn: Callable) -> None:
        self.registry.add_callback(self.event, fn)

    def __contains__(self, fn: object) -> bool:
        return any(e.fn is fn or e.fn == fn for e in self._entries)

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, (list, tuple, EventCallbacks)) else NotImplemented

    def __repr__(self) -> str:
        return repr(list(self))
