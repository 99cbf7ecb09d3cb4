"""cfg/default.yaml (the defaults and their meanings) and yolo_cb/settings/schema.py (the rules) describe the same settings."""

from __future__ import annotations

import ast
import re
import types
import typing
from pathlib import Path

import pytest

from yolo_cb.settings.config import ConfigError, coerce, get_config
from yolo_cb.settings.schema import KINDS, RULES, Settings, load_defaults, schema

SETTINGS = Path(__file__).resolve().parents[1] / "yolo_cb" / "settings"


def test_every_key_of_default_yaml_has_a_rule_and_every_rule_a_key():
    assert list(load_defaults()) == list(RULES)  # the same keys, in the same order
    assert list(schema()) == list(RULES)


@pytest.mark.parametrize("key", list(load_defaults()))
def test_each_default_is_valid_for_its_kind_and_has_a_meaning(key):
    setting = schema()[key]
    assert setting.kind in KINDS
    assert setting.meaning.strip(), f"{key} has no comment of meaning in cfg/default.yaml"
    assert setting.section
    coerce(key, setting.default)  # the default passes its own rule
    if setting.kind == "enum":
        assert setting.choices
    if setting.kind == "int" and setting.default is not None:
        assert setting.low is None or setting.default >= setting.low


def test_the_defaults_resolve_to_themselves():
    args = get_config({})
    for key, setting in schema().items():
        if setting.kind not in ("callbacks", "freeze", "save_epochs", "classes", "lr_scheduler") and key not in ("close_mosaic", "no_aug_epochs"):
            assert getattr(args, key) == setting.default, key


def test_a_rule_checks_what_it_says():
    assert coerce("imgsz", "64") == 64
    assert coerce("imgsz", 33) == 64  # rounded up to the stride, with a warning, as Ultralytics
    with pytest.raises(ConfigError, match="<= 8192"):
        coerce("imgsz", 8193)
    with pytest.raises(ConfigError, match=r"a fraction in \(0, 1\]"):
        coerce("fraction", 0)
    assert coerce("cache", True) == "ram" and coerce("cache", None) is False
    # export variants: checked where the settings are read (a bad one once only warned, after the model was built)
    assert coerce("export_check", "ONNX, openvino_int8") == "onnx,openvino_int8" == coerce("export_check", ["onnx", "openvino_int8"])
    assert coerce("export_check", "") is None and coerce("export_check", None) is None
    for bad, says in (("onnx_bogus", "not an export variant: use a format (onnx, openvino, torchscript"), ("pdf", "not an export variant"),
                      ("onnx_half_int8", "pick one precision"), ("torchscript_nms", "supports neither int8 nor nms"), (3, "comma separated")):
        with pytest.raises(ConfigError, match=f"invalid value for 'export_check'.*{re.escape(says)}"):
            coerce("export_check", bad)


def test_coerce_is_short_functions():
    """coerce is a dispatch over the schema's kinds: no function of settings/ (config.py, values.py, ...) is over 60 lines."""
    modules = sorted(SETTINGS.glob("*.py"))
    assert {"config.py", "values.py"} <= {m.name for m in modules}
    long = {f"{m.name}:{node.name}": node.end_lineno - node.lineno + 1 for m in modules for node in ast.walk(ast.parse(m.read_text()))
            if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno + 1 > 60}
    assert not long


def _holds(value, hint) -> bool:
    """Whether `value` is of the annotated type `hint` (int, float, bool, str, list[...], unions, None, Any), strictly: a
    bool is no int and an int no float, since a resolved setting holds exactly its coerced type."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is typing.Any:
        return True
    if hint is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_holds(value, arg) for arg in args)
    if origin is list:
        return isinstance(value, list) and all(_holds(v, args[0]) for v in value)
    return type(value) is hint


TYPED_RUNS = [{}, {"mode": "val"}, {"mode": "predict", "classes": "0,2"}, {"mode": "export", "format": "openvino", "int8": True},
              {"freeze": 3, "save_epochs": "1,5", "time": 2, "cache": True, "device": "0,1", "pretrained": "w.pt",
               "callback_modules": "json", "lr0": 1, "compile": "default", "unfreeze_epoch": 2, "seed": "7"},
              {"freeze": "backbone", "onnx_check": "strict", "per_class": True, "resume": True, "conf": 0}]


@pytest.mark.parametrize("overrides", TYPED_RUNS)
def test_every_resolved_setting_has_the_type_its_annotation_says(overrides):
    """Config is a Settings: args.<key> is typed by Settings' annotations; they must tell the truth about what resolution
    gives, so that a type checker reading them is right."""
    hints = typing.get_type_hints(Settings)
    assert list(hints) == list(RULES)
    config = get_config(overrides)
    assert isinstance(config, Settings)
    wrong = {key: (getattr(config, key), hints[key]) for key in RULES if not _holds(getattr(config, key), hints[key])}
    assert not wrong
