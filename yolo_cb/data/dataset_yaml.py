"""A dataset YAML read and checked without looking for its images: what the file alone decides.

A dataset YAML (Ultralytics-compatible)::

    path: coco8                # dataset root: absolute, or relative (to the working directory, next to the YAML, then datasets_dir)
    train: images/train        # folder(s) or .txt list(s), relative to path
    val: images/val            # several validation sets: a list of paths (named by stem) or {name: path}
    test:                      # optional
    names: {0: person, ...}    # or a list; left out: `nc: 4` names them class_0 ... class_3 (as Ultralytics)
    download: https://.../coco8.zip   # optional: archive fetched when the images are missing
    generate: {kind: shapes, seed: 0, train: 320, val: 100}  # optional: synthetic data made when missing

`read_dataset` finds the YAML (a path or a bundled name), parses it, checks its required keys, `names`, `nc`,
`category_ids` and the form of its splits, and lists the places its root may be: every refusal `resolve.check_data`
makes before it looks for, downloads or generates images. It imports neither OpenCV nor torch (numpy it does, through
data/synthetic.py and data/verify.py), and writes and fetches nothing, so the CLI calls it before those load.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from yolo_cb.data.data_yaml import DatasetConfigError, DataYaml, read_data_yaml
from yolo_cb.data.formats.cache import source_kind
from yolo_cb.errors import short_repr
from yolo_cb.utils.paths import find_dataset_cfg

SPLIT_KEYS = ("train", "val", "test")


@dataclass(frozen=True)
class DatasetYaml:
    """A dataset YAML as read: its absolute path, its mapping, its names (None: the train split's COCO JSON or VOC
    annotations give them), datasets_dir resolved, and where its root may be, each with why it is looked at."""

    yaml_file: Path
    cfg: dict
    names: dict[int, str] | None
    ddir: Path
    places: list[tuple[Path, str]]
    typed: DataYaml  # every key typed by its rule (data/data_yaml.py): generate's spec, download's URLs


def read_dataset(data: str | os.PathLike, datasets_dir: str | os.PathLike | None = None) -> DatasetYaml:
    """The dataset YAML `data` (a path or a bundled name) read and checked; FileNotFoundError when there is no such
    file, DatasetConfigError (one line naming the file and the key) for anything in it that check_data would refuse."""
    yaml_file = find_dataset_cfg(str(data)).resolve()
    typed = read_data_yaml(yaml_file)  # each key checked by its rule: one line for a value out of it
    cfg, names = typed.raw, typed.names
    ddir = resolve_datasets_dir(datasets_dir)
    places = candidate_roots(cfg, yaml_file, ddir)
    if names is None and not names_in_source(cfg, places, yaml_file):
        names = numbered_names(typed)
    return DatasetYaml(yaml_file, cfg, names, ddir, places, typed)


def resolve_datasets_dir(datasets_dir: str | os.PathLike | None = None) -> Path:
    """``datasets_dir`` if given, else ``$YOLO_CB_DATASETS``, else ``./datasets`` in the working directory."""
    chosen = datasets_dir or os.environ.get("YOLO_CB_DATASETS") or Path.cwd() / "datasets"
    setting = f"datasets_dir={datasets_dir}" if datasets_dir else "YOLO_CB_DATASETS" if os.environ.get("YOLO_CB_DATASETS") else "datasets_dir"
    return resolved(Path(chosen).expanduser(), setting)


def resolved(path: Path, setting: str) -> Path:
    """``path.resolve()``, or a DatasetConfigError naming ``setting`` when it cannot be resolved (a symbolic link loop)."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as error:  # RuntimeError: Python < 3.13 on a symlink loop; OSError (ELOOP) after
        raise DatasetConfigError(f"{setting}: {path} cannot be resolved ({error}); a symbolic link in it points back at "
                                 f"itself: fix or remove the link") from None


def split_items(value, key: str, yaml_file: Path) -> list | None:
    """A split's value as a list of paths (None when empty); DatasetConfigError when it is neither a path nor a list of them."""
    if value is None or value == "":
        return None
    items = value if isinstance(value, (list, tuple)) else [value]
    if not all(isinstance(v, (str, os.PathLike)) for v in items):
        raise DatasetConfigError(f"{yaml_file}: '{key}' must be a path or a list of paths, got {short_repr(value)}")
    return list(items)


