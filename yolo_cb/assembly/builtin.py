"""The default callbacks every trainer has: the progress bar; the names of the recipe's declarations (early stopping's
parameters, the LR schedule's choice, unfreeze stages), which the settings fold in when they read callbacks=
(yolo_cb/settings/declared.py): registered here so that callbacks= knows them, they act at no event.

results.csv, the checkpoint files, the LR schedule, unfreezing and checkpoint averaging are steps the loop calls by name
(yolo_cb/recipe/saver.py, yolo_cb/recipe/schedule.py, recipe/unfreeze.py, recipe/average.py), not callbacks.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from yolo_cb.callbacks.registry import register_callback
from yolo_cb.data.batch import batch_shape
from yolo_cb.settings import declared
from yolo_cb.utils.log import LOGGER


@register_callback("progress")
class Progress:
    """A tqdm bar per epoch on a terminal; one plain line per epoch otherwise. Main process only."""

    rank_zero_only = True  # called on rank 0 only (the dispatcher skips it elsewhere; describe() says so)

    def __init__(self, stream=None):
        self.stream = stream
        self.bar = None
        self.epoch_start = 0.0

    def on_train_epoch_start(self, trainer):
        self.epoch_start = time.perf_counter()
        stream = self.stream or sys.stdout
        if stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=trainer.num_batches, file=stream, bar_format="{l_bar}{bar:10}{r_bar}", leave=True)
        if trainer.epoch == trainer.start_epoch:
            LOGGER.info(header(trainer.loss_names))

    def on_train_batch_end(self, trainer):
        if self.bar is not None:
            self.bar.set_description(line(trainer.epoch, trainer.epochs, trainer.tloss, trainer.batch, trainer.args.imgsz))
            self.bar.update(1)

    def on_train_epoch_end(self, trainer):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        else:
            seconds = time.perf_counter() - self.epoch_start
            progress = line(trainer.epoch, trainer.epochs, trainer.tloss, trainer.batch, trainer.args.imgsz)
            LOGGER.info(f"{progress}   {trainer.batch_i + 1}/{trainer.num_batches} batches, {seconds:.1f}s")

    def teardown(self, trainer):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def header(loss_names) -> str:
    """The progress table's column names."""
    return "".join(f"{n:>11}" for n in ["Epoch", *loss_names, "Instances", "Size"])


def line(epoch: int, epochs: int, tloss, batch: dict, imgsz: int) -> str:
    """One row of the progress table: epoch (1-based) of epochs, the epoch's mean losses, the batch's boxes and size."""
    losses = "".join(f"{v:>11.4g}" for v in tloss)
    boxes, size = batch_shape(batch, imgsz)
    return f"{f'{epoch + 1}/{epochs}':>11}{losses}{boxes:>11}{size:>11}"


@register_callback("early_stopping")
class EarlyStopping:
    """Early stopping's parameters, declared as a callback (`- early_stopping: {patience: 5}`, SuperGradients' and Keras'
    habit): `patience` replaces the setting, `restore_best_weights` (Keras' name) the restore_best setting. The settings
    fold the declaration in when they are read (yolo_cb/settings/declared.py); it acts at no event. Early stopping itself
    is a step of the loop (yolo_cb/recipe/early_stop.py)."""

    def __init__(self, patience: int | None = None, restore_best_weights: bool | None = None):
        self.settings = declared.early_stopping(patience, restore_best_weights)  # checked as the settings check it


@register_callback("lr_schedule")
class ScheduleChoice:
    """The LR schedule declared as a callback (`- lr_schedule: {lr_scheduler: cosine}`): it replaces the lr_scheduler
    setting, folded in when the settings are read (yolo_cb/settings/declared.py); it acts at no event. A schedule of
    your own class is the setting's job: lr_scheduler=module:Class."""

    def __init__(self, lr_scheduler: Any = "linear"):
        self.settings = declared.lr_schedule(lr_scheduler)


@register_callback("unfreeze")
class UnfreezeChoice:
    """Unfreeze stages declared as a callback (`- unfreeze: {stages: {5: [backbone.backbone.dark5], 10: all}}`): the
    loop's unfreeze schedule (yolo_cb/recipe/unfreeze.py) follows them instead of unfreeze_epoch; the settings keep them
    when read (yolo_cb/settings/declared.py, `args.unfreeze_stages`). It acts at no event."""

    def __init__(self, stages: dict):
        self.stages = declared.parse_stages(stages)  # {0-based epoch: "all" | [module names]}


# the default callbacks, registered in this order; their own `after` / `before` say what else must hold
DEFAULTS = ("lr_schedule", "progress", "callback_record")  # lr_schedule: only for lr_scheduler=module:Class (your class)

# the loop's own steps (the LR schedule, results.csv, the checkpoint files, checkpoint averaging, early stopping's
# close_mosaic stage policy), named as the callbacks
# that did them once were: after= / before= may name them (the files are written before on_model_save), they place nothing
LOOP_STEPS = ("lr_schedule", "results_csv", "checkpoint", "epoch_state", "average_best", "stop_stage")
