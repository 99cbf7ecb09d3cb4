"""The recipe's declarations in `callbacks=`, folded into the settings when they are read.

Three registered names declare parts of the training recipe instead of setting them (SuperGradients' and Keras' habit):

    callbacks:
      - early_stopping: {patience: 5, restore_best_weights: false}    # the settings patience= and restore_best=
      - lr_schedule: {lr_scheduler: cosine}                            # the setting lr_scheduler=
      - unfreeze: {stages: {5: [backbone.backbone.dark5], 10: all}}    # stages instead of unfreeze_epoch=

A declaration replaces the setting. `fold` turns them into settings before the Config is made (settings/config.py), so
the recipe (yolo_cb/recipe/parts.py `RecipeParts.from_args`) is built from the settings alone; no callback acts on them
at run time. Declared unfreeze stages have no setting of their own: the Config keeps them in a slot (`unfreeze_stages`),
beside the declarations they come from, which args.yaml and checkpoints record as `callbacks=`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

from yolo_cb.callbacks.spec_check import Declaration, bad_item
from yolo_cb.errors import ConfigError
from yolo_cb.settings.lr_settings import resolve

ALL = "all"  # a stage that unfreezes every module freeze= froze


def parse_stages(stages: Any) -> dict[int, Any]:
    """{epoch: "all" | [module names]} checked: epochs are integers >= 0."""
    if not isinstance(stages, dict) or not stages:
        raise ConfigError(f"unfreeze: stages={stages!r}; expected a mapping {{epoch: all | [module names]}}, e.g. {{5: all}}")
    parsed: dict[int, Any] = {}
    for epoch, names in stages.items():
        try:
            key = int(epoch)
        except (TypeError, ValueError):
            key = -1
        if key < 0 or isinstance(epoch, bool):
            raise ConfigError(f"unfreeze: stage epoch {epoch!r} is not an integer >= 0 (0-based, like trainer.epoch)")
        if names != ALL and not (isinstance(names, (list, tuple)) and names and all(isinstance(n, str) for n in names)):
            raise ConfigError(f"unfreeze: stage {key} unfreezes {names!r}; expected 'all' or a list of module names")
        parsed[key] = names if names == ALL else [str(n) for n in names]
    return dict(sorted(parsed.items()))


def early_stopping(patience: int | None = None, restore_best_weights: bool | None = None) -> dict[str, Any]:
    """`- early_stopping: {...}`: the settings it replaces (patience=, restore_best= under Keras' name)."""
    if patience is not None and (isinstance(patience, bool) or not isinstance(patience, int) or patience < 0):
        raise ConfigError(f"early_stopping: patience={patience!r}, expected an integer >= 0")
    if restore_best_weights is not None and not isinstance(restore_best_weights, bool):
        raise ConfigError(f"early_stopping: restore_best_weights={restore_best_weights!r}, expected true or false")
    given = {"patience": patience, "restore_best": restore_best_weights}
    return {key: value for key, value in given.items() if value is not None}


def lr_schedule(lr_scheduler: Any = "linear") -> dict[str, Any]:
    """`- lr_schedule: {lr_scheduler: ...}`: the setting lr_scheduler= (a schedule the loop runs; not none or module:Class)."""
    if resolve(lr_scheduler).kind in ("class", "none"):
        raise ConfigError(f"lr_schedule: lr_scheduler={lr_scheduler!r} is no schedule the loop runs; give it as the setting "
                          f"lr_scheduler= instead")
    return {"lr_scheduler": lr_scheduler}


def unfreeze(stages: Any) -> dict[str, Any]:
    """`- unfreeze: {stages: ...}`: the stages ({0-based epoch: "all" | [module names]}) that replace unfreeze_epoch=."""
    return {"unfreeze_stages": parse_stages(stages)}


# each declaration's name -> what it folds into the settings (its keyword arguments are the declaration's)
RECIPE_DECLARATIONS: dict[str, Callable[..., dict[str, Any]]] = {
    "early_stopping": early_stopping, "lr_schedule": lr_schedule, "unfreeze": unfreeze}


class Folded(NamedTuple):
    """What the declarations replace: `settings` (patience, restore_best, lr_scheduler) and the unfreeze stages."""

    settings: dict[str, Any]
    unfreeze_stages: dict[int, Any] | None


# the declarations' classes (yolo_cb/assembly/builtin.py) named by import path: folded as their registered names are
CLASS_PATHS = {f"yolo_cb.assembly.builtin{sep}{cls}": name for sep in (":", ".") for cls, name in
               (("EarlyStopping", "early_stopping"), ("ScheduleChoice", "lr_schedule"), ("UnfreezeChoice", "unfreeze"))}


def recipe_name(declared: Declaration) -> str | None:
    """The recipe declaration `declared` is (early_stopping | lr_schedule | unfreeze), or None for any other."""
    if declared.is_event:
        return None
    key = CLASS_PATHS.get(declared.key) if declared.is_import_path else declared.key
    return key if key in RECIPE_DECLARATIONS else None


def is_recipe_declaration(declared: Declaration) -> bool:
    return recipe_name(declared) is not None


def fold(declared: list[Declaration]) -> Folded:
    """The settings the recipe's declarations replace, in declaration order (a later one wins); ConfigError naming the
    item for arguments its declaration does not take or values it refuses."""
    values: dict[str, Any] = {}
    for item in filter(is_recipe_declaration, declared):
        values.update(_declared_values(item))
    stages = values.pop("unfreeze_stages", None)
    return Folded(values, stages)


def _declared_values(declared: Declaration) -> dict[str, Any]:
    name = str(recipe_name(declared))
    function, kwargs = RECIPE_DECLARATIONS[name], dict(declared.arg or {})
    try:
        inspect.signature(function).bind(**kwargs)
    except TypeError as error:
        takes = ", ".join(inspect.signature(function).parameters)
        raise bad_item(declared.item, f"'{name}' {error} (it takes: {takes})") from None
    return function(**kwargs)
