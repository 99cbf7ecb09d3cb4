"""Per-class metrics: results_per_class.csv (every validated epoch, and `yolo-cb val`) and the per_class/ metric keys.

    results_per_class.csv   epoch, class, name, images, instances, P, R, mAP50, mAP50-95 (one row per class with labels)
    trainer.metrics         per_class/<name>/precision(B), .../recall(B), .../mAP50(B), .../mAP50-95(B)

The values are the validator's per-class table (`validator.per_class`, the rows it prints), not recomputed. The keys are
added to the validator's metrics (so to `trainer.metrics`, `model.val()`'s result and every logger) when `per_class=`
says so: auto (the default) for datasets of at most AUTO_MAX_CLASSES classes, true, false. results.csv leaves them out
(they are in results_per_class.csv). During training the CSV is rewritten after each validation: the rows of that epoch
and any later one (a resume repeating epochs) are replaced. `yolo-cb val` writes the rows with an empty epoch.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from yolo_cb.utils.files import atomic_write_text

PREFIX = "per_class/"  # every per-class metric key starts with this
AUTO_MAX_CLASSES = 100  # per_class=auto: keys for datasets of at most this many classes
FILE = "results_per_class.csv"
COLUMNS = ("epoch", "class", "name", "images", "instances", "P", "R", "mAP50", "mAP50-95")
KEY_OF = {"precision": "precision(B)", "recall": "recall(B)", "mAP50": "mAP50(B)", "mAP50-95": "mAP50-95(B)"}  # table -> key


def wanted(setting: Any, nc: int) -> bool:
    """Whether the per_class/ keys go into the metrics (the `per_class=` setting for a dataset of `nc` classes)."""
    if setting == "auto":
        return nc <= AUTO_MAX_CLASSES
    return bool(setting)


def metric_keys(table: list[dict]) -> dict[str, float]:
    """The validator's per-class table as per_class/<name>/<metric> keys."""
    return {f"{PREFIX}{row['name']}/{key}": float(row[field]) for row in table for field, key in KEY_OF.items()}


def is_per_class(key: str) -> bool:
    return key.startswith(PREFIX)


def rows(table: list[dict], epoch: int | None) -> list[dict[str, Any]]:
    """results_per_class.csv rows of one validation (`epoch` 1-based; None: a standalone validation)."""
    return [{"epoch": "" if epoch is None else epoch, "class": r["class"], "name": r["name"], "images": r["images"],
             "instances": r["instances"], "P": f"{r['precision']:.6g}", "R": f"{r['recall']:.6g}", "mAP50": f"{r['mAP50']:.6g}",
             "mAP50-95": f"{r['mAP50-95']:.6g}"} for r in table]


def read(path: Path) -> list[dict[str, str]]:
    if not Path(path).is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write(folder: Path, table: list[dict], epoch: int | None, set_name: str | None = None) -> Path:
    """Write the rows of this validation to folder/results_per_class.csv (results_per_class_<set>.csv for a validation set
    after the first, evaluation/val_sets.py), atomically; during training (`epoch` given) the rows of earlier epochs are kept,
    those of this epoch and later ones replaced."""
    path = Path(folder) / (FILE if set_name is None else FILE.replace(".csv", f"_{set_name}.csv"))
    kept = [r for r in read(path) if epoch is not None and r.get("epoch") and int(r["epoch"]) < epoch]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(COLUMNS))
    writer.writeheader()
    writer.writerows(kept + rows(table, epoch))
    atomic_write_text(path, buffer.getvalue())
    return path
