"""Per-image CPU latency (batch 1) of preprocess / inference / postprocess: PyTorch vs onnxruntime.

    python benchmarks/inference.py                       # yolox-nano and yolox-s at 320 and 640
    python benchmarks/inference.py --models yolox-nano --imgsz 320 --runs 50 --threads 2

Random-init weights (latency does not depend on them), BatchNorm fused, a static ONNX export
(onnxslim-simplified) per model and size. Each cell is the median over --runs timed runs after --warmup runs.
The input is a generated 480x640 BGR scene, letterboxed to the model size exactly as `yolo-cb predict` does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source checkout without installing

from yolo_cb.export.exporter import export_onnx, sample_image
from yolo_cb.nn import build_model
from yolo_cb.nn.postprocess import postprocess, scale_boxes
from yolo_cb.prediction.backend import load_backend
from yolo_cb.prediction.predictor import preprocess


def time_backend(backend, img: np.ndarray, imgsz: int, warmup: int, runs: int) -> dict[str, float]:
    """Median ms per stage for one image."""
    stages: dict[str, list[float]] = {"preprocess": [], "inference": [], "postprocess": []}
    for i in range(warmup + runs):
        t0 = time.perf_counter()
        x, ratio_pad = preprocess(img, imgsz)
        x = x[None]
        t1 = time.perf_counter()
        preds = backend(x)
        t2 = time.perf_counter()
        det = postprocess(preds, conf=0.25, iou=0.65, max_det=300)[0]
        scale_boxes(det, ratio_pad, img.shape[:2])
        t3 = time.perf_counter()
        if i >= warmup:
            stages["preprocess"].append((t1 - t0) * 1e3)
            stages["inference"].append((t2 - t1) * 1e3)
            stages["postprocess"].append((t3 - t2) * 1e3)
    return {k: statistics.median(v) for k, v in stages.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["yolox-nano", "yolox-s"])
    parser.add_argument("--imgsz", nargs="+", type=int, default=[320, 640])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    parser.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    opt = parser.parse_args()
    if opt.threads:
        torch.set_num_threads(opt.threads)
    img = sample_image((480, 640))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in opt.models:
            model = build_model(name, nc=80, verbose=False).eval().fuse()
            for p in model.parameters():
                p.requires_grad_(False)
            for imgsz in opt.imgsz:
                file = export_onnx(model, Path(tmp) / f"{name}-{imgsz}.onnx", (imgsz, imgsz), simplify=True,
                                   metadata={"names": json.dumps({i: str(i) for i in range(80)}), "imgsz": [imgsz, imgsz], "stride": 32})
                for kind, weights in (("pytorch", model), ("onnxruntime", str(file))):
                    ms = time_backend(load_backend(weights), img, imgsz, opt.warmup, opt.runs)
                    rows.append({"model": name, "imgsz": imgsz, "backend": kind, **ms, "total": sum(ms.values())})
                    r = rows[-1]
                    print(f"  {name} {imgsz} {kind}: {r['total']:.1f} ms", flush=True)
    header = "| model | imgsz | backend | preprocess ms | inference ms | postprocess ms | total ms |\n|---|---|---|---|---|---|---|"
    print(f"\nCPU latency per image, batch 1, torch threads {torch.get_num_threads()}, median of {opt.runs} runs after {opt.warmup} warmup\n")
    print(header)
    for r in rows:
        print(f"| {r['model']} | {r['imgsz']} | {r['backend']} | {r['preprocess']:.2f} | {r['inference']:.1f} | {r['postprocess']:.2f} | {r['total']:.1f} |")
    if opt.json:
        opt.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
