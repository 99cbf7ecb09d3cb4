"""The recipe is decided once (issue 60): the declarations `- early_stopping`, `- lr_schedule` and `- unfreeze` in
callbacks= are folded into the settings when they are read, so `RecipeParts.from_args` builds the whole recipe from the
settings alone, and no callback changes it at run time. Early stopping is decided in one place: the patience rule
and the close_mosaic stage's policy (stop_close_mosaic=skip | finish) give the loop one answer per epoch."""

from __future__ import annotations

import pytest

from yolo_cb.assembly.assemble import build_trainer_callbacks
from yolo_cb.assembly.builtin import EarlyStopping, ScheduleChoice, UnfreezeChoice
from yolo_cb.callbacks.dispatch import event_methods
from yolo_cb.callbacks.registry import REGISTRY
from yolo_cb.errors import ConfigError
from yolo_cb.recipe.early_stop import Decision, EarlyStop
from yolo_cb.recipe.parts import RecipeParts
from yolo_cb.settings.config import get_config
from yolo_cb.settings.lr_settings import parsed

DECLARED = [{"early_stopping": {"patience": 7, "restore_best_weights": False}}, {"lr_schedule": {"lr_scheduler": "cosine"}},
            {"unfreeze": {"stages": {3: ["model.1"], "5": "all"}}}]


def test_from_args_alone_builds_the_declared_recipe():
    args = get_config({"callbacks": DECLARED, "freeze": 2, "patience": 50, "lr_scheduler": "linear", "unfreeze_epoch": 1,
                       "restore_best": True})
    recipe = RecipeParts.from_args(args)  # nothing else runs: no trainer, no callback
    assert recipe.early_stop.patience == 7 and args.restore_best is False  # the declaration replaces the settings
    assert args.lr_scheduler == "cosine" and parsed(args).name == "cosine" and recipe.schedule is not None
    assert recipe.unfreeze.stages == {3: ["model.1"], 5: "all"}  # not unfreeze_epoch=1's {1: all}
    assert args.unfreeze_stages == {3: ["model.1"], 5: "all"} and "unfreeze_stages" not in args.as_dict()


def test_without_declarations_the_settings_are_the_recipe():
    args = get_config({"freeze": 2, "patience": 4, "unfreeze_epoch": 1})
    recipe = RecipeParts.from_args(args)
    assert recipe.early_stop.patience == 4 and recipe.unfreeze.stages == {1: "all"} and args.unfreeze_stages is None


def test_a_later_declaration_wins():
    args = get_config({"callbacks": [{"early_stopping": {"patience": 2}}, {"early_stopping": {"patience": 9}}]})
    assert RecipeParts.from_args(args).early_stop.patience == 9


def test_a_declaration_by_its_class_path_is_folded_too():
    args = get_config({"callbacks": [{"yolo_cb.assembly.builtin:EarlyStopping": {"patience": 4}}], "mlflow": False,
                       "onnx_check": False})
    assert RecipeParts.from_args(args).early_stop.patience == 4
    assert all(type(e.owner) is not EarlyStopping for e in build_trainer_callbacks(args).entries())


def test_the_declarations_act_at_no_event_and_are_no_callbacks_of_a_run():
    for cls in (EarlyStopping, ScheduleChoice, UnfreezeChoice):
        assert REGISTRY[cls.registry_name] is cls
        assert not hasattr(cls, "on_pretrain_routine_start")
        with pytest.raises(ValueError, match="has no method named after an event"):
            event_methods(cls.__new__(cls))
    callbacks = build_trainer_callbacks(get_config({"callbacks": DECLARED, "freeze": 2, "mlflow": False, "onnx_check": False}))
    names = {getattr(e.owner, "registry_name", None) for e in callbacks.entries()}
    assert not names & {"early_stopping", "unfreeze"}
    assert all(type(e.owner) is not ScheduleChoice for e in callbacks.entries())


@pytest.mark.parametrize("item, message", [
    ({"early_stopping": {"patience": -1}}, "early_stopping: patience=-1, expected an integer >= 0"),
    ({"early_stopping": {"restore_best_weights": "no"}}, "early_stopping: restore_best_weights='no', expected true or false"),
    ({"early_stopping": {"patiense": 3}}, "'early_stopping' got an unexpected keyword argument 'patiense' .it takes: patience, "
                                          "restore_best_weights."),
    ({"lr_schedule": {"lr_scheduler": "none"}}, "lr_schedule: lr_scheduler='none' is no schedule the loop runs"),
    ({"unfreeze": {"stages": {-1: "all"}}}, "unfreeze: stage epoch -1 is not an integer >= 0"),
])
def test_a_wrong_declaration_is_refused_when_the_settings_are_read(item, message):
    with pytest.raises(ConfigError, match=message):
        get_config({"callbacks": [item]})


# --- early stopping and the close_mosaic stage: one decision, asked once per epoch (recipe/early_stop.py) ---------------
def early_stop(**settings) -> EarlyStop:
    return RecipeParts.from_args(get_config({"patience": 1, "close_mosaic": 2, **settings})).early_stop


def test_skip_stops_now_and_finish_ends_after_the_stage():
    assert early_stop().decide(1, 6, "no improvement", True) == Decision("no improvement")  # skip: stop now
    finish = early_stop(stop_close_mosaic="finish")
    assert finish.decide(0, 6, None, True) == Decision()  # no stop: go on
    assert finish.decide(1, 6, "no improvement", True) == Decision(None, 4)  # end after epoch 4: the stage (3-4) first
    assert finish.state_dict() == {"end": 4}
    assert finish.decide(2, 4, "no improvement", True) == Decision()  # the rule is not asked in the stage
    assert finish.decide(3, 4, None, True) == Decision("early stopping, after the close_mosaic stage (epoch 4)")


def test_a_stop_inside_the_stage_stands():
    assert early_stop(stop_close_mosaic="finish").decide(4, 6, "no improvement", True) == Decision("no improvement")
    assert early_stop(close_mosaic=0, stop_close_mosaic="finish").decide(1, 6, "no improvement", True) == Decision("no improvement")


def test_a_resumed_end_is_the_parts_state_also_from_the_stop_stage_callback():
    parts = RecipeParts.from_args(get_config({"patience": 1, "close_mosaic": 2, "stop_close_mosaic": "finish"}))
    states = {"stop_stage": {"end": 5}, "mine": {}}
    parts.load_states({"saver": parts.saver.state_dict()}, states)  # a file of 7d42114: `recipe` without early_stop
    assert parts.early_stop.end == 5 and states == {"mine": {}}  # taken out: no callback is warned of it
    parts.load_states({"early_stop": {"end": 3}}, {})
    assert parts.early_stop.end == 3


def test_finish_with_a_fixed_stage_start_is_refused():
    with pytest.raises(ConfigError, match="'stop_close_mosaic': finish with next_stage_start_epoch=3 .a fixed stage start"):
        early_stop(stop_close_mosaic="finish", next_stage_start_epoch=3)
    assert early_stop(next_stage_start_epoch=3).stage.fixed_start == 3  # skip: accepted
