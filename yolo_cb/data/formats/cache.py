"""A COCO JSON or VOC split named by a data YAML, as a YOLO folder that training reads like any other.

The folder is ``<datasets_dir>/converted/<source name>-<key>/`` with ``images/<split>/`` (links to the user's images,
copies where links cannot be made) and ``labels/<split>/``: ours, under datasets_dir, never beside the user's data.
The key hashes the source's path, its size and modification time (for VOC: of the list and of every annotation
file), the split, the class names and the dataset root (a COCO JSON's file names resolve inside the data YAML's
root), so a changed source gets a new folder. A folder is written under a temp name and renamed into place when
complete; ``conversion.json`` in it records the source and what was skipped or fixed
(``yolo-cb data check`` reports it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from collections import Counter
from pathlib import Path

from yolo_cb.data.formats.coco import is_coco_json, read_coco
from yolo_cb.data.formats.common import COUNT_WORDS, Split, new_temp_folder, summary, write_split
from yolo_cb.data.formats.voc import annotation_path, is_voc_folder, is_voc_list, read_ids, read_voc, split_list
from yolo_cb.utils.files import LABEL_CACHE, atomic_write_text, read_bounded_text, write_error
from yolo_cb.utils.log import printable

LOGGER = logging.getLogger("yolo_cb")
RECORD = "conversion.json"
FOLDER = "converted"
VERSION = 3  # of the conversion rules: a folder made by other rules is not reused (2: paths that leave the root skipped;
# 3: COCO's root is the data YAML's, and images are looked for in the folders the big exporters write)


def source_kind(path: str | os.PathLike) -> str | None:
    """'coco' for a .json file, 'voc' for a VOC folder or one of its ImageSets/Main lists, None for anything else."""
    p = Path(path)
    if is_coco_json(p):
        return "coco"
    if is_voc_folder(p) or is_voc_list(p):
        return "voc"
    return None


def _stat(path: Path) -> str:
    try:
        st = path.stat()
        return f"{path}\0{st.st_size}\0{st.st_mtime_ns}"
    except OSError:
        return f"{path}\0missing"


def source_key(path: Path, kind: str, split: str, names: dict[int, str] | None, root: Path | None = None) -> str:
    """A hash that changes when the source, the split, the names or the data YAML's root change."""
    h = hashlib.sha256(json.dumps([VERSION, kind, str(path), split, sorted((names or {}).items()), str(root)]).encode())
    h.update(_stat(path).encode())
    if kind == "voc":
        listed = split_list(path, split)
        root = listed.parents[2]
        h.update(_stat(listed).encode())
        for image_id in read_ids(listed, Counter()):
            xml = annotation_path(root, image_id)  # one outside the folder is never looked at
            h.update(_stat(xml).encode() if xml is not None else b"outside")
    return h.hexdigest()[:16]


def read_source(path: Path, kind: str, split: str, names: dict[int, str] | None, root: Path | None = None) -> Split:
    return read_coco(path, names, root) if kind == "coco" else read_voc(path, split, names)


def materialise(path: str, split: str, names: dict[int, str] | None, datasets_dir: Path, root: Path | None = None) -> str:
    """`path` unchanged when it is no COCO JSON or VOC split; else the images folder of its YOLO copy (made once).
    `root`: the data YAML's dataset root (a COCO JSON inside it looks its images up there: coco.coco_root)."""
    kind = source_kind(path)
    if kind is None:
        return path
    source = Path(path).resolve()
    stem = re.sub(r"[^\w.-]", "_", source.stem if kind == "coco" else source.name)
    root = root if kind == "coco" else None
    folder = datasets_dir / FOLDER / f"{stem}-{source_key(source, kind, split, names, root)}"
    if not (folder / RECORD).is_file():
        _convert_into(folder, source, kind, split, names, root)
    return str(folder / "images" / split)


def _convert_into(folder: Path, source: Path, kind: str, split: str, names: dict[int, str] | None, root: Path | None) -> None:
    """Read the source (bad input raises before anything is written), write it under a temp name, rename into place."""
    read = read_source(source, kind, split, names, root)
    LOGGER.info(f"{split}: {kind.upper()} {summary(read)}; as YOLO labels in {folder}")
    for note in read.notes:
        LOGGER.warning(printable(f"{split}: {note}"))  # file names from the source: a newline would forge a line
    tmp = None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = new_temp_folder(folder)
        write_split(read, tmp, split)
        record = {"source": str(source), "kind": kind, "split": split, "names": read.names, "images": len(read.images),
                  "counts": {k: read.counts[k] for k in COUNT_WORDS if read.counts.get(k)}, "notes": read.notes}
        atomic_write_text(tmp / RECORD, json.dumps(record, indent=1))
    except OSError as error:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise write_error(error, folder.parent, "the converted dataset (under datasets_dir)") from None
    try:
        os.rename(tmp, folder)
    except OSError:  # another process (a DDP rank) finished the same folder first: its copy is the same
        shutil.rmtree(tmp, ignore_errors=True)


def conversion_record(images_folder: str | os.PathLike) -> dict | None:
    """The conversion.json of a converted split's images folder, or None for a folder we did not convert."""
    record = Path(images_folder).parent.parent / RECORD
    if Path(images_folder).parent.name != "images" or record.parent.parent.name != FOLDER or not record.is_file():
        return None
    try:
        return json.loads(read_bounded_text(record, LABEL_CACHE))
    except (OSError, ValueError):
        return None
