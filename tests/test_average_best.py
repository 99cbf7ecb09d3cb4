"""Checkpoint averaging (average_best=k): the average of two known checkpoints is their mean (BatchNorm statistics
averaged too), the averaged model is validated, and one line says which file was kept and by how much."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from conftest import TINY

from yolo_cb import YOLO
from yolo_cb.checkpoints.checkpoint import load_checkpoint
from yolo_cb.recipe.average import average_checkpoints
from yolo_cb.settings.config import ConfigError, get_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory, shapes_small_yaml) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("average_best")
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("yolo_cb").addHandler(handler)
    try:
        model = YOLO("yolox-nano.yaml")
        model.add_callback("on_train_end", lambda trainer: lines.append("on_train_end fired"))
        model.train(**{**TINY, "epochs": 3, "save_topk": 2, "average_best": 2, "data": str(shapes_small_yaml), "project": str(root),
                       "name": "exp"})
    finally:
        logging.getLogger("yolo_cb").removeHandler(handler)
    return root / "exp", lines


def test_the_average_of_two_checkpoints_is_their_mean(run):
    folder = run[0] / "weights"
    paths = sorted(folder.glob("best_epoch*.pt"))
    assert len(paths) == 2
    a, b = (load_checkpoint(p) for p in paths)
    averaged = average_checkpoints(paths)
    for mean, first, second in ((averaged.model, a.model, b.model), (averaged.ema, a.ema, b.ema)):
        assert any(k.endswith("running_var") for k in mean)
        for name, value in mean.items():
            if value.is_floating_point():
                assert torch.allclose(value, (first[name] + second[name]) / 2, rtol=1e-6, atol=1e-9), name
            else:
                assert torch.equal(value, first[name]), name  # num_batches_tracked: the first checkpoint's
    assert averaged.extras["averaged_epochs"] == [a.epoch + 1, b.epoch + 1] and averaged.optimizer is None


def test_one_line_says_which_file_was_kept(run):
    folder, lines = run
    said = [m for m in lines if m.startswith("average_best: kept")]
    assert len(said) == 1
    kept = (folder / "weights" / "best_avg.pt").is_file()
    assert ("best_avg.pt" in said[0]) == kept and ("kept best.pt" in said[0]) == (not kept)
    assert lines.index(said[0]) < lines.index("on_train_end fired")  # a loop step before on_train_end: loggers see the file


def test_average_best_needs_save_topk():
    with pytest.raises(ConfigError, match="save_topk >= 3"):
        get_config({"average_best": 3, "save_topk": 2})
    with pytest.raises(ConfigError, match="integer >= 2"):
        get_config({"average_best": 1, "save_topk": 2})
