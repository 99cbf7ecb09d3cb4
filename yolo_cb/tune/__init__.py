"""Hyperparameter tuning (`model.tune()`, `yolo-cb tune`) on Optuna (yolo_cb.tune.tuner) or Ray Tune (backend=ray,
yolo_cb.tune.ray_backend); see docs/tune.md.

Importing this package needs neither: each is imported when a tune starts, with an install hint when missing.
"""

from __future__ import annotations

from yolo_cb.settings.config import get_config
from yolo_cb.tune import ray_backend
from yolo_cb.tune.tuner import tune as run


def tune(model, /, **kwargs) -> dict:
    """Run a tune on the backend `backend=` names (optuna, the default, or ray; a cfg= file may name it too)."""
    backend = kwargs.pop("backend", None)
    args = get_config({"mode": "tune", **({"backend": backend} if backend is not None else {}),
                       **({"cfg": kwargs["cfg"]} if kwargs.get("cfg") else {})})  # a bad value: one ConfigError line
    return ray_backend.tune(model, **kwargs) if args.backend == "ray" else run(model, **kwargs)
