"""Each setting's value typed and range-checked: `coerce` dispatches on the setting's kind (yolo_cb/settings/schema.py,
`COERCERS`), one short function per kind; a wrong value is a ConfigError naming the key, the value and what would be right.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import yaml

from yolo_cb.callbacks.registry import import_user_module
from yolo_cb.callbacks.spec_check import check_callbacks
from yolo_cb.errors import ConfigError, short_repr
from yolo_cb.settings import lr_settings
from yolo_cb.settings.schema import RULES, Setting, schema, settings_of_kind, usable_cpus
from yolo_cb.utils.log import LOGGER
from yolo_cb.utils.yaml_safe import yaml_loads

ALIASES = {"no_aug_epochs": "close_mosaic"}  # another name for a setting -> the setting (YOLOX's name for Ultralytics' close_mosaic)

# The rules live in yolo_cb/settings/schema.py (one Setting per key); these views of it are what the tune search space reads.
INT_RANGES = {key: (rule.low, rule.high) for key, rule in RULES.items() if rule.kind == "int"}  # key: (min, max) inclusive
FRACTIONS = settings_of_kind("fraction")
POSITIVE_FLOATS = settings_of_kind("positive")
NONNEG_FLOATS = settings_of_kind("nonneg")
# Kinds whose string values (from the CLI or a cfg file) parse as YAML scalars first; the others take text as it is.
SCALAR_KINDS = {"int", "procs", "fraction", "positive", "nonneg", "enum", "bool", "bool_or_path", "any"}
VARIANT_FLAGS = ("half", "int8", "nms")  # what may follow an export variant's format: onnx_half, openvino_int8, onnx_nms
_SCHEMA_DEFAULT = object()


def _bad(key: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"invalid value for '{key}': {short_repr(value)} ({type(value).__name__}); expected {expected}")


def _parse_scalar(text: str) -> Any:
    """A CLI or cfg-file string as the YAML scalar it spells (through the bounded loader); the text itself when it
    spells a list, a mapping or no valid YAML, so that the type check names it."""
    stripped = text.strip()
    if not stripped:
        return None
    parsed = _yaml_scalar(stripped)
    return text if parsed is _NOT_SCALAR else parsed


_NOT_SCALAR = object()


@functools.lru_cache(maxsize=4096)
def _yaml_scalar(text: str) -> Any:
    """The YAML scalar `text` spells, or _NOT_SCALAR (a list, a mapping, invalid YAML). Cached: the settings are resolved
    at every predict call (`for frame in frames: model(frame)`), and a scalar (immutable) is the same every time."""
    try:
        parsed = yaml_loads(text)
    except yaml.YAMLError:
        return _NOT_SCALAR
    return _NOT_SCALAR if isinstance(parsed, (dict, list)) else parsed


def _as_number(value: Any) -> Any:
    """A string Python's float() accepts (1e-3, 1E-3, 5e2: YAML 1.1 reads these as text) as that float; else unchanged."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def coerce(key: str, value: Any, default: Any = _SCHEMA_DEFAULT) -> Any:
    """Convert `value` (possibly a string from the CLI) to the type of setting `key`, checking its range. `default`
    (the schema's when not given) decides whether an empty value of a number setting stays None."""
    rule = RULES.get(key)
    if rule is None:  # not a setting: a YAML scalar, unchecked
        return _parse_scalar(value) if isinstance(value, str) else value
    if isinstance(value, str) and rule.kind in SCALAR_KINDS:
        value = _parse_scalar(value)
    if default is _SCHEMA_DEFAULT:
        default = schema()[key].default if key in schema() else None
    return COERCERS[rule.kind](key, rule, value, default)


def _enum(key: str, rule: Setting, value: Any, default: Any) -> Any:
    for given, meant in rule.aliases:
        if value is given:
            value = meant
            break
    choices = rule.choices
    lowered = {str(c).lower(): c for c in choices}
    if isinstance(value, str) and value.lower() in lowered:
        value = lowered[value.lower()]
    if value not in choices or (isinstance(value, bool) and not any(isinstance(c, bool) and c == value for c in choices)):
        raise _bad(key, value, "one of " + " | ".join(str(c) for c in choices))
    return value


def _bool_or_path(key: str, rule: Setting, value: Any, default: Any) -> Any:
    if value is None:
        return False
    if isinstance(value, (bool, str)):
        return value
    raise _bad(key, value, "true, false or a path")


