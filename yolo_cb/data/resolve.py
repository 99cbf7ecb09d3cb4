"""Dataset YAML resolution: find the YAML, the dataset root and its splits; download or generate when absent.

A dataset YAML (Ultralytics-compatible)::

    path: coco8                # dataset root: absolute, or relative (to the working directory, next to the YAML, then datasets_dir)
    train: images/train        # folder(s) or .txt list(s), relative to path
    val: images/val            # several validation sets: a list of paths (named by stem) or {name: path}
    test:                      # optional
    names: {0: person, ...}    # or a list
    download: https://.../coco8.zip   # optional: archive fetched when the images are missing
    generate: {kind: shapes, seed: 0, train: 320, val: 100}  # optional: synthetic data made when missing

Each key is typed and checked where the file is read (yolo_cb/data/data_yaml.py: one line for a value out of its rule).
Downloads, extraction and generation write only under ``datasets_dir``: a root outside it (an absolute
``path:``, one that climbs out with ``..``, or the YAML's own folder when there is no ``path:``) is used
only when the images are already there; otherwise a DataError names the root and datasets_dir.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from yolo_cb.data.data_yaml import DatasetConfigError, DataYaml, GenerateSpec, Split, ValSets, check_category_ids, read_data_yaml
from yolo_cb.data.download import download_dataset, is_url
from yolo_cb.data.synthetic import estimated_bytes, generate_shapes
from yolo_cb.errors import DataError, short_repr
from yolo_cb.utils.files import existing, size_text
from yolo_cb.utils.log import printable
from yolo_cb.utils.paths import find_dataset_cfg

LOGGER = logging.getLogger("yolo_cb")

SPLIT_KEYS = ("train", "val", "test")


def resolve_datasets_dir(datasets_dir: str | os.PathLike | None = None) -> Path:
    """``datasets_dir`` if given, else ``$YOLO_CB_DATASETS``, else ``./datasets`` in the working directory."""
    chosen = datasets_dir or os.environ.get("YOLO_CB_DATASETS") or Path.cwd() / "datasets"
    setting = f"datasets_dir={datasets_dir}" if datasets_dir else "YOLO_CB_DATASETS" if os.environ.get("YOLO_CB_DATASETS") else "datasets_dir"
    try:
        return resolved(Path(chosen).expanduser(), setting)
    except RuntimeError:  # ~nosuchuser
        raise DatasetConfigError(f"{setting}: {short_repr(str(chosen))} starts with the home folder of no user on this machine; "
                                 f"write the folder out") from None


def resolved(path: Path, setting: str) -> Path:
    """``path.resolve()``, or a DatasetConfigError naming ``setting`` when it cannot be resolved (a symbolic link loop)."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as error:  # RuntimeError: Python < 3.13 on a symlink loop; OSError (ELOOP) after
        raise DatasetConfigError(f"{setting}: {path} cannot be resolved ({error}); a symbolic link in it points back at "
                                 f"itself: fix or remove the link") from None


def _split_paths(value: Split, root: Path, key: str, yaml_file: Path) -> list[str] | None:
    """A split's paths (typed by the reader: one path or a list) as absolute path strings, relative ones under `root`."""
    if value is None:
        return None
    items = value if isinstance(value, list) else [value]
    return [str(p if (p := Path(v).expanduser()).is_absolute() else resolved(root / p, f"{yaml_file}: '{key}: {short_repr(v)}'"))
            for v in items]


def _missing(data: DataYaml, root: Path) -> list[str]:
    """The train/val paths that do not exist under ``root``."""
    out = []
    for key in ("train", "val"):
        values = _val_sets(data.val).values() if key == "val" else [data.train]
        for value in values:
            out += [p for p in _split_paths(value, root, key, data.file) or [] if not Path(p).exists()]
    return out


