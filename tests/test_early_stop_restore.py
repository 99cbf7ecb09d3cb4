"""Early stopping that restores (Keras' restore_best_weights) and says what it does with the close_mosaic stage:
stop_close_mosaic=skip stops at once (logged), finish trains the stage first."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import pytest
import torch
from conftest import TINY

from yolo_cb import YOLO
from yolo_cb.checkpoints.checkpoint import load_checkpoint

pytestmark = pytest.mark.slow
# min_delta=10: only the first epoch improves, so patience=1 stops after epoch 2 of 6; close_mosaic=2: epochs 5-6 are the stage
STOPS = dict(TINY, epochs=6, patience=1, min_delta=10.0, close_mosaic=2, no_aug_epochs=2, fraction=0.5, save_period=1)


def epochs_in(run: Path) -> int:
    with open(run / "results.csv", newline="") as f:
        return len(list(csv.DictReader(f)))


def same(state: dict, ckpt: dict) -> bool:
    return all(torch.equal(state[k].cpu(), v) for k, v in ckpt.items())


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shapes_small_yaml):
    root = tmp_path_factory.mktemp("early_stop")
    base = {**STOPS, "data": str(shapes_small_yaml), "project": str(root / "runs")}
    out, logs = {}, {}
    handler = logging.Handler()
    handler.emit = lambda record: logs.setdefault(current[0], []).append(record.getMessage())
    logger = logging.getLogger("yolo_cb")
    logger.addHandler(handler)
    current = [""]
    try:
        for name, extra in (("skip", {}), ("finish", {"stop_close_mosaic": "finish"}),
                            ("keep_last", {"callbacks": [{"early_stopping": {"restore_best_weights": False}}]})):
            current[0] = name
            model = YOLO("yolox-nano.yaml")
            model.train(**{**base, **extra, "name": name})
            out[name] = {"dir": root / "runs" / name, "model": model, "state": model.trainer.model.state_dict()}
    finally:
        logger.removeHandler(handler)
    return out, logs


def test_after_early_stopping_the_model_holds_best_pts_weights(runs):
    out, _ = runs
    run = out["skip"]
    assert epochs_in(run["dir"]) == 2
    best, last = load_checkpoint(run["dir"] / "weights" / "best.pt"), load_checkpoint(run["dir"] / "weights" / "last.pt")
    assert best.epoch == 0 and last.epoch == 1
    assert same(run["state"], best.model) and not same(run["state"], last.model)
    assert run["model"].source.endswith("best.pt")


def test_restore_best_weights_false_keeps_the_last_epoch(runs):
    out, _ = runs
    run = out["keep_last"]
    last = load_checkpoint(run["dir"] / "weights" / "last.pt")
    assert same(run["state"], last.model) and run["model"].source.endswith("last.pt")


def test_skip_says_the_close_mosaic_stage_is_skipped(runs):
    _, logs = runs
    assert any("the close_mosaic stage (2 epochs without mosaic, from epoch 5) is skipped" in m for m in logs["skip"])
    assert not any("stage switch at epoch" in m for m in logs["skip"])


def test_finish_trains_the_close_mosaic_stage_then_stops(runs):
    out, logs = runs
    assert epochs_in(out["finish"]["dir"]) == 4  # stopped after 2, then the 2 stage epochs
    assert any("YOLOX stage switch at epoch 3/4" in m for m in logs["finish"])
    last = load_checkpoint(out["finish"]["dir"] / "weights" / "last.pt")
    assert last.epoch == 3 and last.finished
