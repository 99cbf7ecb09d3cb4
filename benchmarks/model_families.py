"""Accuracy per epoch of model families under one recipe: train each model YAML from scratch on ../shared/datasets/shapes.

    python benchmarks/model_families.py --model yolocb-n.yaml [--model yolox-nano.yaml] [--epochs 6] [--imgsz 256] [key=value ...]

Each model is trained in turn with the same recipe (below; key=value pairs override it, e.g. lr0=0.001) and
validated every epoch. Printed per model: mAP50 and mAP50-95 per epoch, training and validation seconds per epoch,
then one table with every model's mAP50-95 curve side by side. Torch runs with --threads threads (default 1, so
two models can be compared at once, one per core, on a shared machine: accuracy per epoch does not depend on it).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("YOLO_CB_SHARED", ROOT.parent / "shared"))
MAP_KEY = "metrics/mAP50-95(B)"  # the figure compared
# The equal recipe of issue 14 (both families get exactly this): batch 16, nominal batch 16 (a step per batch), AdamW.
RECIPE = dict(batch=16, nbs=16, optimizer="AdamW", lr0=0.002, warmup_epochs=1.0, workers=0, seed=0, cos_lr=False,
              mlflow=False, tensorboard=False, onnx_check=False, plots=False, val=True, exist_ok=True, device="cpu")
NO_MOSAIC_EPOCHS = 2  # the last epochs train without mosaic (no_aug_epochs; Ultralytics' close_mosaic)


def data_yaml(folder: Path) -> Path:
    """A dataset YAML in `folder` that points at the shared shapes dataset."""
    path = folder / "shapes.yaml"
    path.write_text(f"path: {SHARED / 'datasets' / 'shapes'}\ntrain: images/train\nval: images/val\n"
                    "names: [circle, rectangle, triangle, cross]\n")
    return path


def train_one(model_cfg: str, settings: dict) -> list[dict]:
    """Train `model_cfg` with `settings`; one row per epoch: epoch, train_s, val_s, wall_s, map50, map."""
    from yolo_cb import YOLO

    rows: list[dict] = []
    clock: dict[str, float] = {}

    def on_train_start(trainer):
        clock["start"] = time.perf_counter()

    def on_train_epoch_start(trainer):
        clock["epoch"] = time.perf_counter()

    def on_train_epoch_end(trainer):
        clock["train_end"] = time.perf_counter()

    def on_fit_epoch_end(trainer):
        now = time.perf_counter()
        rows.append({"epoch": trainer.epoch + 1, "train_s": clock["train_end"] - clock["epoch"], "val_s": now - clock["train_end"],
                     "wall_s": now - clock["start"], "map50": float(trainer.metrics.get("metrics/mAP50(B)", 0.0)),
                     "map": float(trainer.metrics.get(MAP_KEY, 0.0))})
        r = rows[-1]
        print(f"[model_families] {model_cfg} epoch {r['epoch']}: mAP50 {r['map50']:.3f} mAP50-95 {r['map']:.3f} "
              f"(train {r['train_s']:.0f}s, val {r['val_s']:.0f}s)", flush=True)

    model = YOLO(model_cfg)
    for fn in (on_train_start, on_train_epoch_start, on_train_epoch_end, on_fit_epoch_end):
        model.add_callback(fn.__name__, fn)
    model.train(**settings)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", help="model YAML (repeat to compare several); default yolocb-n.yaml and yolox-nano.yaml")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--imgsz", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1, help="torch / OpenMP threads")
    parser.add_argument("--project", default=str(ROOT / "runs" / "bench" / "model_families"))
    parser.add_argument("overrides", nargs="*", help="key=value train settings over the recipe")
    opts = parser.parse_args()
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[key] = str(opts.threads)
    import torch
    import yaml

    torch.set_num_threads(opts.threads)
    extra = {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in opts.overrides)}
    models = opts.model or ["yolocb-n.yaml", "yolox-nano.yaml"]
    data = data_yaml(Path(tempfile.mkdtemp()))
    settings = {**RECIPE, "no_aug_epochs": NO_MOSAIC_EPOCHS, "close_mosaic": NO_MOSAIC_EPOCHS, **extra, "data": str(data),
                "epochs": opts.epochs, "imgsz": opts.imgsz, "project": opts.project}
    print("settings:", " ".join(f"{k}={v}" for k, v in settings.items() if k not in ("data", "project")), f"threads={opts.threads}")
    curves = {}
    for model_cfg in models:
        rows = train_one(model_cfg, {**settings, "name": Path(model_cfg).stem})
        curves[model_cfg] = rows
        print(f"\n{model_cfg}\n{'epoch':>5} {'mAP50':>7} {'mAP50-95':>9} {'train s':>8} {'val s':>6}")
        for r in rows:
            print(f"{r['epoch']:>5} {r['map50']:>7.3f} {r['map']:>9.3f} {r['train_s']:>8.1f} {r['val_s']:>6.1f}")
        print(f"mean seconds per epoch: train {sum(r['train_s'] for r in rows) / len(rows):.1f}, "
              f"with validation {rows[-1]['wall_s'] / len(rows):.1f}")
    print("\n| epoch | " + " | ".join(f"{m} mAP50-95" for m in curves) + " |")
    print("|---:|" + "---:|" * len(curves))
    for i in range(max(len(rows) for rows in curves.values())):
        cells = [f"{rows[i]['map']:.3f}" if i < len(rows) else "" for rows in curves.values()]
        print(f"| {i + 1} | " + " | ".join(cells) + " |")
    print("| s/epoch (train + val) | " + " | ".join(f"{rows[-1]['wall_s'] / len(rows):.1f}" for rows in curves.values()) + " |")


if __name__ == "__main__":
    main()
