"""`yolo-cb settings` (Ultralytics' `yolo settings mlflow=False`): a user settings file for integration defaults; and the
environment variables of Ultralytics' integrations that yolo-cb refuses, each in one line."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from yolo_cb.cli import entrypoint
from yolo_cb.settings.config import ConfigError, get_config


@pytest.fixture
def config_dir(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "config"
    monkeypatch.setenv("YOLO_CB_CONFIG_DIR", str(folder))
    return folder


def cli(args: list[str], capsys) -> tuple[int, str, str]:
    try:
        entrypoint(args)
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_settings_are_saved_typed_and_become_the_defaults_below_the_command(config_dir, capsys):
    code, out, _ = cli(["settings", "mlflow=False", "comet=True", "datasets_dir=/data/sets"], capsys)
    assert code == 0 and f"saved {config_dir / 'settings.yaml'}" in out
    assert yaml.safe_load((config_dir / "settings.yaml").read_text()) == {"comet": True, "datasets_dir": "/data/sets", "mlflow": False}
    assert "comet          true     (yours)" in out and "tensorboard    true     (default)" in out
    args = get_config({"mode": "train"})
    assert args.mlflow is False and args.comet is True and args.datasets_dir == "/data/sets"
    assert get_config({"mode": "train", "mlflow": True}).mlflow is True  # the command wins over the file
    assert get_config({"mode": "train"}, base={"comet": False}).comet is False  # so does a resumed checkpoint's record
    code, out, _ = cli(["settings", "reset"], capsys)
    assert code == 0 and not (config_dir / "settings.yaml").exists()
    assert get_config({"mode": "train"}).mlflow is True


@pytest.mark.parametrize("token, says", [
    ("sync=False", "'sync' is an Ultralytics setting yolo-cb's settings file does not hold"),
    ("epochs=3", "'epochs' cannot be a user setting: the settings file holds mlflow, tensorboard, wandb, comet"),
    ("comet=maybe", "invalid value for 'comet': 'maybe' (str); expected true or false"),
    ("comet", "'comet' is not key=value"),
])
def test_a_bad_setting_is_one_line_and_exit_2_and_nothing_is_written(config_dir, capsys, token, says):
    code, out, err = cli(["settings", token], capsys)
    assert code == 2 and err.startswith(f"yolo-cb: error: {says}") and len(err.strip().splitlines()) == 1, err
    assert not (config_dir / "settings.yaml").exists()


def test_a_broken_settings_file_is_one_line_naming_it(config_dir):
    config_dir.mkdir()
    (config_dir / "settings.yaml").write_text("epochs: 3\n")
    with pytest.raises(ConfigError, match=f"^'epochs' in {re.escape(str(config_dir / 'settings.yaml'))} cannot be a user setting"):
        get_config({"mode": "train"})


def quiet_trainer(tmp_path: Path) -> SimpleNamespace:
    """What the integrations read before their tool is reached: enough to see what they say about the environment."""
    return SimpleNamespace(is_main=True, save_dir=tmp_path / "run", args=None)


@pytest.mark.parametrize("variable, value, integration, says", [
    ("COMET_MODE", "sideways", "comet", "WARNING Comet: ValueError: COMET_MODE='sideways' is not one of online, offline; Comet logging is off"),
    ("COMET_EVAL_LOG_CONFUSION_MATRIX", "false", "comet", "WARNING Comet: COMET_EVAL_LOG_CONFUSION_MATRIX is not read by yolo-cb "
                                                          "(best.pt's confusion matrix is always logged at the end)"),
    ("MLFLOW_KEEP_RUN_ACTIVE", "True", "mlflow", "WARNING MLflow: MLFLOW_KEEP_RUN_ACTIVE is not read by yolo-cb (start the run yourself"),
])
def test_ultralytics_variables_yolo_cb_does_not_read_are_refused_in_one_line(tmp_path, monkeypatch, caplog, variable, value, integration, says):
    from yolo_cb.assembly.assemble import build_registered

    pytest.importorskip({"comet": "comet_ml", "mlflow": "mlflow"}[integration])
    monkeypatch.setenv(variable, value)
    if variable != "COMET_MODE":
        monkeypatch.setenv("COMET_MODE", "sideways")  # stops Comet right after its check of the environment
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with caplog.at_level(logging.WARNING, logger="yolo_cb"):
        build_registered(integration).on_pretrain_routine_end(quiet_trainer(tmp_path))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(says)]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    assert not (tmp_path / "run").exists()  # nothing was logged anywhere
