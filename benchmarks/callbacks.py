"""Cost of dispatching one event with 0, 1 and 10 registered no-op callbacks, next to a bare Python call.

Ordering (names, after= / before=) and the record (calls, total / max time per callback) are always on: the order is
resolved when a callback is registered, so dispatch walks a ready tuple; each call is timed and counted.

    python benchmarks/callbacks.py
    python benchmarks/callbacks.py --against ../main/yolo_cb/callbacks/dispatch.py   # A/B, interleaved, against another engine
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import timeit

from yolo_cb.callbacks import Callbacks


def noop(obj):
    return None


def per_call_ns(stmt, number: int) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=5)) / number * 1e9


def declared(n: int) -> Callbacks:
    """n no-op callbacks, each declared after the one before and before a last one (a chain the order must honour)."""
    cb = Callbacks()
    cb.add_callback("on_train_batch_end", noop, name="last")
    for i in range(n - 1):
        cb.add_callback("on_train_batch_end", noop, name=f"cb{i}", after=f"cb{i - 1}" if i else None, before="last")
    return cb


def main(number: int = 200_000) -> None:
    obj = object()
    print(f"{'case':<48}{'ns per event':>14}")
    print(f"{'bare Python call noop(obj)':<48}{per_call_ns(lambda: noop(obj), number):>14.0f}")
    results = {}
    for n in (0, 1, 10):
        cb = Callbacks()
        for _ in range(n):
            cb.add_callback("on_train_batch_end", noop)
        results[n] = per_call_ns(lambda cb=cb: cb.run("on_train_batch_end", obj), number)
        print(f"{f'run(event) with {n} no-op callbacks':<48}{results[n]:>14.0f}")
    chain = declared(10)
    ordered = per_call_ns(lambda: chain.run("on_train_batch_end", obj), number)
    print(f"{'run(event) with 10 declared (after/before)':<48}{ordered:>14.0f}")
    print(f"{'per callback, ordering + recording on':<48}{(ordered - results[0]) / 10:>14.0f}")
    assert all(e.calls > 0 and e.max_seconds > 0 for e in chain.entries("on_train_batch_end"))  # the record is kept


def load_engine(path: str):
    """The Callbacks class of another copy of yolo_cb/callbacks/dispatch.py (e.g. main's), for an A/B in one process."""
    spec = importlib.util.spec_from_file_location("other_engine", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["other_engine"] = module
    spec.loader.exec_module(module)
    return module.Callbacks


def per_callback_ns(factory, obj, number: int) -> float:
    """(dispatch with 10 no-op callbacks - dispatch with none) / 10, min of 3 repeats."""
    times = []
    for n in (0, 10):
        cb = factory()
        for _ in range(n):
            cb.add_callback("on_train_batch_end", noop)
        times.append(min(timeit.repeat(lambda cb=cb: cb.run("on_train_batch_end", obj), number=number, repeat=3)) / number * 1e9)
    return (times[1] - times[0]) / 10


def against(path: str, rounds: int = 7, number: int = 50_000) -> None:
    other, obj = load_engine(path), object()
    print(f"{'round':<8}{'other ns/callback':>20}{'this ns/callback':>20}")
    for i in range(rounds):  # interleaved, so both see the same machine load
        print(f"{i + 1:<8}{per_callback_ns(other, obj, number):>20.0f}{per_callback_ns(Callbacks, obj, number):>20.0f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="path of another yolo_cb/callbacks/dispatch.py to compare with, interleaved")
    options = parser.parse_args()
    against(options.against) if options.against else main()