def _bool(key: str, rule: Setting, value: Any, default: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise _bad(key, value, "true or false")


def _int(key: str, rule: Setting, value: Any, default: Any) -> int | None:
    if value is None and default is None:
        return None
    value = _as_number(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and not value.is_integer()):
        raise _bad(key, value, "an integer")
    value = int(value)
    low, high = rule.low, rule.high
    if (low is not None and value < low) or (high is not None and value > high):
        raise _bad(key, value, f"an integer >= {low}" + (f" and <= {high}" if high is not None else ""))
    if rule.multiple and value % rule.multiple:  # as Ultralytics: rounded up to the stride, with a warning
        rounded = -(-value // rule.multiple) * rule.multiple
        if high is not None and rounded > high:
            raise _bad(key, value, f"a multiple of {rule.multiple} (the model's largest stride) <= {high}")
        warn_once(f"WARNING {key}={value} must be a multiple of {rule.multiple} (the model's largest stride): {rounded} is used "
                  f"(rounded up, as Ultralytics does)")
        value = rounded
    return value


_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    """Log a warning once per process (the settings of one command are resolved more than once)."""
    if message not in _WARNED:
        _WARNED.add(message)
        LOGGER.warning(message)


def _procs(key: str, rule: Setting, value: Any, default: Any) -> int | None:
    """An int >= low and at most usable_cpus(): each process (nproc=16 on 2 cores started 17, 5.1 GB) needs a core."""
    value, cores = _int(key, rule, value, default), usable_cpus()
    if value is not None and value > cores:
        raise _bad(key, value, f"an integer from {rule.low} to {cores}, the CPU cores this process may use (each process needs one)")
    return value


FLOAT_CHECKS = {  # kind -> (the value is out of range, what is expected)
    "fraction": (lambda v: not 0.0 <= v <= 1.0, "a fraction in [0, 1]"),
    "positive": (lambda v: v <= 0, "a number > 0"),
    "nonneg": (lambda v: v < 0, "a number >= 0"),
}


def _float(key: str, rule: Setting, value: Any, default: Any) -> float | None:
    if value is None and default is None:
        return None
    value = _as_number(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:  # value != value: nan
        raise _bad(key, value, "a number")
    value = float(value)
    out_of_range, expected = FLOAT_CHECKS[rule.kind]
    if out_of_range(value) or (rule.high is not None and value > rule.high):
        raise _bad(key, value, expected + (f" and <= {rule.high}" if rule.high is not None else ""))
    if rule.low_open and value == 0.0:
        raise _bad(key, value, "a fraction in (0, 1]")
    return value


def _text(key: str, rule: Setting, value: Any, default: Any) -> str | None:
    return None if value is None else str(value)


def _device(key: str, rule: Setting, value: Any, default: Any) -> str | None:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return _text(key, rule, value, default)


def _as_is(key: str, rule: Setting, value: Any, default: Any) -> Any:
    return value


def _metric(key: str, rule: Setting, value: Any, default: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _bad(key, value, "a metric key, e.g. fitness, metrics/mAP50(B) or val/iou_loss")
    return value.strip()


def _modules(key: str, rule: Setting, value: Any, default: Any) -> list[str] | None:
    """Module names (a comma-separated string or a list), each imported now: its @register_callback names register."""
    if value in (None, "", [], False):
        return None
    names = [n.strip() for n in value.split(",")] if isinstance(value, str) else [str(n).strip() for n in value] if isinstance(value, (list, tuple)) else None
    if names is None or not all(names):
        raise _bad(key, value, "module names, comma separated or a list (e.g. mypkg.callbacks)")
    for name in names:
        try:
            import_user_module(name)
        except Exception as error:  # the user's module: named, with its error's first line
            raise ConfigError(f"invalid value for '{key}': cannot import module '{name}' ({type(error).__name__}: "
                              f"{(str(error).splitlines() or [''])[0][:200]}); give an importable module name") from None
    return names


def parse_variant(token: Any) -> dict[str, Any]:
    """An export variant (export_check=, `yolo-cb benchmark format=`): onnx, onnx_half, openvino_int8, onnx_nms, ... ->
    {"format", "half", "int8", "nms"}; the formats are the `format` setting's choices. ConfigError naming what is known."""
    fmt, *flags = str(token).strip().lower().split("_")
    formats = RULES["format"].choices
    if fmt not in formats or not set(flags) <= set(VARIANT_FLAGS):
        raise ConfigError(f"{token!r} is not an export variant: use a format ({', '.join(formats)}) optionally followed by "
                          f"{', '.join('_' + f for f in VARIANT_FLAGS)}, e.g. onnx,onnx_nms,openvino_int8")
    return {"format": fmt, **{flag: flag in flags for flag in VARIANT_FLAGS}}


def variant_conflict(fmt: str, half: bool, int8: bool, nms: bool) -> str | None:
    """Why this format cannot take these options together (format= with half=/int8=/nms=, or a variant), or None."""
    if half and int8:
        return "half=True and int8=True exclude each other: pick one precision"
    if fmt == "torchscript" and (int8 or nms):
        return (f"format=torchscript supports neither int8 nor nms (got int8={int8}, nms={nms}); use format=onnx or "
                f"format=openvino for those")
    return None


def _variants(key: str, rule: Setting, value: Any, default: Any) -> str | None:
    """Export variants, comma separated or a list, each one checked (parse_variant), as one comma-separated string."""
    if value in (None, "", [], False):
        return None
    tokens = value.split(",") if isinstance(value, str) else value if isinstance(value, (list, tuple)) else None
    if tokens is None:
        raise _bad(key, value, "export variants, comma separated or a list, e.g. onnx,openvino_int8")
    names = [str(token).strip().lower() for token in tokens if str(token).strip()]
    for name in names:
        try:
            spec = parse_variant(name)
        except ConfigError as error:
            raise ConfigError(f"invalid value for '{key}': {error}") from None
        conflict = variant_conflict(spec["format"], spec["half"], spec["int8"], spec["nms"])
        if conflict:
            raise ConfigError(f"invalid value for '{key}': {name!r}: {conflict}")
    return ",".join(names) or None


def _callbacks(key: str, rule: Setting, value: Any, default: Any) -> Any:
    if value not in (None, "", [], {}, False):
        check_callbacks(value)
    return value


def _yaml_text(key: str, value: Any) -> Any:
    """A structured setting given as YAML text (a list, a mapping, a number) parsed; other values unchanged."""
    if isinstance(value, str) and value.strip()[:1] in "[{0123456789":
        try:
            return yaml_loads(value)
        except yaml.YAMLError:
            raise _bad(key, value, "valid YAML") from None
    return value


def _freeze(key: str, rule: Setting, value: Any, default: Any) -> int | list[str] | None:
    return parse_freeze(_yaml_text(key, value))


def _lr_scheduler(key: str, rule: Setting, value: Any, default: Any) -> Any:
    value = _yaml_text(key, value)
    lr_settings.resolve(value)  # the name and its parameters are checked here; the checks against other settings in get_config
    return value


def _save_epochs(key: str, rule: Setting, value: Any, default: Any) -> list[int] | None:
    """Epoch numbers (1-based), sorted and unique; None for none."""
    value = _yaml_text(key, value)
    if value in (None, "", []):
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, str):
        value = [v for v in re.split(r"[,\s]+", value) if v]
    try:
        epochs = [int(v) for v in value]
    except (TypeError, ValueError):
        raise _bad(key, value, "a list of epoch numbers (1-based), e.g. save_epochs=[10,50]") from None
    if any(e < 1 for e in epochs) or any(isinstance(v, bool) for v in value):
        raise _bad(key, value, "a list of epoch numbers >= 1")
    return sorted(set(epochs))


def parse_freeze(value: Any) -> int | list[str] | None:
    """None | int >= 0 | a list (or comma-separated string) of module names. Raises ConfigError."""
    if value is None or value is False or value == "" or value == []:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"invalid value for 'freeze': {value!r}; expected a number of layers or a list of module names")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"invalid value for 'freeze': {value}; expected an integer >= 0 or a list of module names")
        return value or None
    if isinstance(value, str):
        value = [part.strip() for part in value.strip("[]").split(",") if part.strip()]
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value):
        return [str(v) for v in value] or None
    raise ConfigError(f"invalid value for 'freeze': {value!r}; expected an integer >= 0 or a list of module names")


