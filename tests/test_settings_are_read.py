"""Every key of cfg/default.yaml is read by the code (no accepted setting is silently ignored), and the check catches an
unread key planted into a copy of the file."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "yolo_cb"
# config.py's type tables name every key only to validate it: that is not a read
TABLES = re.compile(r"# Per-key type rules.*?\ndef load_defaults", re.S)


def package_source(package: Path = PACKAGE) -> str:
    parts = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        if path.name == "config.py" and path.parent == package:
            text = TABLES.sub("", text)
        parts.append(text)
    return "\n".join(parts)


# a read of setting `key` from a settings object: args.key / cfg.key / hyp.key, getattr(args, "key"), args["key"], x.get("key")
SETTINGS = r"(?:args|cfg|hyp|config|overrides|merged|train_args)"


def read_pattern(key: str) -> str:
    return rf"\b{SETTINGS}\.{key}\b|getattr\([\w.]+, [\"']{key}[\"']|\b{SETTINGS}(?:\.get\(|\[)[\"']{key}[\"']"


# settings that take effect while the settings are resolved, by their kind's function in config.py (checked below)
ACT_WHEN_RESOLVED = {"callback_modules": "import_user_module(name)"}  # imported before callbacks= is checked


def unread_keys(default_yaml: Path, source: str) -> list[str]:
    """Keys that no code reads from a settings object (config.py's validation tables do not count)."""
    keys = yaml.safe_load(default_yaml.read_text())
    return [key for key in keys if not re.search(read_pattern(key), source) and key not in ACT_WHEN_RESOLVED]


def test_settings_that_act_when_resolved_do():
    config = (ROOT / "yolo_cb" / "settings" / "values.py").read_text()  # where each setting is typed (yolo_cb/config.py, then settings_types.py, before)
    assert all(effect in config for effect in ACT_WHEN_RESOLVED.values())


def test_every_default_setting_is_read_by_the_code():
    assert unread_keys(ROOT / "cfg" / "default.yaml", package_source()) == []


def test_a_planted_unread_setting_fails_the_rule(tmp_path):
    planted = tmp_path / "default.yaml"
    planted.write_text((ROOT / "cfg" / "default.yaml").read_text() + "shiny_new_knob: 3   # accepted, documented, read by nothing\n")
    assert unread_keys(planted, package_source()) == ["shiny_new_knob"]
