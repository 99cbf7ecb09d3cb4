"""Where a training iteration's time goes on this machine, measured side by side in one run.

    python benchmarks/train_step.py [--model yolox-nano.yaml] [--imgsz 320] [--batch 16] [--steps 6]

1. The model step (forward, loss, backward, optimizer) on a fixed real batch: NCHW, channels_last, each also under
   CPU bf16 autocast, and (--compile) channels_last through torch.compile; interleaved so machine noise hits all alike.
2. A full train iteration (loader + step) with workers 0, 1 and 2 on ../shared/datasets/shapes (mosaic on).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from yolo_cb.data.loading.loader import build_dataloader, build_yolo_dataset
from yolo_cb.nn import build_model
from yolo_cb.settings.config import get_config

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("YOLO_CB_SHARED", ROOT.parent / "shared"))


def model_step(model, optimizer, images, targets, bf16: bool = False) -> float:
    t = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
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
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--compile", action="store_true", help="also time channels_last through torch.compile (inductor)")
    parser.add_argument("--no-loader", action="store_true", help="skip part 2 (the full iterations)")
    opts = parser.parse_args()
    if opts.threads:
        torch.set_num_threads(opts.threads)
    args = get_config({"imgsz": opts.imgsz, "batch": opts.batch})
    names = {0: "circle", 1: "rectangle", 2: "triangle", 3: "cross"}
    train = str(SHARED / "datasets" / "shapes" / "images" / "train")
    dataset = build_yolo_dataset(args, train, "train", names, batch=opts.batch)
    batch = next(iter(build_dataloader(dataset, opts.batch, 0, shuffle=True)))
    images, targets = batch["img"].float() / 255, batch["targets"]

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {opts.model} imgsz {opts.imgsz} batch {opts.batch}")
    variants = {}
    kinds = [("NCHW", torch.contiguous_format, False), ("channels_last", torch.channels_last, False),
             ("NCHW bf16", torch.contiguous_format, True), ("channels_last bf16", torch.channels_last, True)]
    for name, fmt, bf16 in kinds + ([("channels_last compiled", torch.channels_last, False)] if opts.compile else []):
        torch.manual_seed(0)
        model = build_model(opts.model, nc=4, verbose=False).train().to(memory_format=fmt)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        run = torch.compile(model) if name.endswith("compiled") else model
        variants[name] = (run, opt, images.contiguous(memory_format=fmt), bf16)
    times = {name: [] for name in variants}
    for step in range(opts.steps + 2):  # interleaved; the first two rounds are warmup (compilation, oneDNN kernels)
        for name, (model, opt, x, bf16) in variants.items():
            dt = model_step(model, opt, x, targets, bf16)
            if step > 1:
                times[name].append(dt)
    base = statistics.median(times["NCHW"])
    print(f"\n{'model step':<24}{'median s':>10}{'ratio':>8}")
    for name, ts in times.items():
        print(f"{name:<24}{statistics.median(ts):>10.3f}{statistics.median(ts) / base:>8.2f}")
    if opts.no_loader:
        return

    model, opt, _, _ = variants["channels_last"]
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
