"""A checkpoint's settings on resume: which may change, which are never taken from it (code, places to write), and the
settings a resume trains with, resolved once.

A file yolo-cb did not write names no code and no place to write: a checkpoint's ``train_args`` are plain strings that
other code would import (``callbacks``, an ``lr_scheduler`` naming ``module:function``, a ``cfg=`` file that may declare
either) or write to (``project``, ``name``, ``datasets_dir``, ...). Those come only from the user's own command, YAML or
call. A code-naming setting the checkpoint records must be given again (the same, or empty to resume without it), else
the resume is refused with one line, since dropping it silently would change the run. Places are never taken from the
checkpoint: the user's value, else today's default layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from yolo_cb.errors import ConfigError, short_repr
from yolo_cb.settings.config import Config, get_config
from yolo_cb.settings.lr_settings import names_code, parse_lr_scheduler
from yolo_cb.settings.schema import RULES

# Settings that may differ from the checkpoint's when resuming (`resume=True` in yolo_cb/settings/schema.py); anything
# else would change what is trained.
RESUME_MUTABLE = frozenset(key for key, rule in RULES.items() if rule.resume)
# Settings that name code to import: never taken from a checkpoint; a resume needs them given again.
CODE_SETTINGS = ("callback_modules", "callbacks", "lr_scheduler")
# Settings never taken from a checkpoint, silently: a settings file (whose values the checkpoint already records, and
# which may declare code), places to write (or a server to write to) and trust (the permission to run a model file's
# code): the user's value, else the default.
PLACE_SETTINGS = ("cfg", "project", "name", "datasets_dir", "weights_dir", "storage", "save_dir", "trust")


def resume_settings(train_args: dict[str, Any], given: dict[str, Any], path: Path, trains: bool,
                    cfg_values: dict[str, Any] | None = None) -> tuple[dict[str, Any], Config]:
    """(the checkpoint's settings a resume may use, the settings it trains with: those under the user's `given`), resolved
    once; `trains`: the resume trains (a finished run's missing code is no error: nothing will run); `cfg_values`: the
    given cfg= file's settings, when already read."""
    saved = resumable_settings(dict(train_args or {}), given, path, trains=trains)  # no code, no place to write
    return saved, get_config({**settings_to_resume(saved, given), **given, "mode": "train"}, cfg_values=cfg_values)


def settings_to_resume(saved: dict, given: dict) -> dict:
    """A checkpoint's settings under the user's: the pair close_mosaic / no_aug_epochs repaired in an older checkpoint (where
    close_mosaic counted only when no_aug_epochs was 0), and the saved partner of an alias the user gives left out."""
    saved = dict(saved)
    if saved.get("close_mosaic") is not None and saved.get("no_aug_epochs") is not None and saved["close_mosaic"] != saved["no_aug_epochs"]:
        saved["close_mosaic"] = saved["no_aug_epochs"] = saved["no_aug_epochs"] or saved["close_mosaic"]
    for key, partner in (("close_mosaic", "no_aug_epochs"), ("no_aug_epochs", "close_mosaic")):
        if key in given and partner not in given:
            saved.pop(partner, None)
    return saved


def _names_code(key: str, value: Any) -> bool:
    if value in (None, "", [], {}, (), False):
        return False
    if key == "lr_scheduler":
        return names_code(value)
    return True


def _same_lr_scheduler(given: Any, recorded: Any) -> bool:
    try:
        return parse_lr_scheduler(given) == parse_lr_scheduler(recorded)
    except ValueError:
        return False


def resumable_settings(train_args: dict[str, Any], given: dict[str, Any], path: Path | str, trains: bool = True) -> dict[str, Any]:
    """The checkpoint's settings a resume may use, under the user's `given` ones: no place, no code.

    When the resume `trains` (the run is not finished), raises ConfigError (one line, the value shortened) for code the
    checkpoint records and the user did not give again, or an lr_scheduler naming code the user gives differently."""
    saved = {k: v for k, v in train_args.items() if k not in PLACE_SETTINGS}
    for key in CODE_SETTINGS:
        recorded = saved.pop(key, None)
        if not _names_code(key, recorded):
            if recorded is not None:
                saved[key] = recorded  # a built-in schedule: plain data, part of what is trained
            continue
        if not trains:
            continue  # a finished run: nothing will run, so nothing is missing
        if key not in given:
            raise ConfigError(f"cannot resume {path}: it records {key}={short_repr(recorded)}, and yolo-cb never takes code "
                              f"from a checkpoint; give {key}= again (the same value to keep it, or an empty "
                              f"{key}= to resume without it)")
        if key == "lr_scheduler" and not _same_lr_scheduler(given[key], recorded):
            raise ConfigError(f"cannot change lr_scheduler={short_repr(given[key])} (was {short_repr(recorded)}) when resuming {path}: "
                              f"the schedule decides what is trained; give the same lr_scheduler= again")
    return saved
