"""The CLI and settings: strict keys, typed values, exit codes, run dirs, import without side effects."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from yolo_cb.settings.config import ConfigError, describe_settings, get_config, load_defaults
from yolo_cb.utils.files import increment_path

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yolo_cb", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_misspelt_key_exits_2_with_suggestion():
    proc = cli("train", "data=shapes.yaml", "epchs=3")
    assert proc.returncode == 2
    assert "'epchs' is not a valid yolo-cb argument" in proc.stderr and "'epochs'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_type_names_key_and_expected_type():
    proc = cli("train", "imgsz=abc")
    assert proc.returncode == 2 and "'imgsz'" in proc.stderr and "expected an integer" in proc.stderr and "Traceback" not in proc.stderr


def test_key_space_value_is_refused_with_hint_and_dashes_warn():
    proc = cli("train", "epochs", "3")
    assert proc.returncode == 2 and "write epochs=3" in proc.stderr
    proc = cli("train", "--epchs=3")
    assert proc.returncode == 2 and "accepted as 'epchs=3'" in proc.stderr


def test_unknown_mode():
    proc = cli("trian")
    assert proc.returncode == 2 and "'train'" in proc.stderr


def test_cfg_prints_every_setting_with_its_comment():
    proc = cli("cfg")
    assert proc.returncode == 0
    for key, _default, comment in describe_settings():
        if key != "#":
            assert key in proc.stdout and comment in proc.stdout, key
    assert cli("version").stdout.strip() and "Usage" in cli("help").stdout


def test_every_default_has_a_comment():
    rows = [r for r in describe_settings() if r[0] != "#"]
    assert {r[0] for r in rows} == set(load_defaults())
    assert all(comment for _, _, comment in rows)


def test_missing_data_lists_where_it_looked(tmp_path):
    proc = cli("train", "data=nope.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and "nope.yaml" in proc.stderr and "Traceback" not in proc.stderr
    assert "cfg/datasets" in proc.stderr or "looked" in proc.stderr.lower()


@pytest.mark.parametrize(("overrides", "message"), [
    ({"mosaic": 1.5}, "fraction in \\[0, 1\\]"),
    ({"optimizer": "sgdd"}, "one of SGD"),
    ({"imgsz": 8200}, "<= 8192"),
    ({"epochs": 0}, "integer >= 1"),
    ({"amp": "maybe"}, "true or false"),
    ({"lr0": -1}, "> 0"),
])
def test_types_and_ranges(overrides, message):
    with pytest.raises(ConfigError, match=message):
        get_config(overrides)


def test_coercion_from_strings_and_cfg_file(tmp_path):
    cfg = tmp_path / "mine.yaml"
    cfg.write_text("epochs: 7\nlr0: 0.02\n")
    args = get_config({"cfg": str(cfg), "epochs": "9", "cache": "True", "classes": "0,2", "optimizer": "adamw", "save": "false"})
    assert (args.epochs, args.lr0, args.cache, args.classes, args.optimizer, args.save) == (9, 0.02, "ram", [0, 2], "AdamW", False)
    bad = tmp_path / "bad.yaml"
    bad.write_text("epoch: 3\n")
    with pytest.raises(ConfigError, match="'epoch' in .*bad.yaml.*'epochs'"):
        get_config({"cfg": str(bad)})


def test_run_dirs_increment(tmp_path):
    assert increment_path(tmp_path / "exp").name == "exp"
    assert increment_path(tmp_path / "exp").name == "exp-2"
    assert increment_path(tmp_path / "exp").name == "exp-3"
    assert increment_path(tmp_path / "exp", exist_ok=True).name == "exp"


def test_import_has_no_side_effects(tmp_path):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    code = ("import os, sys; before = dict(os.environ); import yolo_cb; "
            "heavy = [m for m in ('mlflow', 'tensorboard', 'onnx', 'onnxruntime', 'cv2', 'matplotlib', 'yolo_cb.model') if m in sys.modules]; "
            "assert not heavy, heavy; assert dict(os.environ) == before; print(yolo_cb.__version__)")
    env = {**os.environ, "HOME": str(home)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert list(home.iterdir()) == [] and list(cwd.iterdir()) == []
