"""Checks of an exported model: its outputs against PyTorch on one image, and its mAP against PyTorch's on a val split.

    side_by_side("best.pt", "best_int8.onnx", data="shapes.yaml", imgsz=64)
    # {"pytorch": 0.712, "export": 0.705, "drop": 0.007, ...}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from yolo_cb.data.loading.loader import build_dataloader
from yolo_cb.evaluation.validator import Validator
from yolo_cb.metrics import DetMetrics
from yolo_cb.prediction.backend import ONNXBackend, OpenVINOBackend, TorchScriptBackend
from yolo_cb.prediction.mobile_backends import ExecuTorchBackend, LiteRTBackend, MNNBackend, NCNNBackend
from yolo_cb.settings.config import get_config
from yolo_cb.utils.log import LOGGER

MAP_KEY = "metrics/mAP50-95(B)"
# the allowed mAP50-95 drop of an export's precision, as the tests and export_check judge it by default
MAP_TOL = {"fp32": 1e-3, "half": 5e-3, "int8": 0.02}


def run_backend(path: str | Path, image: torch.Tensor, fmt: str) -> np.ndarray:
    """The raw output of an exported model of format `fmt` (through its Backend; the file may have a temp name) on image."""
    mobile = {"ncnn": NCNNBackend, "mnn": MNNBackend, "tflite": LiteRTBackend, "executorch": ExecuTorchBackend}
    if fmt in mobile:
        return mobile[fmt](str(path))(image).cpu().numpy()
    kind = {"onnx": ONNXBackend, "openvino": OpenVINOBackend, "torchscript": TorchScriptBackend}[fmt]
    return kind(str(path), device=torch.device("cpu"), fp16=False)(image).cpu().numpy()


def match_detections(ours: np.ndarray, ref: np.ndarray, conf: float = 0.25) -> dict[str, float]:
    """End-to-end outputs (B, max_det, 6) compared as detections: the rows above `conf` in both, matched in order of
    score; max_px is the largest box-corner difference in pixels, missing the count of detections found in one only."""
    worst, missing = 0.0, 0
    for a, b in zip(ours, ref, strict=True):
        a, b = a[a[:, 4] > conf], b[b[:, 4] > conf]
        for row in b:
            same = a[a[:, 5] == row[5]]
            if not len(same):
                missing += 1
                continue
            gap = np.abs(same[:, :4] - row[:4]).max(axis=1)
            worst = max(worst, float(gap.min()))
        missing += max(0, len(a) - len(b))
    return {"max_px": worst, "missing": float(missing)}


def val_map(model: Any, data: Any, imgsz: Any, batch: int, datasets_dir: Any = None, save_dir: Path | None = None,
            like: Validator | None = None) -> tuple[dict, Validator]:
    """The validation metrics of `model` (a path, Module or Backend) on data's val split, and the validator; nothing is
    written. `like`: a validator whose images (same letterbox, same batches) are used again."""
    args = get_config({"mode": "val", "data": data, "imgsz": max(imgsz) if isinstance(imgsz, (list, tuple)) else imgsz, "batch": batch, "plots": False, "save_json": False,
                       "workers": 0, "datasets_dir": datasets_dir})
    loader = None
    if like is not None:
        dataset = like.dataloader.dataset
        loader = build_dataloader(dataset, like.dataloader.batch_size or 1, 0, shuffle=False, rank=-1)
    validator = Validator(args, save_dir=save_dir, dataloader=loader)
    return dict(validator(model=model)), validator


def drop_noise(reference: Validator, exported: Validator, resamples: int = 200, seed: int = 0) -> float:
    """The sampling noise of the mAP50-95 drop between two validations of the same images: the standard deviation of
    the paired drop over `resamples` bootstrap draws of the images (with replacement). On 16 images an export that
    changes a few scores moves the drop by this much either way, whatever its precision costs."""
    ref, exp = reference.det_metrics.records, exported.det_metrics.records
    if len(ref) != len(exp) or len(ref) < 2:
        return 0.0
    rng = np.random.default_rng(seed)

    def score(records: list[dict], draw: np.ndarray, nc: int) -> float:
        metrics = DetMetrics(nc)
        metrics.records = [{**records[i], "key": k} for k, i in enumerate(draw)]
        return float(metrics.compute().map)

    nc = reference.det_metrics.nc
    drops = [score(ref, draw, nc) - score(exp, draw, nc) for draw in (rng.integers(0, len(ref), len(ref)) for _ in range(resamples))]
    return float(np.std(drops, ddof=1))


def side_by_side(reference: nn.Module | str | Path, exported: str | Path, data: Any, imgsz: Any, batch: int = 1,
                 datasets_dir: Any = None) -> dict[str, float]:
    """mAP50-95 of PyTorch and of the export on the val split of `data`, the drop (PyTorch minus export) and its
    sampling noise over the images (`drop_se`, see drop_noise)."""
    folder = Path(exported).parent
    ours, validator = val_map(str(exported), data, imgsz, batch, datasets_dir, folder)
    theirs, ref_validator = val_map(reference, data, imgsz, batch, datasets_dir, folder, like=validator)  # the same letterboxed images
    result = {"pytorch": float(theirs[MAP_KEY]), "export": float(ours[MAP_KEY]),
              "mAP50_pytorch": float(theirs["metrics/mAP50(B)"]), "mAP50_export": float(ours["metrics/mAP50(B)"])}
    result["drop"] = result["pytorch"] - result["export"]
    result["drop_se"] = drop_noise(ref_validator, validator)
    LOGGER.info(f"mAP50-95 on the val split of {data}: PyTorch {result['pytorch']:.4f}, {Path(exported).name} "
                f"{result['export']:.4f} (drop {result['drop']:+.4f})")
    return result
