"""A tune folder is a folder anyone may hand over (security round 4): the places its records name are never used. A
crafted study.db trial whose run_dir named another run made `tune resume=` train and rewrite that run (a 6-epoch run
ended "finished" at 4); a tune.yaml's recorded storage= created a database where the file said and connected to the
server it named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_tune import SPACE, TRIAL

from yolo_cb import YOLO
from yolo_cb.errors import ConfigError

pytestmark = pytest.mark.slow


class Interrupt(Exception):
    pass


def interrupt_after_first_epoch(trainer):
    if trainer.epoch == 0:
        raise Interrupt("stop here")


def test_a_recorded_storage_elsewhere_is_refused_without_touching_it(tmp_path, shapes_small_yaml):
    folder = tmp_path / "tunes" / "t"
    folder.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere" / "planted.db"
    elsewhere.parent.mkdir()
    settings = {**TRIAL, "data": str(shapes_small_yaml), "mlflow": False}
    for storage in (f"sqlite:///{elsewhere}", "postgresql://user:secret@127.0.0.1:9/x"):
        (folder / "tune.yaml").write_text(yaml.safe_dump({"study_name": "t", "storage": storage, "model": "yolox-nano.yaml",
                                                          "iterations": 1, "pruner": "none", "settings": settings, "space": SPACE}))
        with pytest.raises(ConfigError, match=r"tune\.yaml records storage=.* a place recorded in a file is never used; pass storage="):
            YOLO("yolox-nano.yaml").tune(resume=str(folder))
        assert not elsewhere.exists() and not (folder / "study.db").exists()


def test_a_crafted_trial_run_dir_never_makes_resume_train_another_run(tmp_path, shapes_small_yaml):
    import optuna

    victim = YOLO("yolox-nano.yaml")
    victim.add_callback("on_fit_epoch_end", interrupt_after_first_epoch)
    with pytest.raises(Exception, match="stop here"):
        victim.train(**{**TRIAL, "data": str(shapes_small_yaml), "epochs": 3, "mlflow": False, "project": str(tmp_path / "runs"),
                        "name": "victim"})
    last = tmp_path / "runs" / "victim" / "weights" / "last.pt"
    before = last.read_bytes()

    tune = {**TRIAL, "data": str(shapes_small_yaml), "iterations": 1, "space": SPACE, "pruner": "none", "mlflow": False,
            "project": str(tmp_path / "tunes"), "name": "t"}
    YOLO("yolox-nano.yaml").tune(**tune)
    folder = tmp_path / "tunes" / "t"
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{folder / 'study.db'}")
    done = study.trials[0]
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, params=done.params, distributions=done.distributions,
                                              user_attrs={"interrupted": True, "run_dir": str(last.parent.parent.resolve())}))
    YOLO("yolox-nano.yaml").tune(resume=str(folder), iterations=2)
    assert last.read_bytes() == before  # the other run was not trained or rewritten
    retry = optuna.load_study(study_name="t", storage=f"sqlite:///{folder / 'study.db'}").trials[-1]
    assert retry.user_attrs.get("retry_of") == 1 and "resume_from" not in retry.user_attrs
    assert Path(retry.user_attrs["run_dir"]).parent == (folder / "trials").resolve()  # a fresh start in its own folder
