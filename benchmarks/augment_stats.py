"""What the two trainers' first epoch shows the model: the training samples of yolo-cb and Ultralytics side by side.

    python benchmarks/augment_stats.py --data ../shared/datasets/shapes [--imgsz 320] [--samples 512]
                                       [--ultralytics-python /work/venv-ul/bin/python]

Each side builds its own training dataset from the same data.yaml with its default augmentation (mosaic, random
affine, flips, HSV: the settings the equal recipe of benchmarks/vs_ultralytics.py leaves at each side's defaults) and
draws `samples` augmented samples (--seed, default 0): ours from the loader a training run builds (workers=0, batch 16,
so with the mosaic partner pools of issue 58), Ultralytics' from its dataset (its own buffer of partners). With
PYTHONPATH at another yolo-cb checkout, `--side ours` measures that one (a before/after). Printed per side: boxes per sample, box sides in pixels (quantiles), boxes
under 8 px, the share of padding pixels (grey 114) and of samples that are mosaics. Each side runs in its own venv.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PAD = 114  # the grey both sides fill borders with


def summary(boxes_per_sample: list[int], sides: np.ndarray, pad_shares: list[float]) -> dict:
    """The figures of one side from its samples (sides: (N, 2) box widths and heights in pixels)."""
    short = sides.min(axis=1) if len(sides) else np.zeros(0)
    q = lambda a, p: float(np.quantile(a, p)) if len(a) else 0.0  # noqa: E731
    return {"samples": len(boxes_per_sample), "boxes/sample": float(np.mean(boxes_per_sample)),
            "empty samples": int(sum(n == 0 for n in boxes_per_sample)), "short side p10": q(short, 0.1),
            "short side median": q(short, 0.5), "long side p90": q(sides.max(axis=1) if len(sides) else short, 0.9),
            "boxes < 8 px": float(np.mean(short < 8)) if len(short) else 0.0, "padding share": float(np.mean(pad_shares))}


def ours(data: Path, imgsz: int, samples: int, seed: int) -> dict:
    import random

    import torch

    from yolo_cb.data.loading.loader import build_yolo_dataset
    from yolo_cb.data.resolve import check_data
    from yolo_cb.settings.config import get_config

    random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
    args = get_config({"imgsz": imgsz, "data": str(data)})
    spec = check_data(str(data), args.datasets_dir)
    dataset = build_yolo_dataset(args, spec["train"], "train", spec["names"], batch=16)
    counts, sides, pads = [], [], []
    for batch in training_batches(dataset, seed, samples):
        for i, img in enumerate(batch["img"]):
            boxes = batch["targets"][batch["targets"][:, 0] == i]
            counts.append(len(boxes))
            sides.extend(boxes[:, 4:6].tolist())
            pads.append(float((img == PAD).all(dim=0).float().mean()))
    return summary(counts[:samples], np.array(sides).reshape(-1, 2), pads[:samples])


def training_batches(dataset, seed: int, samples: int):
    """Batches of 16 from the loader a training run builds (workers=0), epoch after epoch, until `samples` are out: what
    a run trains on (since issue 58 the loader gives each batch its pool of mosaic partners)."""
    import inspect

    from yolo_cb.data.loading.loader import build_dataloader

    older = "span_epochs" not in inspect.signature(build_dataloader).parameters  # yolo-cb before issue 58 (a before/after run)
    loader = build_dataloader(dataset, 16, 0, shuffle=True, seed=seed, **({} if older else {"span_epochs": True}))
    epoch, seen = 0, 0
    while seen < samples:
        loader.set_epoch(epoch)
        for batch in loader:
            yield batch
            seen += len(batch["img"])
            if seen >= samples:
                return
        epoch += 1


def ultralytics(data: Path, imgsz: int, samples: int, seed: int) -> dict:
    import random

    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
    cfg = get_cfg(overrides={"imgsz": imgsz, "data": str(data)})
    spec = check_det_dataset(str(data))
    dataset = build_yolo_dataset(cfg, spec["train"], 16, spec, mode="train")
    counts, sides, pads = [], [], []
    for i in range(samples):
        sample = dataset[i % len(dataset)]
        h, w = sample["img"].shape[1:]
        boxes = sample["bboxes"].reshape(-1, 4).numpy() * np.array([w, h, w, h])  # normalised cx cy w h -> pixels
        counts.append(len(boxes))
        sides.extend(boxes[:, 2:4].tolist())
        pads.append(float((sample["img"] == PAD).all(dim=0).float().mean()))
    return summary(counts, np.array(sides).reshape(-1, 2), pads)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="a YOLO dataset folder with data.yaml, or the YAML")
    ap.add_argument("--imgsz", type=int, default=320)
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0, help="another seed shows the figures' sampling noise")
    ap.add_argument("--ultralytics-python", default="/work/venv-ul/bin/python")
    ap.add_argument("--side", choices=("ours", "ultralytics"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    data = a.data / "data.yaml" if a.data.is_dir() else a.data
    if a.side:
        print(json.dumps((ours if a.side == "ours" else ultralytics)(data.resolve(), a.imgsz, a.samples, a.seed)))
        return
    results = {}
    for side, python in (("ours", sys.executable), ("ultralytics", a.ultralytics_python)):
        out = subprocess.run([python, __file__, "--data", str(data), "--imgsz", str(a.imgsz), "--samples", str(a.samples), "--seed", str(a.seed), "--side", side],
                             capture_output=True, text=True, check=True, cwd=ROOT)
        results[side] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"| {data.parent.name}, imgsz {a.imgsz}, {a.samples} samples, seed {a.seed} | yolo-cb | Ultralytics |\n|---|---:|---:|")
    for key in results["ours"]:
        print(f"| {key} | {results['ours'][key]:.3g} | {results['ultralytics'][key]:.3g} |")


if __name__ == "__main__":
    main()