def _val_sets(value: ValSets) -> dict[str, Split]:
    """`val:` as {name: split}: a mapping names several validation sets (each validated on its own, its metrics prefixed
    with its name), and so does a list of two or more paths, each set named by its path's stem (`list_set_names`); a
    path (or a list of one) is one set, "val". Unlike Ultralytics, which joins a list into one set: one combined set
    is one path, a .txt file listing the images of every folder."""
    if isinstance(value, list) and len(value) > 1:
        return dict(zip(list_set_names(value), value, strict=True))
    return dict(value) if isinstance(value, dict) else {"val": value}


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


def _generate(spec: GenerateSpec, target: Path, yaml_file: Path) -> None:
    """Make the synthetic set `spec` describes in `target`, once the disk has room for it (one line when it has not)."""
    need, free = estimated_bytes(spec.images(), spec.max_size), shutil.disk_usage(existing(target.parent)).free
    if need > free:
        raise DatasetConfigError(f"{printable(yaml_file)}: 'generate' asks for {spec.images():,} images, up to {size_text(need)}, and "
                                 f"{existing(target.parent)} has {size_text(free)} free; free some space, or ask for fewer images")
    LOGGER.info(f"{yaml_file.name}: generating the synthetic shapes dataset in {target}")
    generate_shapes(target, n_train=spec.train, n_val=spec.val, seed=spec.seed, min_size=spec.min_size,
                    max_size=spec.max_size, max_objects=spec.max_objects, jpeg_quality=spec.jpeg_quality)


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
        keys = ", ".join(printable(k)[:40] for k in read_data_yaml(Path(yaml_file)).written)
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

    spec = read_data_yaml(find_dataset_cfg(str(data)).resolve())
    ddir = resolve_datasets_dir(datasets_dir)
    places = _candidate_roots(spec, ddir)
    if spec.names is None and not _names_in_source(spec, places):
        raise names_missing(spec.file)
    root = next((p for p, _ in places if not _missing(spec, p)), None)
    failure = ""
    if root is None and download:
        root, failure = _fetch_missing(spec, places[-1][0], ddir)
    if root is None:
        looked = "\n".join(f"  {p}  ({why})" for p, why in places)
        wanted = ", ".join(f"{k}: {short_repr(getattr(spec, k))}" for k in ("train", "val"))
        raise FileNotFoundError(
            f"{spec.file}: dataset images not found ({wanted}). Looked for them under:\n{looked}{failure}\n"
            f"Fix: put the dataset in one of those folders, pass datasets_dir=... (or set YOLO_CB_DATASETS; now {ddir}), "
            f"or set 'path:' in {spec.file.name} to the dataset root."
        )
    return _resolved_dataset(spec, root, ddir)


def _source_names(data: dict, yaml_file: Path) -> tuple[dict[int, str], list[int] | None]:
    """The names of a data YAML without `names:`: its train COCO JSON's categories (in id order, and their ids, which
    predictions.json then writes), or the sorted class names of its train VOC split's annotations."""
    from yolo_cb.data.formats.cache import source_kind
    from yolo_cb.data.formats.coco import coco_names
    from yolo_cb.data.formats.voc import split_list, voc_class_names

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
    return DatasetConfigError(f"{yaml_file}: required key 'names' is missing or empty; add it, e.g. 'names: [cat, dog]' "
                              f"(only a COCO JSON or a VOC train split gives the names itself)")


def _names_in_source(spec: DataYaml, places: list[tuple[Path, str]]) -> bool:
    """Whether the train split, under one of the places the root may be, is a COCO JSON or a VOC split (which give names)."""
    from yolo_cb.data.formats.cache import source_kind

    return any(source_kind(p) for root, _ in places for p in _split_paths(spec.train, root, "train", spec.file) or [])


