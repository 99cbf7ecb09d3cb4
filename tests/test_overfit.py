"""Overfit proof: YOLOX-nano from scratch learns one fixed batch of the shapes dataset to mAP50 >= 0.9."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
from shared_data import SHARED
from torchvision.ops import box_convert, box_iou

from yolo_cb.nn import build_model
from yolo_cb.nn.postprocess import postprocess

SHAPES = SHARED / "datasets" / "shapes"
IMGSZ = 256  # letterboxed square input size
NUM_IMAGES = 4  # images in the fixed batch (13 objects, every class)
NUM_CLASSES = 4  # circle, rectangle, triangle, cross
MAX_STEPS = 300  # optimisation steps allowed before the test fails
EVAL_EVERY = 10  # steps between mAP50 checks (training stops at the first check that passes)
TARGET_MAP50 = 0.9  # required mAP@0.5 on the training batch
LR = 3e-3  # AdamW learning rate
SEED = 0  # torch seed for the initial weights


def letterbox(image: np.ndarray, size: int) -> tuple[np.ndarray, float, tuple[int, int]]:
    """Resize keeping aspect so the long side is `size`, pad to size x size with grey; returns image, ratio, (pad_w, pad_h)."""
    cv2 = pytest.importorskip("cv2")
    h, w = image.shape[:2]
    ratio = size / max(h, w)
    new_w, new_h = round(w * ratio), round(h * ratio)
    resized = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    pad_w, pad_h = (size - new_w) // 2, (size - new_h) // 2
    canvas = np.full((size, size, 3), 114, dtype=np.uint8)
    canvas[pad_h : pad_h + new_h, pad_w : pad_w + new_w] = resized
    return canvas, ratio, (pad_w, pad_h)


def load_batch(root: Path, n: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first n train images as a (n, 3, size, size) RGB [0, 1] tensor and targets (N, 6) [img, cls, cx, cy, w, h] pixels."""
    cv2 = pytest.importorskip("cv2")
    images, targets = [], []
    for i, path in enumerate(sorted((root / "images" / "train").glob("*.jpg"))[:n]):
        bgr = cv2.imread(str(path))
        h, w = bgr.shape[:2]
        boxed, ratio, (pad_w, pad_h) = letterbox(bgr, size)
        images.append(torch.from_numpy(boxed[..., ::-1].copy()).permute(2, 0, 1).float() / 255)
        label_file = root / "labels" / "train" / (path.stem + ".txt")
        rows = np.loadtxt(label_file, ndmin=2) if label_file.exists() and label_file.stat().st_size else np.zeros((0, 5))
        for cls, cx, cy, bw, bh in rows:
            targets.append([i, cls, cx * w * ratio + pad_w, cy * h * ratio + pad_h, bw * w * ratio, bh * h * ratio])
    return torch.stack(images), torch.tensor(targets, dtype=torch.float32).reshape(-1, 6)


def average_precision(recall: np.ndarray, precision: np.ndarray) -> float:
    """VOC all-point AP: area under the precision envelope."""
    r = np.concatenate(([0.0], recall, [1.0]))
    p = np.concatenate(([1.0], precision, [0.0]))
    p = np.flip(np.maximum.accumulate(np.flip(p)))
    changes = np.nonzero(r[1:] != r[:-1])[0]
    return float(np.sum((r[changes + 1] - r[changes]) * p[changes + 1]))


def map50(detections: list[torch.Tensor], targets: torch.Tensor, nc: int) -> float:
    """Mean over classes with ground truth of AP at IoU 0.5; detections per image rows [x1, y1, x2, y2, score, cls]."""
    aps = []
    for c in range(nc):
        gt_of_class = targets[targets[:, 1] == c]
        if len(gt_of_class) == 0:
            continue
        scores, hits = [], []
        for i, det in enumerate(detections):
            det = det[det[:, 5] == c]
            det = det[det[:, 4].argsort(descending=True)]
            gt = box_convert(gt_of_class[gt_of_class[:, 0] == i, 2:6], "cxcywh", "xyxy")
            used = torch.zeros(len(gt), dtype=torch.bool)
            ious = box_iou(det[:, :4], gt) if len(gt) else torch.zeros(len(det), 0)
            for d in range(len(det)):
                scores.append(float(det[d, 4]))
                best = int(ious[d].argmax()) if ious.shape[1] else -1
                hit = best >= 0 and ious[d, best] >= 0.5 and not used[best]
                if hit:
                    used[best] = True
                hits.append(hit)
        order = np.argsort(-np.asarray(scores), kind="stable")
        tp = np.cumsum(np.asarray(hits, dtype=float)[order]) if hits else np.zeros(0)
        recall = tp / len(gt_of_class)
        precision = tp / np.arange(1, len(tp) + 1)
        aps.append(average_precision(recall, precision))
    return float(np.mean(aps)) if aps else 0.0


@torch.no_grad()
def recalibrate_batchnorm(model: torch.nn.Module, images: torch.Tensor) -> None:
    """Set BatchNorm running statistics to those of `images` (one train-mode pass, cumulative average).

    With YOLOX's momentum of 0.03, the running statistics still carry the initial (0, 1) values for a few hundred
    steps, which hides from eval mode what a short run has learnt; this measures the weights, not that lag.
    """
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average: after one pass, exactly this batch's statistics
    model.train()
    model(images)
    for m, momentum in zip(norms, momenta, strict=True):
        m.momentum = momentum


def overfit(images: torch.Tensor, targets: torch.Tensor, max_steps: int = MAX_STEPS) -> tuple[int, float]:
    """Train YOLOX-nano on the batch until mAP50 >= TARGET_MAP50 or max_steps; returns (steps, last mAP50)."""
    torch.manual_seed(SEED)
    model = build_model("yolox-nano", NUM_CLASSES, verbose=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    score = 0.0
    for step in range(1, max_steps + 1):
        model.train()
        loss = model(images, targets)["total"]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % EVAL_EVERY == 0:
            recalibrate_batchnorm(model, images)
            model.eval()
            with torch.no_grad():
                detections = postprocess(model(images), conf=0.001, iou=0.65)
            score = map50(detections, targets, NUM_CLASSES)
            if score >= TARGET_MAP50:
                return step, score
    return max_steps, score


@pytest.mark.slow
def test_nano_overfits_one_batch():
    if not (SHAPES / "images" / "train").is_dir():
        pytest.skip(f"shapes dataset not found under {SHARED} (set YOLO_CB_SHARED)")
    images, targets = load_batch(SHAPES, NUM_IMAGES, IMGSZ)
    assert len(targets) > 0
    start = time.perf_counter()
    steps, score = overfit(images, targets)
    print(f"\noverfit: mAP50 {score:.3f} after {steps} steps in {time.perf_counter() - start:.1f}s")
    assert score >= TARGET_MAP50, f"mAP50 {score:.3f} < {TARGET_MAP50} after {steps} steps"


def test_map50_helper_perfect_and_empty():
    targets = torch.tensor([[0, 1, 50.0, 50, 20, 20], [1, 0, 30, 30, 10, 10]])
    perfect = [torch.tensor([[40.0, 40, 60, 60, 0.9, 1]]), torch.tensor([[25.0, 25, 35, 35, 0.8, 0]])]
    assert map50(perfect, targets, NUM_CLASSES) == pytest.approx(1.0)
    assert map50([torch.zeros(0, 6), torch.zeros(0, 6)], targets, NUM_CLASSES) == 0.0
