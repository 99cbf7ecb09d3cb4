"""Per-call time of `for frame in frames: model(frame)`, ours against Ultralytics', on the same frames, paired.

    python benchmarks/predict_per_call.py --ultralytics-python /work/venv-ul/bin/python [--rounds 5 --calls 20 --imgsz 640]

Two worker processes (this file with --worker), one per library, each holding its model; the parent makes the frames
(480 x 640 BGR, moving shapes: what a video gives), then, round after round, asks one worker and then the other to run
`model(frame)` once per frame and to return each call's wall time and the Results' `speed`. Alternating the rounds pairs
them in time on a shared machine. Ours: an untrained YOLOCB-n written as a checkpoint (`YOLO("best.pt")`, as a user
runs); Ultralytics': YOLO11n built from its yaml (untrained: its weights cannot be downloaded here; what is compared is
the cost around the network, and both networks are printed apart). Ultralytics is never our dependency: it runs only in
the interpreter given. Each worker runs on one thread (torch.set_num_threads(1)) and warms up with one call first, which
is reported apart (the one-time set-up), as is the whole first call's `speed`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()


def make_frames(n: int, shape=(480, 640)) -> np.ndarray:
    """n BGR frames of two shapes moving across a grey background."""
    import cv2

    h, w = shape
    frames = np.full((n, h, w, 3), 96, np.uint8)
    for i in range(n):
        cv2.circle(frames[i], (40 + 20 * i % (w - 80), h // 3), 30, (0, 0, 255), -1)
        cv2.rectangle(frames[i], (w - 100 - 15 * i % (w - 150), 2 * h // 3), (w - 40 - 15 * i % (w - 150), 2 * h // 3 + 60), (0, 200, 0), -1)
    return frames


def worker(lib: str, weights: str, frames_file: str, imgsz: int) -> None:
    """Load the model, answer each 'run' line on stdin with one JSON line: per call (wall ms, speed dict)."""
    import torch

    torch.set_num_threads(1)
    frames = np.load(frames_file)
    if lib == "ours":
        from yolo_cb import YOLO
    else:
        from ultralytics import YOLO
    model = YOLO(weights)
    kwargs = {"imgsz": imgsz, "verbose": False}
    t0 = time.perf_counter()
    first = model(frames[0], **kwargs)[0]
    print(json.dumps({"first_ms": (time.perf_counter() - t0) * 1e3, "first_speed": first.speed}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        calls = []
        for frame in frames:
            t = time.perf_counter()
            r = model(frame, **kwargs)[0]
            calls.append({"ms": (time.perf_counter() - t) * 1e3, "speed": r.speed})
        print(json.dumps(calls), flush=True)


def our_checkpoint(folder: Path) -> str:
    """An untrained YOLOCB-n saved as a checkpoint, as training writes one."""
    from yolo_cb.checkpoints.checkpoint import Checkpoint, save_checkpoint
    from yolo_cb.nn import build_model

    model = build_model("yolocb-n", nc=80, verbose=False)
    state = model.state_dict()
    names = {i: f"class{i}" for i in range(80)}
    ckpt = Checkpoint(model=state, ema=state, model_cfg=dict(model.cfg), names=names, train_args={}, epoch=0, version="0", date="2026-01-01")
    return str(save_checkpoint(ckpt, folder / "yolocb-n.pt"))


def start(python: str, lib: str, weights: str, frames_file: str, imgsz: int) -> tuple[subprocess.Popen, dict]:
    cmd = [python, str(HERE), "--worker", lib, "--weights", weights, "--frames-file", frames_file, "--imgsz", str(imgsz)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=tempfile.gettempdir())
    return proc, json.loads(proc.stdout.readline())


def ask(proc: subprocess.Popen) -> list[dict]:
    proc.stdin.write("run\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def summary(calls: list[dict]) -> dict:
    ms = [c["ms"] for c in calls]
    inference = [c["speed"]["inference"] for c in calls]
    around = [c["ms"] - c["speed"]["inference"] for c in calls]
    return {"call": statistics.median(ms), "inference": statistics.median(inference), "around": statistics.median(around)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ultralytics-python", default="/work/venv-ul/bin/python")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20, help="frames per round (one call each)")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--worker", choices=("ours", "ultralytics"))
    parser.add_argument("--weights")
    parser.add_argument("--frames-file")
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.weights, args.frames_file, args.imgsz)
    with tempfile.TemporaryDirectory() as tmp:
        frames_file = str(Path(tmp) / "frames.npy")
        np.save(frames_file, make_frames(args.calls))
        ours, ours_first = start(sys.executable, "ours", our_checkpoint(Path(tmp)), frames_file, args.imgsz)
        theirs, their_first = start(args.ultralytics_python, "ultralytics", "yolo11n.yaml", frames_file, args.imgsz)
        rows = []
        for k in range(args.rounds):
            a, b = summary(ask(ours)), summary(ask(theirs))
            rows.append((a, b))
            print(f"round {k + 1}: ours {a['call']:.1f} ms/call (network {a['inference']:.1f}, around it {a['around']:.1f}) | "
                  f"Ultralytics {b['call']:.1f} ms/call (network {b['inference']:.1f}, around it {b['around']:.1f}) | "
                  f"ratio {a['call'] / b['call']:.2f}x", flush=True)
        for proc in (ours, theirs):
            proc.stdin.close()
            proc.wait()
    report(rows, ours_first, their_first)


def report(rows: list, ours_first: dict, their_first: dict) -> None:
    med = {side: {key: statistics.median(r[i][key] for r in rows) for key in ("call", "inference", "around")} for i, side in enumerate(("ours", "ul"))}
    ratios = [a["call"] / b["call"] for a, b in rows]
    print(f"first call (one-time set-up included): ours {ours_first['first_ms']:.0f} ms, speed {json.dumps(ours_first['first_speed'])}; "
          f"Ultralytics {their_first['first_ms']:.0f} ms, speed {json.dumps(their_first['first_speed'])}")
    print(f"median over rounds: ours {med['ours']['call']:.1f} ms/call (network {med['ours']['inference']:.1f}, around {med['ours']['around']:.1f}); "
          f"Ultralytics {med['ul']['call']:.1f} ms/call (network {med['ul']['inference']:.1f}, around {med['ul']['around']:.1f}); "
          f"per-round ratio ours/theirs: median {statistics.median(ratios):.2f}x, range {min(ratios):.2f}-{max(ratios):.2f}x")


if __name__ == "__main__":
    main()
