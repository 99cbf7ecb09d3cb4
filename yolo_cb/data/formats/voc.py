"""Pascal VOC folder (``Annotations/``, ``JPEGImages/``, ``ImageSets/Main/<split>.txt``) -> Split.

Read with the standard library's xml.etree, defusedxml-style: a file with a DOCTYPE or an ENTITY declaration is
refused before parsing (VOC annotations have neither; entity expansion is how an XML file eats a machine), so no
extra dependency is needed. Rules, as Ultralytics' VOC conversion or stricter:

- the split is the image ids in ``ImageSets/Main/<split>.txt`` (the data YAML key: train, val or test), or a list
  named directly (``train: VOC2012/ImageSets/Main/trainval.txt``); an id listed twice is read once and counted;
- each id's image is ``JPEGImages/<id>.jpg``, else the file the XML's ``<filename>`` names;
- the VOC folder is the dataset root: an id whose annotation or image resolves outside it (``../``, an absolute id, a
  link that points out) is skipped, counted and summed up in one note; nothing outside is read;
- ``<difficult>1</difficult>`` objects are skipped and counted (as Ultralytics); an image with no object left is a
  background;
- box corners are VOC's 1-based pixels, made 0-based by subtracting 1 from each (Ultralytics' ``(xmin + xmax) / 2 - 1``
  centre, ``xmax - xmin`` width), then clipped to ``<size>``; one with no area left is dropped; both counted;
- classes: the data YAML's ``names`` (an object of another class is an error naming it), else every class name
  met, sorted;
- malformed XML, a missing ``<size>`` or ``<bndbox>`` value, an annotation file that is missing: a DataError naming the
  file and the entry, nothing written.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from yolo_cb.data.formats.common import Image, Split, bad_input, class_map, clip_box, finish, inside_root, locate, numbers
from yolo_cb.data.verify import read_list
from yolo_cb.errors import DataError, os_reason, short_repr
from yolo_cb.utils.files import ANNOTATION_XML, read_bounded

DECLARATIONS = re.compile(rb"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)


def is_voc_folder(path: Path) -> bool:
    return path.is_dir() and (path / "Annotations").is_dir() and (path / "JPEGImages").is_dir()


def is_voc_list(path: Path) -> bool:
    """An image-set list inside a VOC folder: <root>/ImageSets/Main/<name>.txt."""
    return path.suffix == ".txt" and path.parent.name == "Main" and path.parent.parent.name == "ImageSets" and is_voc_folder(path.parents[2])


def split_list(path: Path, split: str) -> Path:
    """The image-set list of `split` in the VOC folder `path` (or `path` itself when it is a list)."""
    if is_voc_list(path):
        return path
    listed = path / "ImageSets" / "Main" / f"{split}.txt"
    if not listed.is_file():
        there = sorted(p.stem for p in (path / "ImageSets" / "Main").glob("*.txt") if "_" not in p.stem)
        raise DataError(f"{path}: a VOC folder without {listed.relative_to(path)} for the '{split}' split (lists there: "
                        f"{', '.join(there) or 'none'}); name a list directly, e.g. '{split}: {path.name}/ImageSets/Main/"
                        f"{there[0] if there else 'trainval'}.txt'")
    return listed


def parse_xml(path: Path) -> ET.Element:
    """The root element of an annotation file; refused (DataError) when malformed or when it declares a DOCTYPE/ENTITY."""
    try:
        raw = read_bounded(path, ANNOTATION_XML)  # a FIFO or a device refused by name, never waited on
    except OSError as error:
        raise DataError(f"{path}: cannot be read ({error}); nothing was written") from None
    if DECLARATIONS.search(raw):
        raise bad_input(path, "the XML", "declares a DOCTYPE or ENTITY, which a VOC annotation never has: refused unparsed")
    try:
        return ET.fromstring(raw)
    except ET.ParseError as error:
        raise DataError(f"{path}: not well-formed XML ({error}); nothing was written") from None


def read_ids(listed: Path, counts: Counter) -> list[str]:
    """The image ids of an image-set list, in order, each once (one listed again is counted)."""
    ids: list[str] = []
    seen: set[str] = set()
    for line in read_list(listed, "VOC image-set list", "one image id", after="; nothing was written").splitlines():
        image_id = line.split()[0] if line.split() else ""
        if not image_id:
            continue
        if image_id in seen:
            counts["duplicate_ids"] += 1
            continue
        seen.add(image_id)
        ids.append(image_id)
    return ids


def annotation_path(root: Path, image_id: str) -> Path | None:
    """``Annotations/<id>.xml`` of the VOC folder `root`, resolved; None when it lies outside `root` (an id is read from a
    list: one with '..', an absolute one elsewhere, a link that points out)."""
    return inside_root(root, Path("Annotations") / f"{image_id}.xml")


def annotation_file(root: Path, image_id: str, source: Path) -> Path | None:
    """:func:`annotation_path`, or a DataError naming the id and the list `source` when the file is missing."""
    xml = annotation_path(root, image_id)
    if xml is None:
        return None
    try:
        if xml.exists() and not xml.is_dir():  # a FIFO or a device too: parse_xml refuses it by name
            return xml
        reason = "is missing"
    except OSError as error:  # a name too long for the file system
        reason = f"cannot be looked up ({os_reason(error)})"
    raise bad_input(source, f"id {short_repr(image_id)}", f"its annotation {root / 'Annotations'}/<id>.xml {reason}")


def _text(node: ET.Element, tag: str) -> str | None:
    found = node.find(tag)
    return found.text.strip() if found is not None and found.text is not None else None


def voc_class_names(root: Path, listed: Path) -> list[str]:
    """Every class name the split's annotations use, sorted (the classes when the YAML gives no names)."""
    found: set[str] = set()
    for image_id in read_ids(listed, Counter()):
        xml = annotation_file(root, image_id, listed)
        if xml is not None:
            found.update(_text(obj, "name") or "" for obj in parse_xml(xml).iter("object"))
    return sorted(found - {""})


