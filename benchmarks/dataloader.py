"""Images per second of the training data pipeline (mosaic on, default augmentation).

    python benchmarks/dataloader.py [SHAPES_DIR] [--batches N]

SHAPES_DIR defaults to $YOLO_CB_SHARED/datasets/shapes, else <repo>/../shared/datasets/shapes.
The shared folder is only read: the script works through a temporary folder of symlinks, so
the label cache is written there. Prints a markdown table for BENCHMARKS.md: imgsz 320 and
640, workers 0 and 2, images decoded per sample or cached in RAM; then the cost of each
transform (workers=0).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def shapes_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    shared = Path(os.environ.get("YOLO_CB_SHARED", REPO.parent / "shared"))
    return shared / "datasets" / "shapes"


def read_only_view(src: Path, dest: Path) -> Path:
    """dest/images/train and dest/labels/train as symlinks to src: caches land in dest, never in src."""
    for kind in ("images", "labels"):
        (dest / kind).mkdir(parents=True)
        (dest / kind / "train").symlink_to(src / kind / "train", target_is_directory=True)
    return dest / "images" / "train"


def settings(imgsz: int, cache):
    import yaml

    from yolo_cb.utils.paths import DEFAULT_CFG

    cfg = yaml.safe_load(DEFAULT_CFG.read_text())
    cfg.update(imgsz=imgsz, cache=cache, mosaic=1.0, batch=16)
    return types.SimpleNamespace(**cfg)


def images_per_second(img_path, imgsz: int, workers: int, cache, batches: int) -> tuple[float, float]:
    """(images/s after the first batch, seconds to the first batch)."""
    from yolo_cb.data.loading.loader import build_dataloader, build_yolo_dataset

    names = {0: "circle", 1: "rectangle", 2: "triangle", 3: "cross"}
    ds = build_yolo_dataset(settings(imgsz, cache), img_path, "train", names)
    loader = build_dataloader(ds, 16, workers, shuffle=True, seed=0)
    start = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter() - start
    n, t0 = 0, time.perf_counter()
    for _ in range(batches):
        try:
            n += len(next(it)["im_files"])
        except StopIteration:
            it = iter(loader)
    elapsed = time.perf_counter() - t0
    loader.reset_workers()
    return n / elapsed, first


def transform_costs(img_path, imgsz: int, samples: int = 100) -> dict[str, float]:
    """Milliseconds per sample of loading and of each transform (workers=0, no cache)."""
    import numpy as np

    from yolo_cb.data.loading.loader import build_yolo_dataset

    ds = build_yolo_dataset(settings(imgsz, False), img_path, "train", {i: str(i) for i in range(4)})
    costs = {"load": 0.0} | {type(t).__name__: 0.0 for t in ds.transforms} | {"format": 0.0}
    np.random.seed(0)
    for i in range(samples):
        t = time.perf_counter()
        sample = ds.get_image_and_label(i % len(ds))
        costs["load"] += time.perf_counter() - t
        for tr in ds.transforms:
            t = time.perf_counter()
            sample = tr(sample)
            costs[type(tr).__name__] += time.perf_counter() - t
        t = time.perf_counter()
        ds.format(sample)
        costs["format"] += time.perf_counter() - t
    return {k: 1000 * v / samples for k, v in costs.items()}


def main():
    import logging

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shapes", nargs="?", help="shapes dataset folder (with images/train, labels/train)")
    ap.add_argument("--batches", type=int, default=24, help="batches of 16 timed per configuration")
    a = ap.parse_args()
    logging.getLogger("yolo_cb").setLevel(logging.ERROR)
    src = shapes_dir(a.shapes)
    if not (src / "images" / "train").is_dir():
        sys.exit(f"no shapes dataset at {src} (pass its folder, or set YOLO_CB_SHARED)")
    with tempfile.TemporaryDirectory(prefix="yolo_cb_bench_") as tmp:
        img_path = str(read_only_view(src.resolve(), Path(tmp)))
        print(f"dataset: {src} (train split), batch 16, mosaic 1.0, default augmentation, {os.cpu_count()} CPUs")
        print("\n| imgsz | workers | cache | images/s | ms/image | first batch (s) |")
        print("|------:|--------:|:------|---------:|---------:|----------------:|")
        for imgsz in (320, 640):
            for cache in (False, "ram"):
                for workers in (0, 2):
                    ips, first = images_per_second(img_path, imgsz, workers, cache, a.batches)
                    print(f"| {imgsz} | {workers} | {cache or 'none'} | {ips:.0f} | {1000 / ips:.1f} | {first:.2f} |", flush=True)
        for imgsz in (320, 640):
            costs = transform_costs(img_path, imgsz)
            print(f"\nper-sample cost at imgsz {imgsz}, workers 0, no cache (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in costs.items()))


if __name__ == "__main__":
    main()
