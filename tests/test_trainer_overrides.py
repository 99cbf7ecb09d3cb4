"""Ultralytics' trainer steps a subclass overrides, called by name by the loop: build_optimizer, validate, save_metrics,
save_model (they were refused before); the ones the loop never calls are still refused in one line."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from yolo_cb import YOLO
from yolo_cb.errors import ConfigError
from yolo_cb.training.trainer import Trainer

pytestmark = pytest.mark.slow


class NesterovTrainer(Trainer):
    """One SGD group with Nesterov momentum, built from Ultralytics' arguments."""

    calls: list = []

    def build_optimizer(self, model, name="auto", lr=0.001, momentum=0.9, decay=1e-5, iterations=1e5):
        type(self).calls.append({"name": name, "lr": lr, "momentum": momentum, "decay": decay, "iterations": iterations})
        return torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.8, nesterov=True)


class HalfFitnessTrainer(Trainer):
    """validate() adds a metric and returns a fitness of its own."""

    def validate(self):
        metrics, fitness = super().validate()
        return {**metrics, "custom/half_map50": metrics["metrics/mAP50(B)"] / 2}, -1.0 - self.epoch


def test_a_build_optimizer_override_makes_the_optimizer(tiny):
    model = YOLO("yolox-nano.yaml")
    model.train(**{**tiny, "epochs": 1, "optimizer": "SGD", "lr0": 0.005}, trainer=NesterovTrainer)
    optimizer = model.trainer.optimizer
    assert isinstance(optimizer, torch.optim.SGD) and len(optimizer.param_groups) == 1
    assert optimizer.param_groups[0]["nesterov"] is True and optimizer.param_groups[0]["initial_lr"] == 0.02
    call = NesterovTrainer.calls[-1]
    assert call["name"] == "SGD" and call["lr"] == 0.005 and call["decay"] > 0 and call["iterations"] >= 1
    # the LR schedule owned the group: after the run its LR is the schedule's, not the builder's 0.02
    assert optimizer.param_groups[0]["lr"] != 0.02


def test_a_validate_override_sets_metrics_and_the_fitness_best_pt_follows(tiny):
    model = YOLO("yolox-nano.yaml")
    model.train(**{**tiny, "epochs": 2, "val": True}, trainer=HalfFitnessTrainer)
    trainer = model.trainer
    with open(Path(trainer.save_dir) / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["fitness"]) for r in rows] == [-1.0, -2.0] and "custom/half_map50" in rows[0]
    assert trainer.best_epoch == 0  # fitness -1 (epoch 0) beats -2 (epoch 1): best.pt follows validate()'s fitness


class EveryEpochFileTrainer(Trainer):
    """save_model() keeps a copy of each epoch's last.pt besides what the saver writes; save_metrics() adds a column."""

    saved_before_on_model_save: list = []

    def save_model(self):
        super().save_model()
        (self.wdir / f"mine{self.epoch + 1}.pt").write_bytes((self.wdir / "last.pt").read_bytes())

    def save_metrics(self, metrics):
        super().save_metrics({**metrics, "custom/epoch_squared": (self.epoch + 1) ** 2})


class NoFilesTrainer(Trainer):
    """save_model() that writes nothing: the run keeps no checkpoint files."""

    def save_model(self):
        pass


def test_save_model_and_save_metrics_overrides_are_called_before_on_model_save(tiny):
    seen = []
    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_model_save", lambda t: seen.append(sorted(p.name for p in t.wdir.glob("mine*.pt"))))
    model.train(**{**tiny, "epochs": 2}, trainer=EveryEpochFileTrainer)
    wdir = Path(model.trainer.save_dir) / "weights"
    assert seen == [["mine1.pt"], ["mine1.pt", "mine2.pt"]]  # written before on_model_save fired, each epoch
    assert torch.load(wdir / "mine1.pt", weights_only=True)["epoch"] == 0
    with open(Path(model.trainer.save_dir) / "results.csv", newline="") as f:
        assert [r["custom/epoch_squared"] for r in csv.DictReader(f)] == ["1", "4"]


def test_a_save_model_override_that_writes_nothing_leaves_no_checkpoint(tiny):
    model = YOLO("yolox-nano.yaml")
    model.train(**{**tiny, "epochs": 1, "val": False}, trainer=NoFilesTrainer)
    assert not list((Path(model.trainer.save_dir) / "weights").glob("*.pt"))


def test_a_hook_the_loop_never_calls_is_still_refused(tiny):
    class Preprocessing(Trainer):
        def preprocess_batch(self, batch):
            return batch

    with pytest.raises(ConfigError, match=r"preprocess_batch\(\).*on_train_batch_start"):
        YOLO("yolox-nano.yaml").train(**tiny, trainer=Preprocessing)
