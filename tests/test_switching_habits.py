"""Habits of users coming from Ultralytics, Keras, Lightning, Hugging Face and wall_e (issue 29): each one works here as
there, or fails at once with one line saying what to write; none is silently ignored. Real trainings, tiny images."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from yolo_cb import YOLO
from yolo_cb.callbacks import CallbackError, Callbacks
from yolo_cb.checkpoints.checkpoint import load_checkpoint
from yolo_cb.evaluation.validator import Validator
from yolo_cb.model import DetectionTrainer
from yolo_cb.settings.config import ConfigError
from yolo_cb.training.trainer import Trainer

pytestmark = pytest.mark.slow


def rows(run: Path) -> list[dict]:
    with open(run / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


# --- item 1: the named checkpoint is the one resumed ----------------------------------------------------------------
def test_resume_true_resumes_the_checkpoint_named_as_the_model(tiny, tmp_path):
    """Ultralytics' documented resume, YOLO("runs/.../last.pt").train(resume=True), continues that file's run even when a
    newer (finished) run lies beside it; main took the newest last.pt under the project instead."""
    stopped = YOLO("yolox-nano.yaml")
    stopped.add_callback("on_fit_epoch_end", lambda t: setattr(t, "stop", True))
    stopped.train(**{**tiny, "epochs": 2, "name": "wanted"})
    YOLO("yolox-nano.yaml").train(**{**tiny, "name": "newer"})  # finished, and newer: what resume=True alone would take
    wanted = tmp_path / "runs" / "wanted"
    model = YOLO(str(wanted / "weights" / "last.pt"))
    model.train(resume=True, project=tiny["project"])
    assert len(rows(wanted)) == 2 and len(rows(tmp_path / "runs" / "newer")) == 1
    assert load_checkpoint(wanted / "weights" / "last.pt").epoch == 1
    assert Path(model.source) == (wanted / "weights" / "best.pt").resolve()


# --- item 2: trainer subclasses -------------------------------------------------------------------------------------
class PreprocessTrainer(Trainer):
    """Ultralytics' custom-trainer guide: a batch edited in preprocess_batch() (the loop never calls it)."""

    def preprocess_batch(self, batch):
        return batch


class ClippingTrainer(DetectionTrainer):
    def optimizer_step(self):
        pass


def test_ultralytics_trainer_overrides_are_refused_naming_them(tiny):
    with pytest.raises(ConfigError, match=r"trainer=PreprocessTrainer defines preprocess_batch\(\), which the yolo-cb loop never "
                                          r"calls.*preprocess_batch\(\) -> an on_train_batch_start callback"):
        YOLO("yolox-nano.yaml").train(**tiny, trainer=PreprocessTrainer)
    with pytest.raises(ConfigError, match=r"defines optimizer_step\(\).*on_before_optimizer_step"):
        ClippingTrainer(overrides=tiny)
    assert not (Path(tiny["project"]) / tiny["name"]).exists()  # refused before any run folder


def test_detection_trainer_with_overrides_trains(tiny):
    """Ultralytics' `DetectionTrainer(overrides=args).train()`, with `_callbacks` as its dict of lists."""
    seen = []
    trainer = DetectionTrainer(overrides=dict(tiny), _callbacks={"on_fit_epoch_end": [lambda t: seen.append(t.epoch)]})
    metrics = trainer.train()
    assert seen == [0] and "metrics/mAP50-95(B)" in metrics
    assert (trainer.save_dir / "weights" / "best.pt").is_file() and len(rows(trainer.save_dir)) == 1


# --- item 6: other frameworks' stop flags and callback signatures ---------------------------------------------------
@pytest.mark.parametrize("flag", ["stop_training", "should_stop", "should_training_stop"])
@pytest.mark.parametrize("owner", [Trainer, Validator])
def test_foreign_stop_flags_are_refused_at_the_write(flag, owner):
    obj, name = owner.__new__(owner), owner.__name__.lower()
    with pytest.raises(AttributeError, match=rf"^{name}.{flag} is the stop flag of .*set trainer.stop = True"):
        setattr(obj, flag, True)


def test_a_stop_flag_written_on_the_validator_in_training_names_trainer_stop(tiny):
    model = YOLO("yolox-nano.yaml")  # SuperGradients / Keras: a validation callback gets the context and stops through it
    model.add_callback("on_val_end", lambda v: setattr(v, "stop_training", True))
    with pytest.raises(CallbackError, match=r"validator.stop_training is the stop flag of Keras / SuperGradients.*"
                                            r"validator.trainer.stop = True"):
        model.train(**{**tiny, "epochs": 3})
    assert load_checkpoint(Path(tiny["project"]) / tiny["name"] / "weights" / "last.pt").epoch == 0


