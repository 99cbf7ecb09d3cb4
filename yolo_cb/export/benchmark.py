"""`yolo-cb benchmark model=best.pt data=shapes.yaml formats=onnx,openvino,onnx_int8`: every variant exported, validated
on the val split and timed end to end at batch 1, in one table (and benchmark.csv in the run folder).

Columns: format, file size (MB), mAP50-95, its drop vs PyTorch (same letterboxed images), ms per image (letterbox +
inference + NMS, batch 1, median of the val images after a warm-up) and the thread count every runtime was given.
`format=onnx` benchmarks that one variant (as Ultralytics' format=). Without formats= or format=: the desktop variants, then ncnn, mnn, tflite and executorch where their packages are installed (coreml
cannot run here).
"""

from __future__ import annotations

import csv
import importlib.util
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from yolo_cb.data.resolve import check_data
from yolo_cb.data.verify import imread, list_image_files
from yolo_cb.errors import ConfigError
from yolo_cb.export.convert import file_size, parse_spec
from yolo_cb.export.exporter import Exporter
from yolo_cb.export.mobile import CONVERTERS
from yolo_cb.export.verify import MAP_KEY, val_map
from yolo_cb.nn.postprocess import postprocess
from yolo_cb.prediction.backend import load_backend
from yolo_cb.prediction.predictor import preprocess
from yolo_cb.settings.config import Config
from yolo_cb.utils.files import run_dir
from yolo_cb.utils.log import LOGGER

DEFAULT_FORMATS = "onnx,onnx_half,onnx_int8,onnx_nms,openvino,openvino_half,openvino_int8,torchscript"
TIMED_MOBILE = ("ncnn", "mnn", "tflite", "executorch")  # added to the default list where their packages are installed
TIMED_IMAGES = 30  # val images timed per variant (after 3 warm-up runs)
COLUMNS = ("format", "file", "size_mb", "mAP50-95", "drop", "ms_per_image", "threads")


def default_formats() -> str:
    """DEFAULT_FORMATS, then the mobile formats of TIMED_MOBILE whose converter and runtime are installed."""
    installed = [f for f in TIMED_MOBILE if all(importlib.util.find_spec(m) is not None for m in CONVERTERS[f])]
    return ",".join([DEFAULT_FORMATS, *installed])


def time_backend(backend: Any, files: list[str], imgsz: tuple[int, int], iou: float, max_det: int) -> float:
    """Median ms per image of letterbox + forward + NMS at batch 1 over `files` (decoded beforehand)."""
    images = [img for img in (imread(f) for f in files) if img is not None]
    times = []
    for i, img in enumerate(images[:3] + images):
        t0 = time.perf_counter()
        x = preprocess(img, imgsz, auto=False)[0][None]
        postprocess(backend(x), conf=0.25, iou=iou, max_det=max_det, end2end=backend.end2end)
        if i >= 3:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def export_variant(model: str, token: str, args: Config, folder: Path) -> str:
    """The variant exported into `folder`, the benchmark's own run folder: the user's exports beside the checkpoint are
    never replaced (a dynamic-shape best.onnx became a static batch-1 one)."""
    spec = parse_spec(token)
    exporter = Exporter({"model": model, "imgsz": args.imgsz, "batch": 1, "data": args.data, "datasets_dir": args.datasets_dir,
                         "fraction": args.fraction, "iou": args.iou, "max_det": args.max_det, "opset": args.opset, **spec},
                        validate=False, folder=folder)
    return exporter(model)


def benchmark_tokens(args: Config, format: str | None = None) -> list[str]:
    """The variants to benchmark: formats=, else the one format= the user named (as Ultralytics' benchmark format=onnx),
    else every default variant."""
    if format and args.formats and str(args.formats) != str(format):
        raise ConfigError(f"benchmark format={format} formats={args.formats}: give one (format= one variant, formats= a list)")
    return [t for t in str(args.formats or format or default_formats()).split(",") if t.strip()]


def benchmark(args: Config, format: str | None = None) -> list[dict[str, Any]]:
    """The table rows (see the module docstring); printed, and written to benchmark.csv in the run folder. `format`: the
    format= the user gave (args.format holds the export default, onnx, when none was given)."""
    if not args.model or not str(args.model).endswith((".pt", ".pth")) or not args.data:
        raise ConfigError("benchmark needs model= a .pt checkpoint and data= a dataset YAML, e.g. "
                          "yolo-cb benchmark model=best.pt data=shapes.yaml formats=onnx,openvino")
    tokens = benchmark_tokens(args, format)
    for token in tokens:  # every name checked before any work
        if token.strip().lower().split("_")[0] == "coreml":
            raise ConfigError(f"formats={args.formats}: coreml cannot be validated nor timed here (Core ML runs on Apple platforms "
                              "only); export it with yolo-cb export format=coreml")
        parse_spec(token)
    threads = int(args.threads) if args.threads else torch.get_num_threads()
    torch.set_num_threads(threads)
    imgsz = (args.imgsz, args.imgsz) if isinstance(args.imgsz, int) else tuple(args.imgsz)
    val = check_data(args.data, args.datasets_dir)["val"]
    files = list_image_files(val)[:TIMED_IMAGES]
    rows, reference, folder = [], None, run_dir(args, "benchmark")
    for token in tokens:
        path = export_variant(str(args.model), token, args, folder)
        metrics, validator = val_map(path, args.data, list(imgsz), 1, args.datasets_dir, Path(path).parent)
        if reference is None:
            reference = val_map(str(args.model), args.data, list(imgsz), 1, args.datasets_dir, Path(path).parent, like=validator)[0]
            rows.append(_row("pytorch", str(args.model), reference[MAP_KEY], reference[MAP_KEY],
                             time_backend(load_backend(str(args.model)), files, imgsz, args.iou, args.max_det), threads))
        backend = load_backend(path, threads=threads)
        rows.append(_row(token, path, metrics[MAP_KEY], reference[MAP_KEY], time_backend(backend, files, imgsz, args.iou, args.max_det),
                         threads))
    save = folder / "benchmark.csv"
    with open(save, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(table(rows))
    LOGGER.info(f"benchmark.csv: {save}")
    return rows


def _row(name: str, path: str, score: float, reference: float, ms: float, threads: int) -> dict[str, Any]:
    return {"format": name, "file": Path(path).name, "size_mb": round(file_size(Path(path)) / 1e6, 2), "mAP50-95": round(score, 4),
            "drop": round(reference - score, 4), "ms_per_image": round(ms, 2), "threads": threads}


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)
