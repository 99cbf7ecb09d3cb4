"""What the two trainers' first epoch shows the model: the training samples of yolo-cb and Ultralytics side by side.

    python benchmarks/augment_stats.py --data ../shared/datasets/shapes [--imgsz 320] [--samples 512]
                                       [--ultralytics-python /work/venv-ul/bin/python] [--colour-on worker device]

Each side builds its own training dataset from the same data.yaml with its default augmentation (mosaic, random
affine, flips, HSV: the settings the equal recipe of benchmarks/vs_ultralytics.py leaves at each side's defaults) and
draws `samples` augmented samples (--seed, default 0): ours from the loader a training run builds (workers=0, batch 16,
so with the mosaic partner pools of issue 58), Ultralytics' from its dataset (its own buffer of partners). With
PYTHONPATH at another yolo-cb checkout, `--side ours` measures that one (a before/after). Printed per side: boxes per sample, box sides in pixels (quantiles), boxes
under 8 px, the share of padding pixels (grey 114) and of samples that are mosaics, and the per-channel (R, G, B) mean
and standard deviation of the pixels the model is given, after colour (0-255). Each side runs in its own venv.
--colour-on: ours once per value (issue 58 item 2: worker = OpenCV in the workers; device = the gains drawn in the
workers, the batch coloured by data/loading/device_colour.py as the training step does, here on the CPU).
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


def channel_stats(images: list) -> dict:
    """Per-channel mean and std (0-255) over the pixels of uint8 RGB (3, H, W) images."""
    pixels = np.concatenate([np.asarray(img, dtype=np.float64).reshape(3, -1) for img in images], 1)
    mean, std = pixels.mean(1), pixels.std(1)
    return {f"{c} {what}": float(v[i]) for what, v in (("mean", mean), ("std", std)) for i, c in enumerate("RGB")}


def summary(boxes_per_sample: list[int], sides: np.ndarray, pad_shares: list[float]) -> dict:
    """The figures of one side from its samples (sides: (N, 2) box widths and heights in pixels)."""
    short = sides.min(axis=1) if len(sides) else np.zeros(0)
    q = lambda a, p: float(np.quantile(a, p)) if len(a) else 0.0  # noqa: E731
    return {"samples": len(boxes_per_sample), "boxes/sample": float(np.mean(boxes_per_sample)),
            "empty samples": int(sum(n == 0 for n in boxes_per_sample)), "short side p10": q(short, 0.1),
            "short side median": q(short, 0.5), "long side p90": q(sides.max(axis=1) if len(sides) else short, 0.9),
            "boxes < 8 px": float(np.mean(short < 8)) if len(short) else 0.0, "padding share": float(np.mean(pad_shares))}


def loader_module():
    """yolo-cb's loader module on PYTHONPATH: data/loading/loader.py since issue 58, data/loader.py before (a before run)."""
    import importlib

    new = importlib.util.find_spec("yolo_cb.data.loading")
    return importlib.import_module("yolo_cb.data.loading.loader" if new else "yolo_cb.data.loader")


def ours(data: Path, imgsz: int, samples: int, seed: int, colour_on: str = "worker") -> dict:
    import random

    import torch

    from yolo_cb.data.resolve import check_data
    from yolo_cb.settings.config import get_config

    random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
    args = get_config({"imgsz": imgsz, "data": str(data)})
    spec = check_data(str(data), args.datasets_dir)
    extra = {"colour_on_device": True} if colour_on == "device" else {}
    dataset = loader_module().build_yolo_dataset(args, spec["train"], "train", spec["names"], batch=16, **extra)
    counts, sides, pads, images = [], [], [], []
    for batch in training_batches(dataset, seed, samples):
        for i, img in enumerate(coloured(batch)):
            images.append(img)
            boxes = batch["targets"][batch["targets"][:, 0] == i]
            counts.append(len(boxes))
            sides.extend(boxes[:, 4:6].tolist())
            pads.append(float((img == PAD).all(dim=0).float().mean()))
    return {**summary(counts[:samples], np.array(sides).reshape(-1, 2), pads[:samples]), **channel_stats(images[:samples])}


def coloured(batch: dict):
    """The batch's images as the model sees them (x 255, uint8): colour applied here when the workers left it to the device."""
    if "hsv_gains" not in batch:
        return batch["img"]
    from yolo_cb.data.loading.device_colour import hsv_tables, jitter

    return jitter(batch["img"], hsv_tables(batch["hsv_gains"]))


def training_batches(dataset, seed: int, samples: int):
    """Batches of 16 from the loader a training run builds (workers=0), epoch after epoch, until `samples` are out: what
    a run trains on (since issue 58 the loader gives each batch its pool of mosaic partners)."""
    import inspect

    older = "span_epochs" not in inspect.signature(loader_module().build_dataloader).parameters  # yolo-cb before issue 58 (a before/after run)
    loader = loader_module().build_dataloader(dataset, 16, 0, shuffle=True, seed=seed, **({} if older else {"span_epochs": True}))
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
    counts, sides, pads, images = [], [], [], []
    for i in range(samples):
        sample = dataset[i % len(dataset)]
        images.append(sample["img"])
        h, w = sample["img"].shape[1:]
        boxes = sample["bboxes"].reshape(-1, 4).numpy() * np.array([w, h, w, h])  # normalised cx cy w h -> pixels
        counts.append(len(boxes))
        sides.extend(boxes[:, 2:4].tolist())
        pads.append(float((sample["img"] == PAD).all(dim=0).float().mean()))
    return {**summary(counts, np.array(sides).reshape(-1, 2), pads), **channel_stats(images)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="a YOLO dataset folder with data.yaml, or the YAML")
    ap.add_argument("--imgsz", type=int, default=320)
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0, help="another seed shows the figures' sampling noise")
    ap.add_argument("--ultralytics-python", default="/work/venv-ul/bin/python")
    ap.add_argument("--colour-on", nargs="+", choices=("worker", "device"), default=["worker"], help="ours once per value")
    ap.add_argument("--side", choices=("ours", "ultralytics"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    data = a.data / "data.yaml" if a.data.is_dir() else a.data
    if a.side:
        fn = (lambda *x: ours(*x, a.colour_on[0])) if a.side == "ours" else ultralytics
        print(json.dumps(fn(data.resolve(), a.imgsz, a.samples, a.seed)))
        return
    results = {}
    runs = [(f"yolo-cb (colour_on={c})", "ours", sys.executable, c) for c in a.colour_on]
    for label, side, python, colour in runs + [("Ultralytics", "ultralytics", a.ultralytics_python, "worker")]:
        out = subprocess.run([python, __file__, "--data", str(data), "--imgsz", str(a.imgsz), "--samples", str(a.samples), "--seed", str(a.seed),
                              "--side", side, "--colour-on", colour], capture_output=True, text=True, check=True, cwd=ROOT)
        results[label] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"| {data.parent.name}, imgsz {a.imgsz}, {a.samples} samples, seed {a.seed} | {' | '.join(results)} |\n|---|{'---:|' * len(results)}")
    for key in results[runs[0][0]]:
        print(f"| {key} | {' | '.join(f'{r[key]:.5g}' for r in results.values())} |")


if __name__ == "__main__":
    main()
