"""A registered callback (Entry) and the one rule that orders the callbacks of an event: names, `after`, `before`.

Each callback has a name (default: its function's or class's name). `after=` / `before=` name the callbacks it must
follow / precede in every event both have; "*" means all the others. Otherwise registration order is kept (defaults
are registered first, then integrations, then the user's, so that is the order they run in unless declared). A "*"
only moves the callback that declares it (to the end or the start); it never reorders the others among themselves, so
the user's own callbacks run in the order their list shows. A cycle is an error naming the callbacks in it; a name no
callback has is an error when the set is complete (`check_names`).
"""

from __future__ import annotations

import heapq
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from yolo_cb.errors import ConfigError

ORIGINS = ("default", "integration", "user", "yaml")  # where a callback came from (shown by describe(), never ordering)
EVERY = "*"  # in after= / before=: every other callback of the event


def callback_name(fn: Any) -> str:
    """A readable qualified name for a function, bound method, lambda or callable object (where it is defined)."""
    owner = getattr(fn, "__self__", None)
    if owner is not None and hasattr(fn, "__name__") and not isinstance(owner, types.ModuleType):
        return f"{type(owner).__module__}.{type(owner).__qualname__}.{fn.__name__}"
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None) or type(fn).__module__
    return f"{module}.{qualname}"


def short_name(fn: Any) -> str:
    """The default declared name: a function's name, a bound method's class name, a callable object's class name."""
    owner = getattr(fn, "__self__", None)
    if owner is not None and not isinstance(owner, types.ModuleType):
        return type(owner).__name__
    return getattr(fn, "__name__", None) or type(fn).__name__


def names_of(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """after= / before= as a tuple of names ("a" or ["a", "b"]; None: none)."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    names = tuple(value)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise TypeError(f"after= / before= take callback names (strings), got {bad!r}")
    return names


@dataclass(eq=False, slots=True)
class Entry:
    """One registered callback: the function, its name and place, error policy, and what it did (the record)."""

    fn: Callable
    name: str  # the declared name: what after= / before=, the record and checkpoint state use
    where: str = ""  # where it is defined (module.qualname), for messages
    origin: str = "user"
    on_error: str = "raise"
    owner: Any = None  # the object the method came from (for state_dict), if any
    after: tuple[str, ...] = ()
    before: tuple[str, ...] = ()
    seq: int = 0  # registration order, the tie-breaker
    rank_zero: bool = False  # declared to act on rank 0 only (rank_zero_only)
    enabled: bool = True
    disabled_why: str = ""
    calls: int = 0
    seconds: float = 0.0
    max_seconds: float = 0.0
    errors: list = field(default_factory=list)

    @property
    def identity(self) -> Any:
        """What one name stands for: the owner object of a method set, else the function."""
        return self.owner if self.owner is not None else self.fn


def resolve(event: str, entries: list[Entry]) -> list[Entry]:
    """`entries` in the order their after= / before= declare, registration order between free ones; a cycle is a
    ConfigError (a ValueError) naming its callbacks."""
    if not any(e.after or e.before for e in entries):
        return sorted(entries, key=lambda e: e.seq)
    by_name: dict[str, list[Entry]] = {}
    for e in entries:
        by_name.setdefault(e.name, []).append(e)
    follows: dict[int, set[int]] = {id(e): set() for e in entries}  # id(e) -> ids of the entries e must come after
    named: dict[int, set[int]] = {id(e): set() for e in entries}  # the same, by name only (no "*"): what places an entry

    def edge(first: Entry, then: Entry, by_name: bool) -> None:
        if first is not then:
            follows[id(then)].add(id(first))
            if by_name:
                named[id(then)].add(id(first))

    for e in entries:
        for name in e.after:
            for other in (entries if name == EVERY else by_name.get(name, ())):
                if name != EVERY or not _star_exempt(other, e):
                    edge(other, e, name != EVERY)
        for name in e.before:
            for other in (entries if name == EVERY else by_name.get(name, ())):
                if name != EVERY or not _star_exempt(e, other):
                    edge(e, other, name != EVERY)
    return _topological(event, entries, follows, named)


def _star_exempt(first: Entry, then: Entry) -> bool:
    """A "*" never overrides an explicit declaration the other way, nor orders two entries that both say "*"."""
    explicit = then.name in first.after or first.name in then.before
    return explicit or (EVERY in first.after and EVERY in then.after) or (EVERY in first.before and EVERY in then.before)


def _priorities(entries: list[Entry], follows: dict[int, set[int]]) -> dict[int, int]:
    """Each entry's place among the free ones: its own registration number, or that of the earliest callback it must
    precede by name (directly or not), so `before="x"` lands right before x rather than wherever its own number puts
    it. `follows` holds the named declarations only: every callback precedes one declared after="*", and letting that
    lower their places would order them by nothing but their numbers' ties (it once fired the user's D A B C as B C D A)."""
    precedes: dict[int, list[int]] = {id(e): [] for e in entries}
    for then, firsts in follows.items():
        for first in firsts:
            precedes[first].append(then)
    seq = {id(e): e.seq for e in entries}
    found: dict[int, int] = {}

    def key(node: int, visiting: frozenset) -> int:
        if node not in found:
            later = [key(n, visiting | {node}) for n in precedes[node] if n not in visiting]  # a cycle is reported later
            found[node] = min([seq[node], *later])
        return found[node]

    return {id(e): key(id(e), frozenset()) for e in entries}


def _topological(event: str, entries: list[Entry], follows: dict[int, set[int]], named: dict[int, set[int]]) -> list[Entry]:
    by_id = {id(e): e for e in entries}
    rank = _priorities(entries, named)
    waiting = {key: set(deps) for key, deps in follows.items()}
    ready = [(rank[id(e)], e.seq, id(e)) for e in entries if not waiting[id(e)]]
    heapq.heapify(ready)
    ordered: list[Entry] = []
    while ready:
        *_, key = heapq.heappop(ready)
        ordered.append(by_id[key])
        for other, deps in waiting.items():
            if key in deps:
                deps.discard(key)
                if not deps:
                    heapq.heappush(ready, (rank[other], by_id[other].seq, other))
    if len(ordered) < len(entries):
        raise ConfigError(f"callbacks of '{event}' form a cycle in their after=/before= declarations: {' -> '.join(_cycle(waiting, by_id))}")
    return ordered


def _cycle(waiting: dict[int, set[int]], by_id: dict[int, Entry]) -> list[str]:
    """The names along one cycle among the entries still waiting."""
    key = next(k for k, deps in waiting.items() if deps)
    path: list[int] = []
    while key not in path:
        path.append(key)
        key = next(iter(waiting[key]))
    loop = path[path.index(key):] + [key]
    return [by_id[k].name for k in reversed(loop)]
