"""The callback engine on its own: names, order, errors, policies, timing, state, registry."""

from __future__ import annotations

import pytest

from yolo_cb.assembly.assemble import apply_specs, build_trainer_callbacks, parse_specs
from yolo_cb.callbacks import EVENTS, CallbackError, Callbacks, rank_zero_only
from yolo_cb.callbacks.registry import REGISTRY, register_callback
from yolo_cb.settings.config import get_config


def test_unknown_event_suggests_the_closest():
    cb = Callbacks()
    with pytest.raises(ValueError, match="(?i)did you mean 'on_fit_epoch_end'"):
        cb.add_callback("on_fit_epoch_ned", print)
    with pytest.raises(ValueError, match="unknown callback event"):
        cb.run("on_nothing", object())


def test_non_callable_is_refused():
    with pytest.raises(TypeError, match="must be callable"):
        Callbacks().add_callback("on_train_end", 42)


def test_order_is_registration_unless_declared():
    cb, seen = Callbacks(), []
    cb.add_callback("on_train_end", lambda o: seen.append("user1"), name="user1")
    cb.add_callback("on_train_end", lambda o: seen.append("default"), origin="default")
    cb.add_callback("on_train_end", lambda o: seen.append("first"), before="user1")
    cb.add_callback("on_train_end", lambda o: seen.append("user2"))
    cb.run("on_train_end", None)
    assert seen == ["first", "user1", "default", "user2"]


def test_set_clear_reset():
    cb, seen = Callbacks(), []
    cb.add_callback("on_train_end", lambda o: seen.append("d"), origin="default")
    cb.mark_defaults()
    cb.add_callback("on_train_end", lambda o: seen.append("u"))
    cb.set_callback("on_train_start", lambda o: seen.append("s"))
    cb.reset_callbacks()
    cb.run("on_train_end", None)
    cb.run("on_train_start", None)
    assert seen == ["d"]
    cb.clear_callback("on_train_end")
    cb.run("on_train_end", None)
    assert seen == ["d"]


def test_raising_callback_names_callback_and_event():
    def broken(obj):
        raise ZeroDivisionError("boom")

    cb = Callbacks()
    cb.add_callback("on_train_epoch_end", broken)
    with pytest.raises(CallbackError) as info:
        cb.run("on_train_epoch_end", None)
    text = str(info.value)
    assert "test_raising_callback_names_callback_and_event.<locals>.broken" in text and "on_train_epoch_end" in text
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_disable_policy_switches_the_whole_object_off(caplog):
    class Integration:
        calls = 0

        def on_train_start(self, trainer):
            raise RuntimeError("server down")

        def on_train_end(self, trainer):
            Integration.calls += 1

    cb = Callbacks()
    cb.add_callbacks(Integration(), origin="integration", on_error="disable")
    cb.run("on_train_start", None)
    cb.run("on_train_start", None)
    cb.run("on_train_end", None)
    assert Integration.calls == 0
    assert sum("switched off" in r.message for r in caplog.records) == 1
    row = next(r for r in cb.record() if r["event"] == "on_train_end")
    assert row["name"] == "Integration" and not row["enabled"] and "server down" in row["disabled_why"] and row["calls"] == 0


def test_warn_policy_keeps_calling():
    calls = []

    def flaky(obj):
        calls.append(1)
        raise ValueError("x")

    cb = Callbacks()
    cb.add_callback("on_train_batch_end", flaky, on_error="warn")
    for _ in range(3):
        cb.run("on_train_batch_end", None)
    assert len(calls) == 3


def test_object_with_misspelt_method_is_refused():
    class Bad:
        def on_fit_epoch_ed(self, trainer):
            pass

    with pytest.raises(ValueError, match="names no event.*on_fit_epoch_end"):
        Callbacks().add_callbacks(Bad())


def test_timing_stats_and_table():
    cb = Callbacks()
    cb.add_callback("on_train_end", lambda o: None)
    for _ in range(5):
        cb.run("on_train_end", None)
    row = cb.stats()[0]
    assert row["calls"] == 5 and row["total_s"] >= 0
    assert "on_train_end" in cb.table()


