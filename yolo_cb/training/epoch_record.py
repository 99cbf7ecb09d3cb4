"""The epoch record: one epoch's results, built once by the trainer, read by results.csv and every logger.

`trainer.epoch_record` is made after validation, right before on_model_save, and stays until the next epoch's;
`trainer.new_images` lists the image files written during the epoch. Both live in the trainer's private `_output` (EpochOutput).
Keys are Ultralytics' (the ones results.csv writes): train/<loss>, metrics/mAP50-95(B) ..., val/<loss>, fitness, lr/pg<i>.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from yolo_cb.evaluation.per_class import is_per_class


@dataclass(frozen=True)
class EpochRecord:
    epoch: int  # the epoch, 1-based (as results.csv numbers it)
    time: float  # seconds since the run began, when the record was made (results.csv "time"), rounded to 1 ms
    train: dict[str, float] = field(default_factory=dict)  # the epoch's mean train losses: train/iou_loss ...
    metrics: dict[str, float] = field(default_factory=dict)  # the latest validated metrics (val losses, fitness included)
    lr: dict[str, float] = field(default_factory=dict)  # lr/pg<i> of each parameter group at the epoch's end
    validated: bool = False  # the metrics are this epoch's (val_period / val=False skip some epochs)
    times: dict[str, float] = field(default_factory=dict)  # time/<phase>_ms of the epoch up to this record, and time/epoch_ms

    @property
    def fitness(self) -> float | None:
        return self.metrics.get("fitness")

    def row(self) -> dict[str, float | int]:
        """results.csv's row: epoch, time, train losses, metrics (the latest, validated this epoch or not), lrs, phase times;
        the per_class/ keys are in results_per_class.csv instead (evaluation/per_class.py)."""
        metrics = {k: v for k, v in self.metrics.items() if not is_per_class(k)}
        return {"epoch": self.epoch, "time": self.time, **self.train, **metrics, **self.lr, **self.times}

    def scalars(self) -> dict[str, float]:
        """What the trackers log per epoch: train losses, lrs, phase times and, for an epoch that validated, the metrics."""
        return {**self.train, **self.lr, **self.times, **(self.metrics if self.validated else {})}


@dataclass
class EpochOutput:
    """What an epoch produced for the loggers: its record and the image files written in it."""

    record: EpochRecord | None = None  # the last epoch that reached on_model_save (None before the first)
    images: list[Path] = field(default_factory=list)  # image files written this epoch (emptied at each epoch start)
