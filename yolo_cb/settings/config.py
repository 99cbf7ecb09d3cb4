"""Settings: defaults from cfg/default.yaml, the user's settings file, a `cfg=` file, then overrides; typed, range-checked, strict.

An unknown key, a wrong type or an out-of-range value raises ConfigError naming the key,
the value and what would be right (with 'did you mean' for misspelt keys). Each setting's kind, range or choices
are in yolo_cb/settings/schema.py; each value is typed by yolo_cb/settings/values.py (`coerce`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from yolo_cb.callbacks.spec_check import Declaration, check_callbacks
from yolo_cb.errors import ConfigError
from yolo_cb.settings import lr_settings
from yolo_cb.settings.controls import CONTROLS_HINT
from yolo_cb.settings.declared import fold
from yolo_cb.settings.schema import Settings, describe_settings, load_defaults
from yolo_cb.settings.ultralytics_keys import refused_keys_message, split_cfg_keys, unknown_key_message
from yolo_cb.settings.user import load_user_settings
from yolo_cb.settings.values import (  # noqa: F401
    ALIASES,
    FRACTIONS,
    INT_RANGES,
    NONNEG_FLOATS,
    POSITIVE_FLOATS,
    _yaml_text,
    coerce,
    parse_freeze,
    resolve_close_mosaic,
)
from yolo_cb.utils.files import atomic_write_text
from yolo_cb.utils.log import LOGGER, setup_logging
from yolo_cb.utils.paths import find_dataset_cfg
from yolo_cb.utils.yaml_safe import load_yaml

__all__ = ["Config", "ConfigError", "check_callbacks", "coerce", "describe_settings", "get_config", "load_defaults", "parse_freeze",
           "save_config"]


class Config(Settings, SimpleNamespace):
    """The resolved settings; attribute access (args.epochs, typed by `Settings`' annotations) and dict conversion.
    Structured settings are typed values (freeze, save_epochs, classes); lr_scheduler= keeps the value given (plain data, as checkpoints and args.yaml record
    it) and its parsed form (yolo_cb.settings.lr_settings.parsed) in a slot, outside the settings; so does callbacks=
    (its checked declarations: `callback_declarations`), whose recipe declarations are folded into the settings when
    read (settings/declared.py): declared unfreeze stages, which no setting holds, in the slot `unfreeze_stages`."""

    __slots__ = ("_declared", "_lr_scheduler", "_sealed", "_unfreeze_stages")

    @property
    def unfreeze_stages(self) -> dict[int, Any] | None:
        """The unfreeze stages `- unfreeze: {stages: ...}` declared ({0-based epoch: "all" | [module names]}); None: none."""
        return getattr(self, "_unfreeze_stages", None)

    def seal(self) -> Config:
        """Fix the settings: a run is planned once (the trainer freezes its settings when it is made); a later write of a
        setting raises, naming what steers a run instead (docs/callbacks.md, "Controls")."""
        object.__setattr__(self, "_sealed", True)
        return self

    def settle(self, start: Any = None) -> Config:
        """A run's settings, sealed after their last two facts are recorded (args.yaml and checkpoints; a resume from any
        folder finds the same files): the model the run starts from (`start`, where model= is empty) and the data YAML
        as an absolute path."""
        if self.model is None and isinstance(start, (str, Path)):
            self.model = str(start)
        try:
            self.data = str(find_dataset_cfg(str(self.data or "shapes.yaml")).resolve())
        except (FileNotFoundError, OSError):
            pass  # check_data reports it, with every place it looked
        return self.seal()

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_sealed", False) and not name.startswith("_") and getattr(self, name, object()) != value:
            raise AttributeError(f"args.{name} cannot be changed: the settings are fixed once a run is planned (a write now would "
                                 f"change nothing already built from it). Pass {name}= to train(), or: {CONTROLS_HINT}")
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if getattr(self, "_sealed", False):
            raise AttributeError(f"args.{name} cannot be deleted: the settings are fixed once a run is planned")
        super().__delattr__(name)

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)

    def __iter__(self):
        """(key, value) pairs, so that `dict(args)` works as on Ultralytics' settings namespace."""
        return iter(vars(self).items())


def check_keys(overrides: dict[str, Any], valid: dict[str, Any], source: str = "") -> None:
    for key in overrides:
        if key not in valid:
            where = f" in {source}" if source else ""
            raise ConfigError(unknown_key_message(key, valid, where))


