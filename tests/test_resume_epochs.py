"""Another length on resume: `resume=last.pt epochs=4` trains a finished 2-epoch run on to 4 epochs along the LR curve
of a 4-epoch run, recorded in args.yaml and the checkpoint; fewer epochs than trained is refused with one line."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml
from conftest import TINY
from test_bad_input import cli

from yolo_cb import YOLO
from yolo_cb.checkpoints.checkpoint import load_checkpoint

pytestmark = pytest.mark.slow
LRS = ("lr/pg0", "lr/pg1", "lr/pg2")


def lrs(run: Path) -> list[list[float]]:
    """Each epoch's LRs as results.csv has them (6 significant digits)."""
    with open(run / "results.csv", newline="") as f:
        return [[float(r[k]) for k in LRS] for r in csv.DictReader(f)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shapes_small_yaml) -> dict[str, Path]:
    """A straight 4-epoch run, and a 2-epoch run that finished and was resumed with epochs=4 (fraction: 2 batches an epoch)."""
    root = tmp_path_factory.mktemp("resume_epochs")
    base = {**TINY, "data": str(shapes_small_yaml), "project": str(root / "runs"), "fraction": 0.5}
    YOLO("yolox-nano.yaml").train(**{**base, "epochs": 4, "name": "straight"})
    YOLO("yolox-nano.yaml").train(**{**base, "epochs": 2, "name": "longer"})
    short = lrs(root / "runs" / "longer")
    YOLO().train(resume=str(root / "runs" / "longer" / "weights" / "last.pt"), epochs=4)
    return {"root": root, "straight": root / "runs" / "straight", "longer": root / "runs" / "longer", "short": short}


def test_a_finished_run_extended_follows_the_longer_runs_lr_curve(runs):
    straight, longer = lrs(runs["straight"]), lrs(runs["longer"])
    assert len(longer) == 4
    assert longer[2:] == straight[2:]  # epochs 3 and 4: the 4-epoch schedule (as results.csv writes them)
    assert runs["short"][1] != straight[1]  # the 2-epoch run had its own curve (so the comparison tests something)


def test_the_new_length_is_recorded(runs):
    assert yaml.safe_load((runs["longer"] / "args.yaml").read_text())["epochs"] == 4
    ckpt = load_checkpoint(runs["longer"] / "weights" / "last.pt")
    assert ckpt.train_args["epochs"] == 4 and ckpt.epoch == 3 and ckpt.finished


def test_fewer_epochs_than_trained_is_refused_with_one_line(runs):
    last = runs["longer"] / "weights" / "last.pt"
    result = cli(["train", f"resume={last}", "epochs=3"], cwd=runs["root"])
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "'epochs': 3" in lines[0] and "has trained 4 epochs" in lines[0] and "epochs >= 4" in lines[0]
