"""A real tiny run's callbacks.json, strict_callbacks, phase timings in results.csv, and callback state kept across a
resume (a 4-epoch run stopped after epoch 2, then resumed)."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from yolo_cb import YOLO
from yolo_cb.callbacks.dispatch import CallbackError
from yolo_cb.checkpoints.checkpoint import load_checkpoint
from yolo_cb.training.run_state import PHASES

pytestmark = pytest.mark.slow

TINY = dict(model="yolox-nano.yaml", imgsz=64, batch=8, workers=0, mosaic=0.0, mlflow=False, tensorboard=False, onnx_check=False,
            plots=False, no_aug_epochs=0, warmup_epochs=0.0, optimizer="AdamW", lr0=0.002, exist_ok=False)


class History:
    """State updated in on_fit_epoch_end, after the epoch's files were written and on_model_save fired."""

    def __init__(self):
        self.epochs: list[int] = []

    def on_fit_epoch_end(self, trainer):
        self.epochs.append(trainer.epoch)

    def state_dict(self):
        return {"epochs": list(self.epochs)}

    def load_state_dict(self, state):
        self.epochs = list(state["epochs"])


@pytest.fixture(scope="module")
def stopped_and_resumed(tmp_path_factory, shapes_small_yaml):
    """A 4-epoch run stopped after epoch 2 (strict_callbacks on: every user callback ran), then resumed."""
    root = tmp_path_factory.mktemp("record")
    run = {**TINY, "data": str(shapes_small_yaml), "project": str(root / "runs"), "name": "exp", "epochs": 4, "strict_callbacks": True}
    batches, saved_history = [], {}

    def count_batches(trainer):  # a closure: in the record under its name
        batches.append(trainer.batch_i)

    def read_last_pt(trainer):  # what last.pt holds when the next epoch starts
        if trainer.epoch > 0:
            saved_history[trainer.epoch] = load_checkpoint(trainer.last).callbacks["history"]["epochs"]

    first = YOLO("yolox-nano.yaml")
    first.add_callbacks(History(), name="history")
    first.add_callback("on_train_batch_end", count_batches)
    first.add_callback("on_train_epoch_start", read_last_pt)
    first.add_callback("on_fit_epoch_end", lambda t: setattr(t, "stop", t.epoch == 1), name="stop_after_two")
    first.train(**run)
    folder = root / "runs" / "exp"
    record_before = json.loads((folder / "callbacks.json").read_text())
    closing_history = load_checkpoint(folder / "weights" / "last.pt").callbacks["history"]["epochs"]
    second = YOLO("yolox-nano.yaml")
    history = History()
    second.add_callbacks(history, name="history")
    second.train(resume=str(folder / "weights" / "last.pt"))
    return {"folder": folder, "history": history, "record": record_before, "batches": batches, "saved_history": saved_history,
            "closing_history": closing_history}


def test_state_updated_in_on_fit_epoch_end_survives_a_resume(stopped_and_resumed):
    assert stopped_and_resumed["history"].epochs == [0, 1, 2, 3]


def test_last_pt_is_written_once_per_epoch_and_once_as_the_run_ends(stopped_and_resumed):
    """No rewrite after on_fit_epoch_end: epoch 2 starts from epoch 1's files, written before History's update; the loop's
    closing last.pt (the run stopped after epoch 2) has both updates."""
    assert stopped_and_resumed["saved_history"] == {1: []}
    assert stopped_and_resumed["closing_history"] == [0, 1]


def test_callbacks_json_records_every_callback(stopped_and_resumed):
    record = stopped_and_resumed["record"]
    rows = {(r["event"], r["name"]): r for r in record["callbacks"]}
    mine = rows[("on_train_batch_end", "count_batches")]
    assert mine["calls"] == len(stopped_and_resumed["batches"]) > 0 and mine["calls_by_rank"] == {"0": mine["calls"]}
    assert mine["origin"] == "user" and mine["max_s"] >= mine["mean_s"] > 0 and mine["errors"] == 0 and mine["enabled"]
    assert rows[("on_fit_epoch_end", "history")]["calls"] == 2
    assert rows[("on_train_epoch_end", "progress")]["origin"] == "default" and rows[("on_train_epoch_end", "progress")]["calls"] == 2
    assert record["world_size"] == 1 and record["ranks_missing"] == []
    assert rows[("teardown", "progress")]["calls"] == 1  # rewritten at teardown, after the other teardown callbacks ran


def test_the_documented_never_ran_helper_reads_the_record(stopped_and_resumed):
    doc = (Path(__file__).resolve().parents[1] / "docs" / "callbacks.md").read_text()
    section = doc[doc.index("## What ran: callbacks.json"):doc.index("## Strict mode")]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    namespace: dict = {}
    exec(compile(code, "docs/callbacks.md example", "exec"), namespace)  # noqa: S102 - the documented code
    assert namespace["never_ran"](stopped_and_resumed["folder"]) == []  # strict_callbacks passed: every user callback ran


def test_phase_timings_in_results_csv_sum_to_the_epoch_time(stopped_and_resumed):
    with open(stopped_and_resumed["folder"] / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    for row in rows:
        phases = [float(row[f"time/{name}_ms"]) for name in PHASES]
        epoch = float(row["time/epoch_ms"])
        assert all(p >= 0 for p in phases) and min(phases[:3]) > 0, row  # (4 batches of 8, nbs 64: few optimizer steps)
        assert abs(sum(phases) - epoch) <= 0.1 * epoch, (row, sum(phases), epoch)


def test_strict_callbacks_fails_a_callback_that_never_ran(tiny, caplog):
    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_params_update", lambda t: None, name="never_fires")  # epochs=1: no next epoch to update for
    model.add_callback("on_predict_end", lambda p: None, name="predict_only")
    with pytest.raises(CallbackError, match="strict_callbacks: 1 callback.*'never_fires'.*on 'on_params_update'") as info:
        model.train(**{**tiny, "epochs": 1, "strict_callbacks": True})
    assert "callbacks.json" in str(info.value)
    assert any("'predict_only'" in r.getMessage() and "training never fires" in r.getMessage() for r in caplog.records)
    record = json.loads((Path(tiny["project"]) / "exp" / "callbacks.json").read_text())
    assert next(r for r in record["callbacks"] if r["name"] == "never_fires")["calls"] == 0
