"""`yolo-cb convert source=... format=coco|voc|labelme|labelstudio out=...`: an export as a YOLO dataset.

``out/images/<split>/`` (links to the source images; copies where links cannot be made), ``out/labels/<split>/``
(YOLO txt, an empty file for a background) and ``out/data.yaml`` (no ``path:``: the dataset is the YAML's folder).
Every split is read first; bad input raises a DataError naming the file and the entry before anything is written.
The dataset is written under a temp name beside ``out`` and renamed into place, so ``out`` is whole or absent.

Splits: COCO, every ``*.json`` in the source folder and its subfolders (less a ``<kind>_<split>.json`` beside that
split's ``instances_<split>.json``: COCO 2017's captions and keypoints, said), or the one JSON given, each named by
``coco.split_name`` (its stem less ``instances_``; Roboflow's ``<split>/_annotations.coco.json``, its folder); each
JSON's images are looked for as coco.py says, inside its root (``coco.coco_root``); VOC, every
``ImageSets/Main/<split>.txt`` (class lists ``<class>_<split>.txt`` left out); LabelMe and Label Studio have none: one split, ``train``, which data.yaml also names as ``val`` (said).
Classes: ``names=`` (a comma list) when given, else the first split's (COCO: its categories; the others: every
label met, sorted); the other splits are matched to them by name.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path

from yolo_cb.data.formats.coco import read_coco, split_name
from yolo_cb.data.formats.common import Split, new_temp_folder, summary, write_split
from yolo_cb.data.formats.labelme import read_labelme, read_labelstudio
from yolo_cb.data.formats.voc import is_voc_folder, read_voc
from yolo_cb.errors import DataError
from yolo_cb.utils.files import atomic_write_text, write_error
from yolo_cb.utils.log import printable

LOGGER = logging.getLogger("yolo_cb")
FORMATS = ("coco", "voc", "labelme", "labelstudio")
TRAIN_WORDS, VAL_WORDS = ("train", "trainval"), ("val", "test")


def _coco_files(source: Path) -> list[Path]:
    if source.is_file():
        return [source]
    found = sorted(p for p in source.rglob("*.json") if p.is_file())
    if not found:
        raise DataError(f"source={source}: no COCO *.json in it or its subfolders")
    other_kinds = [f for f in found if _beside_instances(f)]
    if other_kinds:
        LOGGER.info(f"source={source}: left out, as another kind of annotation of a split whose instances_*.json (boxes) "
                    f"is converted: {', '.join(printable(f.name) for f in other_kinds)}")
        found = [f for f in found if f not in other_kinds]
    stems = [split_name(f) for f in found]
    twice = next((s for s in stems if stems.count(s) > 1), None)
    if twice:
        raise DataError(f"source={source}: two JSON files would be the split {twice!r}: "
                        f"{', '.join(str(f) for f, s in zip(found, stems, strict=True) if s == twice)}; convert each on its own")
    return found


def _beside_instances(path: Path) -> bool:
    """Whether `path` is another kind of annotation of a split beside that split's instances JSON (COCO 2017's
    annotations/ holds captions_train2017.json and person_keypoints_train2017.json beside instances_train2017.json)."""
    split = path.stem.rsplit("_", 1)[-1]
    return not path.name.startswith("instances_") and "_" in path.stem and (path.parent / f"instances_{split}.json").is_file()


def _train_first(names: list[str]) -> list[str]:
    return sorted(names, key=lambda n: (not any(w in n.lower() for w in TRAIN_WORDS), n))


def read_splits(source: Path, fmt: str, names: dict[int, str] | None) -> dict[str, Split]:
    """{split name: Split}, the train-like split first; its classes are the others'."""
    if fmt == "coco":
        files = {split_name(f): f for f in _coco_files(source)}
        return _read_each(_train_first(list(files)), lambda split, n: read_coco(files[split], n), names)
    if fmt == "voc":
        if not is_voc_folder(source):
            raise DataError(f"source={source}: not a VOC folder (it needs Annotations/ and JPEGImages/)")
        lists = [p.stem for p in sorted((source / "ImageSets" / "Main").glob("*.txt")) if "_" not in p.stem]
        if not lists:
            raise DataError(f"source={source}: no ImageSets/Main/<split>.txt lists the images of a split")
        return _read_each(_train_first(lists), lambda split, n: read_voc(source, split, n), names)

    reader = read_labelme if fmt == "labelme" else read_labelstudio
    return {"train": reader(source, names)}


