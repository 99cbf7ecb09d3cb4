"""Real tiny trainings: every event fires in order, errors, stop, stateful callbacks across resume."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from yolo_cb import YOLO
from yolo_cb.callbacks import CallbackError
from yolo_cb.callbacks.events import TRAINER_EVENTS, VALIDATOR_EVENTS
from yolo_cb.recipe.stop import StopCause

pytestmark = pytest.mark.slow


def record_all(model: YOLO, seen: list) -> None:
    for event in {**TRAINER_EVENTS, **VALIDATOR_EVENTS}:
        model.add_callback(event, lambda obj, e=event: seen.append(e))


def test_every_trainer_and_validator_event_fires_in_order(tiny):
    seen: list[str] = []
    model = YOLO("yolox-nano.yaml")
    record_all(model, seen)
    model.train(**{**tiny, "epochs": 2})
    counts = Counter(seen)
    batches = 4 * 2  # 32 images / batch 8, two epochs
    optimizer_steps = counts["optimizer_step"]
    assert counts["on_pretrain_routine_start"] == counts["on_pretrain_routine_end"] == counts["on_train_start"] == 1
    assert counts["on_train_epoch_start"] == counts["on_train_epoch_end"] == 2
    for event in ("on_train_batch_start", "on_train_batch_loss_end", "on_after_backward", "on_train_batch_end"):
        assert counts[event] == batches, event
    assert 1 <= optimizer_steps == counts["on_before_zero_grad"] == counts["on_before_optimizer_step"] <= batches
    assert counts["on_model_save"] == counts["on_fit_epoch_end"] == 2
    assert counts["on_params_update"] == 1  # between the two epochs
    assert counts["on_train_end"] == counts["teardown"] == 1 and counts["on_exception"] == 0
    assert counts["on_val_start"] == counts["on_val_end"] == 3  # each epoch + final validation of best.pt
    assert counts["on_val_batch_start"] == counts["on_val_batch_end"] > 0
    # documented order of the once-per-run and per-epoch events
    firsts = [e for e in seen if e in ("on_pretrain_routine_start", "on_pretrain_routine_end", "on_train_start")]
    assert firsts == ["on_pretrain_routine_start", "on_pretrain_routine_end", "on_train_start"]
    epoch1 = seen[seen.index("on_train_epoch_start"):seen.index("on_fit_epoch_end") + 1]
    order = [e for e in dict.fromkeys(epoch1)]
    assert order.index("on_train_batch_start") < order.index("on_train_batch_loss_end") < order.index("on_after_backward") < order.index("on_train_batch_end")
    assert order.index("on_train_epoch_end") < order.index("on_val_start") < order.index("on_val_end") < order.index("on_model_save") < order.index("on_fit_epoch_end")
    assert seen[-2:] == ["on_train_end", "teardown"]
    assert seen.index("on_params_update") > seen.index("on_fit_epoch_end")
    assert seen.index("on_after_backward") < seen.index("on_before_optimizer_step") < seen.index("optimizer_step")


def test_raising_callback_saves_last_fires_exception_and_teardown(tiny, tmp_path):
    seen = []

    def explode(trainer):
        raise KeyError("metrics/mAP")

    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_fit_epoch_end", explode)
    model.add_callback("on_exception", lambda t: seen.append(("on_exception", type(t.exception).__name__)))
    model.add_callback("teardown", lambda t: seen.append(("teardown", None)))
    with pytest.raises(CallbackError, match=r"callback 'explode' \(test_trainer_events.test_raising_callback_saves_last_fires_exception_and_teardown.<locals>.explode\) failed in event 'on_fit_epoch_end'"):
        model.train(**tiny)
    assert seen == [("on_exception", "CallbackError"), ("teardown", None)]
    last = tmp_path / "runs" / "exp" / "weights" / "last.pt"
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["epoch"] == 0 and ckpt["optimizer"] is not None


def test_disable_policy_callback_does_not_stop_training(tiny, caplog):
    def broken(trainer):
        raise RuntimeError("logging server down")

    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_train_batch_end", broken, on_error="disable")
    metrics = model.train(**tiny, verbose=True)
    assert "metrics/mAP50-95(B)" in metrics
    table = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("callbacks, per event in firing order"))
    assert "on_train_batch_end" in table and "disable" in table and "broken" in table


def test_stop_at_batch_two_ends_epoch_early_and_run_cleanly(tiny):
    seen = []

    def stop_at_batch_2(trainer):
        if trainer.batch_i == 1:
            trainer.stop, trainer.stop_reason = True, "test stop"

    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_train_batch_end", stop_at_batch_2)
    for event in ("on_train_batch_end", "on_fit_epoch_end", "on_val_end", "on_train_end", "teardown"):
        model.add_callback(event, lambda t, e=event: seen.append(e))
    metrics = model.train(**{**tiny, "epochs": 3})
    counts = Counter(seen)
    assert counts["on_train_batch_end"] == 2 and counts["on_fit_epoch_end"] == 1
    assert counts["on_val_end"] == 2  # the stopped epoch + final validation of best.pt
    assert counts["on_train_end"] == counts["teardown"] == 1
    assert "metrics/mAP50-95(B)" in metrics
    assert model.trainer.stop_reason == "test stop"


def test_design_example_stop_at_target_works_as_written(tiny):
    def stop_at_target(trainer):
        score = trainer.metrics["metrics/mAP50-95(B)"]
        if score >= 0.0:
            trainer.stop = True

    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_fit_epoch_end", stop_at_target)
    model.train(**{**tiny, "epochs": 5})
    assert model.trainer.epoch == 0
    assert model.trainer.stop_cause is StopCause.CALLBACK  # a plain trainer.stop = True


def test_a_stop_with_a_finishing_cause_leaves_final_checkpoints(tiny):
    """request_stop(StopCause.TARGET, ...) (the docs' example): the cause is kept, and the run counts as finished, so
    last.pt is final (no optimizer state) where a plain stop keeps it resumable."""
    def stop_at_target(trainer):
        if trainer.metrics.get("metrics/mAP50-95(B)", 0) >= 0.0:
            trainer.request_stop(StopCause.TARGET, "target mAP reached")
            trainer.request_stop(StopCause.CALLBACK, "a second request does not replace the first")

    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_fit_epoch_end", stop_at_target)
    model.train(**{**tiny, "epochs": 3})
    assert (model.trainer.stop_cause, model.trainer.stop_reason) == (StopCause.TARGET, "target mAP reached")
    last = torch.load(Path(tiny["project"]) / tiny["name"] / "weights" / "last.pt", weights_only=True)
    assert last["optimizer"] is None and last["finished"] is True and last["epoch"] == 0


def test_stateful_callback_state_survives_resume(tiny, tmp_path):
    from cbpkg import Marker

    first = Marker()
    model = YOLO("yolox-nano.yaml")
    model.add_callbacks(first)
    model.add_callback("on_fit_epoch_end", lambda t: setattr(t, "stop", t.epoch == 1))
    model.train(**{**tiny, "epochs": 4})
    assert first.count == 2
    last = tmp_path / "runs" / "exp" / "weights" / "last.pt"
    assert torch.load(last, weights_only=True)["callbacks"]["Marker"] == {"count": 2}  # under its declared name
    second = Marker()
    resumed = YOLO("yolox-nano.yaml")
    resumed.add_callbacks(second)
    resumed.add_callback("on_train_start", lambda t: setattr(second, "at_start", second.count))
    resumed.train(resume=str(last))
    assert second.at_start == 2 and second.count == 4


def test_cli_yaml_and_python_declarations_register_the_same(tiny, tmp_path):
    from yolo_cb.assembly.assemble import build_trainer_callbacks
    from yolo_cb.settings.config import get_config

    cfg = tmp_path / "cb.yaml"
    cfg.write_text("callbacks:\n  - on_fit_epoch_end: cbpkg:log_epoch\n  - cbpkg:Marker\n")
    from_cli = build_trainer_callbacks(get_config({"callbacks": "on_fit_epoch_end=cbpkg:log_epoch,cbpkg:Marker"}))
    from_yaml = build_trainer_callbacks(get_config({"cfg": str(cfg)}))
    import cbpkg

    model = YOLO("yolox-nano.yaml").add_callback("on_fit_epoch_end", cbpkg.log_epoch).add_callbacks(cbpkg.Marker())
    from_python = build_trainer_callbacks(get_config({}), model.callbacks)
    table = lambda c: [(e.name, "declared" if e.origin in ("user", "yaml") else e.origin) for e in c.entries()]  # noqa: E731
    assert table(from_cli) == table(from_yaml) == table(from_python)
    assert {e.origin for e in from_yaml.entries() if e.name == "log_epoch"} == {"yaml"}
    assert {e.origin for e in from_python.entries() if e.name == "log_epoch"} == {"user"}


def test_one_registration_reaches_train_val_export_and_predict(tiny, tmp_path, shapes_dir):
    seen = Counter()
    model = YOLO("yolox-nano.yaml")
    for event in ("on_train_end", "on_val_end", "on_export_end", "on_predict_end"):
        model.add_callback(event, lambda obj, e=event: seen.update([(e, type(obj).__name__)]))
    model.train(**tiny)
    model.val(project=str(tmp_path / "val"))
    model.export(format="onnx")
    model.predict(str(sorted((shapes_dir / "images" / "val").glob("*.jpg"))[0]), project=str(tmp_path / "predict"))
    assert seen == Counter({("on_train_end", "Trainer"): 1, ("on_val_end", "Validator"): 3, ("on_export_end", "Exporter"): 1,
                            ("on_predict_end", "Predictor"): 1})