def test_state_round_trip_and_unclaimed_warning(caplog):
    from cbpkg import Marker

    cb = Callbacks()
    m = Marker()
    m.count = 7
    cb.add_callbacks(m)
    state = cb.state_dict()
    assert state == {"Marker": {"count": 7}}  # under its declared name (default: the class's name)
    other = Callbacks()
    fresh = Marker()
    other.add_callbacks(fresh)
    other.load_state_dict({**state, "gone.Callback": {"x": 1}})
    assert fresh.count == 7
    assert any("gone.Callback" in r.message and "no callback of this run has that name" in r.message for r in caplog.records)
    older = Callbacks()
    legacy = Marker()
    older.add_callbacks(legacy)
    older.load_state_dict({"cbpkg.Marker": {"count": 3}})  # a checkpoint from before declared names: its qualified class name
    assert legacy.count == 3


def test_specs_cli_and_yaml_forms_register_the_same(tmp_path):
    cli = Callbacks()
    apply_specs(cli, "on_fit_epoch_end=cbpkg:log_epoch,cbpkg:Marker,test_marker")
    yml = Callbacks()
    apply_specs(yml, [{"on_fit_epoch_end": "cbpkg:log_epoch"}, "cbpkg:Marker", {"test_marker": {"tag": "y"}}])
    py = Callbacks()
    import cbpkg

    py.add_callback("on_fit_epoch_end", cbpkg.log_epoch)
    py.add_callbacks(cbpkg.Marker())
    py.add_callbacks(REGISTRY["test_marker"](), name="test_marker")
    names = lambda c: [(e, x.name) for e in EVENTS for x in c.entries(e)]  # noqa: E731
    assert names(cli) == names(yml) == names(py)


def test_unknown_registered_name_and_bad_import_path():
    with pytest.raises(ValueError, match="'early_stoping' is not a registered callback. Did you mean 'early_stopping'"):
        apply_specs(Callbacks(), "early_stoping")
    with pytest.raises(ValueError, match="needs that module imported first: callback_modules=mypkg.cbs"):  # issue #42
        apply_specs(Callbacks(), "my_own_logger")
    with pytest.raises(ValueError, match="cannot import module 'nopkg.mod'"):
        apply_specs(Callbacks(), "on_train_end=nopkg.mod:fn")
    with pytest.raises(ValueError, match="unknown event 'on_train_ned'"):
        apply_specs(Callbacks(), "on_train_ned=cbpkg:log_epoch")


def test_parse_specs_forms():
    assert parse_specs("a, b=c:d") == ["a", "b=c:d"]
    assert parse_specs(None) == []
    assert parse_specs({"x": {"k": 1}}) == [{"x": {"k": 1}}]


def test_register_callback_refuses_a_second_owner():
    @register_callback("unique_test_name")
    class A:
        def on_train_end(self, t):
            pass

    with pytest.raises(ValueError, match="already registered"):
        register_callback("unique_test_name")(type("B", (), {}))


def test_trainer_callbacks_defaults_then_integrations_then_user():
    args = get_config({"mlflow": False, "tensorboard": False, "onnx_check": False, "plots": False, "no_aug_epochs": 0,
                       "callbacks": "on_fit_epoch_end=cbpkg:log_epoch"})
    user = Callbacks()
    user.add_callback("on_fit_epoch_end", print)
    cb = build_trainer_callbacks(args, user)
    origins = [e.origin for e in cb.entries("on_fit_epoch_end")]
    assert origins == sorted(origins, key=["default", "integration", "user", "yaml"].index)
    assert [e.name for e in cb.entries("on_fit_epoch_end")][-2:] == ["print", "log_epoch"]


def test_rank_zero_only(monkeypatch):
    calls = []
    fn = rank_zero_only(lambda o: calls.append(1))
    monkeypatch.setenv("RANK", "1")
    fn(None)
    monkeypatch.setenv("RANK", "0")
    fn(None)
    assert calls == [1]


class RankZeroLogger:
    """A callback class that is rank-0-only by nature: it says so once, and has no `is_main` check of its own."""

    rank_zero_only = True

    def __init__(self):
        self.seen: list[int] = []

    def on_fit_epoch_end(self, trainer):
        self.seen.append(trainer.rank)


