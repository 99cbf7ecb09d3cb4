"""Side by side in one run: seconds per epoch of yolo-cb (the convergence recipe) and Ultralytics YOLO11n.

    python benchmarks/ultralytics_reference.py [--epochs 2]

Needs `ultralytics` importable (it is not a dependency of yolo-cb; install it in a separate venv that
sees this project's packages). Both train from scratch on ../shared/datasets/shapes at imgsz 320, batch 16,
workers 0, validating every epoch; the printed ratio is what BENCHMARKS.md uses with Ultralytics'
published epochs-to-target.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("YOLO_CB_SHARED", ROOT.parent / "shared"))


def data_yaml() -> Path:
    path = Path(tempfile.mkdtemp()) / "shapes.yaml"
    path.write_text(f"path: {SHARED / 'datasets' / 'shapes'}\ntrain: images/train\nval: images/val\n"
                    "names: {0: circle, 1: rectangle, 2: triangle, 3: cross}\n")
    return path


def time_epochs(add_callback, train) -> list[tuple[float, float]]:
    """[(seconds of the epoch incl. validation, mAP50-95)] via each framework's on_fit_epoch_end (training epochs only)."""
    marks: list[tuple[float, float]] = []
    start = [time.perf_counter()]

    def on_fit_epoch_end(trainer):
        now = time.perf_counter()
        marks.append((now - start[0], float(trainer.metrics.get("metrics/mAP50-95(B)", 0.0))))
        start[0] = now

    add_callback("on_fit_epoch_end", on_fit_epoch_end)
    add_callback("on_train_start", lambda trainer: start.__setitem__(0, time.perf_counter()))
    train()
    return marks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--target", type=float, default=0.14)
    opts = parser.parse_args()
    data = data_yaml()
    project = Path(tempfile.mkdtemp())

    from benchmarks.convergence import RECIPE
    from yolo_cb import YOLO as YoloCB

    ours = YoloCB("yolox-nano.yaml")
    cb = time_epochs(ours.add_callback, lambda: ours.train(**{**RECIPE, "data": str(data), "epochs": opts.epochs, "project": str(project), "name": "cb"}))

    from ultralytics import YOLO as UltralyticsYOLO

    theirs = UltralyticsYOLO("yolo11n.yaml")
    ul = time_epochs(theirs.add_callback, lambda: theirs.train(data=str(data), epochs=opts.epochs, imgsz=320, batch=16, workers=0, device="cpu",
                                                                 plots=False, project=str(project), name="ul", amp=False, verbose=False))
    cb, ul = cb[:opts.epochs], ul[:opts.epochs]  # Ultralytics fires on_fit_epoch_end once more after its final validation
    print(f"\n{'framework':<34}{'s/epoch (mean, incl. val)':>27}  mAP50-95 per epoch")
    for name, marks in (("yolo-cb yolox-nano (recipe)", cb), ("ultralytics YOLO11n (defaults)", ul)):
        mean = sum(m[0] for m in marks) / len(marks)
        print(f"{name:<34}{mean:>27.1f}  {' '.join(f'{m[1]:.3f}' for m in marks)}")
    ratio = (sum(m[0] for m in ul) / len(ul)) / (sum(m[0] for m in cb) / len(cb))
    print(f"Ultralytics epoch / yolo-cb epoch: {ratio:.2f}x")
    for name, marks in (("yolo-cb", cb), ("ultralytics", ul)):
        elapsed, reached = 0.0, None
        for epoch, (seconds, score) in enumerate(marks, 1):
            elapsed += seconds
            if score >= opts.target and reached is None:
                reached = (epoch, elapsed)
        print(f"{name}: mAP50-95 >= {opts.target} " + (f"at epoch {reached[0]} after {reached[1]:.0f} s" if reached else "not reached"))


if __name__ == "__main__":
    main()
