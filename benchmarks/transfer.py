"""Transfer-learning speed-up on shapes: fine-tuning from a checkpoint trained on a different synthetic set, against
training from scratch, side by side in one run.

    python benchmarks/transfer.py [--imgsz 160] [--pretrain-epochs 10] [--epochs 15] [--targets 0.1 0.2 0.3]
                                  [--train-images 512] [--val-images 128] [--out runs/bench/transfer] [--quick]

1. A different synthetic set is generated with ../shared/tools/make_shapes.py into a temp folder: seed 1 (the tool's
   default is 0) and other classes (ellipse, hexagon: none of shapes' circle, rectangle, triangle, cross),
   --train-images / --val-images (512 / 128: the size of the shared shapes set).
2. YOLOX-nano is trained on it from scratch for --pretrain-epochs (one core, one thread: on a shared machine two threads
   fight the other processes for both cores); its best.pt is the starting checkpoint.
3. Side by side, at the same time, each pinned to its own core with one thread: the same recipe on
   ../shared/datasets/shapes (4 classes; its first --train-images / --val-images images) from that checkpoint (every
   matching tensor transferred, the class head re-initialised for 4 classes) and from scratch (yolox-nano.yaml). Same seed, data order, augmentation and epochs;
   only the initial weights differ. Validation every epoch.

Printed: both curves (mAP50-95 and wall seconds per epoch), the epoch and seconds at which each reaches each target,
and the pretraining cost; raw figures in OUT/results.json, each run's log in OUT/<run>.log. This file is its own
worker: each run is `python benchmarks/transfer.py --worker SPEC.json`.
--quick: a smoke test (imgsz 64, 1 + 2 epochs, 32 / 16 images).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("YOLO_CB_SHARED", ROOT.parent / "shared"))
MAKE_SHAPES = SHARED / "tools" / "make_shapes.py"
MAP_KEY = "metrics/mAP50-95(B)"
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")
PRETRAIN_CLASSES = "ellipse,hexagon"
PRETRAIN_SEED = 1
# The recipe of benchmarks/convergence.py (BENCHMARKS.md), at a smaller image size; the same for every run here.
RECIPE = dict(batch=16, nbs=16, optimizer="AdamW", lr0=0.002, warmup_epochs=1.0, workers=0, channels_last=True, no_aug_epochs=0,
              seed=0, mlflow=False, tensorboard=False, onnx_check=False, plots=False, val=True, exist_ok=True)


# --- worker: one training run, its curve written as JSON ---------------------------------------------------------------
def worker(spec_file: str) -> None:
    import torch

    from yolo_cb import YOLO

    spec = json.loads(Path(spec_file).read_text())
    torch.set_num_threads(int(spec["threads"]))
    curve, start = [], {}

    def on_train_start(trainer):
        start["t"] = time.perf_counter()

    def on_fit_epoch_end(trainer):
        score = float(trainer.metrics.get(MAP_KEY, 0.0))
        curve.append({"epoch": trainer.epoch + 1, "seconds": time.perf_counter() - start["t"], "map": score})
        print(f"[{spec['label']}] epoch {trainer.epoch + 1}: {curve[-1]['seconds']:.0f} s, mAP50-95 {score:.4f}", flush=True)
        Path(spec["result"]).write_text(json.dumps({"curve": curve}))

    model = YOLO(spec["model"])
    model.add_callback("on_train_start", on_train_start)
    model.add_callback("on_fit_epoch_end", on_fit_epoch_end)
    t0 = time.perf_counter()
    model.train(**spec["train"])
    weights = Path(model.trainer.wdir)
    best = weights / "best.pt" if (weights / "best.pt").is_file() else weights / "last.pt"
    Path(spec["result"]).write_text(json.dumps({"curve": curve, "total_seconds": time.perf_counter() - t0, "best": str(best)}))


# --- driver ------------------------------------------------------------------------------------------------------------
def launch(label: str, model: str, train: dict, out: Path, threads: int, core: int | None) -> subprocess.Popen:
    spec = {"label": label, "model": model, "train": train, "threads": threads, "result": str(out / f"{label}.json")}
    spec_file = out / f"{label}.spec.json"
    spec_file.write_text(json.dumps(spec))
    env = {**os.environ, **{k: str(threads) for k in THREAD_ENV}}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_file)]
    if core is not None and shutil.which("taskset"):
        cmd = ["taskset", "-c", str(core), *cmd]
    log = open(out / f"{label}.log", "w")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    proc.log = log
    return proc


def wait(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        rc = proc.wait()
        proc.log.close()
        if rc:
            raise SystemExit(f"a run failed (exit {rc}); see {proc.log.name}")


def data_yaml(folder: Path, path: Path, names: list[str], train: str = "images/train", val: str = "images/val") -> Path:
    file = folder / f"{path.name}.yaml"
    file.write_text(f"path: {path}\ntrain: {train}\nval: {val}\nnames: {names}\n")
    return file


def first_at(curve: list[dict], target: float) -> dict | None:
    return next((c for c in curve if c["map"] >= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--imgsz", type=int, default=160)
    parser.add_argument("--pretrain-epochs", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--targets", type=float, nargs="+", default=[0.1, 0.2, 0.3])
    parser.add_argument("--train-images", type=int, default=512)
    parser.add_argument("--val-images", type=int, default=128)
    parser.add_argument("--out", default=str(ROOT / "runs" / "bench" / "transfer"))
    parser.add_argument("--quick", action="store_true")
    opts = parser.parse_args()
    if opts.worker:
        return worker(opts.worker)
    if opts.quick:
        opts.imgsz, opts.pretrain_epochs, opts.epochs, opts.train_images, opts.val_images = 64, 1, 2, 32, 16
    out = Path(opts.out).resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tmp = Path(tempfile.mkdtemp(prefix="yolo_cb_transfer_"))
    n_train, n_val = opts.train_images, opts.val_images
    try:
        pre = tmp / "pretrain_shapes"
        t0 = time.perf_counter()
        subprocess.run([sys.executable, str(MAKE_SHAPES), str(pre), "--train", str(n_train), "--val", str(n_val), "--seed",
                        str(PRETRAIN_SEED), "--classes", PRETRAIN_CLASSES], check=True, stdout=subprocess.DEVNULL)
        print(f"pretraining set: {pre} ({n_train} train / {n_val} val, classes {PRETRAIN_CLASSES}, seed {PRETRAIN_SEED}), "
              f"made in {time.perf_counter() - t0:.0f} s", flush=True)
        shapes = SHARED / "datasets" / "shapes"
        if (n_train, n_val) != (512, 128):  # the first images of each split via .txt lists
            for split, n in (("train", n_train), ("val", n_val)):
                files = sorted((shapes / "images" / split).glob("*.jpg"))[:n]
                (tmp / f"{split}.txt").write_text("\n".join(map(str, files)) + "\n")
            target_yaml = data_yaml(tmp, shapes, ["circle", "rectangle", "triangle", "cross"], str(tmp / "train.txt"), str(tmp / "val.txt"))
        else:
            target_yaml = data_yaml(tmp, shapes, ["circle", "rectangle", "triangle", "cross"])
        pre_yaml = data_yaml(tmp, pre, PRETRAIN_CLASSES.split(","))

        common = {**RECIPE, "imgsz": opts.imgsz, "project": str(out)}
        print(f"pretraining yolox-nano from scratch on it for {opts.pretrain_epochs} epochs (1 thread) ...", flush=True)
        pretrain = launch("pretrain", "yolox-nano.yaml", {**common, "data": str(pre_yaml), "epochs": opts.pretrain_epochs, "name": "pretrain"},
                          out, threads=1, core=0)
        wait([pretrain])
        pre_result = json.loads((out / "pretrain.json").read_text())
        start = pre_result["best"]
        print(f"pretraining done in {pre_result['total_seconds']:.0f} s; best mAP50-95 on its own val set "
              f"{max(c['map'] for c in pre_result['curve']):.3f}; fine-tuning from {start}", flush=True)

        target = {**common, "data": str(target_yaml), "epochs": opts.epochs}
        print(f"side by side on shapes, {opts.epochs} epochs each, one core and one thread each ...", flush=True)
        runs = [launch("scratch", "yolox-nano.yaml", {**target, "name": "scratch"}, out, threads=1, core=0),
                launch("transfer", start, {**target, "name": "transfer"}, out, threads=1, core=1)]
        wait(runs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    results = {label: json.loads((out / f"{label}.json").read_text()) for label in ("pretrain", "scratch", "transfer")}
    transferred = next((line.strip() for line in (out / "transfer.log").read_text().splitlines() if "transferred" in line), "?")
    (out / "results.json").write_text(json.dumps({"settings": {**vars(opts), **RECIPE}, **results}, indent=1))
    scratch, transfer = results["scratch"]["curve"], results["transfer"]["curve"]
    print(f"\nrecipe (every run): imgsz={opts.imgsz} " + " ".join(f"{k}={v}" for k, v in RECIPE.items()))
    print(f"pretraining: {opts.pretrain_epochs} epochs on {n_train} images of {PRETRAIN_CLASSES} (seed {PRETRAIN_SEED}), "
          f"{results['pretrain']['total_seconds']:.0f} s; fine-tune log: {transferred}\n")
    print(f"target set: shapes, {n_train} train / {n_val} val images\n")
    print("| epoch | from scratch mAP50-95 | s | fine-tuned mAP50-95 | s |")
    print("|---:|---:|---:|---:|---:|")
    for a, b in zip(scratch, transfer, strict=False):
        print(f"| {a['epoch']} | {a['map']:.3f} | {a['seconds']:.0f} | {b['map']:.3f} | {b['seconds']:.0f} |")
    print("\n| target mAP50-95 | from scratch | fine-tuned |")
    print("|---:|---:|---:|")
    for t in opts.targets:
        cells = []
        for curve in (scratch, transfer):
            hit = first_at(curve, t)
            cells.append(f"epoch {hit['epoch']}, {hit['seconds']:.0f} s" if hit else f"not reached in {len(curve)} epochs ({curve[-1]['seconds']:.0f} s)")
        print(f"| {t:g} | {cells[0]} | {cells[1]} |")
    print(f"\nraw figures: {out / 'results.json'}")


if __name__ == "__main__":
    main()
