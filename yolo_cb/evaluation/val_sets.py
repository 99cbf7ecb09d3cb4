"""Several validation sets: `val:` in a data YAML as a mapping of names to splits, or a list of two or more splits.

    val: {day: images/val_day, night: images/val_night}      # data YAML
    val: [images/val_day, night.txt]                          # the same as {val_day: images/val_day, night: night.txt}
    yolo-cb train data=that.yaml monitor=night/metrics/mAP50-95(B)

A list names each set by its path's stem; a stem met before gets _2, _3, ... (a/val, b/val: val, val_2). Ultralytics
joins a list into one set; here one combined set is one path: a .txt file listing the images of every folder.

Each set is validated after each validated epoch. Every set's metrics are in trainer.metrics under `<name>/<key>`
(`night/metrics/mAP50(B)`, `night/fitness`, `night/val/iou_loss`, ...); the first set's also under the plain keys, so
`monitor=fitness` (the default) follows the first set, and code that reads Ultralytics' keys reads the first set.
results.csv and every logger carry them all (they read trainer.metrics); each set after the first writes its per-class
table to results_per_class_<name>.csv. A path under `val:` is one set. The final validation of best.pt, and
`yolo-cb val` (split=val), are on the first set.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def extra_sets(data: dict) -> dict[str, Any]:
    """The validation sets after the first one, {name: split} (empty for a single set)."""
    sets = dict(data.get("val_sets") or {})
    return dict(list(sets.items())[1:]) if len(sets) > 1 else {}


def first_name(data: dict) -> str | None:
    sets = data.get("val_sets") or {}
    return next(iter(sets)) if len(sets) > 1 else None


def prefixed(name: str, metrics: dict[str, float]) -> dict[str, float]:
    return {f"{name}/{k}": v for k, v in metrics.items()}


def placeholder_keys(data: dict, metrics: dict[str, float]) -> dict[str, float]:
    """The NaN placeholders of every set (`<name>/<key>`), so that monitor= can name a set's metric before epoch 1."""
    names = ([first_name(data)] if first_name(data) else []) + list(extra_sets(data))
    return {key: value for name in names for key, value in prefixed(name, metrics).items()}


def validate_sets(validate_on: Callable[[Any], Mapping], validator: Any, data: dict, first_loader: Any,
                  extra_val: dict[str, Any]) -> dict[str, float]:
    """Validate the first set, then every other set; one metrics dict with all of them. `validate_on(loader)` validates
    the training's model on one loader with `validator` (the trainer's validation, val losses included)."""
    result = validate_on(first_loader)
    first = first_name(data)
    if first is None:
        return dict(result)
    out = {**result, **prefixed(first, result)}
    try:
        for name, loader in extra_val.items():
            validator.set_name = name  # callbacks on on_val_* see which set; per-class rows go to its own CSV
            out.update(prefixed(name, dict(validate_on(loader))))
    finally:
        validator.set_name = None
        validator.dataloader, validator.metrics = first_loader, result  # validator.metrics: the first set's, as without extra sets
    return out
