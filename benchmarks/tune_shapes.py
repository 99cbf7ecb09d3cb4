"""A short tune on shapes, and the best trial against the default settings at the same epochs, side by side.

    python benchmarks/tune_shapes.py [--model yolocb-n.yaml] [--iterations 8] [--epochs 5] [--imgsz 128] [--batch 16]
                                     [--nbs 64] [--train-images 512] [--val-images 128] [--out /tmp/tune_shapes]

1. `YOLO(model).tune(data=shapes, iterations=N, epochs=E, imgsz=S)`: the default search space, the default
   median pruner, TPE seeded with seed=0; trial 0 is the settings as given (the baseline).
2. A plain `train` with the default settings (optimizer=auto, ...), the same model, data, epochs, image size, batch and
   nbs (both parts get exactly the same fixed settings; the tune only changes the settings of its search space).

Printed: every trial (state, epochs trained, fitness, mAP50, mAP50-95, seconds), then the best trial's mAP beside the
default training's, and the wall time of each part; raw figures in OUT/results.json. ../shared/datasets/shapes is used
in place (512 train / 128 val images; --train-images / --val-images take the first N of each split, sorted by name).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("YOLO_CB_SHARED", ROOT.parent / "shared"))
NAMES = ["circle", "rectangle", "triangle", "cross"]
MAPS = ("metrics/mAP50(B)", "metrics/mAP50-95(B)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="yolocb-n.yaml", help="YOLOCB-n leaves mAP 0 within a few epochs; YOLOX-nano does not")
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--imgsz", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--nbs", type=int, default=64, help="nominal batch: 64 accumulates 4 batches of 16 per optimizer step")
    parser.add_argument("--train-images", type=int, default=512)
    parser.add_argument("--val-images", type=int, default=128)
    parser.add_argument("--out", default="/tmp/tune_shapes")
    opt = parser.parse_args()

    from yolo_cb import YOLO

    out = Path(opt.out)
    out.mkdir(parents=True, exist_ok=True)
    images = SHARED / "datasets" / "shapes" / "images"
    for split, count in (("train", opt.train_images), ("val", opt.val_images)):
        (out / f"{split}.txt").write_text("\n".join(map(str, sorted((images / split).glob("*.jpg"))[:count])) + "\n")
    data = out / "shapes.yaml"
    data.write_text(f"path: {out}\ntrain: train.txt\nval: val.txt\nnames: {NAMES}\n")
    common = dict(data=str(data), epochs=opt.epochs, imgsz=opt.imgsz, batch=opt.batch, nbs=opt.nbs, workers=0, mlflow=False, tensorboard=False, onnx_check=False, plots=False)

    t0 = time.perf_counter()
    result = YOLO(opt.model).tune(**common, iterations=opt.iterations, project=str(out), name="tune")
    tune_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    default = YOLO(opt.model).train(**common, project=str(out), name="default")
    default_s = time.perf_counter() - t0

    with open(Path(result["save_dir"]) / "trials.csv", newline="") as f:
        trials = list(csv.DictReader(f))
    print(f"{'trial':>5} {'state':>9} {'epochs':>6} {'fitness':>8} {'mAP50':>7} {'mAP50-95':>8} {'seconds':>8}")
    for t in trials:
        print(f"{t['number']:>5} {t['state']:>9} {t['epochs']:>6} {_f(t['fitness']):>8} {_f(t['mAP50(B)']):>7} {_f(t['mAP50-95(B)']):>8} "
              f"{_f(t['duration_s'], 1):>8}")
    best = next(t for t in trials if int(t["number"]) == result["best_trial"])
    print(f"\n{'':<32}{'mAP50':>8}{'mAP50-95':>10}")
    print(f"{'default settings (train)':<32}{default[MAPS[0]]:>8.4f}{default[MAPS[1]]:>10.4f}")
    print(f"{'best trial ' + best['number']:<32}{float(best['mAP50(B)']):>8.4f}{float(best['mAP50-95(B)']):>10.4f}")
    print(f"\ntune: {tune_s:.0f}s ({result['trials']}); default training: {default_s:.0f}s")
    print(f"best settings: {result['best_hyperparameters']}")
    (out / "results.json").write_text(json.dumps({"settings": vars(opt), "tune": result, "tune_s": tune_s, "default": default,
                                                   "default_s": default_s, "trials": trials}, indent=1, default=str))


def _f(value: str, digits: int = 4) -> str:
    return f"{float(value):.{digits}f}" if value not in ("", None) else "-"


if __name__ == "__main__":
    main()
