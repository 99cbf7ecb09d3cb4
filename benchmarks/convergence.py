"""Time to accuracy: train from scratch on ../shared/datasets/shapes until val mAP50-95 reaches a target.

    python benchmarks/convergence.py [--model yolox-nano.yaml] [--target 0.14] [--max-epochs 30] [key=value ...]

Validates every epoch and prints the curve (epoch, wall seconds, mAP50-95), seconds per epoch and
train images per second. Extra key=value pairs go to model.train() (e.g. channels_last=False).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import yaml

from yolo_cb import YOLO

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("YOLO_CB_SHARED", ROOT.parent / "shared"))
# The recipe measured in BENCHMARKS.md: batch 16 at imgsz 320 as the Ultralytics reference; nbs=16 (one optimizer
# step per batch: 4x more updates per epoch than nbs=64, which is what matters on a short CPU run).
RECIPE = dict(imgsz=320, batch=16, nbs=16, optimizer="AdamW", lr0=0.002, warmup_epochs=1.0, workers=0, channels_last=True,
              no_aug_epochs=0, mlflow=False, tensorboard=False, onnx_check=False, plots=False, val=True, exist_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="yolox-nano.yaml")
    parser.add_argument("--target", type=float, default=0.14)
    parser.add_argument("--max-epochs", type=int, default=30)
    parser.add_argument("overrides", nargs="*", help="key=value settings passed to train()")
    opts = parser.parse_args()
    extra = {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in opts.overrides)}

    data = Path(tempfile.mkdtemp()) / "shapes.yaml"
    data.write_text(f"path: {SHARED / 'datasets' / 'shapes'}\ntrain: images/train\nval: images/val\n"
                    "names: [circle, rectangle, triangle, cross]\n")
    curve: list[tuple[int, float, float]] = []
    epoch_times: list[float] = []
    start = {}

    def on_train_start(trainer):
        start["t"] = time.perf_counter()

    def on_train_epoch_start(trainer):
        start["epoch"] = time.perf_counter()

    def on_train_epoch_end(trainer):
        epoch_times.append(time.perf_counter() - start["epoch"])

    def on_fit_epoch_end(trainer):
        score = trainer.metrics.get("metrics/mAP50-95(B)", 0.0)
        curve.append((trainer.epoch + 1, time.perf_counter() - start["t"], score))
        print(f"[convergence] epoch {trainer.epoch + 1}: {curve[-1][1]:.0f}s mAP50-95 {score:.4f}", flush=True)
        if score >= opts.target:
            trainer.stop, trainer.stop_reason = True, f"target mAP50-95 {opts.target} reached"

    model = YOLO(opts.model)
    for fn in (on_train_start, on_train_epoch_start, on_train_epoch_end, on_fit_epoch_end):
        model.add_callback(fn.__name__, fn)
    settings = {**RECIPE, **extra, "data": str(data), "epochs": opts.max_epochs, "project": str(ROOT / "runs" / "bench"), "name": "convergence"}
    model.train(**settings)
    n_train = len(model.trainer.train_loader.dataset)
    print("\nsettings:", " ".join(f"{k}={v}" for k, v in settings.items() if k not in ("data", "project", "name")))
    print(f"{'epoch':>5} {'seconds':>8} {'mAP50-95':>9}")
    for epoch, seconds, score in curve:
        print(f"{epoch:>5} {seconds:>8.0f} {score:>9.4f}")
    mean_epoch = sum(epoch_times) / len(epoch_times)
    reached = next((c for c in curve if c[2] >= opts.target), None)
    print(f"train seconds per epoch (no validation): {mean_epoch:.1f}; train images/s: {n_train / mean_epoch:.1f}")
    print(f"target {opts.target}: " + (f"reached at epoch {reached[0]} after {reached[1]:.0f} s ({reached[1] / 60:.1f} min)" if reached else "not reached"))


if __name__ == "__main__":
    main()