def test_a_foreign_stop_flag_in_training_stops_with_the_line_naming_trainer_stop(tiny):
    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_fit_epoch_end", lambda t: setattr(t, "stop_training", True))
    with pytest.raises(CallbackError, match=r"trainer.stop_training is the stop flag of Keras / SuperGradients.*trainer.stop = True"):
        model.train(**{**tiny, "epochs": 3})
    assert load_checkpoint(Path(tiny["project"]) / tiny["name"] / "weights" / "last.pt").epoch == 0


class LightningStyle:
    def on_train_epoch_end(self, trainer, pl_module):
        pass


class HuggingFaceStyle:
    def on_fit_epoch_end(self, args, state, control, **kwargs):
        pass


def test_other_frameworks_signatures_fail_at_registration():
    callbacks = Callbacks()
    with pytest.raises(TypeError, match=r"takes \(trainer, pl_module\).*one argument, the trainer.*Lightning"):
        callbacks.add_callbacks(LightningStyle())
    with pytest.raises(TypeError, match=r"takes \(args, state, control, kwargs\).*Hugging Face"):
        callbacks.add_callbacks(HuggingFaceStyle())
    with pytest.raises(TypeError, match=r"one argument, the validator"):
        callbacks.add_callback("on_val_end", lambda validator, extra: None)
    with pytest.raises(TypeError, match=r"one argument, the predictor"):
        callbacks["on_predict_end"].insert(0, lambda predictor, extra: None)  # the dict-of-lists form too
    assert not callbacks.entries()


class WallEStyle:
    def __init__(self):
        self.registered_with = None

    def on_register(self, callbacks):
        self.registered_with = callbacks

    def on_train_end(self, trainer):
        pass


def test_on_register_fires_when_added():
    callbacks, obj = Callbacks(), WallEStyle()
    callbacks.add_callbacks(obj)
    assert obj.registered_with is callbacks and [e.name for e in callbacks.entries()] == ["WallEStyle"]


# --- item 4: an LR written during warmup sticks ---------------------------------------------------------------------
def test_lr_written_during_warmup_sticks(tiny):
    """warmup_epochs=1 is at least 100 batches: every batch here is in warmup. A write after batch 1 is the LR of every
    later batch (main: the warmup ramp overwrote it at the next batch)."""
    used: list[list[float]] = []

    def record(trainer):  # runs after the schedule's own on_train_batch_start: the LR this batch trains with
        used.append([g["lr"] for g in trainer.optimizer.param_groups])

    def write(trainer):
        if trainer.epoch == 0 and trainer.batch_i == 1:
            for group in trainer.optimizer.param_groups:
                group["lr"] = 5e-4

    model = YOLO("yolox-nano.yaml").add_callback("on_train_batch_start", record).add_callback("on_train_batch_end", write)
    model.train(**{**tiny, "epochs": 2, "warmup_epochs": 1.0, "lr_scheduler": "constant"})
    assert len(used) == 8 and used[1] != [5e-4] * len(used[1])
    assert all(lrs == pytest.approx([5e-4] * len(lrs), rel=1e-9) for lrs in used[2:]), used


# --- item 7: a stop before the first batch --------------------------------------------------------------------------
def test_stop_before_the_first_epoch_trains_nothing(tiny):
    batches = []
    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_pretrain_routine_start", lambda t: setattr(t, "stop", True))
    model.add_callback("on_train_batch_start", lambda t: batches.append(t.batch_i))
    model.train(**{**tiny, "epochs": 2})
    weights = Path(tiny["project"]) / tiny["name"] / "weights"
    assert batches == [] and not (weights / "last.pt").exists() and not (weights / "best.pt").exists()


# --- docs/callbacks.md "Habits from other frameworks, one by one": every example runs --------------------------------
def test_every_habit_example_runs(tiny, capsys):
    from conftest import ROOT

    text = (ROOT / "docs" / "callbacks.md").read_text()
    section = text[text.index("## Habits from other frameworks, one by one"):]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) >= 4
    model, settings = YOLO("yolox-nano.yaml"), {}
    for code in blocks:
        namespace = {"model": model}
        exec(compile(code, "docs/callbacks.md habit example", "exec"), namespace)  # noqa: S102 - the documented code
        settings.update(namespace.get("settings", {}))
    said = capsys.readouterr().out
    assert "takes (trainer, pl_module), but yolo-cb calls it with one argument, the trainer" in said
    model.train(**{**tiny, "epochs": 3, **settings})
    run = Path(tiny["project"]) / tiny["name"]
    said = capsys.readouterr().out
    assert "trainer.stop_training is the stop flag of Keras / SuperGradients" in said and "trained 3 epochs" in said
    assert "validator.stop_training is the stop flag of Keras / SuperGradients" in said and "validator.trainer.stop = True" in said
    assert "epoch 1" in said and "epoch 2" in said
    table = rows(run)
    assert len(table) == 2 and float(table[0]["train/l1_loss"]) == 0 and float(table[1]["train/l1_loss"]) > 0  # the stage switch
    assert (run / "val_batch0_pred_epoch2.jpg").is_file() and not (run / "val_batch0_pred_epoch1.jpg").exists()  # freq=2


