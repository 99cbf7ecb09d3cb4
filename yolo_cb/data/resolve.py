"""Dataset YAML resolution: find the YAML, the dataset root and its splits; download or generate when absent.

A dataset YAML (Ultralytics-compatible)::

    path: coco8                # dataset root: absolute, or relative (to the working directory, next to the YAML, then datasets_dir)
    train: images/train        # folder(s) or .txt list(s), relative to path
    val: images/val            # several validation sets: a list of paths (named by stem) or {name: path}
    test:                      # optional
    names: {0: person, ...}    # or a list; left out: `nc: 4` names them class_0 ... class_3 (as Ultralytics)
    download: https://.../coco8.zip   # optional: archive fetched when the images are missing
    generate: {kind: shapes, seed: 0, train: 320, val: 100}  # optional: synthetic data made when missing

Downloads, extraction and generation write only under ``datasets_dir``: a root outside it (an absolute
``path:``, one that climbs out with ``..``, or the YAML's own folder when there is no ``path:``) is used
only when the images are already there; otherwise a DataError names the root and datasets_dir.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from yolo_cb.data.download import download_dataset, is_url
from yolo_cb.data.formats.cache import materialise, source_kind
from yolo_cb.data.formats.coco import coco_names
from yolo_cb.data.formats.voc import split_list, voc_class_names
from yolo_cb.data.synthetic import generate_shapes
from yolo_cb.errors import DataError, short_repr
from yolo_cb.utils.paths import find_dataset_cfg
from yolo_cb.utils.yaml_safe import load_yaml

LOGGER = logging.getLogger("yolo_cb")

SPLIT_KEYS = ("train", "val", "test")


class DatasetConfigError(DataError):
    """A dataset YAML that is missing a key or has a value of the wrong kind."""


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


def _class_id(key) -> int | None:
    """A names key as a class id: an int, or text or a float that is exactly an integer (never 1.5 -> 1, never a bool)."""
    if isinstance(key, bool):
        return None
    if isinstance(key, int):
        return key
    if isinstance(key, float):
        return int(key) if key.is_integer() else None
    if isinstance(key, str) and key.strip().lstrip("-").isdigit():
        return int(key)
    return None


def parse_names(raw, yaml_file: Path) -> dict[int, str]:
    """``names`` as a list or a {id: name} dict -> {0: name, 1: name, ...} (ids must be 0..nc-1)."""
    if isinstance(raw, (list, tuple)):
        names = {i: str(n) for i, n in enumerate(raw)}
    elif isinstance(raw, dict):
        bad = [k for k in raw if _class_id(k) is None]
        if bad:
            raise DatasetConfigError(f"{yaml_file}: 'names' keys must be integer class ids (0, 1, ...), got {short_repr(bad[0])}; "
                                     f"number the classes 0..{len(raw) - 1}")
        names = {_class_id(k): str(v) for k, v in raw.items()}
    else:
        raise DatasetConfigError(f"{yaml_file}: 'names' must be a list or an {{id: name}} mapping, got {type(raw).__name__}")
    if not names:
        raise DatasetConfigError(f"{yaml_file}: 'names' is empty; list the class names")
    if sorted(names) != list(range(len(names))):
        raise DatasetConfigError(f"{yaml_file}: 'names' ids must be 0..{len(names) - 1} without gaps, got {sorted(names)}; "
                                 f"number the classes 0..{len(names) - 1} (and the class ids in the label files with them)")
    return dict(sorted(names.items()))


def _split_paths(value, root: Path, key: str, yaml_file: Path) -> list[str] | None:
    if value is None or value == "":
        return None
    items = value if isinstance(value, (list, tuple)) else [value]
    if not all(isinstance(v, (str, os.PathLike)) for v in items):
        raise DatasetConfigError(f"{yaml_file}: '{key}' must be a path or a list of paths, got {short_repr(value)}")
    return [str(p if (p := Path(v).expanduser()).is_absolute() else resolved(root / p, f"{yaml_file}: '{key}: {v}'")) for v in items]


def _missing(cfg: dict, root: Path, yaml_file: Path) -> list[str]:
    """The train/val paths that do not exist under ``root``."""
    out = []
    for key in ("train", "val"):
        values = _val_sets(cfg, yaml_file).values() if key == "val" else [cfg.get(key)]
        for value in values:
            out += [p for p in _split_paths(value, root, key, yaml_file) or [] if not Path(p).exists()]
    return out


def _val_sets(cfg: dict, yaml_file: Path) -> dict[str, Any]:
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


def _generate(spec, target: Path, yaml_file: Path) -> None:
    spec = {"kind": spec} if isinstance(spec, str) else dict(spec)
    kind = spec.pop("kind", "shapes")
    if kind != "shapes":
        raise DatasetConfigError(f"{yaml_file}: 'generate' kind '{kind}' is unknown (known: shapes)")
    n_train, n_val = int(spec.pop("train", 320)), int(spec.pop("val", 100))
    LOGGER.info(f"{yaml_file.name}: generating the synthetic shapes dataset in {target}")
    generate_shapes(target, n_train=n_train, n_val=n_val, **spec)


def check_inside_datasets_dir(target: Path, ddir: Path, yaml_file: Path, action: str) -> None:
    """Refuse to download, extract or generate anywhere but under datasets_dir (the extraction folder is target's parent)."""
    if target.parent == ddir or ddir in target.parent.parents:
        return
    raise DataError(
        f"{yaml_file}: the dataset root {target} is outside datasets_dir ({ddir}) and its images are missing; yolo-cb "
        f"{action} datasets only into datasets_dir. Put the images under {target} yourself, or give a relative 'path:' "
        f"(e.g. 'path: {target.name}') so that it is {'downloaded' if action == 'downloads' else 'generated'} into "
        f"{ddir / target.name}, or pass datasets_dir= a folder that holds {target}")


def missing_split_error(yaml_file: str | Path, split: str) -> DatasetConfigError:
    """The error for split=<split> when the data YAML gives no such split: it names the YAML and the keys it has."""
    try:
        keys = ", ".join(str(k) for k in (load_yaml(yaml_file, DatasetConfigError, "dataset YAML") or {}))
    except DataError:
        keys = "?"
    return DatasetConfigError(f"split={split}: the dataset YAML {yaml_file} has no '{split}' split (its keys: {keys}); add a "
                              f"'{split}:' key (an images folder, a .txt list or a list of those) or choose a split it has "
                              f"(split=val|test|train)")


SINGLE_CLASS_NAMES = {0: "item"}  # single_cls=True: every class is this one, as Ultralytics names it


def single_class(data: dict) -> dict:
    """The dataset dict of a single_cls=True run (as Ultralytics): one class, 'item'; `label_names` keeps the YAML's names,
    by which the label files are still checked (a class id beyond them is an error as without single_cls)."""
    return {**data, "names": dict(SINGLE_CLASS_NAMES), "nc": 1, "label_names": data.get("label_names", data["names"])}


def check_data(data: str | os.PathLike, datasets_dir: str | None = None, download: bool = True) -> dict:
    """Resolve a dataset YAML (path or bundled name) into absolute split paths, names and nc.

    Returns ``yaml_file``, ``path`` (root), ``train``/``val``/``test`` (an absolute path string, a list of them
    when the YAML lists several, or None), ``names`` ({id: name}), ``nc``, and ``category_ids`` when the YAML has one. Downloads
    (``download:``) or generates (``generate:``) missing data unless `download` is False; otherwise raises
    FileNotFoundError listing every place looked.
    """

    yaml_file = find_dataset_cfg(str(data)).resolve()
    cfg, names = _read_dataset_yaml(yaml_file)
    ddir = resolve_datasets_dir(datasets_dir)
    places = _candidate_roots(cfg, yaml_file, ddir)
    if names is None and not _names_in_source(cfg, places, yaml_file):
        names = numbered_names(cfg, yaml_file)
    root = next((p for p, _ in places if not _missing(cfg, p, yaml_file)), None)
    failure = ""
    if root is None and download:
        root, failure = _fetch_missing(cfg, places[-1][0], ddir, yaml_file)
    if root is None:
        looked = "\n".join(f"  {p}  ({why})" for p, why in places)
        wanted = ", ".join(f"{k}: {cfg[k]}" for k in ("train", "val"))
        raise FileNotFoundError(
            f"{yaml_file}: dataset images not found ({wanted}). Looked for them under:\n{looked}{failure}\n"
            f"Fix: put the dataset in one of those folders, pass datasets_dir=... (or set YOLO_CB_DATASETS; now {ddir}), "
            f"or set 'path:' in {yaml_file.name} to the dataset root."
        )
    return _resolved_dataset(cfg, names, root, yaml_file, ddir)


def _source_names(data: dict, yaml_file: Path) -> tuple[dict[int, str], list[int] | None]:
    """The names of a data YAML without `names:`: its train COCO JSON's categories (in id order, and their ids, which
    predictions.json then writes), or the sorted class names of its train VOC split's annotations."""
    train = data["train"][0] if isinstance(data["train"], list) else data["train"]
    kind = source_kind(train)
    if kind == "coco":
        return coco_names(Path(train))
    if kind == "voc":
        listed = split_list(Path(train), "train")
        found = voc_class_names(listed.parents[2], listed)
        if found:
            LOGGER.info(f"{yaml_file.name}: no names given; the classes of {listed} are {found}")
            return dict(enumerate(found)), None
    raise names_missing(yaml_file)


def names_missing(yaml_file: Path) -> DatasetConfigError:
    return DatasetConfigError(f"{yaml_file}: required key 'names' is missing or empty; add it, e.g. 'names: [cat, dog]', or "
                              f"give the number of classes, e.g. 'nc: 2' (named class_0, class_1); only a COCO JSON or a VOC "
                              f"train split gives the names itself")


def _nc(cfg: dict, yaml_file: Path) -> int | None:
    """The YAML's `nc:` (the number of classes) as a positive integer; None when not given."""
    raw = cfg.get("nc")
    if raw is None:
        return None
    nc = _class_id(raw)
    if nc is None or nc < 1:
        raise DatasetConfigError(f"{yaml_file}: 'nc' must be the number of classes (a whole number of 1 or more), got {short_repr(raw)}")
    return nc


def numbered_names(cfg: dict, yaml_file: Path) -> dict[int, str]:
    """The names of a YAML with `nc:` and no `names:`: class_0 ... class_{nc-1}, as Ultralytics names them (said in
    one line); without `nc:` either, the names_missing error."""
    nc = _nc(cfg, yaml_file)
    if nc is None:
        raise names_missing(yaml_file)
    LOGGER.info(f"{yaml_file.name}: no 'names', 'nc: {nc}': the classes are named class_0 ... class_{nc - 1} (as Ultralytics "
                f"names them); add 'names:' to name them")
    return {i: f"class_{i}" for i in range(nc)}


def _names_in_source(cfg: dict, places: list[tuple[Path, str]], yaml_file: Path) -> bool:
    """Whether the train split, under one of the places the root may be, is a COCO JSON or a VOC split (which give names)."""
    return any(source_kind(p) for root, _ in places for p in _split_paths(cfg.get("train"), root, "train", yaml_file) or [])


def _read_dataset_yaml(yaml_file: Path) -> tuple[dict, dict[int, str] | None]:
    """The YAML's mapping and its names, with the required keys checked (one line naming the key and an example)."""
    cfg = load_yaml(yaml_file, DatasetConfigError, "dataset YAML")
    if not isinstance(cfg, dict):
        raise DatasetConfigError(f"{yaml_file}: expected a mapping with train/val/names keys")
    for key in ("train", "val", "names"):
        if key == "names" and cfg.get(key) in (None, "", [], {}):
            return cfg, None  # a COCO JSON / VOC train split gives them once the root is known, else the error is raised then
        if cfg.get(key) in (None, "", [], {}):
            example = {"train": "images/train", "val": "images/val", "names": "[cat, dog]"}[key]
            raise DatasetConfigError(f"{yaml_file}: required key '{key}' is missing or empty; add it, e.g. '{key}: {example}'")
    names = parse_names(cfg["names"], yaml_file)
    if _nc(cfg, yaml_file) not in (None, len(names)):
        raise DatasetConfigError(f"{yaml_file}: 'nc' is {cfg['nc']} but 'names' has {len(names)} entries")
    return cfg, names


def _candidate_roots(cfg: dict, yaml_file: Path, ddir: Path) -> list[tuple[Path, str]]:
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


def _fetch_missing(cfg: dict, target: Path, ddir: Path, yaml_file: Path) -> tuple[Path | None, str]:
    """(root, why not): download (``download:``) or generate (``generate:``) the dataset into `target`, inside datasets_dir."""
    downloads = cfg.get("download")
    downloads = [downloads] if isinstance(downloads, str) else list(downloads or [])
    if not (downloads or cfg.get("generate")):
        return None, ""
    check_inside_datasets_dir(target, ddir, yaml_file, "downloads" if downloads else "generates")
    if downloads:
        failure = _download_all(downloads, target, yaml_file)
        if failure:
            return None, failure
    else:
        _generate(cfg["generate"], target, yaml_file)
    if not _missing(cfg, target, yaml_file):
        return target, ""
    return None, (f"\nAfter {'downloading' if downloads else 'generating'} into {target.parent}, these are still missing: "
                  f"{_missing(cfg, target, yaml_file)}")


def _download_all(urls: list, target: Path, yaml_file: Path) -> str:
    """Download each archive into target's folder; '' or the first failure (an unsafe archive raises DataError)."""

    for url in urls:
        if not is_url(url):
            raise DatasetConfigError(f"{yaml_file}: 'download' must be an http(s) URL of a zip/tar archive, got {short_repr(url)}")
        try:
            download_dataset(url, target.parent, only=target.name)  # into the dataset's folder, never a sibling's
        except DataError as e:  # an unsafe or unusable archive: refused, whatever else is missing
            raise DataError(f"{yaml_file}: the download from {url} was refused: {e}") from None
        except (OSError, ValueError) as e:
            return f"\nThe download from {url} failed: {e}"
    return ""


def _resolved_dataset(cfg: dict, names: dict[int, str] | None, root: Path, yaml_file: Path, ddir: Path) -> dict:
    """The data dict: yaml_file, path, the splits as absolute paths, names, nc, and category_ids when given.

    A split naming a COCO JSON or a VOC folder becomes the images folder of its YOLO copy under datasets_dir
    (data/formats/cache.py); without `names:` the train split's categories are the names. A COCO JSON inside the root
    that `path:` gives has that root as its dataset root (coco.coco_root); without `path:` its own."""
    out = {"yaml_file": str(yaml_file), "path": str(root)}
    given_root = root if cfg.get("path") not in (None, "") else None  # never the YAML's folder: it may be a home folder
    category_ids = None
    if names is None:
        names, category_ids = _source_names({"train": _split_paths(cfg.get("train"), root, "train", yaml_file)}, yaml_file)
        if _nc(cfg, yaml_file) not in (None, len(names)):
            raise DatasetConfigError(f"{yaml_file}: 'nc' is {cfg['nc']} but the train split's annotations give {len(names)} "
                                     f"classes; correct nc or leave it out")

    def split(value, key):  # one path as a string, a list as a list of strings (as Ultralytics' data dict)
        paths = [materialise(p, key.split(":")[0], names, ddir, given_root) for p in _split_paths(value, root, key, yaml_file) or []] or None
        return paths[0] if paths and not isinstance(value, (list, tuple)) else paths

    for key in SPLIT_KEYS:
        out[key] = split(cfg.get(key), key) if key != "val" else None
    out["val_sets"] = {name: split(value, f"val: {name}") for name, value in _val_sets(cfg, yaml_file).items()}
    out["val"] = next(iter(out["val_sets"].values()))  # the first set: what a single-set reader of data["val"] gets
    out["val_named"] = isinstance(cfg.get("val"), dict)  # a {name: path} mapping (fingerprints of version 1 counted its first set)
    out["names"], out["nc"] = names, len(names)
    if cfg.get("category_ids") is not None:
        ids = cfg["category_ids"]
        if not isinstance(ids, (list, tuple)) or len(ids) != len(names):
            raise DatasetConfigError(f"{yaml_file}: 'category_ids' must be a list of {len(names)} ids (one per name)")
        out["category_ids"] = [int(i) for i in ids]
    elif category_ids is not None:
        out["category_ids"] = category_ids
    return out


def require_local(data: str, datasets_dir: str | None, recorded_in: str) -> None:
    """DataError, one line, when the dataset a file records (a checkpoint's data=) is not on this machine: a setting read
    from a file never starts a download (a checkpoint's data=coco8.yaml made val create ./datasets and fetch it)."""
    cfg, _ = _read_dataset_yaml(find_dataset_cfg(str(data)).resolve())
    if not cfg.get("download"):
        return  # nothing it could fetch (a synthetic set is generated locally, as for any run)
    try:
        check_data(data, datasets_dir, download=False)
    except FileNotFoundError:
        raise DataError(f"{recorded_in} records data={data}, which is not on this machine, and a setting read from a file never "
                        f"starts a download: pass data= (data={data} fetches it when its YAML says how)") from None
