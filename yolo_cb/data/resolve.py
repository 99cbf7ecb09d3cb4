"""Dataset YAML resolution: find the YAML, the dataset root and its splits; download or generate when absent.

The YAML's form (its keys, names, splits) is read and checked by yolo_cb/data/dataset_yaml.py, without looking for
images; here the root is found among the places it may be, and the images are downloaded (``download:``) or generated
(``generate:``) when they are missing.

Downloads, extraction and generation write only under ``datasets_dir``: a root outside it (an absolute
``path:``, one that climbs out with ``..``, or the YAML's own folder when there is no ``path:``) is used
only when the images are already there; otherwise a DataError names the root and datasets_dir.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from yolo_cb.data.data_yaml import GenerateSpec, check_category_ids, read_data_yaml
from yolo_cb.data.dataset_yaml import (
    SPLIT_KEYS,
    DatasetConfigError,
    DatasetYaml,
    category_ids,
    names_missing,
    read_dataset,
    split_paths,
    val_sets,
)
from yolo_cb.data.download import download_dataset, is_url
from yolo_cb.data.formats.cache import materialise, source_kind
from yolo_cb.data.formats.coco import coco_names
from yolo_cb.data.formats.voc import split_list, voc_class_names
from yolo_cb.data.synthetic import estimated_bytes, generate_shapes
from yolo_cb.errors import DataError, short_repr
from yolo_cb.utils.files import existing, size_text
from yolo_cb.utils.log import printable
from yolo_cb.utils.paths import find_dataset_cfg

LOGGER = logging.getLogger("yolo_cb")


def _missing(cfg: dict, root: Path, yaml_file: Path) -> list[str]:
    """The train/val paths that do not exist under ``root``."""
    out = []
    for key in ("train", "val"):
        values = val_sets(cfg, yaml_file).values() if key == "val" else [cfg.get(key)]
        for value in values:
            out += [p for p in split_paths(value, root, key, yaml_file) or [] if not Path(p).exists()]
    return out


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

    found = read_dataset(data, datasets_dir)  # every refusal the YAML itself decides, before any image is looked for
    cfg, yaml_file = found.cfg, found.yaml_file
    root = next((p for p, _ in found.places if not _missing(cfg, p, yaml_file)), None)
    failure = ""
    if root is None and download:
        root, failure = _fetch_missing(found, found.places[-1][0])
    if root is None:
        raise images_not_found(found, failure)
    return _resolved_dataset(found, root)


def images_not_found(found: DatasetYaml, failure: str) -> FileNotFoundError:
    """The error for a dataset whose images are in none of the places its root may be (`failure`: why a download or the
    generation did not bring them)."""
    looked = "\n".join(f"  {p}  ({why})" for p, why in found.places)
    wanted = ", ".join(f"{k}: {short_repr(found.cfg[k])}" for k in ("train", "val"))
    return FileNotFoundError(
        f"{found.yaml_file}: dataset images not found ({wanted}). Looked for them under:\n{looked}{failure}\n"
        f"Fix: put the dataset in one of those folders, pass datasets_dir=... (or set YOLO_CB_DATASETS; now {found.ddir}), "
        f"or set 'path:' in {found.yaml_file.name} to the dataset root."
    )


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


def _fetch_missing(found: DatasetYaml, target: Path) -> tuple[Path | None, str]:
    """(root, why not): download (``download:``) or generate (``generate:``) the dataset into `target`, inside datasets_dir."""
    spec, yaml_file = found.typed, found.yaml_file
    if not (spec.download or spec.generate):
        return None, ""
    check_inside_datasets_dir(target, found.ddir, yaml_file, "downloads" if spec.download else "generates")
    if spec.download:
        failure = _download_all(spec.download, target, yaml_file)
        if failure:
            return None, failure
    else:
        _generate(spec.generate, target, yaml_file)
    if not _missing(found.cfg, target, yaml_file):
        return target, ""
    return None, (f"\nAfter {'downloading' if spec.download else 'generating'} into {target.parent}, these are still missing: "
                  f"{short_repr(_missing(found.cfg, target, yaml_file), 300)}")


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


def _resolved_dataset(found: DatasetYaml, root: Path) -> dict:
    """The data dict: yaml_file, path, the splits as absolute paths, names, nc, and category_ids when given.

    A split naming a COCO JSON or a VOC folder becomes the images folder of its YOLO copy under datasets_dir
    (data/formats/cache.py); without `names:` the train split's categories are the names. A COCO JSON inside the root
    that `path:` gives has that root as its dataset root (coco.coco_root); without `path:` its own."""
    cfg, names, yaml_file, ddir = found.cfg, found.names, found.yaml_file, found.ddir
    out = {"yaml_file": str(yaml_file), "path": str(root)}
    given_root = root if cfg.get("path") not in (None, "") else None  # never the YAML's folder: it may be a home folder
    source_ids = None
    if names is None:
        names, source_ids = _source_names({"train": split_paths(cfg.get("train"), root, "train", yaml_file)}, yaml_file)
        check_category_ids(found.typed, len(names))
        if found.typed.nc not in (None, len(names)):
            raise DatasetConfigError(f"{yaml_file}: 'nc' is {cfg['nc']} but the train split's annotations give {len(names)} "
                                     f"classes; correct nc or leave it out")

    def split(value, key):  # one path as a string, a list as a list of strings (as Ultralytics' data dict)
        paths = [materialise(p, key.split(":")[0], names, ddir, given_root) for p in split_paths(value, root, key, yaml_file) or []] or None
        return paths[0] if paths and not isinstance(value, (list, tuple)) else paths

    for key in SPLIT_KEYS:
        out[key] = split(cfg.get(key), key) if key != "val" else None
    out["val_sets"] = {name: split(value, f"val: {name}") for name, value in val_sets(cfg, yaml_file).items()}
    out["val"] = next(iter(out["val_sets"].values()))  # the first set: what a single-set reader of data["val"] gets
    out["val_named"] = isinstance(cfg.get("val"), dict)  # a {name: path} mapping (fingerprints of version 1 counted its first set)
    out["names"], out["nc"] = names, len(names)
    ids = category_ids(found.typed)
    if ids is not None or source_ids is not None:
        out["category_ids"] = ids if ids is not None else source_ids
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
