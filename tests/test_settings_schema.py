"""cfg/default.yaml (the defaults and their meanings) and yolo_cb/settings/schema.py (the rules) describe the same settings."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from yolo_cb.settings.config import ConfigError, coerce, get_config
from yolo_cb.settings.schema import KINDS, RULES, load_defaults, schema

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
    with pytest.raises(ConfigError, match="a multiple of 32"):
        coerce("imgsz", 33)
    with pytest.raises(ConfigError, match=r"a fraction in \(0, 1\]"):
        coerce("fraction", 0)
    assert coerce("cache", True) == "ram" and coerce("cache", None) is False


def test_coerce_is_short_functions():
    """coerce is a dispatch over the schema's kinds: no function of settings/ (config.py, values.py, ...) is over 60 lines."""
    modules = sorted(SETTINGS.glob("*.py"))
    assert {"config.py", "values.py"} <= {m.name for m in modules}
    long = {f"{m.name}:{node.name}": node.end_lineno - node.lineno + 1 for m in modules for node in ast.walk(ast.parse(m.read_text()))
            if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno + 1 > 60}
    assert not long
