"""What colour costs where it runs (issue 58 item 2): the workers' OpenCV HSV per batch against the batched torch code of
data/loading/device_colour.py on this machine's CPU (eager, and torch.compile where it works), paired rounds.

    python benchmarks/colour_cost.py [--data ../shared/datasets/shapes] [--imgsz 640] [--batches 16 64] [--rounds 3]
                                     [--threads 1] [--compile]

Per round and batch size, one after another: `worker` = RandomHSV (cv2 BGR->HSV, one LUT, HSV->BGR) on each of the
batch's images, as the loader's workers spend it (summed over the batch: CPU time a worker no longer spends with
colour_on=device); `eager` = model_input(batch, gains) on the CPU (the jitter and /255); `/255 only` = model_input(batch,
None), what the step costs without colour; `compiled` = torch.compile(model_input) (inductor), after a warm call.
The images are real (the set's first train images letterboxed to imgsz, repeated). Prints ms per batch (median of the
rounds) and each one's ratio to `worker` within its round.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GAINS = (0.015, 0.7, 0.4)  # cfg/default.yaml's hsv_h, hsv_s, hsv_v


def images(data: Path, imgsz: int, count: int):
    """`count` BGR images (the set's first 16, letterboxed to imgsz, repeated)."""
    import cv2

    from yolo_cb.data.transforms import letterbox

    files = sorted((data / "images" / "train").glob("*.jpg"))[:16]
    base = [letterbox(cv2.imread(str(f)), imgsz)[0] for f in files]
    return [base[i % len(base)] for i in range(count)]


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def one_round(bgr: list, batch, gains, compiled) -> dict[str, float]:
    from yolo_cb.data.loading.device_colour import model_input
    from yolo_cb.data.transforms import RandomHSV

    hsv = RandomHSV(*GAINS)
    row = {"worker": timed(lambda: [hsv({"img": img.copy()}) for img in bgr]) - timed(lambda: [img.copy() for img in bgr]),
           "eager": timed(lambda: model_input(batch, gains)), "/255 only": timed(lambda: model_input(batch, None))}
    if compiled is not None:
        row["compiled"] = timed(lambda: compiled(batch, gains))
    return row


def measure(a, size: int) -> dict[str, list[float]]:
    import cv2
    import numpy as np
    import torch

    from yolo_cb.data.loading.device_colour import model_input

    bgr = images(a.data, a.imgsz, size)
    batch = torch.from_numpy(np.stack([cv2.cvtColor(b, cv2.COLOR_BGR2RGB) for b in bgr])).permute(0, 3, 1, 2)  # channels_last, as collate
    gains = torch.from_numpy(np.random.default_rng(0).uniform(-1, 1, (size, 3)) * GAINS + 1)
    compiled = None
    if a.compile:
        compiled = torch.compile(model_input)
        compiled(batch, gains)  # the compilation, untimed
    rows: dict[str, list[float]] = {}
    for _ in range(a.rounds):
        for key, value in one_round(bgr, batch, gains, compiled).items():
            rows.setdefault(key, []).append(value)
    return rows


def main() -> None:
    import torch

    from benchmarks.loader_replay import cpu_name

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "datasets" / "shapes")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch's and OpenCV's threads")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile(model_input) (inductor)")
    a = ap.parse_args()
    import cv2

    torch.set_num_threads(a.threads)
    cv2.setNumThreads(a.threads if a.threads > 1 else 0)
    print(f"CPU: {cpu_name()}; {a.threads} thread(s); torch {torch.__version__}; imgsz {a.imgsz}; {a.rounds} rounds")
    print("| batch | side | ms per batch (median) | runs | x worker (paired) |\n|---:|---|---:|---|---:|")
    for size in a.batches:
        rows = measure(a, size)
        for key, values in rows.items():
            ratio = statistics.median(v / w for v, w in zip(values, rows["worker"], strict=True))
            print(f"| {size} | {key} | {statistics.median(values):.1f} | {', '.join(f'{v:.0f}' for v in values)} | {ratio:.2f} |", flush=True)


if __name__ == "__main__":
    main()
