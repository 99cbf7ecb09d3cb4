"""The trainer's public names: what callbacks, integrations, tune and the docs' examples read (and write) on `trainer`.

The trainer keeps its state in a private typed RunState (`_state`, yolo_cb/training/run_state.py) and its parts in private
collaborators (`_parts`, `_step`, `_place`, `_clock`, `_output`, `_recipe`); these names stay readable on the trainer
itself, and only the controls (yolo_cb/settings/controls.py CONTROLS, the one list) steer the run."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest

from yolo_cb import YOLO
from yolo_cb.recipe.schedule import LRSchedule, Warmup
from yolo_cb.recipe.stop import StopCause
from yolo_cb.settings.controls import CONTROL_NAMES, CONTROLS_HINT
from yolo_cb.training.run_state import RunState
from yolo_cb.training.step import BatchStep, StepResult
from yolo_cb.training.trainer import Trainer

# found by grepping `trainer.` in yolo_cb/callbacks, yolo_cb/integrations, yolo_cb/tune, tests/cbpkg, docs and tests
CALLBACK_NAMES = (
    # Ultralytics' names
    "args", "epoch", "epochs", "start_epoch", "metrics", "fitness", "best_fitness", "tloss", "loss", "loss_items", "lr",
    "model", "ema", "optimizer", "train_loader", "test_loader", "validator", "data", "device", "save_dir", "wdir", "best",
    "last", "plots", "epoch_time", "epoch_time_start", "batch_size", "stop", "stop_reason", "add_callback",
    "label_loss_items", "callbacks", "criterion", "scaler", "accumulate", "last_opt_step", "world_size", "rank",
    # yolo-cb's own
    "batch", "batch_i", "batches_done", "num_batches", "optimizer_steps", "save_step_due", "completed_epoch",
    "metrics_epoch", "validated_this_epoch", "monitor", "monitor_value", "improved", "best_epoch", "stop_cause",
    "request_stop", "exception", "is_main", "elapsed", "resume_ckpt", "loss_names", "frozen", "validate_every_epoch",
    "momentum", "warmup_iters", "warmup_bias_lr", "batch_instances", "batch_size_px", "checkpoint_dict",
    "data_fingerprint", "lr_schedule", "epoch_record", "new_images", "setup_done",
    # the controls: the one list (yolo_cb/settings/controls.py; docs/callbacks.md, "Controls")
    *CONTROL_NAMES,
)
PRIVATE_HOLDERS = ("_state", "_parts", "_step", "_place", "_clock", "_output", "_recipe", "_checkpointer", "_signals")


@pytest.fixture
def trained(tiny):
    model = YOLO("yolox-nano.yaml")
    seen = {}
    model.add_callback("on_fit_epoch_end", lambda t: seen.update({n: hasattr(t, n) for n in CALLBACK_NAMES}))
    model.train(**tiny)
    return model.trainer, seen


@pytest.mark.slow
def test_every_name_callbacks_read_is_on_the_trainer(trained):
    trainer, seen = trained
    missing_during = [n for n, ok in seen.items() if not ok]
    missing_after = [n for n in CALLBACK_NAMES if not hasattr(trainer, n)]
    assert not missing_during and not missing_after, (missing_during, missing_after)
    assert isinstance(trainer._state, RunState)
    assert trainer.epoch == trainer._state.progress.epoch == 0 and trainer.epochs == 1
    assert trainer.metrics is trainer._state.metrics.values and "fitness" in trainer.metrics
    assert trainer.best.name == "best.pt" and trainer.last.name == "last.pt" and trainer.best.parent == trainer.wdir
    assert trainer.stop is False and trainer.stop_reason == ""
    assert set(trainer.lr) == {f"lr/pg{i}" for i in range(len(trainer.optimizer.param_groups))}
    own = sorted(vars(trainer))  # after a whole run: nothing is created on the trainer outside __init__
    assert len(own) <= 15, own


# What the facade (model.py) and a DDP worker (training/launch.py) call on the trainer they made: its run and its result.
FACADE_CALLS = ("train", "final_metrics", "final_weights")
OUR_CALLBACK_CODE = ("yolo_cb/callbacks", "yolo_cb/integrations", "yolo_cb/tune", "yolo_cb/training/launch.py", "yolo_cb/model.py")


def names_read_on_trainer(root: Path) -> dict[str, str]:
    """`trainer.<name>` (and `t.<name>` in a lambda's `t`) read anywhere in our callbacks and integrations -> one place."""
    seen = {}
    for rel in OUR_CALLBACK_CODE:
        target = root / rel
        for path in ([target] if target.is_file() else sorted(target.rglob("*.py"))):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "trainer":
                    seen.setdefault(node.attr, f"{path.relative_to(root)}:{node.lineno}")
    return seen


def test_every_trainer_name_our_callbacks_read_is_declared():
    """Each name our own callbacks, integrations and tune read on a trainer is declared: a property of the class, or one
    of the attributes its __init__ sets; and is in CALLBACK_NAMES, the list this file pins."""
    from yolo_cb.settings.config import get_config
    from yolo_cb.training.trainer import Trainer

    read = names_read_on_trainer(Path(__file__).resolve().parents[1])
    assert len(read) > 30  # the scan finds the reads (it would pass vacuously on a wrong root)
    instance = Trainer(get_config({}))
    undeclared = {n: where for n, where in read.items() if not (hasattr(Trainer, n) or n in vars(instance))}
    unpinned = {n: where for n, where in read.items() if n not in CALLBACK_NAMES + FACADE_CALLS}
    assert not undeclared and not unpinned, (undeclared, unpinned)


def test_at_most_40_trainer_names_are_read_outside_the_trainer_each_pinned():
    """Issue 43's count: the distinct `trainer.<name>` reads (not writes) in yolo_cb/ outside the trainer's own modules
    (training/trainer.py, training/surface.py) are at most 40 (79 at 7f3d9f3), and each is a name this file pins."""
    package = Path(__file__).resolve().parents[1] / "yolo_cb"
    own = {package / "training" / "trainer.py", package / "training" / "surface.py"}
    read: dict[str, str] = {}
    for path in sorted(set(package.rglob("*.py")) - own):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and isinstance(node.value, ast.Name) and node.value.id == "trainer":
                read.setdefault(node.attr, f"{path.relative_to(package)}:{node.lineno}")
    assert 30 < len(read) <= 40, sorted(read)
    assert not {n: w for n, w in read.items() if n not in CALLBACK_NAMES + FACADE_CALLS}


def test_run_state_fields_are_few_and_typed():
    from dataclasses import fields

    state = RunState()
    groups = [getattr(state, f.name) for f in fields(state)]
    assert sum(len(fields(g)) for g in groups) <= 27  # 25, and the two states the controls set (validate_each_epoch, restore_best)
    assert all(f.type for g in groups for f in fields(g))


@pytest.mark.slow
def test_stop_set_by_a_callback_stops_the_run(tiny):
    model = YOLO("yolox-nano.yaml")
    batches = []

    def stop_after_two(trainer):
        batches.append(trainer.batch_i)
        if len(batches) == 2:
            trainer.stop = True

    model.add_callback("on_train_batch_end", stop_after_two)
    model.train(**{**tiny, "epochs": 3})
    trainer = model.trainer
    assert len(batches) == 2 and trainer.epoch == 0 and trainer.stop is True
    assert trainer._state.stop.flag is True and trainer.stop_cause == StopCause.CALLBACK


# the names a callback may write: the controls that are attributes (the others are methods); every other name is read-only
WRITABLE = ("stop", "stop_reason", "restore_best", "patience", "loss", "validate_every_epoch")


def test_only_the_controls_are_writable_and_the_rest_read_the_run_state():
    from yolo_cb.settings.config import get_config
    from yolo_cb.training.run_state import TrainerName
    from yolo_cb.training.trainer import Trainer

    names = {n: d for klass in reversed(Trainer.__mro__) for n, d in vars(klass).items() if isinstance(d, TrainerName)}
    assert sorted(n for n, d in names.items() if d.control) == sorted(WRITABLE)
    assert set(WRITABLE) <= set(CONTROL_NAMES) and all(callable(getattr(Trainer, n)) for n in set(CONTROL_NAMES) - set(WRITABLE))
    trainer = Trainer(get_config({"epochs": 3}))
    assert trainer.epochs == trainer._state.progress.epochs == 3 and trainer.completed_epoch == -1
    for name in sorted(set(names) - set(WRITABLE)):
        with pytest.raises(AttributeError, match=rf"trainer\.{name} is read-only .*controls"):
            setattr(trainer, name, None)
    for name in ("lr_schedule", "monitor", "epoch_record", "best", "last", "is_main"):  # plain properties: no setter at all
        with pytest.raises(AttributeError):
            setattr(trainer, name, None)
    state = trainer._state
    state.progress.epoch, state.best.fitness, state.metrics.values = 2, 0.5, {"fitness": 0.5}  # the trainer's own writes
    assert (trainer.epoch, trainer.best_fitness, trainer.metrics) == (2, 0.5, {"fitness": 0.5})
    trainer.stop, trainer.stop_reason = True, "enough"
    assert state.stop.flag is True and state.stop.reason == "enough"
    trainer.request_stop(StopCause.TARGET, "later")  # the first stop kept its (missing) cause: this one fills it in
    assert state.stop.cause == StopCause.TARGET and trainer.stop_reason == "later"


def test_a_trainer_made_without_a_plan_records_its_model_and_the_data_yaml_path_then_seals_its_settings():
    """Trainer(args, model=...) made directly (no YOLO.train plan): args.yaml and checkpoints still record the model it
    starts from and the data YAML as an absolute path, and the settings are read-only from then on."""
    from yolo_cb.settings.config import get_config
    from yolo_cb.training.trainer import Trainer

    trainer = Trainer(get_config({"data": "shapes.yaml", "mode": "train"}), model="yolox-nano.yaml")
    assert trainer.args.model == "yolox-nano.yaml"
    assert Path(trainer.args.data).is_absolute() and Path(trainer.args.data).name == "shapes.yaml"
    with pytest.raises(AttributeError, match="cannot be changed"):
        trainer.args.epochs = 7


# Ultralytics' own API that takes a trainer and is no event handler: validator(trainer=...) validates during training.
TRAINER_PARAMETER_API = {"evaluation/validator.py": {"__call__"}}


def test_outside_callbacks_and_integrations_only_event_handlers_take_a_trainer():
    """Issue 43: helpers take and return values; a function with a `trainer` parameter outside callbacks/ and integrations/
    is an event handler (named for an event) or Ultralytics' validator(trainer=...)."""
    from yolo_cb.callbacks.events import EVENTS

    package = Path(__file__).resolve().parents[1] / "yolo_cb"
    found = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel.startswith(("callbacks/", "integrations/")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "trainer" in [a.arg for a in node.args.args + node.args.kwonlyargs]:
                found[f"{rel}:{node.name}"] = node.name in EVENTS or node.name in TRAINER_PARAMETER_API.get(rel, set())
    assert len(found) > 3  # the scan sees the built-in callbacks' handlers
    assert all(found.values()), sorted(k for k, ok in found.items() if not ok)


def test_the_loop_computes_the_batch_index_once_and_the_step_returns_what_it_did():
    """`ni` (the batch's index over the run) was computed twice per batch, in the step and in the LR schedule: the loop
    computes it and hands it to both; the step returns its result (loss items, finite, stepped), and the warmup both
    follow is one value (recipe/schedule.py Warmup)."""
    run, warm = inspect.signature(BatchStep.run), inspect.signature(LRSchedule.warmup_batch)
    assert "ni" in run.parameters and "num_batches" not in run.parameters and run.return_annotation == "StepResult"
    assert "ni" in warm.parameters and "num_batches" not in warm.parameters
    assert StepResult._fields == ("losses", "finite", "stepped")
    loop = inspect.getsource(Trainer._train_epoch)
    assert loop.count("parts.num_batches * state.progress.epoch") == 1 and "ni =" in loop and loop.count("ni =") == 1
    warmup = Warmup.of(SimpleNamespace(warmup_epochs=1.0, warmup_bias_lr=0.1, warmup_momentum=0.8), num_batches=50, momentum=0.937)
    assert warmup.iters == 100 and [warmup.accumulate(ni, 64, 16) for ni in (0, 50, 100, 101)] == [1, 2, 4, None]


def test_the_holders_are_private_and_a_write_through_state_names_the_control():
    """Issue 60, step 3: `trainer.state.progress.epochs = 3` in a callback skipped end_after's checks. The holders are
    private; `trainer.state` is a read-only view whose writes raise, naming the control that steers that field."""
    from yolo_cb.settings.config import get_config

    trainer = Trainer(get_config({"epochs": 5}))
    assert set(PRIVATE_HOLDERS) <= set(vars(trainer))
    assert not [n for n in ("parts", "step", "place", "clock", "output", "recipe", "checkpointer", "signals") if hasattr(trainer, n)]
    assert "state" not in CALLBACK_NAMES and trainer.state.progress.epochs == 5  # readable, for inspection
    errors = []

    def shorten_by_hand(t):
        for write in (lambda: setattr(t.state.progress, "epochs", 3), lambda: setattr(t.state.stop, "flag", True),
                      lambda: setattr(t.state, "best", None)):
            with pytest.raises(AttributeError) as caught:
                write()
            errors.append(str(caught.value))

    trainer.add_callback("on_fit_epoch_end", shorten_by_hand)
    trainer.run_callbacks("on_fit_epoch_end")  # the real dispatcher calls the callback with this trainer
    assert "trainer.state.progress.epochs is read-only" in errors[0] and "use trainer.end_after(epochs)" in errors[0]
    assert "trainer.request_stop(cause, reason)" in errors[1] and CONTROLS_HINT in errors[2]
    assert trainer.epochs == 5 and trainer.stop is False
    trainer.end_after(3)  # the control, with its checks
    assert trainer.epochs == 3
    with pytest.raises(ValueError, match="end_after"):
        trainer.end_after(9)


def test_each_surface_name_is_declared_on_its_own_line_with_a_type_and_a_docstring():
    """surface.py declared several names per line by tuple unpacking (untyped to a checker); each is its own annotated
    line now, `name: TrainerName[T] = state_field(...)`, and keeps a docstring of its own."""
    import typing

    from yolo_cb.training import surface
    from yolo_cb.training.run_state import TrainerName

    body = next(n for n in ast.parse(inspect.getsource(surface)).body if isinstance(n, ast.ClassDef) and n.name == "TrainerSurface").body
    assert not [n.lineno for n in body if isinstance(n, ast.Assign) and any(isinstance(t, ast.Tuple) for t in n.targets)]
    declared = {n: d for n, d in vars(surface.TrainerSurface).items() if isinstance(d, TrainerName)}
    hints = typing.get_type_hints(surface.TrainerSurface, vars(surface))
    assert len(declared) > 50 and set(declared) <= set(hints)
    assert all(typing.get_origin(hints[n]) is TrainerName and typing.get_args(hints[n]) for n in declared)
    assert not [n for n, d in declared.items() if not d.__doc__ or d.__doc__.startswith("trainer._")]


def test_inside_the_trainer_the_loop_reads_and_writes_one_path_per_fact():
    """The loop read `self.best_fitness` and wrote `self.state.best.fitness`: inside training/trainer.py no surface name
    (a TrainerName, kept for callbacks) is used on `self`; the loop uses the private holders."""
    from yolo_cb.training import surface, trainer
    from yolo_cb.training.run_state import TrainerName

    names = {n for n, d in vars(surface.TrainerSurface).items() if isinstance(d, TrainerName)}
    names |= {"monitor", "lr_schedule", "epoch_record", "new_images", "elapsed", "flag_device"}
    used = {}
    for module in (trainer, surface):
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr in names:
                used.setdefault(node.attr, f"{module.__name__}:{node.lineno}")
    assert not used, used


def test_the_controls_are_listed_once_and_every_place_names_them_from_the_list():
    """Five places listed the controls by hand; CONTROLS feeds the hint of every read-only name, the settings' error and
    the Trainer's docstring (docs/callbacks.md's table is compared in tests/test_callbacks_doc.py)."""
    from yolo_cb.settings.config import get_config
    from yolo_cb.training.run_state import TrainerName

    args = get_config({}).seal()
    with pytest.raises(AttributeError) as settings_error:
        args.epochs = 7
    name_error = None
    try:
        Trainer(get_config({})).epoch = 1
    except AttributeError as error:
        name_error = str(error)
    for name in CONTROL_NAMES:
        assert f"trainer.{name}" in CONTROLS_HINT and f"- {name}: " in Trainer.__doc__
        assert CONTROLS_HINT in str(settings_error.value) and CONTROLS_HINT in name_error
    writable = [n for klass in Trainer.__mro__ for n, d in vars(klass).items() if isinstance(d, TrainerName) and d.control]
    assert set(writable) <= set(CONTROL_NAMES) and all(hasattr(Trainer, n) for n in CONTROL_NAMES)
