"""How a callback steers a run: the trainer's controls (request_stop, withdraw_stop, end_after, validate_each_epoch,
restore_best), never a write of a setting or of the run's length (docs/callbacks.md, "Controls")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from yolo_cb import YOLO
from yolo_cb.recipe.stop import StopCause
from yolo_cb.settings.config import get_config

PACKAGE = Path(__file__).resolve().parents[1] / "yolo_cb"
# run-state names only the trainer writes; a callback reaches them through a control
OWNED_BY_THE_TRAINER = {"stop_cause", "stop_reason", "epochs", "start_epoch", "epoch", "validate_every_epoch"}
# the functions that fill settings in while a run is planned, all called from yolo_cb/training/plan.py before it seals them
PLANNING = {("training/plan.py", "fresh_train_args"), ("settings/config.py", "settle")}


def writes_outside_the_plan(package: Path) -> list[str]:
    """'file:line what' for each write of a setting (`<x>.args.name = ...`, `args.name = ...`) outside PLANNING, and each
    write of a trainer-owned name or of `trainer.stop = False` outside training/."""
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        tree = ast.parse(path.read_text())
        for function in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            for node in ast.walk(function):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
                flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
                for target in (t for t in flat if isinstance(t, ast.Attribute)):
                    found += _bad_write(rel, function.name, target, node)
    return sorted(set(found))


def _bad_write(rel: str, function: str, target: ast.Attribute, node: ast.AST) -> list[str]:
    base = target.value
    is_args = (isinstance(base, ast.Name) and base.id == "args") or (isinstance(base, ast.Attribute) and base.attr == "args")
    if is_args and not target.attr.startswith("_") and (rel, function) not in PLANNING:
        return [f"{rel}:{node.lineno} args.{target.attr}"]
    on_trainer = isinstance(base, ast.Name) and base.id == "trainer"
    if on_trainer and not rel.startswith("training/"):
        withdrawn = target.attr == "stop" and isinstance(getattr(node, "value", None), ast.Constant) and node.value.value is False
        if target.attr in OWNED_BY_THE_TRAINER or withdrawn:
            return [f"{rel}:{node.lineno} trainer.{target.attr}"]
    return []


def test_no_code_outside_the_trainer_writes_a_setting_or_the_run_length():
    assert writes_outside_the_plan(PACKAGE) == []


def test_the_scan_sees_planted_writes(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "integrations").mkdir(parents=True)
    (pkg / "integrations" / "x.py").write_text(
        "def on_fit_epoch_end(trainer):\n    trainer.stop = False\n    trainer.epochs = 3\n    trainer.args.lr0 = 0.1\n"
        "    trainer.stop = True\n")
    assert writes_outside_the_plan(pkg) == ["integrations/x.py:2 trainer.stop", "integrations/x.py:3 trainer.epochs",
                                            "integrations/x.py:4 args.lr0"]


def test_a_sealed_setting_refuses_a_write_naming_it_and_the_controls():
    args = get_config({"epochs": 3}).seal()
    args.epochs = 3  # the same value: no change, no error
    with pytest.raises(AttributeError, match=r"args\.epochs cannot be changed.*trainer\.end_after"):
        args.epochs = 5
    assert args.epochs == 3


class Steering:
    """Epoch 0: asks for a stop, which a second callback withdraws; epoch 1: shortens the 4-epoch run to 2 epochs;
    a write of a setting from a callback raises."""

    def __init__(self):
        self.withdrawn, self.refusal, self.validated = [], None, []

    def on_train_start(self, trainer):
        try:
            trainer.args.lr0 = 1.0
        except AttributeError as error:
            self.refusal = str(error)
        trainer.validate_each_epoch()

    def ask(self, trainer):
        if trainer.epoch == 0:
            trainer.request_stop(StopCause.CALLBACK, "asked by the first callback")

    def withdraw(self, trainer):
        self.withdrawn.append(trainer.withdraw_stop(StopCause.CALLBACK))
        self.validated.append(trainer.validated_this_epoch)
        if trainer.epoch == 1:
            trainer.end_after(2)


@pytest.mark.slow
def test_callbacks_steer_through_the_controls(tiny):
    steering, model = Steering(), YOLO("yolox-nano.yaml")
    model.add_callback("on_train_start", steering.on_train_start)
    model.add_callback("on_fit_epoch_end", steering.ask)
    model.add_callback("on_fit_epoch_end", steering.withdraw)
    model.train(**{**tiny, "epochs": 4, "val": True, "val_period": 5})
    trainer = model.trainer
    assert steering.refusal is not None and "args.lr0 cannot be changed" in steering.refusal and trainer.args.lr0 != 1.0
    assert steering.withdrawn == [True, False]  # epoch 0's stop was withdrawn; epoch 1 had none
    assert trainer.epoch == 1 and trainer.epochs == 2 and trainer.stop is False  # ended after 2 of 4 epochs
    assert steering.validated == [True, True]  # val_period=5, yet every epoch validated (validate_each_epoch)
    rows = (Path(trainer.save_dir) / "results.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + 2
    for impossible in (1, 5, True):  # fewer than the 2 completed, more than the 4 planned, not an integer
        with pytest.raises(ValueError, match=r"end_after.*from 2 .* to 4"):
            trainer.end_after(impossible)
