"""Declared callback order: names, after= / before=, across defaults, integrations, user callbacks and YAML specs;
cycles and unknown names fail naming the callbacks; `yolo-cb callbacks` prints the resolved order (pinned)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from yolo_cb.assembly.assemble import build_trainer_callbacks
from yolo_cb.callbacks import Callbacks
from yolo_cb.errors import ConfigError
from yolo_cb.settings.config import get_config

ROOT = Path(__file__).resolve().parents[1]
QUIET = {"mlflow": False, "onnx_check": False, "wandb": False}


def names(cb: Callbacks, event: str) -> list[str]:
    return [e.name for e in cb.entries(event)]


def test_declared_order_across_defaults_integrations_user_and_yaml():
    user = Callbacks()
    user.add_callback("on_fit_epoch_end", lambda t: None, name="mine", before="visualize")
    user.add_callback("on_fit_epoch_end", lambda t: None, name="after_yaml", after="yaml_log")
    spec = [{"on_fit_epoch_end": {"call": "cbpkg:log_epoch", "name": "yaml_log", "before": "tensorboard"}}]
    cb = build_trainer_callbacks(get_config({**QUIET, "tensorboard": True, "callbacks": spec}), user)
    order = names(cb, "on_fit_epoch_end")
    assert order.index("mine") < order.index("visualize")  # a user callback placed before an integration
    assert order.index("yaml_log") < order.index("tensorboard")  # a YAML spec placed before an integration
    assert order.index("after_yaml") > order.index("yaml_log")  # a user callback after a YAML one
    assert not {"early_stopping", "stop_stage", "results_csv", "epoch_state"} & set(order)  # steps of the loop, no callbacks
    origins = {e.name: e.origin for e in cb.entries("on_fit_epoch_end")}
    assert (origins["mine"], origins["yaml_log"], origins["tensorboard"], origins["visualize"]) == ("user", "yaml", "integration", "integration")


def test_dispatch_follows_the_declared_order_and_ties_keep_registration_order():
    cb, seen = Callbacks(), []
    for label, kwargs in [("a", {}), ("b", {}), ("c", {"before": "a"}), ("d", {"after": "*"}), ("e", {}), ("f", {"after": "a"})]:
        cb.add_callback("on_train_end", lambda o, label=label: seen.append(label), name=label, **kwargs)
    cb["on_train_end"].insert(1, lambda o: seen.append("inserted"))  # Ultralytics' list habit: position 1 holds
    cb.run("on_train_end", None)
    assert seen == ["c", "inserted", "a", "b", "e", "f", "d"]  # f: after a, and registered after e


def test_an_object_with_on_methods_is_placed_by_name():
    class Clip:
        def on_before_optimizer_step(self, trainer):
            seen.append("clip")

    class GradLog:
        after = "Clip"  # a class's own declaration

        def on_before_optimizer_step(self, trainer):
            seen.append("log")

    cb, seen = Callbacks(), []
    cb.add_callbacks(GradLog())
    cb.add_callbacks(Clip(), name="Clip")
    cb.run("on_before_optimizer_step", None)
    assert seen == ["clip", "log"]


def test_a_cycle_fails_naming_the_callbacks():
    cb = Callbacks()
    cb.add_callback("on_train_end", print, name="alpha", after="beta")
    with pytest.raises(ConfigError, match=r"cycle.*(alpha -> beta -> alpha|beta -> alpha -> beta)"):
        cb.add_callback("on_train_end", repr, name="beta", after="alpha")
    assert names(cb, "on_train_end") == ["alpha"]  # the refused one is not registered


def test_an_unknown_name_fails_with_a_suggestion():
    user = Callbacks()
    user.add_callback("on_model_save", print, after="chekpoint")
    with pytest.raises(ConfigError, match="after='chekpoint'.*Did you mean 'checkpoint'"):
        build_trainer_callbacks(get_config(QUIET), user)
    absent = Callbacks()
    absent.add_callback("on_model_save", print, after="lr_schedule")  # a built-in this run leaves out: no error
    cb = build_trainer_callbacks(get_config({**QUIET, "lr_scheduler": "none", "warmup_epochs": 0}), absent)
    assert "lr_schedule" not in names(cb, "on_model_save")


def test_two_callbacks_of_one_name_are_told_apart():
    cb = Callbacks()
    cb.add_callback("on_train_end", lambda o: None, name="log")
    cb.add_callback("on_train_end", lambda o: None, name="log")
    assert names(cb, "on_train_end") == ["log", "log#2"]


PINNED = """\
event                        callback               origin       on_error  rank
on_pretrain_routine_end      tensorboard            integration  disable   rank 0
                             visualize              integration  disable   rank 0
on_train_epoch_start         progress               default      raise     rank 0
                             stage_switch           integration  raise     all ranks
                             visualize              integration  disable   rank 0
on_train_batch_end           progress               default      raise     rank 0
                             visualize              integration  disable   rank 0
on_train_epoch_end           progress               default      raise     rank 0
on_fit_epoch_end             tensorboard            integration  disable   rank 0
                             visualize              integration  disable   rank 0
                             log_epoch              yaml         raise     all ranks
on_train_end                 tensorboard            integration  disable   rank 0
                             callback_record        default      raise     all ranks
teardown                     progress               default      raise     rank 0
                             tensorboard            integration  disable   rank 0
                             callback_record        default      raise     rank 0
on_val_batch_end             visualize              integration  disable   rank 0
"""


def test_cli_callbacks_prints_the_resolved_default_set():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    cmd = [sys.executable, "-m", "yolo_cb", "callbacks", "mlflow=false", "onnx_check=false", "tensorboard=true",
           "callbacks=on_fit_epoch_end=cbpkg:log_epoch"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == PINNED
    bad = subprocess.run([*cmd[:4], "callbacks=[{on_fit_epoch_end: {call: 'cbpkg:log_epoch', before: chekpoint}}]"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2 and "before='chekpoint'" in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_describe_is_what_the_table_prints():
    cb = build_trainer_callbacks(get_config(QUIET))
    rows = cb.describe()
    assert {"event", "name", "origin", "on_error", "rank", "where"} <= set(rows[0])
    assert [r["name"] for r in rows if r["event"] == "on_model_save"] == names(cb, "on_model_save")
    assert all(r["name"] in cb.table() for r in rows)


def test_a_removed_callback_leaves_no_dangling_place():
    cb = Callbacks()
    first, second = (lambda o: None), (lambda o: None)
    cb["on_train_end"].append(first)
    cb["on_train_end"].insert(0, second)  # declared before the first lambda
    cb["on_train_end"].remove(first)
    assert cb.entries("on_train_end")[0].before == ()
    cb.check_names()  # no error for a name that was there and was removed