def resolve_close_mosaic(sources: list[dict], default: int) -> int:
    """close_mosaic and its YOLOX alias no_aug_epochs: the last source (base, cfg file, overrides) that gives either wins;
    one source giving both with different values is an error."""
    value = default
    for i, source in enumerate(sources):
        given = {k: coerce(k, source[k], 0) for k in ("close_mosaic", *ALIASES) if source.get(k) is not None}
        if i == 0 and len(set(given.values())) > 1:  # a checkpoint of an older yolo-cb: close_mosaic counted when no_aug_epochs was 0
            given = {"close_mosaic": given["no_aug_epochs"] or given["close_mosaic"]}
        if len(set(given.values())) > 1:
            raise ConfigError(f"invalid value for 'no_aug_epochs': {given['no_aug_epochs']} while close_mosaic={given['close_mosaic']}; "
                              f"no_aug_epochs is YOLOX's name for close_mosaic: give one of them (or the same value)")
        if given:
            value = next(iter(given.values()))
    return value


def _coerce_classes(value: Any, key: str = "classes") -> list[int] | None:
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, str):
        value = [v for v in re.split(r"[,\s\[\]]+", value) if v]
    try:
        return [int(v) for v in value]
    except (TypeError, ValueError):
        raise _bad(key, value, f"an integer or a list of integers, e.g. {key}=0,2") from None


def _classes(key: str, rule: Setting, value: Any, default: Any) -> list[int] | None:
    return _coerce_classes(value, key)


COERCERS = {  # a setting's kind (yolo_cb/settings/schema.py) -> how a value of it is typed and checked
    "int": _int, "fraction": _float, "positive": _float, "nonneg": _float, "enum": _enum, "bool": _bool,
    "bool_or_path": _bool_or_path, "text": _text, "device": _device, "free": _as_is, "any": _as_is, "metric": _metric,
    "callbacks": _callbacks, "modules": _modules, "classes": _classes, "freeze": _freeze, "save_epochs": _save_epochs, "lr_scheduler": _lr_scheduler,
    "procs": _procs, "variants": _variants,
}