def load_cfg_file(cfg_file: Any, defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings of a `cfg=` file, its keys checked (ConfigError: missing, not a mapping, an unknown key)."""
    path = Path(str(cfg_file)).expanduser()
    if not path.is_file():
        raise ConfigError(f"cfg={cfg_file}: file not found")
    loaded = load_yaml(path, ConfigError, "settings file (cfg=)") or {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"cfg={cfg_file}: expected a mapping of settings, got {type(loaded).__name__}")
    return read_whole(loaded, defaults or load_defaults(), str(path))


def read_whole(loaded: dict[str, Any], valid: dict[str, Any], path: str) -> dict[str, Any]:
    """A cfg= file's settings read whole (Ultralytics' own default.yaml, as `yolo copy-cfg` writes it, included): every key
    yolo-cb cannot use in one ConfigError; Ultralytics settings yolo-cb lacks that hold Ultralytics' default, and
    `opset:` / `channels_last:` / `nms:` left empty, are left out with one info line naming them."""
    refused, left_out, nulls = split_cfg_keys(loaded, valid)
    if refused:
        raise ConfigError(refused_keys_message(loaded, refused, valid, path))
    parts = [f"{', '.join(left_out)} (Ultralytics settings yolo-cb does not have, each at Ultralytics' default)"] if left_out else []
    parts += [f"{', '.join(nulls)} (empty: yolo-cb's default)"] if nulls else []
    said = f"cfg={path}: left out, as asking for nothing: {'; '.join(parts)}"
    if parts and said not in _SAID:  # once per process: the settings of one command are resolved more than once
        _SAID.add(said)
        setup_logging()
        LOGGER.info(said)
    return {k: v for k, v in loaded.items() if k not in left_out and k not in nulls}


_SAID: set[str] = set()


def get_config(overrides: dict[str, Any] | None = None, base: dict[str, Any] | None = None,
               cfg_values: dict[str, Any] | None = None) -> Config:
    """Defaults <- the user's settings file (yolo_cb/settings/user.py) <- `base` (e.g. a checkpoint's train_args) <- cfg=
    file <- overrides; typed and checked. `cfg_values`: the cfg= file's settings when they were already read (resume=auto
    reads them to find its run folder), so that the file is read once."""
    defaults = load_defaults()
    merged = {**defaults, **load_user_settings()}
    overrides = dict(overrides or {})
    if base:
        merged.update({k: v for k, v in base.items() if k in defaults})
    cfg_file = overrides.get("cfg") or (base or {}).get("cfg")
    if cfg_file:
        loaded = cfg_values if cfg_values is not None else load_cfg_file(cfg_file, defaults)
        merged.update(loaded)
    check_keys(overrides, defaults)
    merged.update(overrides)
    sources = [base or {}, loaded if cfg_file else {}, overrides]
    merged["close_mosaic"] = merged["no_aug_epochs"] = resolve_close_mosaic(sources, defaults["close_mosaic"])
    return check_pairs(_typed(merged, defaults))


def check_overrides(overrides: dict[str, Any]) -> None:
    """Each given key and value checked (ConfigError, one line, on the first wrong one) without resolving a run's
    settings: what `yolo-cb train resume=...` does before torch loads, since a resume's settings are the checkpoint's
    under these and are resolved once, by its plan (lr_scheduler= is checked there, against the settings it needs)."""
    defaults = load_defaults()
    check_keys(overrides, defaults)
    for key, value in overrides.items():
        if key == "cfg":
            load_cfg_file(value, defaults)
        elif key != "lr_scheduler":
            coerce(key, value, defaults.get(key))


def names_a_resume(value: Any) -> bool:
    """Whether a resume= value asks for a resume (a path, true, auto), read as the settings would read it."""
    return value is not None and coerce("resume", value) not in (None, False)


MODE_SETTINGS = {"augment": ("predict", "track", "val"), "single_cls": ("train", "val", "tune"), "persist": ("track",),
                 "embed": ("predict",)}  # switches only these modes read


def check_pairs(config: Config) -> Config:
    """Settings that need another one: unfreeze_epoch= and unfreeze_warmup= need freeze= (without frozen layers they
    would do nothing), and worst_source= needs worst_batches=;
    average_best=k averages the files save_topk keeps, so needs k >= 2 and save_topk >= k."""
    if config.unfreeze_epoch is not None and config.freeze is None:
        raise ConfigError(f"invalid value for 'unfreeze_epoch': {config.unfreeze_epoch}; nothing is frozen: set freeze= "
                          f"(a layer count or module names) as well, or leave unfreeze_epoch empty")
    defaults = load_defaults()
    warmup, default_warmup = config.unfreeze_warmup, defaults["unfreeze_warmup"]
    if config.freeze is None and warmup != default_warmup:
        raise ConfigError(f"invalid value for 'unfreeze_warmup': {warmup}; it is the warmup of layers that were frozen, and "
                          f"nothing is frozen: set freeze= as well, or leave unfreeze_warmup at {default_warmup}")
    if config.worst_source != defaults["worst_source"] and not config.worst_batches:
        raise ConfigError(f"invalid value for 'worst_source': {config.worst_source}; it says what worst_batches ranks, and "
                          f"worst_batches is 0 (off): set worst_batches=k as well")
    for key, modes in MODE_SETTINGS.items():
        if getattr(config, key) and config.mode not in modes:
            raise ConfigError(f"{key}={getattr(config, key)} is a {' / '.join(modes)} setting; {config.mode} does not read it (Ultralytics ignores it "
                              f"there): drop it" + (". Training's augmentation: mosaic=, fliplr=, scale=, hsv_h=, ..." if key == "augment" else ""))
    if config.mode == "track":
        require_trackers()  # before torch loads
    k = config.average_best
    if k and (k < 2 or config.save_topk < k):
        raise ConfigError(f"invalid value for 'average_best': {k}; it averages the best_epoch*.pt files save_topk keeps: give "
                          f"an integer >= 2 and save_topk >= {k} (save_topk is {config.save_topk}), or 0 for off")
    return config


EMPTY_CALLBACKS = (None, "", [], {}, False)  # callbacks= values that declare nothing


def _typed(merged: dict[str, Any], defaults: dict[str, Any]) -> Config:
    """Every setting typed and checked in file order; callbacks= read into declarations and checked once first (the
    run's callbacks are built from these), the recipe's declarations replacing the settings they declare
    (settings/declared.py); lr_scheduler= parsed once, checked against the settings before it (cos_lr, warmup_epochs),
    and its parsed form kept on the Config."""
    value = merged.get("callbacks")
    declared = check_callbacks(value) if value not in EMPTY_CALLBACKS else []
    folded = fold(declared)
    values: dict[str, Any] = {}
    schedule = None
    for key, value in {**merged, **folded.settings}.items():
        if key == "lr_scheduler":
            values[key] = _yaml_text(key, value)
            schedule = lr_settings.resolve(values[key], SimpleNamespace(**values))
        elif key == "callbacks":
            values[key] = value
        else:
            values[key] = coerce(key, value, defaults.get(key))
    config = Config(**values)
    lr_settings.parsed(config, schedule)
    object.__setattr__(config, "_declared", (config.callbacks, tuple(declared)))
    object.__setattr__(config, "_unfreeze_stages", folded.unfreeze_stages)
    return config


def callback_declarations(args: Any) -> list[Declaration]:
    """`args.callbacks` as the declarations read and checked when the settings were resolved (kept on the Config, so the
    setting is parsed once per run); read here only for settings that are no Config."""
    kept = getattr(args, "_declared", None)
    if kept is not None and kept[0] is args.callbacks:
        return list(kept[1])
    return check_callbacks(args.callbacks) if args.callbacks not in EMPTY_CALLBACKS else []


def save_config(cfg: Config, path: Path) -> None:
    """Write the resolved settings as YAML (args.yaml in each run dir)."""
    data = {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.as_dict().items()}
    atomic_write_text(Path(path), yaml.safe_dump(data, sort_keys=False))


def require_trackers() -> None:
    """The one-line refusal when the tracker package (the `track` extra) is not installed, found without importing it."""
    try:
        found = importlib.util.find_spec("trackers") is not None
    except ImportError:  # a finder that refuses the name
        found = False
    if not found:
        raise ConfigError("track needs the `trackers` package (BoT-SORT / ByteTrack), which is not installed: "
                          "pip install 'yolo-cb[track]'")