def test_the_dispatcher_does_not_call_rank_zero_only_callbacks_on_other_ranks(monkeypatch):
    """The rank_zero_only flag (a class's attribute, or the decorator on a function or one method) is honoured by the
    dispatcher: on a rank > 0 such a callback is not called (its calls stay 0 in the record); on rank 0 and without DDP
    (rank -1) it is; a callback without the flag runs on every rank."""
    from types import SimpleNamespace

    class Mixed:
        def __init__(self):
            self.calls: list[str] = []

        def on_fit_epoch_end(self, trainer):
            self.calls.append("every rank")

        @rank_zero_only
        def on_train_end(self, trainer):
            self.calls.append("rank 0")

    monkeypatch.delenv("RANK", raising=False)
    cb, logger, mixed, plain = Callbacks(), RankZeroLogger(), Mixed(), []
    cb.add_callbacks(logger)
    cb.add_callbacks(mixed)
    cb.add_callback("on_fit_epoch_end", rank_zero_only(lambda t: plain.append(("decorated", t.rank))))
    cb.add_callback("on_fit_epoch_end", lambda t: plain.append(("plain", t.rank)))
    for rank in (1, 0, -1):
        cb.run("on_fit_epoch_end", SimpleNamespace(rank=rank))
        cb.run("on_train_end", SimpleNamespace(rank=rank))
    assert logger.seen == [0, -1]
    assert plain == [("plain", 1), ("decorated", 0), ("plain", 0), ("decorated", -1), ("plain", -1)]
    assert mixed.calls == ["every rank", "every rank", "rank 0", "every rank", "rank 0"]
    rows = {(r["event"], r["name"]): r for r in cb.record()}
    assert rows[("on_fit_epoch_end", "RankZeroLogger")]["calls"] == 2 and rows[("on_fit_epoch_end", "RankZeroLogger")]["rank"] == "rank 0"
    seen, other = [], Callbacks()  # an object with no rank of its own (a validator): this process's RANK decides
    other.add_callback("on_val_end", rank_zero_only(lambda v: seen.append("rank 0")))
    other.add_callback("on_val_end", lambda v: seen.append("every rank"))
    monkeypatch.setenv("RANK", "1")
    other.run("on_val_end", SimpleNamespace())
    monkeypatch.setenv("RANK", "0")
    other.run("on_val_end", SimpleNamespace())
    assert seen == ["every rank", "rank 0", "every rank"]


def test_callbacks_that_declare_rank_zero_only_keep_no_is_main_check_of_their_own():
    """Issue 60: the flag was described on 8 callbacks while ~20 hand-written `is_main` checks remained. A callback class
    that declares `rank_zero_only = True` checks no rank itself (the dispatcher does)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "yolo_cb"
    declaring = []
    for path in sorted([*root.glob("integrations/*.py"), *root.glob("callbacks/*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(isinstance(n, ast.Assign) and [getattr(t, "id", "") for t in n.targets] == ["rank_zero_only"]
                                                        for n in node.body):
                declaring.append(node.name)
                checks = [n.lineno for n in ast.walk(node) if isinstance(n, ast.Attribute) and n.attr == "is_main"]
                assert not checks, f"{path.name}:{node.name} declares rank_zero_only and checks is_main at {checks}"
    assert {"MLflow", "WandB", "TensorBoard", "Tracker", "RayTuneReport", "WorstImages", "Visualize", "OnnxCheck"} <= set(declaring), declaring


def test_the_recipe_is_no_callback_and_its_old_names_place_nothing():
    """The LR schedule, results.csv and the checkpoint files are the loop's steps (called before on_model_save fires),
    not callbacks; after= / before= naming the callbacks they once were is accepted and places nothing."""
    user = Callbacks()
    user.add_callback("on_model_save", print, after="checkpoint")
    user.add_callback("on_fit_epoch_end", repr, before="results_csv")
    cb = build_trainer_callbacks(get_config({"mlflow": False, "tensorboard": False, "onnx_check": False}), user)
    every = {e.name for e in cb.entries()}
    assert not every & {"checkpoint", "results_csv", "lr_schedule", "epoch_state", "early_stopping"}, every
    assert [e.name for e in cb.entries("on_model_save")] == ["print"]
