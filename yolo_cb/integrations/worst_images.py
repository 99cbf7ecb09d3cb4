"""Worst images (`worst_batches=k`): the k validation images of lowest per-image AP, or the k training batches of
highest loss, drawn with their labels (left) and predictions (right, score >= 0.25). `worst_source=` picks which:

    yolo-cb train data=... worst_batches=8                      # val (default): worst/epoch{N}_{rank}_{image}.jpg
    yolo-cb train data=... worst_batches=4 worst_source=train   # worst/epoch{N}_train{rank}_batch{i}.jpg
    yolo-cb train data=... worst_batches=4 worst_source=both    # both kinds

val: after each validation in training, each image of the (first) validation set is scored by its own COCO mAP50-95
(the validator's matching, over the classes it has labels of); images without labels have no AP and are not ranked;
ties keep the loader's order. `callback.worst` holds the last ranking [(image file, AP), ...].

train: every training batch's total loss (`trainer.loss`, as the step computed it, on rank 0's batches; non-finite
losses are not ranked) is compared as the epoch goes, and the k highest are kept (the augmented images and targets
the model saw). At the epoch's end each is drawn as a grid: labels | predictions of the model as it is then (the EMA,
which validation uses), not as it was at that batch. A mid-epoch resume ranks the batches trained after it.
`callback.worst_train` holds [(epoch, batch index, loss), ...], highest first.

The files are appended to `trainer.new_images`, so TensorBoard, MLflow and W&B log them.
"""

from __future__ import annotations

import heapq
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from yolo_cb.callbacks.registry import integration
from yolo_cb.errors import ConfigError
from yolo_cb.recipe.ema import unwrap
from yolo_cb.utils.draw import draw_boxes, plot_batch, targets_to_boxes, write_image
from yolo_cb.utils.files import own_folder

if TYPE_CHECKING:  # torch loads when a run ranks images, not when this registers
    import torch

    from yolo_cb.evaluation.val_metrics import ImageStats

PRED_CONF = 0.25  # predictions below this score are not drawn
SOURCES = ("val", "train", "both")  # what is ranked: validation images by AP, training batches by loss, or both


def worst(stats: ImageStats, k: int) -> list[tuple[dict, float]]:
    """The k records of `stats` (validator.stats) with the lowest per-image mAP50-95, images without labels left out
    (ties in their order)."""
    scored = [(s, ap) for s, ap in zip(stats, stats.image_maps(), strict=True) if ap is not None]
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
    return write_image(path, np.concatenate([draw_boxes(image, labels, names), draw_boxes(image, preds, names, scores=True)], 1))


def predictions(trainer, images: torch.Tensor) -> list[torch.Tensor]:
    """Detections >= PRED_CONF of the validated model (EMA, else the training model) on uint8 `images`, post-processed
    as the validator does, in eval mode and without gradients; the model's modes are restored."""
    import torch

    model = unwrap(trainer.ema.ema if trainer.ema is not None else trainer.model)
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            preds = model(images.to(next(model.parameters()).device).float() / 255)
    finally:
        for module, mode in modes:
            module.train(mode)
    return [p.cpu() for p in trainer.validator.postprocess(preds, conf=PRED_CONF)]


def draw_batch(trainer, images: torch.Tensor, targets: torch.Tensor, path: Path) -> Path:
    """A training batch as two grids side by side: its labels | the model's predictions now."""
    names = {int(k): str(v) for k, v in trainer.data["names"].items()}
    labels = plot_batch(images, targets_to_boxes(targets, len(images)), names)
    preds = plot_batch(images, predictions(trainer, images), names, scores=True)
    return write_image(path, np.concatenate([labels, preds], 1))


@integration("worst_batches", enabled=lambda args: bool(args.worst_batches))
class WorstImages:
    """Draws the k worst validation images after each validation in training, and/or the k training batches of
    highest loss after each epoch (worst_source=val | train | both); see the module docstring."""

    rank_zero_only = True

    def __init__(self, k: int | None = None, source: str | None = None):
        if source not in (None, *SOURCES):
            raise ConfigError(f"worst_batches: source={source!r}; expected one of {', '.join(SOURCES)}")
        self.k = k  # None: the worst_batches setting
        self.source = source  # None: the worst_source setting
        self.worst: list[tuple[str, float]] = []  # the last validation's ranking: (image file, AP), lowest first
        self.worst_train: list[tuple[int, int, float]] = []  # the last epoch's: (epoch, batch index, loss), highest first
        self._heap: list[tuple[float, int, torch.Tensor, torch.Tensor]] = []  # (loss, batch index, images, targets)

    def _k(self, trainer) -> int:
        return int(self.k if self.k is not None else trainer.args.worst_batches)

    def _wants(self, trainer, kind: str) -> bool:
        source = self.source if self.source is not None else trainer.args.worst_source
        return source in (kind, "both")

    def on_train_epoch_start(self, trainer):
        self._heap = []

    def on_train_batch_loss_end(self, trainer):
        if not self._wants(trainer, "train"):
            return
        loss = float(trainer.loss.detach())
        if not math.isfinite(loss):
            return
        if len(self._heap) < self._k(trainer) or loss > self._heap[0][0]:
            entry = (loss, trainer.batch_i, trainer.batch["img"].detach().cpu().clone(), trainer.batch["targets"].detach().cpu().clone())
            (heapq.heappush if len(self._heap) < self._k(trainer) else heapq.heapreplace)(self._heap, entry)

    def on_train_epoch_end(self, trainer):
        if not self._wants(trainer, "train") or trainer.save_dir is None:
            return
        chosen = sorted(self._heap, key=lambda e: (-e[0], e[1]))
        self.worst_train = [(trainer.epoch, batch_i, loss) for loss, batch_i, _, _ in chosen]
        for rank, (_, batch_i, images, targets) in enumerate(chosen):
            path = own_folder(Path(trainer.save_dir), "worst") / f"epoch{trainer.epoch + 1}_train{rank}_batch{batch_i}.jpg"
            trainer.new_images.append(draw_batch(trainer, images, targets, path))
        self._heap = []

    def on_val_end(self, validator):
        trainer = validator.trainer
        if not validator.training or trainer is None or validator.set_name is not None or validator.save_dir is None:
            return
        if not self._wants(trainer, "val"):
            return
        chosen = worst(validator.stats, self._k(trainer))
        self.worst = [(str(s["im_file"]), ap) for s, ap in chosen]
        for rank, (stat, _) in enumerate(chosen):  # own_folder: a link planted at worst/ is replaced, not followed
            path = own_folder(Path(validator.save_dir), "worst") / f"epoch{trainer.epoch + 1}_{rank}_{Path(stat['im_file']).stem}.jpg"
            trainer.new_images.append(draw_side_by_side(stat, validator.names, path))
