"""The schema of every setting: its type once resolved, its kind, range or choices, and whether a resume may change it.

The default and the one-line meaning of each setting are read from cfg/default.yaml (the single source of defaults: a
setting's value there, its comment there); this module adds, in `class Settings`, one annotated line per setting: its
type (what `args.<key>` holds: a resolved Config is a Settings) and its rule (`RULES` is read from those lines). `yolo_cb.settings.config` types and checks values by
dispatching on `Setting.kind`; the resume checks (`RESUME_MUTABLE` in yolo_cb/settings/resume.py and in
yolo_cb/tune/tuner.py) are derived from the `resume` and `tune_resume` flags here. tests/test_settings_schema.py checks
that cfg/default.yaml and this table name the same keys, and that every default is valid for its kind.

Kinds: int (low/high, multiple) | fraction (in [0, 1]; low_open: (0, 1]) | positive (float > 0) | nonneg (float >= 0) |
enum (choices, aliases) | bool | bool_or_path | text (a string or empty) | device | free (any value, unparsed) | any (a
YAML scalar, unchecked) | metric | callbacks | classes | freeze | save_epochs | lr_scheduler | procs (an int from low
to the CPU cores this process may use: usable_cpus()) | variants (export variants: a `format` choice then _half, _int8
and/or _nms; comma separated or a list).
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Annotated, Any, get_type_hints

import yaml

from yolo_cb.utils.paths import DEFAULT_CFG

__all__ = ["KINDS", "MAX_IMGSZ", "RULES", "Setting", "Settings", "describe_settings", "load_defaults", "schema", "settings_of_kind", "usable_cpus"]

KINDS = ("int", "fraction", "positive", "nonneg", "enum", "bool", "bool_or_path", "text", "device", "free", "any", "metric",
         "callbacks", "modules", "classes", "freeze", "save_epochs", "lr_scheduler", "procs", "variants")

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
    low: float | None = None  # int / float kinds: inclusive bounds (floats: high only); None = unbounded
    high: float | None = None
    multiple: int | None = None  # int: a multiple of this, rounded up with a warning (imgsz: the largest stride)
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


class Settings:
    """Every setting of cfg/default.yaml, in its order, with the type its value has once resolved (what `args.<key>`
    holds: `yolo_cb.settings.config.Config` is a Settings) and its rule (a Setting: kind, range or choices, whether a
    resume may change it). Only annotations: a value lives in a Config, its default in cfg/default.yaml."""

    # what to run
    task: Annotated[str, _enum("detect")]
    mode: Annotated[str, _enum("train", "val", "predict", "track", "export", "tune", "benchmark", **R)]
    model: Annotated[str | None, _k("text")]
    trust: Annotated[bool, _k("bool")]
    data: Annotated[str | None, _k("text")]
    cfg: Annotated[str | None, _k("text")]
    # training
    epochs: Annotated[int, _int(1, **R)]
    time: Annotated[float | None, _k("positive", **R)]
    patience: Annotated[int, _int(0, **R)]
    monitor: Annotated[str, _k("metric")]
    monitor_mode: Annotated[str, _enum("auto", "max", "min")]
    min_delta: Annotated[float, _k("nonneg")]
    restore_best: Annotated[bool, _k("bool", **R)]
    stop_close_mosaic: Annotated[str, _enum("skip", "finish")]
    batch: Annotated[int, _int(1, **R)]
    imgsz: Annotated[int, _int(32, MAX_IMGSZ, multiple=32)]
    save: Annotated[bool, _k("bool")]
    save_period: Annotated[int, _int(-1, **R)]
    save_steps: Annotated[int, _int(0, **R)]
    save_topk: Annotated[int, _int(0, **R)]
    average_best: Annotated[int, _int(0, **R)]
    save_initial: Annotated[bool, _k("bool", **R)]
    save_epochs: Annotated[list[int] | None, _k("save_epochs", **R)]
    cache: Annotated[bool | str, _enum(False, "ram", "disk", aliases=((True, "ram"), (None, False)), **RT)]
    device: Annotated[str | None, _k("device", **RT)]
    nproc: Annotated[int, _k("procs", low=1, **R)]
    workers: Annotated[int, _int(0, **RT)]
    project: Annotated[str | None, _k("text", **T)]
    name: Annotated[str | None, _k("text", **T)]
    exist_ok: Annotated[bool, _k("bool", **R)]
    pretrained: Annotated[bool | str, _k("bool_or_path")]
    optimizer: Annotated[str, _enum("SGD", "Adam", "AdamW", "auto")]
    verbose: Annotated[bool, _k("bool", **RT)]
    seed: Annotated[int, _int()]
    deterministic: Annotated[bool, _k("bool", **R)]
    rect: Annotated[bool, _k("bool")]
    single_cls: Annotated[bool, _k("bool")]
    cos_lr: Annotated[bool, _k("bool")]
    close_mosaic: Annotated[int, _int(0)]
    resume: Annotated[bool | str, _k("bool_or_path", **R)]
    amp: Annotated[bool, _k("bool", **R)]
    fraction: Annotated[float, Setting("fraction", low_open=True)]
    freeze: Annotated[int | list[str] | None, _k("freeze")]
    unfreeze_epoch: Annotated[int | None, _int(0)]
    unfreeze_warmup: Annotated[float, _k("nonneg")]
    grad_clip: Annotated[float, _k("nonneg")]
    channels_last: Annotated[bool, _k("bool")]
    compile: Annotated[bool | str, _enum(False, True, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", "inductor", "aot_eager", "eager", "cudagraphs", **R)]
    sync_bn: Annotated[bool, _k("bool")]
    val: Annotated[bool, _k("bool", **R)]
    val_period: Annotated[int, _int(1, **R)]
    # optimisation
    lr0: Annotated[float, _k("positive")]
    lrf: Annotated[float, _k("fraction")]
    momentum: Annotated[float, _k("fraction")]
    weight_decay: Annotated[float, _k("nonneg")]
    warmup_epochs: Annotated[float, _k("nonneg")]
    warmup_momentum: Annotated[float, _k("fraction")]
    warmup_bias_lr: Annotated[float, _k("nonneg")]
    nbs: Annotated[int, _int(1)]
    lr_scheduler: Annotated[Any, _k("lr_scheduler")]
    # loss
    box: Annotated[float, _k("positive")]
    iou_type: Annotated[str, _enum("iou", "giou")]
    # augmentation
    hsv_h: Annotated[float, _k("fraction")]
    hsv_s: Annotated[float, _k("fraction")]
    hsv_v: Annotated[float, _k("fraction")]
    colour_on: Annotated[str, _enum("auto", "worker", "device", **RT)]
    degrees: Annotated[float, _k("nonneg")]
    translate: Annotated[float, _k("fraction")]
    scale: Annotated[float, _k("fraction")]
    shear: Annotated[float, _k("nonneg")]
    perspective: Annotated[float, _k("nonneg", high=0.001)]
    flipud: Annotated[float, _k("fraction")]
    fliplr: Annotated[float, _k("fraction")]
    mosaic: Annotated[float, _k("fraction")]
    mixup: Annotated[float, _k("fraction")]
    # YOLOX stage switch
    no_aug_epochs: Annotated[int | None, _int(0)]
    next_stage_start_epoch: Annotated[int | None, _int(0)]
    # validation / prediction
    split: Annotated[str, _enum("train", "val", "test")]
    conf: Annotated[float | None, _k("fraction")]
    iou: Annotated[float, _k("fraction")]
    max_det: Annotated[int, _int(1)]
    agnostic_nms: Annotated[bool, _k("bool")]
    augment: Annotated[bool, _k("bool")]
    classes: Annotated[list[int] | None, _k("classes")]
    half: Annotated[bool, _k("bool")]
    save_json: Annotated[bool, _k("bool")]
    per_class: Annotated[str | bool, _enum("auto", True, False, **RT)]
    save_txt: Annotated[bool, _k("bool")]
    save_conf: Annotated[bool, _k("bool")]
    plots: Annotated[bool, _k("bool", **RT)]
    plot_period: Annotated[int, _int(1, **R)]
    worst_batches: Annotated[int, _int(0, **RT)]
    worst_source: Annotated[str, _enum("val", "train", "both", **RT)]
    source: Annotated[Any, _k("free")]
    show_labels: Annotated[bool, _k("bool")]
    show_conf: Annotated[bool, _k("bool")]
    show: Annotated[bool, _k("bool")]
    save_crop: Annotated[bool, _k("bool")]
    line_width: Annotated[int | None, _int(1)]
    vid_stride: Annotated[int, _int(1)]
    embed: Annotated[list[int] | None, _k("classes")]
    tracker: Annotated[str, _enum("botsort.yaml", "bytetrack.yaml", "botsort", "bytetrack")]
    persist: Annotated[bool, _k("bool")]
    # export
    format: Annotated[str, _enum("onnx", "openvino", "torchscript", "ncnn", "mnn", "tflite", "executorch", "coreml")]
    int8: Annotated[bool, _k("bool")]
    nms: Annotated[bool, _k("bool")]
    dynamic: Annotated[bool, _k("bool")]
    simplify: Annotated[bool, _k("bool")]
    opset: Annotated[int, _int(7)]
    export_tol: Annotated[float, _k("positive")]
    formats: Annotated[str | None, _k("text")]
    threads: Annotated[int, _int(0)]
    # tuning
    iterations: Annotated[int, _int(1, **T)]
    space: Annotated[Any, _k("free")]
    storage: Annotated[Any, _k("free", **T)]
    pruner: Annotated[str, _enum("median", "hyperband", "none")]
    tune_keep: Annotated[int, _int(0, **T)]
    backend: Annotated[str, _enum("optuna", "ray")]
    # callbacks and integrations
    callback_modules: Annotated[list[str] | None, _k("modules", **RT)]
    callbacks: Annotated[Any, _k("callbacks", **RT)]
    strict_callbacks: Annotated[bool, _k("bool", **RT)]
    mlflow: Annotated[bool, _k("bool", **RT)]
    tensorboard: Annotated[bool, _k("bool", **RT)]
    wandb: Annotated[bool, _k("bool")]
    comet: Annotated[bool, _k("bool")]
    clearml: Annotated[bool, _k("bool")]
    raytune: Annotated[str | bool, _enum("auto", True, False, **RT)]
    dvc: Annotated[bool, _k("bool")]
    onnx_check: Annotated[bool | str, _enum(True, False, "strict", **RT)]
    onnx_check_best: Annotated[bool, _k("bool", **R)]
    export_check: Annotated[str | None, _k("variants", **RT)]
    export_check_tol: Annotated[float, _k("positive", **R)]
    export_check_strict: Annotated[bool, _k("bool", **R)]
    onnx_check_tol: Annotated[float, _k("positive", **R)]
    onnx_check_imgsz: Annotated[int, _int(0, MAX_IMGSZ, multiple=32, **R)]
    # datasets
    datasets_dir: Annotated[str | None, _k("text", **RT)]
    weights_dir: Annotated[Any, _k("any", **RT)]


# Each setting's rule, read from the annotations of Settings (the one list of the settings in code).
RULES: dict[str, Setting] = {key: hint.__metadata__[0] for key, hint in get_type_hints(Settings, include_extras=True).items()}


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