def _candidate_roots(spec: DataYaml, ddir: Path) -> list[tuple[Path, str]]:
    """Where the dataset root may be, each with why it is looked at, in the order Ultralytics looks."""
    raw_path, yaml_dir = spec.path, spec.file.parent
    if raw_path is None:
        places = [(yaml_dir, "the YAML's folder (no 'path:' key)")]
    elif Path(raw_path).expanduser().is_absolute():
        places = [(Path(raw_path).expanduser(), "'path:' in the YAML")]
    else:  # Ultralytics resolves a relative path: from the working directory; then next to the YAML, then datasets_dir
        places = [(Path.cwd() / raw_path, "relative to the working directory"), (yaml_dir / raw_path, "next to the YAML"),
                  (ddir / raw_path, "under datasets_dir")]
    setting = f"{spec.file}: 'path: {short_repr(raw_path)}'" if raw_path else f"{spec.file}: its folder"
    return [(resolved(p, setting), why) for p, why in places]


def _fetch_missing(spec: DataYaml, target: Path, ddir: Path) -> tuple[Path | None, str]:
    """(root, why not): download (``download:``) or generate (``generate:``) the dataset into `target`, inside datasets_dir."""
    if not (spec.download or spec.generate):
        return None, ""
    check_inside_datasets_dir(target, ddir, spec.file, "downloads" if spec.download else "generates")
    if spec.download:
        failure = _download_all(spec.download, target, spec.file)
        if failure:
            return None, failure
    else:
        _generate(spec.generate, target, spec.file)
    if not _missing(spec, target):
        return target, ""
    return None, (f"\nAfter {'downloading' if spec.download else 'generating'} into {target.parent}, these are still missing: "
                  f"{short_repr(_missing(spec, target), 300)}")


def _download_all(urls: tuple[str, ...], target: Path, yaml_file: Path) -> str:
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


def _resolved_dataset(spec: DataYaml, root: Path, ddir: Path) -> dict:
    """The data dict: yaml_file, path, the splits as absolute paths, names, nc, and category_ids when given.

    A split naming a COCO JSON or a VOC folder becomes the images folder of its YOLO copy under datasets_dir
    (data/formats/cache.py); without `names:` the train split's categories are the names."""
    from yolo_cb.data.formats.cache import materialise

    out = {"yaml_file": str(spec.file), "path": str(root)}
    names, category_ids = spec.names, None
    if names is None:
        names, category_ids = _source_names({"train": _split_paths(spec.train, root, "train", spec.file)}, spec.file)
        check_category_ids(spec, len(names))

    def split(value: Split, key: str):  # one path as a string, a list as a list of strings (as Ultralytics' data dict)
        paths = [materialise(p, key.split(":")[0], names, ddir) for p in _split_paths(value, root, key, spec.file) or []] or None
        return paths[0] if paths and not isinstance(value, list) else paths

    out["train"] = split(spec.train, "train")
    val_sets = {name: split(value, f"val: {name}") for name, value in _val_sets(spec.val).items()}
    out["val"], out["test"] = next(iter(val_sets.values())), split(spec.test, "test")  # val: the first set
    out["val_sets"] = val_sets
    out["val_named"] = isinstance(spec.val, dict)  # a {name: path} mapping (fingerprints of version 1 counted its first set)
    out["names"], out["nc"] = names, len(names)
    if spec.category_ids is not None or category_ids is not None:
        out["category_ids"] = list(spec.category_ids) if spec.category_ids is not None else category_ids
    return out


def require_local(data: str, datasets_dir: str | None, recorded_in: str) -> None:
    """DataError, one line, when the dataset a file records (a checkpoint's data=) is not on this machine: a setting read
    from a file never starts a download (a checkpoint's data=coco8.yaml made val create ./datasets and fetch it)."""
    if not read_data_yaml(find_dataset_cfg(str(data)).resolve()).download:
        return  # nothing it could fetch (a synthetic set is generated locally, as for any run)
    try:
        check_data(data, datasets_dir, download=False)
    except FileNotFoundError:
        raise DataError(f"{recorded_in} records data={data}, which is not on this machine, and a setting read from a file never "
                        f"starts a download: pass data= (data={data} fetches it when its YAML says how)") from None
