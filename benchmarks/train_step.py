"""Where a training iteration's time goes on this machine, measured side by side in one run.

    python benchmarks/train_step.py [--model yolox-nano.yaml] [--imgsz 320] [--batch 16] [--steps 6]

1. The model step (forward, loss, backward, optimizer) on a fixed real batch, NCHW vs channels_last,
   interleaved so machine noise hits both alike.
2. A full train iteration (loader + step) with workers 0, 1 and 2 on ../shared/datasets/shapes (mosaic on).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from yolo_cb.config import get_config
from yolo_cb.data.loader import build_dataloader, build_yolo_dataset
from yolo_cb.nn import build_model

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("YOLO_CB_SHARED", ROOT.parent / "shared"))


def model_step(model, optimizer, images, targets) -> float:
    t = time.perf_counter()
    loss = model(images, targets)["total"]
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="yolox-nano.yaml")
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=6)
    opts = parser.parse_args()
    args = get_config({"imgsz": opts.imgsz, "batch": opts.batch})
    names = {0: "circle", 1: "rectangle", 2: "triangle", 3: "cross"}
    train = str(SHARED / "datasets" / "shapes" / "images" / "train")
    dataset = build_yolo_dataset(args, train, "train", names, batch=opts.batch)
    batch = next(iter(build_dataloader(dataset, opts.batch, 0, shuffle=True)))
    images, targets = batch["img"].float() / 255, batch["targets"]

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {opts.model} imgsz {opts.imgsz} batch {opts.batch}")
    variants = {}
    for name, fmt in (("NCHW", torch.contiguous_format), ("channels_last", torch.channels_last)):
        torch.manual_seed(0)
        model = build_model(opts.model, nc=4, verbose=False).train().to(memory_format=fmt)
        variants[name] = (model, torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9), images.contiguous(memory_format=fmt))
    times = {name: [] for name in variants}
    for step in range(opts.steps + 1):  # interleaved; the first round is warmup
        for name, (model, opt, x) in variants.items():
            dt = model_step(model, opt, x, targets)
            if step:
                times[name].append(dt)
    base = statistics.median(times["NCHW"])
    print(f"\n{'model step':<16}{'median s':>10}{'ratio':>8}")
    for name, ts in times.items():
        print(f"{name:<16}{statistics.median(ts):>10.3f}{statistics.median(ts) / base:>8.2f}")

    model, opt, _ = variants["channels_last"]
    print(f"\n{'full iteration':<16}{'median s':>10}{'loader s':>10}  (channels_last model, mosaic on)")
    for workers in (0, 1, 2):
        loader = build_dataloader(dataset, opts.batch, workers, shuffle=True)
        it = iter(loader)
        next(it)
        totals, waits = [], []
        for _ in range(opts.steps):
            t0 = time.perf_counter()
            b = next(it)
            t1 = time.perf_counter()
            model_step(model, opt, (b["img"].float() / 255).contiguous(memory_format=torch.channels_last), b["targets"])
            totals.append(time.perf_counter() - t0)
            waits.append(t1 - t0)
        del it, loader
        print(f"{f'workers={workers}':<16}{statistics.median(totals):>10.3f}{statistics.median(waits):>10.3f}")


if __name__ == "__main__":
    main()
