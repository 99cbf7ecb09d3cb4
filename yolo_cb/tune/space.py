"""The search space of `tune`: which settings each trial samples, and from where.

A space is a mapping {setting: spec}, from a YAML file or a dict, one entry per setting of cfg/default.yaml:

    lr0: [1.0e-4, 1.0e-2, log]        # a range sampled on a log scale
    momentum: [0.6, 0.98]             # a range sampled uniformly
    close_mosaic: [0, 5]              # an integer setting: whole numbers, both ends included
    degrees: {low: 0, high: 30, step: 5}
    optimizer: {choices: [SGD, AdamW]}

Every key must be a tunable setting (the training, optimisation, loss, augmentation and stage-switch settings that
change what is learned) and every bound or choice must be a valid value of that setting; anything else raises
ConfigError naming the key, with a 'did you mean' for misspelt ones. Optuna is only needed to sample (`suggest`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from yolo_cb.errors import ConfigError
from yolo_cb.settings.config import FRACTIONS, INT_RANGES, NONNEG_FLOATS, POSITIVE_FLOATS, coerce, describe_settings, load_defaults
from yolo_cb.utils.suggest import did_you_mean
from yolo_cb.utils.yaml_safe import load_yaml

# Sections of cfg/default.yaml whose settings may be tuned, less the keys there that only say how a run is carried out.
TUNABLE_SECTIONS = ("training", "optimisation", "loss", "augmentation", "YOLOX stage switch")
OPERATIONAL = {"epochs", "time", "patience", "save", "save_period", "save_topk", "cache", "device", "nproc", "workers", "project",
               "name", "exist_ok", "resume", "verbose", "deterministic", "amp", "val", "val_period", "channels_last", "sync_bn",
               "pretrained", "freeze", "fraction", "seed", "batch", "imgsz"}
RANGE_KEYS = {"low", "high", "log", "step"}


@dataclass(frozen=True)
class Param:
    """One tuned setting: a numeric range (`low`..`high`, optionally on a log scale or in steps) or a list of choices."""

    name: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple | None = None

    @property
    def is_int(self) -> bool:
        return self.choices is None and self.name in INT_RANGES

    def suggest(self, trial) -> Any:
        if self.choices is not None:
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.is_int:
            return trial.suggest_int(self.name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.name, float(self.low), float(self.high), step=self.step, log=self.log)

    def clip(self, value: Any) -> Any:
        """`value` moved into this range (the baseline trial's value of a setting whose default lies outside it)."""
        if self.choices is not None:
            return value if value in self.choices else self.choices[0]
        return min(max(value, self.low), self.high)

    def as_yaml(self) -> Any:
        if self.choices is not None:
            return {"choices": list(self.choices)}
        spec: dict[str, Any] = {"low": self.low, "high": self.high}
        if self.log:
            spec["log"] = True
        if self.step is not None:
            spec["step"] = self.step
        return spec


def tunable_settings() -> list[str]:
    keys, section = [], ""
    for key, default, _ in describe_settings():
        if key == "#":
            section = str(default)
        elif section.startswith(TUNABLE_SECTIONS) and key not in OPERATIONAL:
            keys.append(key)
    return keys


def default_space(epochs: int, optimizer: str, loss_settings: tuple[str, ...]) -> dict[str, Any]:
    """The space tuned when none is given: what matters on a small budget. lr0's range follows the optimizer; `box` is in
    it only when the model's loss takes it (`loss_settings`: its criterion's reads_settings; YOLOCB's loss takes none)."""
    adam = optimizer.lower().startswith("adam")
    space: dict[str, Any] = {
        "lr0": [1e-4, 1e-2, "log"] if adam else [1e-3, 1e-1, "log"],
        "lrf": [0.01, 1.0],
        "momentum": [0.6, 0.98],
        "weight_decay": [0.0, 0.001],
        "warmup_epochs": [0.0, float(min(3, epochs))],
        "box": [1.0, 10.0],
        "hsv_h": [0.0, 0.1], "hsv_s": [0.0, 0.9], "hsv_v": [0.0, 0.9],
        "degrees": [0.0, 30.0], "translate": [0.0, 0.5], "scale": [0.0, 0.9], "shear": [0.0, 5.0],
        "flipud": [0.0, 0.5], "fliplr": [0.0, 1.0], "mosaic": [0.0, 1.0], "mixup": [0.0, 0.5],
    }
    if "box" not in loss_settings:
        del space["box"]
    if epochs > 1:  # the last N epochs without mosaic/mixup (the YOLOX stage switch; Ultralytics' close_mosaic)
        space["close_mosaic"] = [0, epochs]
    return space


def load_space(value: Any) -> dict[str, Any]:
    """`space=` as given (a mapping, a YAML file path, or a YAML mapping written inline) -> a mapping."""
    if isinstance(value, (str, Path)):
        path = Path(str(value)).expanduser()
        if path.is_file():
            value = load_yaml(path, ConfigError, "search space (space=)")
        else:
            import yaml

            try:
                value = yaml.safe_load(str(value))
            except yaml.YAMLError:
                value = None
            if not isinstance(value, dict):
                raise ConfigError(f"space={str(path)!r}: not a file, nor a YAML mapping such as \"{{lr0: [1.0e-4, 1.0e-2, log]}}\"")
    if not isinstance(value, dict) or not value:
        raise ConfigError(f"space: expected a mapping of settings to ranges or choices, got {type(value).__name__}: {value!r} (see docs/tune.md)")
    return value


def parse_space(value: Any) -> list[Param]:
    """A checked list of Params from a space mapping or file; ConfigError names the first bad entry."""
    mapping = load_space(value)
    defaults, tunable = load_defaults(), tunable_settings()
    params = []
    for key, spec in mapping.items():
        if key not in defaults:
            raise ConfigError(f"space: '{key}' is not a yolo-cb setting.{did_you_mean(str(key), tunable)} See docs/tune.md for the format.")
        if key not in tunable:
            raise ConfigError(f"space: '{key}' cannot be tuned: it does not change what a trial learns (set it as {key}=... for all trials). "
                              f"Tunable: {', '.join(tunable)}")
        params.append(_parse_param(key, spec, defaults[key]))
    return params


def _parse_param(key: str, spec: Any, default: Any) -> Param:
    form = "[low, high], [low, high, log], {low: L, high: H, log: true, step: S} or {choices: [...]}"

    def bad(reason: str) -> ConfigError:
        return ConfigError(f"space: '{key}': {spec!r} {reason}; expected {form}")

    if isinstance(spec, dict) and "choices" in spec:
        extra = set(spec) - {"choices"}
        if extra:
            raise bad(f"mixes choices with {', '.join(sorted(map(str, extra)))}")
        choices = spec["choices"]
        if not isinstance(choices, (list, tuple)) or not choices:
            raise bad("has no list of choices")
        checked = tuple(_valid(key, c, default) for c in choices)
        if any(not isinstance(c, (bool, int, float, str, type(None))) for c in checked):
            raise bad("has a choice that is not a plain value (number, string, boolean)")
        return Param(key, choices=checked)
    if isinstance(spec, (list, tuple)):
        if len(spec) == 3 and spec[2] == "log":
            spec = {"low": spec[0], "high": spec[1], "log": True}
        elif len(spec) == 2:
            spec = {"low": spec[0], "high": spec[1]}
        else:
            raise bad("is not a range")
    if not isinstance(spec, dict):
        raise bad("is neither a range nor choices")
    unknown = set(spec) - RANGE_KEYS
    if unknown:
        word = sorted(map(str, unknown))[0]
        raise bad(f"has the unknown key '{word}'.{did_you_mean(word, sorted(RANGE_KEYS | {'choices'}))}")
    if "low" not in spec or "high" not in spec:
        raise bad("needs both low and high")
    if key not in INT_RANGES and not _is_number_setting(key):
        raise bad(f"is a range, but '{key}' is not a number setting: give {{choices: [...]}}")
    low, high = _valid(key, spec["low"], default), _valid(key, spec["high"], default)
    if not low < high:
        raise bad(f"needs low < high (got {low} and {high})")
    log, step = spec.get("log", False), spec.get("step")
    if not isinstance(log, bool):
        raise bad("has log that is not true or false")
    if log and low <= 0:
        raise bad("is on a log scale, which needs low > 0")
    if step is not None and (isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0 or (key in INT_RANGES and step != int(step))):
        raise bad("has a step that is not a positive number" + (" (a whole number for this integer setting)" if key in INT_RANGES else ""))
    if step is not None and log:
        raise bad("has both step and log, which Optuna cannot sample together")
    return Param(key, low=low, high=high, log=log, step=step)


def _is_number_setting(key: str) -> bool:
    return key in FRACTIONS | NONNEG_FLOATS | POSITIVE_FLOATS


def _valid(key: str, value: Any, default: Any) -> Any:
    """`value` typed and range-checked as setting `key` (ConfigError names the key and what is allowed)."""
    try:
        return coerce(key, value, default)
    except ConfigError as error:
        raise ConfigError(f"space: {error}") from None
