"""Per-frame cost and id switches of the two trackers `track` offers (the `trackers` package's ByteTrack and BoT-SORT,
through yolo_cb.prediction.tracking, as `track` runs them), on detections whose truth is known.

    python benchmarks/tracker_cost.py [--frames 300 --objects 8]

The detections: `--objects` boxes moving at constant speed over a 640 x 480 frame (two of them crossing, all wrapping at
the edges), jittered by 1.5 px, 10% of them missed each frame, and 5 low-score false positives a frame. An id switch is
an object whose tracked box carries another id than its previous tracked box. The frame given to BoT-SORT (for its
camera-motion step) is noise, the worst case for its optical flow.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def detections(frames: int, objects: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per frame: (n, 6) boxes [x1, y1, x2, y2, conf, cls] and each box's true object (-1: a false positive)."""
    rng = np.random.default_rng(seed)
    start = rng.uniform([50, 50], [550, 400], (objects, 2))
    speed = rng.uniform(-3, 3, (objects, 2))
    speed[:2] = [[3, 0], [-3, 0]]
    start[1] = [start[0][0] + 450, start[0][1] + 5]  # the first two cross
    out = []
    for t in range(frames):
        centre = (start + speed * t) % [600, 440]
        boxes = np.concatenate([centre - 20, centre + 20], 1) + rng.normal(0, 1.5, (objects, 4))
        seen = rng.random(objects) > 0.1
        corner = rng.uniform(0, 600, (5, 2))
        rows = np.concatenate([np.c_[boxes[seen], rng.uniform(0.5, 0.95, seen.sum()), np.zeros(seen.sum())],
                               np.c_[corner, corner + 30, rng.uniform(0.1, 0.3, 5), np.zeros(5)]])
        out.append((rows, np.r_[np.arange(objects)[seen], -np.ones(5, int)]))
    return out


def run(name: str, sequence: list, image: np.ndarray) -> str:
    from yolo_cb.prediction.tracking import new_tracker, tracked_boxes

    tracker, times, last, switches, tracked = new_tracker(name), [], {}, 0, 0
    for rows, truth in sequence:
        t = time.perf_counter()
        out = tracked_boxes(tracker, rows, image)
        times.append(time.perf_counter() - t)
        for box in out:
            obj = truth[np.abs(rows[:, :4] - box[:4]).sum(1).argmin()]
            if obj >= 0:
                tracked += 1
                switches += obj in last and last[obj] != box[4]
                last[obj] = box[4]
    return f"{name}: {np.median(times) * 1e3:.2f} ms a frame (median), {tracked} object boxes tracked, {switches} id switches"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--objects", type=int, default=8)
    args = parser.parse_args()
    sequence = detections(args.frames, args.objects)
    image = np.random.default_rng(1).integers(0, 255, (480, 640, 3), dtype=np.uint8)
    for name in ("bytetrack.yaml", "botsort.yaml"):
        print(run(name, sequence, image), flush=True)


if __name__ == "__main__":
    main()
