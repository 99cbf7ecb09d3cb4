"""The user's own defaults for integrations: `yolo-cb settings mlflow=False comet=True` (Ultralytics' `yolo settings`).

One YAML file, `settings.yaml` in the user's config folder: YOLO_CB_CONFIG_DIR when set, else
$XDG_CONFIG_HOME/yolo-cb, else ~/.config/yolo-cb. It holds only the integration switches and the two folders
(USER_KEYS); its values sit between cfg/default.yaml and everything else (a cfg= file, a checkpoint being resumed, the
command line win over it). Read when settings are resolved (yolo_cb.settings.config.get_config), never on import. A switch that
comes from this file is not "asked for" by the command: when its package is missing, the run warns and goes on
(callbacks/assemble.py), where `comet=True` on the command line stops before any work.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from yolo_cb.errors import ConfigError
from yolo_cb.utils.files import atomic_write_text
from yolo_cb.utils.yaml_safe import load_yaml

ENV_DIR = "YOLO_CB_CONFIG_DIR"  # the folder of settings.yaml (Ultralytics' YOLO_CONFIG_DIR)
FILE_NAME = "settings.yaml"
USER_KEYS = ("mlflow", "tensorboard", "wandb", "comet", "clearml", "dvc", "datasets_dir", "weights_dir")
# keys of Ultralytics' settings file that have no place in ours, and why
ULTRALYTICS_ONLY = {
    "runs_dir": "runs go to project= (default runs/detect), given per command",
    "sync": "yolo-cb sends nothing anywhere", "api_key": "yolo-cb has no hub", "hub": "yolo-cb has no hub",
    "openai_api_key": "yolo-cb calls no such service", "uuid": "yolo-cb sends nothing anywhere",
    "raytune": "not built in yolo-cb yet", "neptune": "no Neptune integration in yolo-cb", "settings_version": "not needed",
    "openvino_msg": "no such message here", "vscode_msg": "no such message here",
}


def settings_path() -> Path:
    folder = os.environ.get(ENV_DIR) or Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "yolo-cb"
    return Path(folder).expanduser() / FILE_NAME


def check_key(key: str, where: str) -> None:
    """ConfigError (one line) for a key the settings file cannot hold."""
    if key in USER_KEYS:
        return
    if key in ULTRALYTICS_ONLY:
        raise ConfigError(f"'{key}'{where} is an Ultralytics setting yolo-cb's settings file does not hold ({ULTRALYTICS_ONLY[key]}); "
                          f"it holds {', '.join(USER_KEYS)}")
    raise ConfigError(f"'{key}'{where} cannot be a user setting: the settings file holds {', '.join(USER_KEYS)} "
                      f"(give any other setting per command, or in a cfg= file)")


def load_user_settings() -> dict[str, Any]:
    """The file's settings ({} without a file); ConfigError naming the file for one that is broken."""
    path = settings_path()
    if not path.is_file():
        return {}
    data = load_yaml(path, ConfigError, "user settings file") or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, got {type(data).__name__}; fix it or run `yolo-cb settings reset`")
    for key in data:
        check_key(str(key), f" in {path}")
    return data


def save_user_settings(values: dict[str, Any]) -> Path:
    """Merge `values` (already typed) into the file; returns its path."""
    path = settings_path()
    merged = {**load_user_settings(), **values}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, yaml.safe_dump(merged, sort_keys=True))
    return path


def reset_user_settings() -> Path:
    path = settings_path()
    path.unlink(missing_ok=True)
    return path
