"""Visualisation (plots=True): training labels, batches and validation labels/predictions drawn as JPEGs in the run dir.

- labels.jpg (at on_pretrain_routine_end, once per run folder): the training labels' class histogram, box shapes,
  centres and sizes (utils/plotting.py), as Ultralytics' labels.jpg; MLflow and the other loggers send it with the
  run's other images.

- train_batch0.jpg .. train_batch2.jpg: the first 3 batches of the run's first epoch, as the model sees them
  (after augmentation: mosaic, affine, HSV, flip), with their labels.
- val_batch0_labels.jpg (once) and val_batch0_pred_epoch{N}.jpg every `plot_period` epochs (N as in results.csv,
  1-based): the first validation batch with its labels / with the EMA model's predictions at conf >= 0.25.

Drawing happens inside the epoch (on_train_batch_end, on_val_batch_end), so the files exist before on_fit_epoch_end;
each file written is appended to `trainer.new_images` (this epoch's), which the TensorBoard, MLflow and W&B
integrations read there, whatever the registration order.
"""

from __future__ import annotations

import re
from pathlib import Path

from yolo_cb.callbacks.registry import callback_alias, integration
from yolo_cb.data.verify import imread
from yolo_cb.utils.draw import plot_batch, targets_to_boxes
from yolo_cb.utils.log import LOGGER
from yolo_cb.utils.plotting import plot_labels

TRAIN_BATCHES = 3  # how many training batches are drawn
PRED_CONF = 0.25  # predictions below this score are not drawn


@callback_alias("DetectionVisualizationCallback", {"freq": "period"})  # SuperGradients' name: freq epochs apart
@integration("visualize", enabled=lambda args: bool(args.plots))
class Visualize:
    """Draws batches into the run dir (main process only); see the module docstring."""

    rank_zero_only = True  # the dispatcher calls it on rank 0 only

    def __init__(self, train_batches: int = TRAIN_BATCHES, conf: float = PRED_CONF, period: int | None = None):
        self.train_batches, self.conf = int(train_batches), float(conf)
        self.epoch = 0
        self.epochs = 0
        self.first_epoch = 0
        self.given_period = period  # epochs between prediction images; None: the plot_period setting
        self.period = 1
        self.active = False  # a trainer is running an epoch (val images are drawn only for in-training validation)

    # --- trainer events ---------------------------------------------------------------------
    def on_pretrain_routine_end(self, trainer):
        path = Path(trainer.save_dir) / "labels.jpg"
        if path.exists() or getattr(trainer, "train_loader", None) is None:
            return
        plot_labels(trainer.train_loader.dataset.labels, _names(trainer.data.get("names")), path)
        trainer.new_images.append(path)

    def on_train_epoch_start(self, trainer):
        self.epoch, self.epochs, self.first_epoch = trainer.epoch, trainer.epochs, trainer.start_epoch
        self.period = max(int(self.given_period or getattr(trainer.args, "plot_period", 1) or 1), 1)
        self.active = True

    def on_train_batch_end(self, trainer):
        if trainer.epoch != trainer.start_epoch or trainer.batch_i >= self.train_batches:
            return

        batch = trainer.batch
        path = Path(trainer.save_dir) / f"train_batch{trainer.batch_i}.jpg"
        plot_batch(batch["img"], targets_to_boxes(batch["targets"], len(batch["img"])), _names(trainer.data.get("names")), path)
        trainer.new_images.append(path)

    def on_fit_epoch_end(self, trainer):
        self.active = False

    # --- validator events (the trainer's validator shares the trainer's callbacks) -------------
    def on_val_batch_end(self, validator):
        if not (self.active and validator.training and validator.batch_i == 0 and validator.save_dir is not None):
            return
        if not self.due():
            return

        batch, save_dir, names = validator.batch, Path(validator.save_dir), _names(validator.names)
        labels = save_dir / "val_batch0_labels.jpg"
        if not labels.exists():
            plot_batch(batch["img"], targets_to_boxes(batch["targets"], len(batch["img"])), names, labels)
            validator.trainer.new_images.append(labels)
        preds = [p[p[:, 4] >= self.conf].detach().float().cpu() for p in validator.preds]
        path = save_dir / f"val_batch0_pred_epoch{self.epoch + 1}.jpg"
        plot_batch(batch["img"], preds, names, path, scores=True)
        validator.trainer.new_images.append(path)

    def due(self) -> bool:
        """Predictions are drawn every `plot_period` epochs and at the last epoch."""
        return (self.epoch + 1) % self.period == 0 or self.epoch + 1 == self.epochs


def _names(names) -> dict[int, str]:
    if isinstance(names, (list, tuple)):
        return dict(enumerate(map(str, names)))
    return {int(k): str(v) for k, v in dict(names or {}).items()}


def image_tag(path: Path, epoch: int) -> tuple[str, int]:
    """(tag, 0-based epoch step) of a visualisation file: val_batch0_pred_epoch3.jpg -> ('val_batch0_pred', 2)."""
    match = re.fullmatch(r"(.+)_epoch(\d+)", path.stem)
    if match:
        return match.group(1), int(match.group(2)) - 1
    return path.stem, epoch


def read_rgb(path: Path):
    """An image file as an RGB HWC uint8 array, or None (with a debug line) when it cannot be read."""

    img = imread(str(path))
    if img is None:
        LOGGER.debug(f"could not read {path}")
        return None
    return img[..., ::-1].copy()
