"""COCO instances JSON -> :class:`~yolo_cb.data.formats.common.Split`.

Read with the standard library's json (pycocotools' COCO class does the same json.load and builds indexes, but
checks nothing and prints to stdout; it stays a dev dependency). Rules, each as Ultralytics' ``convert_coco`` or
stricter:

- categories are sorted by id and numbered 0..n-1 (ids with gaps: 1, 3, 7 -> 0, 1, 2), names kept; when the data YAML
  gives ``names``, each category is matched to the class of the same name instead;
- an ``iscrowd`` annotation is skipped and counted; an image without annotations is kept as a background;
- a box (x, y, w, h, pixels) is clipped to the image; one with no area left is dropped; both counted;
- the dataset root (:func:`coco_root`) is the data YAML's ``path:`` when it has one and the JSON is inside it; else
  (and for ``yolo-cb convert``) the JSON's folder, or its parent when the JSON sits in ``annotations/`` (COCO 2017,
  Ultralytics' coco/);
- each image's ``file_name`` is looked for in the folders the big exporters write (:func:`image_folders`): beside the
  JSON (Roboflow's ``<split>/_annotations.coco.json``), then ``<root>/``, ``<root>/<split>/`` (COCO 2017's
  ``train2017/``), ``<root>/images/<split>/`` (Ultralytics' ``images/train2017/``) and ``<root>/images/``, where
  ``<split>`` is :func:`split_name` and ``<root>`` the JSON's own root, then the data YAML's (when they differ); an
  image found in none is skipped, counted and named once, and a split where none is found is a DataError naming the
  folders; its name in the YOLO folder is its ``file_name`` (subfolders kept, a leading ``images/`` dropped; an
  absolute one or one with ``..`` keeps only its last part);
- a ``file_name`` that resolves outside the dataset root (``../``, an absolute path elsewhere, a link that points
  out) is skipped, counted and summed up in one note; nothing outside is read;
- two image entries with the same ``file_name`` are refused; two files that would share a label file are renamed
  ``<stem>_2`` and said;
- malformed JSON, an image or annotation entry missing a key, an annotation naming an image id or a category id that
  is not there, a bbox that is not 4 numbers: a DataError naming the file and the entry, nothing written.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

from yolo_cb.data.formats.common import Image, Split, bad_input, class_map, clip_box, finish, inside_root, locate, numbers, safe_name
from yolo_cb.errors import DataError, short_repr
from yolo_cb.utils.files import ANNOTATION_JSON, FileRefused, read_bounded_text

ROBOFLOW_STEM = "_annotations.coco"  # Roboflow's COCO export: <split>/_annotations.coco.json beside the split's images
ANNOTATIONS = "annotations"  # the folder of COCO 2017's JSONs, beside its image folders


def load_json(path: Path):
    """The parsed JSON of `path`, or a DataError naming the file and where the syntax breaks."""
    try:
        return json.loads(read_bounded_text(path, ANNOTATION_JSON))  # a FIFO or a device refused by name, never waited on
    except FileRefused:
        raise
    except json.JSONDecodeError as error:
        raise DataError(f"{path}: not valid JSON (line {error.lineno}, column {error.colno}: {error.msg}); nothing was written") from None
    except (OSError, UnicodeDecodeError) as error:
        raise DataError(f"{path}: cannot be read ({error}); nothing was written") from None
    except RecursionError:
        raise DataError(f"{path}: its JSON is nested too deeply (over {sys.getrecursionlimit()} levels of [ or {{), which no "
                        f"annotation file is; nothing was written") from None
    except ValueError as error:  # a number of more digits than Python converts (4300)
        raise DataError(f"{path}: cannot be read as JSON ({str(error).split(';')[0]}); nothing was written") from None


def is_coco_json(path: Path) -> bool:
    """A .json file (what a data YAML split naming a file with that suffix means)."""
    return path.suffix.lower() == ".json" and path.is_file()


def _entries(data, key: str, path: Path) -> list[dict]:
    value = data.get(key, [] if key == "annotations" else None)
    if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
        raise bad_input(path, f"'{key}'", f"must be a list of objects, got {short_repr(value)}")
    return value


def categories(path: Path, data=None) -> list[tuple[int, str]]:
    """The JSON's categories as (id, name) sorted by id."""
    data = load_json(path) if data is None else data
    if not isinstance(data, dict):
        raise bad_input(path, "the top level", "must be an object with images, annotations and categories")
    out = []
    for i, cat in enumerate(_entries(data, "categories", path)):
        if not isinstance(cat.get("id"), int) or isinstance(cat.get("id"), bool) or not isinstance(cat.get("name"), str):
            raise bad_input(path, f"categories[{i}]", f"needs an integer 'id' and a text 'name', got {short_repr(cat)}")
        out.append((cat["id"], cat["name"]))
    for k in (0, 1):  # an id given twice is ambiguous; so is a name (classes are matched by name across splits)
        values = [c[k] for c in out]
        twice = next((v for v in values if values.count(v) > 1), None)
        if twice is not None:
            raise bad_input(path, "categories", f"category {'id' if k == 0 else 'name'} {short_repr(twice)} is given twice")
    return sorted(out)


def coco_names(path: Path) -> tuple[dict[int, str], list[int]]:
    """({0: name, ...}, [category id of each]) of a COCO JSON: its categories in id order."""
    cats = categories(path)
    if not cats:
        raise bad_input(path, "categories", "is empty: the classes cannot be taken from it; add names to the data YAML")
    return {i: name for i, (_, name) in enumerate(cats)}, [cid for cid, _ in cats]