# --- SuperGradients names, callback_modules=, multi_process_safe, wall_e names --------------------------------------
def test_supergradients_names_are_built_as_ours_or_refused_naming_ours():
    from yolo_cb.assembly.catalog import check_callback_names
    from yolo_cb.callbacks import multi_process_safe, rank_zero_only
    from yolo_cb.settings.config import get_config

    def check(callbacks):  # the form is checked by the settings, the registered names (and aliases) by the catalog
        check_callback_names(get_config({"callbacks": callbacks}).callbacks)

    assert multi_process_safe is rank_zero_only
    with pytest.raises(ConfigError, match=r"'EarlyStop' is a SuperGradients callback.*\(here: patience=3 monitor_mode=max monitor=fitness\)"):
        check([{"EarlyStop": {"patience": 3, "mode": "max", "monitor": "fitness"}}])
    for name, ours in (("TimerCallback", "timing is built in"), ("CosineLRCallback", "lr_scheduler=cosine"),
                       ("PPYoloETrainingStageSwitchCallback", "close_mosaic=")):
        with pytest.raises(ConfigError, match=rf"'{name}' is a SuperGradients callback yolo-cb does not build: .*{re.escape(ours)}"):
            check(name)
    with pytest.raises(ConfigError, match=r"built here as 'onnx_check', which has no counterpart of model_name"):
        check([{"ModelConversionCheckCallback": {"model_name": "yolox", "atol": 1e-3}}])
    check([{"ModelConversionCheckCallback": {"atol": 1e-3}}, "YoloXTrainingStageSwitchCallback"])
    with pytest.raises(ValueError, match=r"'after_running_batch' is a wall_e name: here it is 'on_train_batch_end'"):
        Callbacks().add_callback("after_running_batch", print)


def test_callback_modules_imports_a_registered_callback_for_the_cli(tiny, tmp_path):
    import os
    import subprocess
    import sys

    from conftest import ROOT

    package = tmp_path / "mycbs"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from pathlib import Path\nfrom yolo_cb.callbacks import register_callback\n\n\n"
        "@register_callback('epoch_marker')\nclass EpochMarker:\n    def on_fit_epoch_end(self, trainer):\n"
        "        (Path(trainer.save_dir) / f'marked{trainer.epoch}').touch()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    args = [f"{k}={v}" for k, v in {**tiny, "callback_modules": "mycbs", "callbacks": "epoch_marker"}.items()]
    done = subprocess.run([sys.executable, "-m", "yolo_cb", "train", *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (Path(tiny["project"]) / tiny["name"] / "marked0").is_file()


# --- Ultralytics API bits: Results, metrics.confusion_matrix, callbacks helpers -------------------------------------
def test_ultralytics_results_metrics_and_callback_helpers(tiny, tmp_path, monkeypatch, shapes_dir):
    from yolo_cb.assembly.assemble import add_integration_callbacks, get_default_callbacks

    callbacks = get_default_callbacks()
    assert "Progress" in [type(e.owner).__name__ for e in callbacks.entries("on_train_epoch_end")]
    callbacks.setdefault("on_train_end", []).append(print)
    assert print in callbacks["on_train_end"]
    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_val_batch_end", lambda v: v.batch_i == 0 and v.training and
                       (v.plot_val_samples(v.batch, 7), v.plot_predictions(v.batch, v.preds, 7, conf=0.0)))
    metrics = model.train(**{**tiny, "plots": True})
    run = Path(tiny["project"]) / tiny["name"]
    assert (run / "val_batch7_labels.jpg").is_file() and (run / "val_batch7_pred.jpg").is_file()
    assert metrics.confusion_matrix is not None and metrics.confusion_matrix.matrix.shape == (5, 5)
    before = len(model.trainer.callbacks.entries())
    add_integration_callbacks(model.trainer)  # already there (visualize): added once only
    assert len(model.trainer.callbacks.entries()) == before
    image = sorted((shapes_dir / "images" / "val").glob("*.jpg"))[0]
    monkeypatch.chdir(tmp_path)
    r = model(image, conf=0.0)[0]
    assert (r.masks, r.keypoints, r.probs, r.obb, r.boxes.id, r.boxes.is_track, r.save_dir) == (None, None, None, None, None, False, None)
    lines = r.to_csv().splitlines()
    assert lines[0] == "name,class,confidence,box" and len(lines) == len(r) + 1 and len(r) > 0  # Ultralytics' columns
    frame = r.to_df()
    assert list(frame.columns) == lines[0].split(",") and len(frame) == len(r)
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    r.show()  # no display: nothing shown, one warning (Ultralytics' behaviour); tests/test_ultralytics_silent.py reads it
    saved = model.predict(image, save=True, project=str(tmp_path / "p"))[0]
    assert saved.save_dir and Path(saved.save_dir, image.name).is_file()
