"""The schema of every setting: its kind, range or choices, and whether a resume may change it.

The default and the one-line meaning of each setting are read from cfg/default.yaml (the single source of defaults: a
setting's value there, its comment there); this module adds the rules. `yolo_cb.settings.config` types and checks values by
dispatching on `Setting.kind`; the resume checks (`RESUME_MUTABLE` in yolo_cb/settings/resume.py and in
yolo_cb/tune/tuner.py) are derived from the `resume` and `tune_resume` flags here. tests/test_settings_schema.py checks
that cfg/default.yaml and this table name the same keys, and that every default is valid for its kind.

Kinds: int (low/high, multiple) | fraction (in [0, 1]; low_open: (0, 1]) | positive (float > 0) | nonneg (float >= 0) |
enum (choices, aliases) | bool | bool_or_path | text (a string or empty) | device | free (any value, unparsed) | any (a
YAML scalar, unchecked) | metric | callbacks | classes | freeze | save_epochs | lr_scheduler | procs (an int from low
to the CPU cores this process may use: usable_cpus()).
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import yaml

from yolo_cb.utils.paths import DEFAULT_CFG

__all__ = ["KINDS", "MAX_IMGSZ", "RULES", "Setting", "describe_settings", "load_defaults", "schema", "settings_of_kind", "usable_cpus"]

KINDS = ("int", "fraction", "positive", "nonneg", "enum", "bool", "bool_or_path", "text", "device", "free", "any", "metric",
         "callbacks", "modules", "classes", "freeze", "save_epochs", "lr_scheduler", "procs")

# The largest imgsz accepted: 8192 px is above any detector's training size, while one 32768 x 32768 batch already asks
# for gigabytes (imgsz=1e9 would ask for exabytes); larger is refused, from the command line or a checkpoint alike.
MAX_IMGSZ = 8192


def usable_cpus() -> int:
    """CPU cores this process may run on (its affinity, else the machine's): nproc's maximum, one core per process."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Setting:
    """One setting: `kind` says how a value is typed and checked (see the module docstring)."""

    kind: str
    low: float | None = None  # int / float kinds: inclusive bounds; None = unbounded
    high: float | None = None
    multiple: int | None = None  # int: the value must be a multiple of this (imgsz: the largest stride)
    low_open: bool = False  # fraction: 0 is excluded
    choices: tuple = ()  # enum: the accepted values (strings match case-insensitively)
    aliases: tuple = ()  # enum: (given, meant) pairs matched by identity (cache=True means ram)
    resume: bool = False  # a training resume may change it
    tune_resume: bool = False  # a tune resume may change it
    name: str = ""  # filled from cfg/default.yaml, with default, meaning and section
    default: Any = None
    meaning: str = ""
    section: str = ""


def _int(low=None, high=None, **kw) -> Setting:
    return Setting("int", low=low, high=high, **kw)


def _enum(*choices, **kw) -> Setting:
    return Setting("enum", choices=choices, **kw)


def _k(kind: str, **kw) -> Setting:
    return Setting(kind, **kw)


R, T, RT = {"resume": True}, {"tune_resume": True}, {"resume": True, "tune_resume": True}  # who may change it on resume

# Every setting of cfg/default.yaml, in its order.
RULES: dict[str, Setting] = {
    # what to run
    "task": _enum("detect"), "mode": _enum("train", "val", "predict", "export", "tune", "benchmark", **R), "model": _k("text"),
    "data": _k("text"), "cfg": _k("text"),
    # training
    "epochs": _int(1, **R), "time": _k("positive", **R), "patience": _int(0, **R), "monitor": _k("metric"),
    "monitor_mode": _enum("auto", "max", "min"), "min_delta": _k("nonneg"),
    "restore_best": _k("bool", **R), "stop_close_mosaic": _enum("skip", "finish"), "batch": _int(1, **R), "imgsz": _int(32, MAX_IMGSZ, multiple=32),
    "save": _k("bool"), "save_period": _int(-1, **R), "save_steps": _int(0, **R), "save_topk": _int(0, **R), "average_best": _int(0, **R),
    "save_initial": _k("bool", **R), "save_epochs": _k("save_epochs", **R),
    "cache": _enum(False, "ram", "disk", aliases=((True, "ram"), (None, False)), **RT), "device": _k("device", **RT),
    "nproc": _k("procs", low=1, **R), "workers": _int(0, **RT), "project": _k("text", **T), "name": _k("text", **T), "exist_ok": _k("bool", **R),
    "pretrained": _k("bool_or_path"), "optimizer": _enum("SGD", "Adam", "AdamW", "auto"), "verbose": _k("bool", **RT),
    "seed": _int(), "deterministic": _k("bool", **R), "rect": _k("bool"), "single_cls": _k("bool"), "cos_lr": _k("bool"), "close_mosaic": _int(0),
    "resume": _k("bool_or_path", **R), "amp": _k("bool", **R), "fraction": Setting("fraction", low_open=True), "freeze": _k("freeze"),
    "unfreeze_epoch": _int(0), "unfreeze_warmup": _k("nonneg"),
    "grad_clip": _k("nonneg"), "channels_last": _k("bool"),
    "compile": _enum(False, True, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", "inductor", "aot_eager", "eager",
                     "cudagraphs", **R),
    "sync_bn": _k("bool"), "val": _k("bool", **R), "val_period": _int(1, **R),
    # optimisation
    "lr0": _k("positive"), "lrf": _k("fraction"), "momentum": _k("fraction"), "weight_decay": _k("nonneg"),
    "warmup_epochs": _k("nonneg"), "warmup_momentum": _k("fraction"), "warmup_bias_lr": _k("nonneg"), "nbs": _int(1),
    "lr_scheduler": _k("lr_scheduler"),
    # loss
    "box": _k("positive"), "iou_type": _enum("iou", "giou"),
    # augmentation
    "hsv_h": _k("fraction"), "hsv_s": _k("fraction"), "hsv_v": _k("fraction"), "degrees": _k("nonneg"), "translate": _k("fraction"),
    "scale": _k("fraction"), "shear": _k("nonneg"), "flipud": _k("fraction"), "fliplr": _k("fraction"), "mosaic": _k("fraction"),
    "mixup": _k("fraction"),
    # YOLOX stage switch
    "no_aug_epochs": _int(0), "next_stage_start_epoch": _int(0),
    # validation / prediction
    "split": _enum("train", "val", "test"), "conf": _k("fraction"), "iou": _k("fraction"), "max_det": _int(1),
    "agnostic_nms": _k("bool"), "augment": _k("bool"), "classes": _k("classes"), "half": _k("bool"), "save_json": _k("bool"), "per_class": _enum("auto", True, False, **RT), "save_txt": _k("bool"),
    "save_conf": _k("bool"), "plots": _k("bool", **RT), "plot_period": _int(1, **R), "worst_batches": _int(0, **RT), "worst_source": _enum("val", "train", "both", **RT), "source": _k("free"),
    "show_labels": _k("bool"), "show_conf": _k("bool"), "show": _k("bool"), "save_crop": _k("bool"), "line_width": _int(1),
    # export
    "format": _enum("onnx", "openvino", "torchscript", "ncnn", "mnn", "tflite", "executorch", "coreml"), "int8": _k("bool"), "nms": _k("bool"), "dynamic": _k("bool"), "simplify": _k("bool"), "opset": _int(7),
    "export_tol": _k("positive"), "formats": _k("text"), "threads": _int(0),
    # tuning
    "iterations": _int(1, **T), "space": _k("free"), "storage": _k("free", **T), "pruner": _enum("median", "hyperband", "none"),
    "tune_keep": _int(0, **T), "backend": _enum("optuna", "ray"),
    # callbacks and integrations
    "callback_modules": _k("modules", **RT), "callbacks": _k("callbacks", **RT), "strict_callbacks": _k("bool", **RT), "mlflow": _k("bool", **RT), "tensorboard": _k("bool", **RT), "wandb": _k("bool"),
    "comet": _k("bool"), "clearml": _k("bool"), "raytune": _enum("auto", True, False, **RT), "dvc": _k("bool"),
    "onnx_check": _enum(True, False, "strict", **RT), "onnx_check_best": _k("bool", **R),
    "export_check": _k("text", **RT), "export_check_tol": _k("positive", **R), "export_check_strict": _k("bool", **R),
    "onnx_check_tol": _k("positive", **R), "onnx_check_imgsz": _int(0, MAX_IMGSZ, multiple=32, **R),
    # datasets
    "datasets_dir": _k("text", **RT), "weights_dir": _k("any", **RT),
}


def load_defaults() -> dict[str, Any]:
    """cfg/default.yaml as a dict, a fresh copy for each caller (the file is parsed once per process)."""
    return copy.deepcopy(_parsed_defaults())


@lru_cache(maxsize=1)
def _parsed_defaults() -> dict[str, Any]:
    return yaml.safe_load(DEFAULT_CFG.read_text())


def describe_settings() -> list[tuple[str, Any, str]]:
    """(key, default, comment) for every setting, in file order, with section headers as ('#', title, '')."""
    rows = []
    for line in DEFAULT_CFG.read_text().splitlines():
        header = re.match(r"#\s*---\s*(.+?)\s*-+\s*$", line)
        if header:
            rows.append(("#", header.group(1), ""))
            continue
        match = re.match(r"^([a-z_0-9]+):\s*([^#]*?)\s*(?:#\s*(.*))?$", line)
        if match:
            key, raw, comment = match.groups()
            rows.append((key, yaml.safe_load(raw) if raw else None, comment or ""))
    return rows


@lru_cache(maxsize=1)
def schema() -> dict[str, Setting]:
    """Every setting of cfg/default.yaml with its rule, default, meaning and section, in file order. A key of the file
    without a rule is a free value (the schema test fails on it)."""
    defaults, section, table = load_defaults(), "", {}
    for key, _, meaning in describe_settings():
        if key == "#":
            section = _
            continue
        rule = RULES.get(key, Setting("free"))
        table[key] = replace(rule, name=key, default=defaults.get(key), meaning=meaning, section=section)
    return table


def settings_of_kind(*kinds: str) -> set[str]:
    return {key for key, rule in RULES.items() if rule.kind in kinds}
