"""The epoch record: results.csv's row and the trackers' scalars come from one record, built once per epoch."""

from __future__ import annotations

from yolo_cb.training.epoch_record import EpochRecord


def test_row_and_scalars():
    record = EpochRecord(epoch=3, time=12.5, train={"train/iou_loss": 1.0}, lr={"lr/pg0": 0.01},
                         metrics={"metrics/mAP50-95(B)": 0.2, "fitness": 0.3}, validated=False)
    assert list(record.row()) == ["epoch", "time", "train/iou_loss", "metrics/mAP50-95(B)", "fitness", "lr/pg0"]
    assert record.scalars() == {"train/iou_loss": 1.0, "lr/pg0": 0.01}  # an epoch that did not validate logs no metrics
    validated = EpochRecord(**{**record.__dict__, "validated": True})
    assert validated.scalars() == {"train/iou_loss": 1.0, "lr/pg0": 0.01, "metrics/mAP50-95(B)": 0.2, "fitness": 0.3}
    assert validated.fitness == 0.3