def split_paths(value, root: Path, key: str, yaml_file: Path) -> list[str] | None:
    """A split's paths as absolute path strings, relative ones under `root` (None when the split is empty)."""
    items = split_items(value, key, yaml_file)
    if items is None:
        return None
    return [str(p if (p := Path(v).expanduser()).is_absolute() else resolved(root / p, f"{yaml_file}: '{key}: {v}'")) for v in items]


def val_sets(cfg: dict, yaml_file: Path) -> dict[str, Any]:
    """`val:` as {name: split}: a mapping names several validation sets (each validated on its own, its metrics prefixed
    with its name), and so does a list of two or more paths, each set named by its path's stem (`list_set_names`); a
    path (or a list of one) is one set, "val". Unlike Ultralytics, which joins a list into one set: one combined set
    is one path, a .txt file listing the images of every folder."""
    value = cfg.get("val")
    if isinstance(value, (list, tuple)) and len(value) > 1:
        return dict(zip(list_set_names(value), value, strict=True))
    if not isinstance(value, dict):
        return {"val": value}
    bad = [k for k in value if not isinstance(k, str) or not k or "/" in k]
    if not value or bad:
        raise DatasetConfigError(f"{yaml_file}: 'val' as a mapping names validation sets {{name: path}}; "
                                 f"{'it is empty' if not value else f'{bad[0]!r} is not a name (text without /)'}")
    return dict(value)


def list_set_names(paths: list | tuple) -> list[str]:
    """The name of each set of a `val:` list: its path's stem (images/val_day -> val_day, night.txt -> night); a stem
    met before gets _2, _3, ... in list order (a/val, b/val -> val, val_2)."""
    names: list[str] = []
    for path in paths:
        stem = Path(str(path)).stem or "val"
        name, n = stem, 1
        while name in names:
            n += 1
            name = f"{stem}_{n}"
        names.append(name)
    return names


def names_missing(yaml_file: Path) -> DatasetConfigError:
    return DatasetConfigError(f"{yaml_file}: required key 'names' is missing or empty; add it, e.g. 'names: [cat, dog]', or "
                              f"give the number of classes, e.g. 'nc: 2' (named class_0, class_1); only a COCO JSON or a VOC "
                              f"train split gives the names itself")


def numbered_names(typed: DataYaml) -> dict[int, str]:
    """The names of a YAML with `nc:` and no `names:`: class_0 ... class_{nc-1}, as Ultralytics names them (said in
    one line); without `nc:` either, the names_missing error."""
    if typed.nc is None:
        raise names_missing(typed.file)
    logging.getLogger("yolo_cb").info(f"{typed.file.name}: no 'names', 'nc: {typed.nc}': the classes are named class_0 ... "
                                      f"class_{typed.nc - 1} (as Ultralytics names them); add 'names:' to name them")
    return {i: f"class_{i}" for i in range(typed.nc)}


def names_in_source(cfg: dict, places: list[tuple[Path, str]], yaml_file: Path) -> bool:
    """Whether the train split, under one of the places the root may be, is a COCO JSON or a VOC split (which give names)."""
    return any(source_kind(p) for root, _ in places for p in split_paths(cfg.get("train"), root, "train", yaml_file) or [])


def category_ids(typed: DataYaml) -> list[int] | None:
    """The YAML's `category_ids` (one COCO id per name, counted by the typed reader), or None when it has none."""
    return None if typed.category_ids is None else list(typed.category_ids)


def candidate_roots(cfg: dict, yaml_file: Path, ddir: Path) -> list[tuple[Path, str]]:
    """Where the dataset root may be, each with why it is looked at, in the order Ultralytics looks."""
    raw_path = cfg.get("path")
    yaml_dir = yaml_file.parent
    if raw_path in (None, ""):
        places = [(yaml_dir, "the YAML's folder (no 'path:' key)")]
    elif Path(str(raw_path)).expanduser().is_absolute():
        places = [(Path(str(raw_path)).expanduser(), "'path:' in the YAML")]
    else:  # Ultralytics resolves a relative path: from the working directory; then next to the YAML, then datasets_dir
        places = [(Path.cwd() / str(raw_path), "relative to the working directory"), (yaml_dir / str(raw_path), "next to the YAML"),
                  (ddir / str(raw_path), "under datasets_dir")]
    return [(resolved(p, f"{yaml_file}: 'path: {raw_path}'" if raw_path else f"{yaml_file}: its folder"), why) for p, why in places]
