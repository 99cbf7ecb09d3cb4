"""Callbacks importable by path, for the CLI / YAML declaration tests."""

import json
import os
from pathlib import Path

from yolo_cb.callbacks import register_callback


def log_epoch(trainer):
    path = Path(os.environ.get("CBPKG_LOG", "cbpkg.log"))
    with open(path, "a") as f:
        f.write(json.dumps({"event": "on_fit_epoch_end", "epoch": trainer.epoch}) + "\n")


class Marker:
    """An object callback with state."""

    def __init__(self, tag="marker"):
        self.tag = tag
        self.count = 0

    def on_train_epoch_end(self, trainer):
        self.count += 1

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


@register_callback("test_marker")
def make_marker(tag="registered"):
    return Marker(tag)


def log_batch(trainer):
    path = Path(os.environ.get("CBPKG_LOG", "cbpkg.log"))
    with open(path, "a") as f:
        f.write(f"{trainer.epoch},{trainer.batch_i}\n")