def _read_each(splits: list[str], read, names: dict[int, str] | None) -> dict[str, Split]:
    out: dict[str, Split] = {}
    for split in splits:
        out[split] = read(split, names)
        names = out[split].names  # the first split's classes are every split's
    return out


def data_yaml(splits: dict[str, Split]) -> str:
    """The data.yaml text: train, val (the train split when there is no other), test, names."""
    import yaml

    keys = list(splits)
    train = next((k for k in keys if k.lower() in TRAIN_WORDS), keys[0])
    val = next((k for k in keys if k.lower() == "val"), None) or next((k for k in keys if k != train and "val" in k.lower()), None)
    test = next((k for k in keys if k.lower() == "test" and k != val), None)
    val = val or test or next((k for k in keys if k != train), train)
    cfg = {"train": f"images/{train}", "val": f"images/{val}"}
    if test and test != val:
        cfg["test"] = f"images/{test}"
    cfg["names"] = dict(splits[train].names)
    if val == train:
        LOGGER.warning(f"the export has one split ({train}): data.yaml names it as train and as val; split it to validate on "
                       f"images not trained on")
    return yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True)


def parse_names_arg(value: str | None) -> dict[int, str] | None:
    if not value:
        return None
    listed = [n.strip() for n in str(value).split(",") if n.strip()]
    if len(set(listed)) < len(listed):
        raise DataError(f"names={value}: a class is named twice")
    return dict(enumerate(listed))


def convert(source: str | os.PathLike, fmt: str, out: str | os.PathLike, names: str | None = None) -> Path:
    """Convert `source` (format `fmt`) into the YOLO dataset folder `out`; returns its data.yaml."""
    if fmt not in FORMATS:
        raise DataError(f"format={fmt}: convert reads {', '.join(FORMATS)}")
    source, out = Path(source).expanduser().resolve(), Path(out).expanduser().resolve()
    if not source.exists():
        raise DataError(f"source={source}: no such file or folder")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataError(f"out={out} exists and is not an empty folder; name a new folder")
    splits = read_splits(source, fmt, parse_names_arg(names))
    text = data_yaml(splits)
    for split in splits.values():
        LOGGER.info(summary(split))
        for note in split.notes:
            LOGGER.warning(printable(note))  # file names from the export: a newline would forge a line
    return _write_all(splits, text, out)


def _write_all(splits: dict[str, Split], text: str, out: Path) -> Path:
    tmp = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = new_temp_folder(out)
        for name, split in splits.items():
            write_split(split, tmp, name)
        atomic_write_text(tmp / "data.yaml", text)
        _claim(tmp, out)
    except OSError as error:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise write_error(error, out, "the converted dataset") from None
    LOGGER.info(f"wrote {out / 'data.yaml'}")
    return out / "data.yaml"


def _claim(tmp: Path, out: Path) -> None:
    """Rename the finished `tmp` to `out` (replacing an empty folder there): of two converts into one folder at once, the
    first rename wins and the other is a DataError, one line, its own temp folder removed; what the first wrote is kept."""
    try:
        os.rename(tmp, out)  # POSIX: replaces an empty folder, fails on one that holds files
    except OSError as error:
        if error.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        raise DataError(f"out={out}: another process wrote it while this convert ran (it is no longer an empty folder); "
                        f"its dataset is kept and this one was not written: name a new folder") from None
