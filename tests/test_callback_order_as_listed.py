"""The order a user sees is the order that runs: for every way to register callbacks (add_callback, the live list's
append / insert / extend / assignment, add_callbacks(obj), `callbacks=` on the CLI), `model.callbacks[event]` lists
them in the order a real training fires them, among the built-ins (whose after="*" once reshuffled them: a list
D A B C fired B C D A)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from yolo_cb import YOLO

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
EVENT = "on_fit_epoch_end"  # the event where the integrations declare after=


def recorder(fired: list[str], label: str):
    def callback(trainer):
        fired.append(label)

    callback.__name__ = f"cb_{label}"
    return callback


class ObjectCallback:
    """add_callbacks(obj): its on_fit_epoch_end is one more entry, placed where it was registered."""

    def __init__(self, fired: list[str]):
        self.fired = fired

    def on_fit_epoch_end(self, trainer):
        self.fired.append("obj")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, shapes_small_yaml):
    """One real training with callbacks registered every Python way, in an order where each way matters."""
    from conftest import TINY

    fired: list[str] = []
    model = YOLO("yolox-nano.yaml")
    cb = {label: recorder(fired, label) for label in "ABCDEFGHIJ"}
    model.add_callback(EVENT, cb["A"])  # add_callback
    model.callbacks[EVENT].append(cb["B"])  # list append
    model.add_callback(EVENT, cb["C"])
    model.callbacks[EVENT].insert(0, cb["D"])  # list insert at the front: D A B C
    model.callbacks[EVENT].extend([cb["E"], cb["F"]])  # list extend
    model.add_callbacks(ObjectCallback(fired))  # an object's on_* method
    model.callbacks[EVENT].insert(2, cb["G"])  # insert in the middle: D A G B C E F obj
    model.callbacks["on_train_end"] = [cb["H"], cb["I"]]  # list assignment (replaces the event's list)
    model.callbacks["on_train_end"].insert(0, cb["J"])  # J H I
    listed = {event: [getattr(fn, "__name__", "obj").removeprefix("cb_") if not hasattr(fn, "__self__") else "obj"
                      for fn in model.callbacks[event]] for event in (EVENT, "on_train_end")}
    run = tmp_path_factory.mktemp("order")
    model.train(**{**TINY, "data": str(shapes_small_yaml), "project": str(run), "name": "exp"})
    return listed, fired, model


def fired_per_epoch(fired: list[str]) -> list[str]:
    """The labels fired at the first epoch's on_fit_epoch_end (each registered label fires once per epoch there)."""
    first = [x for x in fired if x not in "HIJ"]
    return first[:len(set(first))]


def test_add_callback_and_list_append_fire_as_listed(trained):
    listed, fired, _ = trained
    assert listed[EVENT] == ["D", "A", "G", "B", "C", "E", "F", "obj"]
    order = fired_per_epoch(fired)
    assert [x for x in order if x in "ABC"] == ["A", "B", "C"]


def test_list_insert_at_the_front_and_in_the_middle_holds(trained):
    listed, fired, _ = trained
    assert fired_per_epoch(fired)[:3] == ["D", "A", "G"]  # failed on 7f3d9f3: B C ... D A


def test_list_extend_and_add_callbacks_object_fire_as_listed(trained):
    listed, fired, _ = trained
    assert fired_per_epoch(fired) == listed[EVENT]


def test_list_assignment_and_insert_fire_as_listed(trained):
    listed, fired, _ = trained
    assert listed["on_train_end"] == ["J", "H", "I"]
    assert [x for x in fired if x in "HIJ"] == ["J", "H", "I"]


def test_the_trainers_set_keeps_the_users_list_among_the_built_ins(trained):
    """What `yolo-cb callbacks` / training_callbacks() show is the same order, the built-ins around it."""
    listed, _, model = trained
    names = [e.name for e in model.trainer.callbacks.entries(EVENT)]
    users = [n for n in names if n.startswith("cb_") or n == "ObjectCallback"]
    assert [n.removeprefix("cb_") if n != "ObjectCallback" else "obj" for n in users] == listed[EVENT]
    assert "epoch_state" not in names  # the saver's keep_up step, no callback


def test_declared_after_is_applied_on_top_of_the_listed_order(tiny):
    """after= moves only the callback that declares it; the rest keep their listed order, and `training_callbacks()`
    (what `yolo-cb callbacks` prints) shows the order that fires."""
    fired: list[str] = []
    model = YOLO("yolox-nano.yaml")
    for label in "PQR":
        model.add_callback(EVENT, recorder(fired, label))
    model.add_callback(EVENT, recorder(fired, "S"), after="mlflow")  # an integration this run leaves out: places nothing
    model.callbacks[EVENT].insert(0, recorder(fired, "T"))
    shown = [e.name.removeprefix("cb_") for e in model.training_callbacks(**tiny).entries(EVENT) if e.name.startswith("cb_")]
    model.train(**tiny)
    assert fired == shown == ["T", "P", "Q", "R", "S"]


def test_cli_cfg_callbacks_with_before_land_where_declared(tmp_path, shapes_small_yaml):
    """`callbacks=` on the CLI, from a cfg= YAML's list with before= (the form that reshuffled on 7f3d9f3: c a b(before c) fired a b c):
    b lands right before c, a keeps its place after them (a real subprocess)."""
    import yaml
    from conftest import TINY

    log = tmp_path / "order.jsonl"
    specs = [{EVENT: "cbpkg:order_c"}, {EVENT: "cbpkg:order_a"}, {EVENT: {"call": "cbpkg:order_b", "before": "order_c"}}]
    cfg = tmp_path / "custom.yaml"
    cfg.write_text(yaml.safe_dump({"callbacks": specs}))
    settings = {**TINY, "data": str(shapes_small_yaml), "project": str(tmp_path / "runs"), "name": "exp"}
    env = {**os.environ, "CBPKG_LOG": str(log), "PYTHONPATH": str(ROOT / "tests")}
    out = subprocess.run([sys.executable, "-m", "yolo_cb", "train", f"cfg={cfg}", *[f"{k}={v}" for k, v in settings.items()]],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert [json.loads(line)["label"] for line in log.read_text().splitlines()] == ["b", "c", "a"]
