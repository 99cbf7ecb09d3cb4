"""Worst validation images (`worst_batches=k`): after each validation in training, the k images of the (first)
validation set with the lowest per-image AP, drawn with their labels (left) and predictions (right, score >= 0.25).

    yolo-cb train data=... worst_batches=8      # runs/detect/train/worst/epoch{N}_{rank}_{image}.jpg

Per-image AP is COCO mAP50-95 of that image alone (the validator's own matching, over the classes it has labels of);
images without labels have no AP and are not ranked. Ties keep the loader's order. The files are appended to
`trainer.new_images`, so TensorBoard, MLflow and W&B log them; `callback.worst` holds the last ranking
[(image file, AP), ...]. Training batches are not ranked (no per-batch loss is kept).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from yolo_cb.callbacks.registry import integration
from yolo_cb.metrics import DetMetrics
from yolo_cb.utils.draw import draw_boxes

PRED_CONF = 0.25  # predictions below this score are not drawn


def image_ap(stat: dict, nc: int) -> float | None:
    """COCO mAP50-95 of one validated image (a `validator.stats` entry); None when it has no labels."""
    if len(stat["gt_cls"]) == 0:
        return None
    metrics = DetMetrics(nc)
    metrics.update(stat["pred_boxes"], stat["pred_scores"], stat["pred_cls"], stat["gt_boxes"], stat["gt_cls"], key=0)
    return float(metrics.compute().map)


def worst(stats: list[dict], nc: int, k: int) -> list[tuple[dict, float]]:
    """The k entries of `stats` with the lowest per-image AP (ties in their order)."""
    scored = [(s, ap) for s in stats if (ap := image_ap(s, nc)) is not None]
    return sorted(scored, key=lambda item: item[1])[:k]


def _rows(xywh: np.ndarray, scores: np.ndarray, cls: np.ndarray) -> np.ndarray:
    boxes = np.asarray(xywh, dtype=np.float64).reshape(-1, 4)
    xyxy = np.concatenate([boxes[:, :2], boxes[:, :2] + boxes[:, 2:]], 1)
    return np.concatenate([xyxy, np.asarray(scores, dtype=np.float64).reshape(-1, 1), np.asarray(cls).reshape(-1, 1)], 1)


def draw_side_by_side(stat: dict, names: dict[int, str], path: Path) -> Path:
    """The original image with its labels (left) and its predictions >= PRED_CONF (right), written to `path`."""
    import cv2

    image = cv2.imread(str(stat["im_file"]))
    labels = _rows(stat["gt_boxes"], np.ones(len(stat["gt_cls"])), stat["gt_cls"])
    keep = np.asarray(stat["pred_scores"]) >= PRED_CONF
    preds = _rows(np.asarray(stat["pred_boxes"])[keep], np.asarray(stat["pred_scores"])[keep], np.asarray(stat["pred_cls"])[keep])
    canvas = np.concatenate([draw_boxes(image, labels, names), draw_boxes(image, preds, names, scores=True)], 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), canvas)
    return path


@integration("worst_batches", enabled=lambda args: bool(args.worst_batches))
class WorstImages:
    """Draws the k worst validation images after each validation in training; see the module docstring."""

    rank_zero_only = True

    def __init__(self, k: int | None = None):
        self.k = k  # None: the worst_batches setting
        self.worst: list[tuple[str, float]] = []

    def on_val_end(self, validator):
        trainer = validator.trainer
        if not validator.training or trainer is None or validator.set_name is not None or validator.save_dir is None:
            return
        k = int(self.k if self.k is not None else trainer.args.worst_batches)
        chosen = worst(validator.stats, validator.nc, k)
        self.worst = [(str(s["im_file"]), ap) for s, ap in chosen]
        folder = Path(validator.save_dir) / "worst"
        for rank, (stat, _) in enumerate(chosen):
            path = folder / f"epoch{trainer.epoch + 1}_{rank}_{Path(stat['im_file']).stem}.jpg"
            trainer.new_images.append(draw_side_by_side(stat, validator.names, path))
