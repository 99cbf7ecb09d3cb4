"""Cost of dispatching one event with 0, 1 and 10 registered no-op callbacks, next to a bare Python call.

Ordering (names, after= / before=) and the record (calls, total / max time per callback) are always on: the order is
resolved when a callback is registered, so dispatch walks a ready tuple; each call is timed and counted.

    python benchmarks/callbacks.py
    python benchmarks/callbacks.py --against ../main/yolo_cb/callbacks/dispatch.py   # A/B, interleaved, against another engine

What the default callbacks cost in a real training (issue 44): the training in a fresh process per run, its closing
line's figure (yolo-cb's own callbacks, seconds and share of the training's wall time), the process's wall time and
its CPU time (all threads: work moved to a background thread still counts there),
interleaved A B A B over code trees (each a checkout's root) and/or with the integrations off:

    python benchmarks/callbacks.py --cost demo --trees . ../main --rounds 3            # the demo's training, this tree vs main
    python benchmarks/callbacks.py --cost coco8 --trees . --off --rounds 3             # 3 epochs of coco8, integrations on vs off
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

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


# the trainings --cost runs: scripts/demo.py's (shapes, 12 epochs at 256) and a 3-epoch coco8 run with the CLI's defaults
COST_RUNS = {
    "demo": ["data=shapes.yaml", "imgsz=256", "epochs=12", "close_mosaic=3", "batch=16", "nbs=16", "optimizer=AdamW", "lr0=0.002",
             "warmup_epochs=1.0", "workers=0", "plots=True"],
    "coco8": ["data=coco8.yaml", "epochs=3"],
}
INTEGRATIONS_OFF = ["mlflow=False", "tensorboard=False", "onnx_check=False", "plots=False"]
CLOSING = re.compile(r"callbacks: yolo-cb's own \(defaults and integrations\) (\S+)s = (\S+)% of the training's (\S+)s wall time")


def cost_once(tree: Path, run: str, off: bool, folder: Path) -> dict:
    """One training in a fresh process on the code of `tree`: its closing line's figures and the process's wall time."""
    args = [*COST_RUNS[run], *(INTEGRATIONS_OFF if off else []), f"project={folder}", "name=run"]
    env = {**os.environ, "PYTHONPATH": str(tree.resolve())}
    start, used = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "yolo_cb", "train", *args], cwd=folder, env=env, capture_output=True, text=True)
    process_s, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime  # every thread of the process: a background one too
    match = CLOSING.search(done.stdout + done.stderr)
    if done.returncode or not match:
        raise RuntimeError(f"{tree} {run}: exit {done.returncode}\n{(done.stdout + done.stderr)[-2000:]}")
    own, share, wall = (float(g) for g in match.groups())
    slowest = (done.stdout + done.stderr).split("slowest: ")[-1].split("; every callback")[0]
    record = json.loads((folder / "run" / "callbacks.json").read_text())["callbacks"]
    checkpoint_s = sum(r["total_s"] for r in record if r["name"] == "checkpoint")  # leaving the callbacks for the loop
    return {"own_s": own, "share": share, "train_s": wall, "process_s": process_s, "cpu_s": cpu_s, "slowest": slowest,
            "own_but_checkpoint_s": own - checkpoint_s}


def cost(trees: list[str], run: str, off: bool, rounds: int) -> None:
    """Interleaved rounds over every (tree, integrations on / off) variant; a fresh run folder each time."""
    variants = [(Path(t), False) for t in trees] + ([(Path(trees[0]), True)] if off else [])
    print(f"{'round':<6}{'tree':<24}{'integrations':<14}{'callbacks s':>12}{'share %':>9}{'training s':>12}{'process s':>11}{'CPU s':>8}{'but ckpt %':>11}")
    for i in range(rounds):
        for tree, variant_off in variants:
            with tempfile.TemporaryDirectory(prefix="cb-cost-") as folder:
                r = cost_once(tree, run, variant_off, Path(folder))
            print(f"{i + 1:<6}{str(tree)[-23:]:<24}{'off' if variant_off else 'on':<14}{r['own_s']:>12.2f}{r['share']:>9.1f}"
                  f"{r['train_s']:>12.1f}{r['process_s']:>11.1f}{r['cpu_s']:>8.1f}"
                  f"{100 * r['own_but_checkpoint_s'] / r['train_s']:>11.1f}   {r['slowest'][:160]}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="path of another yolo_cb/callbacks/dispatch.py to compare with, interleaved")
    parser.add_argument("--cost", choices=sorted(COST_RUNS), help="time a real training's callbacks instead (see the docstring)")
    parser.add_argument("--trees", nargs="+", default=["."], help="--cost: code trees (checkout roots) to compare, interleaved")
    parser.add_argument("--off", action="store_true", help="--cost: also the first tree with mlflow, tensorboard, onnx_check, plots off")
    parser.add_argument("--rounds", type=int, default=3, help="--cost: interleaved rounds")
    options = parser.parse_args()
    if options.cost:
        cost(options.trees, options.cost, options.off, options.rounds)
    else:
        against(options.against) if options.against else main()
