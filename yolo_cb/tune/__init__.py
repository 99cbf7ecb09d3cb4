"""Hyperparameter tuning on Optuna (`model.tune()`, `yolo-cb tune`); see yolo_cb.tune.tuner and docs/tune.md.

Importing this package needs no Optuna: it is imported when a tune starts, with an install hint when missing.
"""

from __future__ import annotations

from yolo_cb.tune.tuner import tune as run


def tune(model, /, **kwargs) -> dict:
    return run(model, **kwargs)
