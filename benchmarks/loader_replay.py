"""The training loader under a GPU's timing, replayed on a CPU: ours before and after issue 58, and Ultralytics'.

    python benchmarks/loader_replay.py [--data DIR] [--imgsz 640] [--batch 64] [--workers 2] [--epochs 4]
        [--step-ms 50] [--boundary-s 1.0] [--cache none ram] [--rounds 3] [--baseline-ref 7d42114]
        [--ultralytics-python /work/venv-ul/bin/python] [--parts check replay cpu] [--cpu-batch-sizes 64 16]
        [--sides before after after-device ultralytics]

Each side builds its training loader as its trainer does (ours: build_yolo_dataset + build_dataloader, as
yolo_cb/training/build.py calls it at that commit; Ultralytics: ultralytics.data.build.build_yolo_dataset +
build_dataloader) with each side's default augmentation (mosaic 1.0), in its own process and venv.

- replay: `epochs` epochs; after every batch the main process sleeps `step-ms` (a GPU's step: the host waits, the CPU
  is free for the workers), after every epoch `boundary-s` (validation and the checkpoint). Reported: images/s of the
  whole epochs, boundaries included, from the first batch asked for (worker start included) and from epoch 2 on.
- cpu: one worker (workers=1), no step: images per CPU-second of the worker process (its threads' time on a CPU,
  /proc/PID/task/TID/schedstat), over `cpu-images` images after 2 warm batches, at each of --cpu-batch-sizes; and the
  worker's minor page faults per image (fresh memory is what costs most in a VM).
- check: the harness on a case whose answer is known: a step so long (`check-step-ms`) that no loader is the limit;
  the replay must report batch / step for the epochs (boundaries included: images / (batches x step + boundary)).

Sides: "before" (--baseline-ref), "after" (the working tree as its trainer builds the loader on a CPU: colour in the
workers), "after-device" (the working tree with colour_on=device, as on a CUDA device: the workers draw the HSV gains and
leave the colour to the device, issue 58 item 2), "ultralytics". Sides run one after another, `rounds` times, interleaved (before, after, Ultralytics, before, ...); the median of
each side is printed with its ratio to ours before. "before" is --baseline-ref extracted with `git archive` into a
temporary folder. The data folder is only read (label caches go where each side puts caches of read-only data).
Only the standard library is imported at the top: a side imports what it uses.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("YOLO_CB_SHARED", ROOT.parent / "shared"))


# --- one side, in its own process ----------------------------------------------------------------------------------
def our_loader(p: dict):
    """Our training loader as the trainer of the code on PYTHONPATH builds it; (loader, key of the batch's files)."""
    import importlib
    import inspect

    from yolo_cb.data.resolve import check_data
    from yolo_cb.settings.config import get_config

    loading = importlib.util.find_spec("yolo_cb.data.loading")  # the loader's package since issue 58; data/loader.py before
    loader_module = importlib.import_module("yolo_cb.data.loading.loader" if loading else "yolo_cb.data.loader")
    build_dataloader, build_yolo_dataset = loader_module.build_dataloader, loader_module.build_yolo_dataset
    args = get_config({"imgsz": p["imgsz"], "data": p["data"], "batch": p["batch"], "cache": p["cache"], "workers": p["workers"]})
    spec = check_data(p["data"], args.datasets_dir)
    colour = {"colour_on_device": True} if p.get("colour_on") == "device" else {}  # a side "after-device" (issue 58 item 2)
    dataset = build_yolo_dataset(args, spec["train"], "train", spec["names"], batch=p["batch"], **colour)
    issue58 = "span_epochs" in inspect.signature(build_dataloader).parameters  # the trainer passes these since issue 58
    extra = {"span_epochs": True, "channels_last": bool(args.channels_last), "pin_memory": False} if issue58 else {}
    return build_dataloader(dataset, p["batch"], p["workers"], shuffle=True, seed=0, **extra), "im_files"


def ultralytics_loader(p: dict):
    """Ultralytics' training loader as its trainer builds it (get_dataloader: build_yolo_dataset + build_dataloader)."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_dataloader, build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    cfg = get_cfg(overrides={"imgsz": p["imgsz"], "data": p["data"], "batch": p["batch"], "cache": p["cache"], "workers": p["workers"]})
    data = check_det_dataset(p["data"])
    dataset = build_yolo_dataset(cfg, data["train"], p["batch"], data, mode="train")
    return build_dataloader(dataset, p["batch"], p["workers"], shuffle=True), "im_file"


def replay(p: dict) -> dict:
    """Whole epochs under a simulated step and boundary: per-epoch seconds and images."""
    loader, files = (our_loader if p["lib"] == "ours" else ultralytics_loader)(p)
    seconds, images = [], []
    for epoch in range(p["epochs"]):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        start, n = time.perf_counter(), 0
        for batch in loader:
            n += len(batch[files])
            time.sleep(p["step_ms"] / 1000)
        time.sleep(p["boundary_s"])
        seconds.append(time.perf_counter() - start)
        images.append(n)
    return {"seconds": seconds, "images": images, "batches": len(loader)}


def children_usage() -> tuple[float, int]:
    """(CPU seconds, minor page faults) of this process's children (the loader's workers): their threads' time on a CPU
    from /proc/PID/task/TID/schedstat (nanoseconds), faults from /proc/PID/stat (whole process)."""
    nanoseconds, faults = 0, 0
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for pid in (task / "children").read_text().split():
            for thread in Path(f"/proc/{pid}/task").iterdir():
                nanoseconds += int((thread / "schedstat").read_text().split()[0])
            faults += int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])  # minflt, field 10
    return nanoseconds / 1e9, faults


def cpu_per_image(p: dict) -> dict:
    """One worker, no step: images per CPU-second of the worker over `cpu_images` images after 2 warm batches."""
    loader, files = (our_loader if p["lib"] == "ours" else ultralytics_loader)({**p, "workers": 1})
    batches = iter_batches(loader)
    for _ in range(2):
        next(batches)
    (cpu, faults), images = children_usage(), 0
    while images < p["cpu_images"]:
        images += len(next(batches)[files])
    cpu_end, faults_end = children_usage()
    return {"images": images, "cpu_s": cpu_end - cpu, "faults": faults_end - faults}


def iter_batches(loader):
    epoch = 0
    while True:
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        yield from loader
        epoch += 1


# --- the comparison ------------------------------------------------------------------------------------------------
def run_side(side: str, part: str, params: dict, a, baseline: Path) -> dict:
    python = a.ultralytics_python if side == "ultralytics" else sys.executable
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(baseline if side == "before" else ROOT)}
    colour = "device" if side == "after-device" else "worker"
    payload = json.dumps({**params, "lib": "ultralytics" if side == "ultralytics" else "ours", "part": part, "colour_on": colour})
    with tempfile.TemporaryDirectory(prefix="replay_") as cwd:  # Ultralytics writes its settings and runs under the cwd
        out = subprocess.run([python, __file__, "--side", payload], capture_output=True, text=True, cwd=cwd, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{side} {part} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def replay_rates(result: dict) -> tuple[float, float]:
    """(images/s over all epochs, images/s from epoch 2 on)."""
    s, n = result["seconds"], result["images"]
    return sum(n) / sum(s), sum(n[1:]) / sum(s[1:])


def extract(ref: str, dest: Path) -> Path:
    archive = dest / "src.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), ref], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(dest / "src", filter="data")
    return dest / "src"


def table(title: str, rows: dict[str, list[float]], unit: str) -> str:
    """Each side's median and runs, and its ratio to ours before and to Ultralytics as the median of the ratios within
    a round (the sides of one round ran one after another, minutes apart: the machine's load drifts less within one)."""
    def paired(side: str, other: str) -> str:
        if other not in rows or side == other:
            return ""
        return f"{statistics.median(a / b for a, b in zip(rows[side], rows[other], strict=True)):.2f}"

    lines = [f"\n{title}", f"| side | {unit} (median) | runs | x ours before (paired) | x Ultralytics (paired) |", "|---|---:|---|---:|---:|"]
    for side, values in rows.items():
        runs = ", ".join(f"{v:.1f}" for v in values)
        lines.append(f"| {side} | {statistics.median(values):.1f} | {runs} | {paired(side, 'before')} | {paired(side, 'ultralytics')} |")
    return "\n".join(lines)


def compare(a, baseline: Path) -> None:
    sides = [s for s in a.sides if s != "ultralytics" or a.ultralytics_python]
    base = {"data": a.data, "imgsz": a.imgsz, "batch": a.batch, "workers": a.workers, "epochs": a.epochs,
            "step_ms": a.step_ms, "boundary_s": a.boundary_s, "cpu_images": a.cpu_images}
    for cache in a.cache:
        params = {**base, "cache": "ram" if cache == "ram" else False}
        if "check" in a.parts:
            check(a, baseline, sides, params)
        if "replay" in a.parts:
            runs = {s: [] for s in sides}
            steady = {s: [] for s in sides}
            for _ in range(a.rounds):
                for side in sides:
                    whole, later = replay_rates(run_side(side, "replay", params, a, baseline))
                    runs[side].append(whole)
                    steady[side].append(later)
            what = f"batch {a.batch}, {a.workers} workers, imgsz {a.imgsz}, cache={cache}, step {a.step_ms} ms, boundary {a.boundary_s} s, {a.epochs} epochs"
            print(table(f"replay, {what}: images/s of whole epochs (worker start included)", runs, "images/s"))
            print(table(f"replay, {what}: images/s of epochs 2-{a.epochs}", steady, "images/s"), flush=True)
        if "cpu" in a.parts:
            for batch in a.cpu_batch_sizes:
                rates, faults = {s: [] for s in sides}, {s: [] for s in sides}
                for _ in range(a.rounds):
                    for side in sides:
                        r = run_side(side, "cpu", {**params, "batch": batch}, a, baseline)
                        rates[side].append(r["images"] / r["cpu_s"])
                        faults[side].append(r["faults"] / r["images"])
                what = f"one worker, batch {batch}, imgsz {a.imgsz}, cache={cache}"
                print(table(f"{what}: images per CPU-second of the worker", rates, "images/CPU-s"))
                print(table(f"{what}: the worker's minor page faults per image", faults, "faults/image"), flush=True)


def check(a, baseline: Path, sides: list[str], params: dict) -> None:
    """A step so long that no loader is the limit: every side must show images / (batches x step + boundary)."""
    params = {**params, "step_ms": a.check_step_ms, "epochs": 2}
    print(f"\ncheck: step {a.check_step_ms} ms, boundary {a.boundary_s} s, cache={params['cache']}: the loader cannot be the limit")
    print("| side | expected images/s (epoch 2) | measured | measured / expected |\n|---|---:|---:|---:|")
    for side in sides:
        r = run_side(side, "replay", params, a, baseline)
        expected = r["images"][1] / (r["batches"] * a.check_step_ms / 1000 + a.boundary_s)
        measured = r["images"][1] / r["seconds"][1]
        print(f"| {side} | {expected:.1f} | {measured:.1f} | {measured / expected:.3f} |", flush=True)


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(SHARED / "datasets" / "shapes" / "data.yaml"), help="a data YAML (or its folder)")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--step-ms", type=float, default=50.0, help="the simulated GPU step per batch")
    ap.add_argument("--boundary-s", type=float, default=1.0, help="the simulated pause at each epoch's end (validation)")
    ap.add_argument("--cache", nargs="+", choices=("none", "ram"), default=["none", "ram"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parts", nargs="+", choices=("replay", "cpu", "check"), default=["check", "replay", "cpu"])
    ap.add_argument("--cpu-images", type=int, default=640, help="images timed per CPU-per-image run")
    ap.add_argument("--cpu-batch-sizes", type=int, nargs="+", default=[64, 16])
    ap.add_argument("--check-step-ms", type=float, default=3000.0)
    ap.add_argument("--baseline-ref", default="7d42114", help="the commit of 'ours before'")
    ap.add_argument("--ultralytics-python", default="/work/venv-ul/bin/python", help="'' leaves Ultralytics out")
    ap.add_argument("--sides", nargs="+", choices=("before", "after", "after-device", "ultralytics"), default=["before", "after", "ultralytics"])
    ap.add_argument("--side", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.side:
        p = json.loads(a.side)
        print(json.dumps(replay(p) if p["part"] == "replay" else cpu_per_image(p)))
        return
    data = Path(a.data)
    a.data = str((data / "data.yaml" if data.is_dir() else data).resolve())
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; data {a.data}; before = {a.baseline_ref}, after = the working tree")
    with tempfile.TemporaryDirectory(prefix="replay_base_") as tmp:
        compare(a, extract(a.baseline_ref, Path(tmp)))


if __name__ == "__main__":
    main()