def split_name(path: Path) -> str:
    """The split a COCO JSON holds: its stem less ``instances_`` (instances_val2017.json -> val2017); for Roboflow's
    ``<split>/_annotations.coco.json``, the folder's name."""
    stem = Path(path).stem.removeprefix("instances_")
    return Path(path).parent.name if stem == ROBOFLOW_STEM else stem


def coco_root(path: Path, data_root: Path | None = None) -> Path:
    """The dataset root of the COCO JSON `path`: the data YAML's root `data_root` when the JSON is inside it; else the
    JSON's folder, or its parent when that folder is ``annotations/`` (COCO 2017: ``annotations/`` beside
    ``train2017/``; Ultralytics' coco/: beside ``images/``). Every file_name must resolve inside it."""
    if data_root is not None and inside_root(data_root, path) is not None:
        return Path(os.path.realpath(data_root))
    return path.parent.parent if path.parent.name.lower() == ANNOTATIONS else path.parent


def image_folders(path: Path, root: Path) -> list[Path]:
    """The folders a file_name is looked for in, in order (see the module docstring); those outside `root` left out."""
    split = split_name(path)
    bases = [b for b in dict.fromkeys([coco_root(path), root]) if inside_root(root, b) is not None]
    folders = [path.parent] + [f for b in bases for f in (b, b / split, b / "images" / split, b / "images")]
    return list(dict.fromkeys(folders))


def read_coco(path: Path, names: dict[int, str] | None = None, data_root: Path | None = None) -> Split:
    """Read a COCO instances JSON (see the module docstring); `names` None: the classes are its categories;
    `data_root`: the data YAML's root (:func:`coco_root`)."""
    path = Path(path).resolve()
    data = load_json(path)
    cats = categories(path, data)
    if names is None:
        names = {i: name for i, (_, name) in enumerate(cats)}
        by_id = {cid: i for i, (cid, _) in enumerate(cats)}
    else:
        by_name = class_map([name for _, name in cats], names, path, "categories")
        by_id = {cid: by_name[name] for cid, name in cats}
    root = coco_root(path, data_root)
    split = Split(path, [], dict(names), root=root, looked=image_folders(path, root))
    images = _images(data, path, split)
    for i, ann in enumerate(_entries(data, "annotations", path)):
        _add_annotation(ann, i, images, by_id, path, split.counts)
    split.images = [image for image in images.values() if image is not None]
    return finish(split)


def _images(data: dict, path: Path, split: Split) -> dict[int, Image | None]:
    """image id -> Image (None for an image whose file is missing or outside the root: its annotations go with it)."""
    out: dict[int, Image | None] = {}
    first_by_name: dict[str, int] = {}
    for i, entry in enumerate(_entries(data, "images", path)):
        image_id, file_name = entry.get("id"), entry.get("file_name")
        if image_id is None or isinstance(image_id, (bool, dict, list)) or not isinstance(file_name, str) or not file_name:
            raise bad_input(path, f"images[{i}]", f"needs an 'id' and a 'file_name', got {short_repr(entry)}")
        where = f"images[{i}] (id {short_repr(image_id)})"
        if image_id in out:
            raise bad_input(path, where, f"image id {short_repr(image_id)} is given twice")
        if file_name in first_by_name:
            raise bad_input(path, where, f"file_name {short_repr(file_name)} is also image id {short_repr(first_by_name[file_name])}: "
                            f"two entries name one file; merge or remove one")
        first_by_name[file_name] = image_id
        width, height = numbers([entry.get("width"), entry.get("height")], 2, path, where, "width, height")
        if width <= 0 or height <= 0:
            raise bad_input(path, where, f"width and height must be positive, got {width:g}x{height:g}")
        found = locate(split, [folder / file_name for folder in split.looked], file_name, f"{where} file_name",
                       f"{path}: images[{i}] file_name {short_repr(file_name)} is in none of "
                       f"{', '.join(str(f) for f in split.looked)}: skipped")
        name = safe_name(file_name, f"{image_id}.jpg")
        name = name.removeprefix("images/") or name  # images/a.jpg beside the JSON: a.jpg in images/<split>/, as a.jpg in images/
        out[image_id] = None if found is None else Image(found[1], name, width, height)
    return out


def _add_annotation(ann: dict, i: int, images: dict, by_id: dict[int, int], path: Path, counts: Counter) -> None:
    entry = f"annotations[{i}] (id {short_repr(ann.get('id', '?'))})"
    image_id = ann.get("image_id")
    if image_id not in images:
        raise bad_input(path, entry, f"image_id {short_repr(image_id)} is not the id of any entry in 'images'")
    if ann.get("category_id") not in by_id:
        raise bad_input(path, entry, f"category_id {short_repr(ann.get('category_id'))} is not the id of any entry in 'categories'")
    x, y, w, h = numbers(ann.get("bbox"), 4, path, entry, "bbox")
    if ann.get("iscrowd"):
        counts["crowd_skipped"] += 1
        return
    image = images[image_id]
    if image is None:
        return
    box = clip_box((x, y, x + w, y + h), image.width, image.height, counts)
    if box is not None:
        image.boxes.append((by_id[ann["category_id"]], *box))
