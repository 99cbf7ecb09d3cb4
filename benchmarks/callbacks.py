"""Cost of dispatching one event with 0, 1 and 10 registered no-op callbacks, next to a bare Python call.

    python benchmarks/callbacks.py
"""

from __future__ import annotations

import timeit

from yolo_cb.callbacks import Callbacks


def noop(obj):
    return None


def per_call_ns(stmt, number: int) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=5)) / number * 1e9


def main(number: int = 200_000) -> None:
    obj = object()
    print(f"{'case':<36}{'ns per event':>14}")
    print(f"{'bare Python call noop(obj)':<36}{per_call_ns(lambda: noop(obj), number):>14.0f}")
    for n in (0, 1, 10):
        cb = Callbacks()
        for _ in range(n):
            cb.add_callback("on_train_batch_end", noop)
        print(f"{f'run(event) with {n} no-op callbacks':<36}{per_call_ns(lambda cb=cb: cb.run('on_train_batch_end', obj), number):>14.0f}")


if __name__ == "__main__":
    main()
