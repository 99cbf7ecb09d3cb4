"""A self-launched DDP run is refused while it is planned, before any folder or process, when its workers could not
start it: weights load()ed in memory (the workers read files), or a trainer= class (the workers build the Trainer)."""

from __future__ import annotations

import pytest

from yolo_cb.errors import ConfigError
from yolo_cb.model import DetectionTrainer
from yolo_cb.nn import build_model
from yolo_cb.training.plan import plan_run


def settings(tmp_path) -> dict:
    return {"epochs": 1, "nproc": 2, "device": "cpu", "project": str(tmp_path / "runs"), "name": "exp"}


def test_weights_loaded_in_memory_are_refused_for_a_self_launched_run(tmp_path):
    loaded = build_model("yolox-nano.yaml", nc=80, verbose=False)
    with pytest.raises(ConfigError, match=r"cannot start from weights load\(\)ed in memory"):
        plan_run(settings(tmp_path), "yolox-nano.yaml", loaded=loaded)
    assert not (tmp_path / "runs").exists()


def test_a_trainer_class_is_refused_for_a_self_launched_run(tmp_path):
    class MyTrainer(DetectionTrainer):
        pass

    with pytest.raises(ConfigError, match="trainer=MyTrainer cannot be used with a self-launched DDP run"):
        plan_run(settings(tmp_path), "yolox-nano.yaml", trainer_class=MyTrainer)
    assert not (tmp_path / "runs").exists()


def test_the_standard_trainer_plans_a_launch(tmp_path):
    plan = plan_run(settings(tmp_path), "yolox-nano.yaml")
    assert plan.launches_workers and plan.world_size == 2 and plan.callbacks is None
    assert not (tmp_path / "runs").exists()