def read_voc(path: Path, split: str = "train", names: dict[int, str] | None = None) -> Split:
    """Read one split of a VOC folder (see the module docstring)."""
    path = Path(path).resolve()
    listed = split_list(path, split)
    root = listed.parents[2] if is_voc_list(listed) else path
    if names is None:
        names = dict(enumerate(voc_class_names(root, listed)))
    out = Split(listed, [], dict(names), root=root, looked=[root / "JPEGImages"])
    for image_id in read_ids(listed, out.counts):
        image = _read_annotation(root, image_id, names, out)
        if image is not None:
            out.images.append(image)
    return finish(out)


def _read_annotation(root: Path, image_id: str, names: dict[int, str], out: Split) -> Image | None:
    xml = annotation_file(root, image_id, out.source)
    if xml is None:
        out.leaves_root(image_id)
        return None
    node = parse_xml(xml)
    size = node.find("size")
    if size is None:
        raise bad_input(xml, "<size>", "is missing: the image's width and height are needed")
    width, height = numbers([_text(size, "width"), _text(size, "height")], 2, xml, "<size>", "width, height", text=True)
    named = _text(node, "filename")
    candidates = [Path("JPEGImages") / f"{image_id}.jpg"] + ([Path("JPEGImages") / Path(named).name] if named else [])
    found = locate(out, candidates, image_id, f"id {short_repr(image_id)} <filename>",
                   f"{xml}: its image {root / candidates[-1]} is missing: skipped")
    if found is None:
        return None
    image = Image(found[1], found[0].name, width, height)
    objects = list(node.iter("object"))
    by_name = class_map([_text(o, "name") or "" for o in objects], names, xml, "<object><name>")
    for k, obj in enumerate(objects):
        if (_text(obj, "difficult") or "0") == "1":
            out.counts["difficult_skipped"] += 1
            continue
        box = obj.find("bndbox")
        if box is None:
            raise bad_input(xml, f"object {k + 1} ({_text(obj, 'name')})", "has no <bndbox>")
        x1, y1, x2, y2 = numbers([_text(box, t) for t in ("xmin", "ymin", "xmax", "ymax")], 4, xml,
                                 f"object {k + 1} ({_text(obj, 'name')}) <bndbox>", "xmin, ymin, xmax, ymax", text=True)
        clipped = clip_box((x1 - 1, y1 - 1, x2 - 1, y2 - 1), width, height, out.counts)
        if clipped is not None:
            image.boxes.append((by_name[_text(obj, "name") or ""], *clipped))
    return image
