"""What every annotation format is read into, and how it is written out as a YOLO dataset.

A reader (coco.py, voc.py, labelme.py, labelstudio.py) turns an export into a :class:`Split`: its images, each with
its boxes in pixels and already mapped to class ids 0..nc-1, and the counts of what was skipped or fixed. Nothing is
written while reading, so bad input (raised as a DataError naming the file and the entry) leaves nothing behind.
Every file an export names is looked up through :func:`inside_root`: it stays inside the export's dataset root.
:func:`write_split` then writes ``images/<split>/`` (links to the source images) and ``labels/<split>/`` (YOLO txt).
"""

from __future__ import annotations

import math
import os
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from yolo_cb.data.verify import img2label_path
from yolo_cb.errors import DataError, os_reason, short_repr

MIN_SIZE_PX = 1e-6  # a clipped box narrower or lower than this (pixels) has no area: dropped


@dataclass
class Image:
    """One source image: its file, the name it gets in the YOLO folder, its size and its boxes (cls, x1, y1, x2, y2) in pixels."""

    path: Path
    name: str  # a relative POSIX path inside images/<split>/ (subfolders kept)
    width: float
    height: float
    boxes: list[tuple[int, float, float, float, float]] = field(default_factory=list)


@dataclass
class Split:
    """A read split: its images, the class names, and the counts of what was skipped or fixed (name -> count)."""

    source: Path
    images: list[Image]
    names: dict[int, str]
    counts: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)  # one line each: a renamed duplicate, a missing image file
    root: Path | None = None  # the dataset root: every file the source names must resolve inside it (inside_root)
    outside_example: str = ""  # the first name read that leaves the root, as the source gives it
    looked: list[Path] = field(default_factory=list)  # the folders image files are looked for in (named when none is)
    missing_example: str = ""  # the first image name not found, as the source gives it

    def missing(self, note: str, shown: str = "") -> None:
        """Count an image whose file is missing; the first one's note and name are kept."""
        self.counts["missing_images"] += 1
        if self.counts["missing_images"] == 1:
            self.notes.append(note)
            self.missing_example = shown

    def leaves_root(self, shown: str) -> None:
        """Count an entry skipped because the path it names resolves outside the root; the first is the example."""
        self.counts["outside_root"] += 1
        self.outside_example = self.outside_example or shown


def inside_root(root: Path, named: str | os.PathLike) -> Path | None:
    """The path that `named` (read from a file we did not write: relative to `root`, or absolute) names, with every
    symbolic link followed (the root's own too); None when it resolves outside `root`. A '..' that climbs out, an
    absolute path elsewhere, a link in the root that points out, and a name that cannot be a path (a NUL byte) are all
    outside; an absolute path that resolves inside the root is inside. The one function every reader looks a named
    file up through.

    The dataset root of each format: COCO, the data YAML's ``path:`` when given and the JSON is inside it, else the
    JSON's folder, or its parent when that folder is ``annotations/`` (COCO 2017: ``annotations/`` beside
    ``train2017/``; coco.py's ``coco_root``, which also says where file_name is looked for); Pascal VOC, the folder
    holding Annotations/, JPEGImages/ and ImageSets/ (the ids of a list name files there); LabelMe, the folder given
    (the JSON's folder when one file is given); Label Studio, the folder of the export."""
    try:
        real_root = Path(os.path.realpath(root))
        target = Path(os.path.realpath(Path(root) / named))
    except (OSError, ValueError):  # ValueError: a NUL byte
        return None
    return target if target == real_root or real_root in target.parents else None


def locate(split: Split, candidates: list, shown: str, entry: str, missing: str) -> tuple[Path, Path] | None:
    """(the candidate, its resolved path) of the first of `candidates` (paths relative to ``split.root``, or absolute)
    that is a file inside the root. None when none is: counted as an entry that leaves the root when a candidate did
    (`shown`, the name as the source gives it, is the example; nothing outside is looked at), else as a missing image
    (`missing`: the note of the first). A name the system cannot look up (one too long) is a DataError naming `entry`."""
    left = False
    for candidate in candidates:
        real = inside_root(split.root, candidate)
        if real is None:
            left = True
            continue
        try:
            if real.is_file():
                return Path(candidate), real
        except OSError as error:
            raise bad_input(split.source, entry, f"{short_repr(shown)} cannot be looked up ({os_reason(error)})") from None
    if left:
        split.leaves_root(shown)
    else:
        split.missing(missing, shown)
    return None


def bad_input(source: Path | str, entry: str, what: str) -> DataError:
    """The one-line error for bad input: the file, the entry in it, and what is wrong."""
    return DataError(f"{source}: {entry}: {what}; nothing was written")


def finite(value, text: bool = False) -> float | None:
    """`value` as a finite float, or None: not a number (a bool, a string unless `text`), NaN, infinite, or an integer
    too large for a float."""
    if isinstance(value, bool) or (isinstance(value, str) and not text):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return out if math.isfinite(out) else None


def numbers(value, count: int, source: Path, entry: str, what: str, text: bool = False) -> list[float]:
    """`value` as `count` finite numbers, or a DataError naming the entry (a bbox of 3 numbers, a NaN, a string unless
    `text`: an XML file's numbers are text)."""
    out = [finite(v, text) for v in value] if isinstance(value, (list, tuple)) and len(value) == count else []
    if len(out) != count or None in out:
        raise bad_input(source, entry, f"{what} must be {count} numbers, got {short_repr(value)}")
    return out


def clip_box(box: tuple[float, float, float, float], width: float, height: float, counts: Counter) -> tuple[float, ...] | None:
    """A pixel box (x1, y1, x2, y2) clipped to the image; None (counted as `dropped_zero_area`) when nothing is left.
    A box that had to be clipped is counted as `clipped`."""
    x1, y1, x2, y2 = box
    if x2 - x1 <= MIN_SIZE_PX or y2 - y1 <= MIN_SIZE_PX:
        counts["dropped_zero_area"] += 1
        return None
    cx1, cy1, cx2, cy2 = max(x1, 0.0), max(y1, 0.0), min(x2, width), min(y2, height)
    if cx2 - cx1 <= MIN_SIZE_PX or cy2 - cy1 <= MIN_SIZE_PX:
        counts["dropped_outside"] += 1
        return None
    if (cx1, cy1, cx2, cy2) != (x1, y1, x2, y2):
        counts["clipped"] += 1
    return cx1, cy1, cx2, cy2


def class_map(found: list[str], names: dict[int, str] | None, source: Path, what: str) -> dict[str, int]:
    """Class name -> id: the given `names` (each found name must be one of them), else `found` in its order."""
    if names is None:
        return {name: i for i, name in enumerate(found)}
    by_name = {name: i for i, name in names.items()}
    unknown = [n for n in found if n not in by_name]
    if unknown:
        raise bad_input(source, what, f"class {unknown[0]!r} is not in names ({', '.join(names.values())}); add it to names "
                        f"or leave names out to take the classes from the annotations")
    return by_name


def safe_name(raw: str, fallback: str) -> str:
    """A relative POSIX name inside our folder for a file named `raw` by an annotation: subfolders kept; an absolute
    name, one with '..' or a URL keeps only its last part (a file we did not write names no place to write)."""
    parts = PurePosixPath(str(raw).replace("\\", "/")).parts
    if not parts or parts[0] == "/" or ".." in parts or ":" in parts[0]:
        return PurePosixPath(str(raw).replace("\\", "/")).name or fallback
    return "/".join(p for p in parts if p not in ("", "."))


def finish(split: Split) -> Split:
    """`split` with its images' names made distinct (:func:`disambiguate`) and the entries that left its root summed up
    in one note; a DataError (:func:`no_images`) when it has no image."""
    if not split.images:
        raise no_images(split)
    disambiguate(split.images, split.notes)
    if split.counts["outside_root"]:
        split.notes.append(f"{split.source}: skipped {split.counts['outside_root']} entries whose image path leaves "
                           f"{split.root}: e.g. {short_repr(split.outside_example)} (a file named in an annotation is read "
                           f"only from inside its dataset root, links followed; move the images there)")
    return split


LOOKED_SHOWN = 6  # folders named in the error of a split without images; the rest are counted


def no_images(split: Split) -> DataError:
    """The one line for a split that would have 0 images: what was skipped, and the folders where images were looked for."""
    skipped = [f"{split.counts[k]} {COUNT_WORDS[k]}" for k in ("missing_images", "outside_root") if split.counts[k]]
    if not skipped:
        return DataError(f"{split.source}: lists no image, so the converted set would have 0 images; nothing was written")
    folders = [str(f) for f in dict.fromkeys(split.looked)]
    more = f" and {len(folders) - LOOKED_SHOWN} more folders" if len(folders) > LOOKED_SHOWN else ""
    example = split.missing_example or split.outside_example
    return DataError(f"{split.source}: none of its images was found, so the converted set would have 0 images "
                     f"({', '.join(skipped)}); looked for {short_repr(example)} and the others in "
                     f"{', '.join(folders[:LOOKED_SHOWN])}{more} (the dataset root is {split.root}): put the images in one "
                     f"of them; nothing was written")


def disambiguate(images: list[Image], notes: list[str]) -> None:
    """Two images whose YOLO names would share a label file (a/1.jpg and a/1.png; two 1.jpg kept by last part) get
    ``<stem>_2``, ``<stem>_3``... in order, each rename noted."""
    seen: set[str] = set()
    for image in images:
        stem = str(PurePosixPath(image.name).with_suffix(""))
        key, n = stem, 1
        while key in seen:
            n += 1
            key = f"{stem}_{n}"
        if n > 1:
            new = key + PurePosixPath(image.name).suffix
            notes.append(f"{image.path}: named {new} (as {image.name} it would share its label file {stem}.txt with another image)")
            image.name = new
        seen.add(key)


def yolo_lines(image: Image) -> str:
    """The YOLO label text of an image: `cls cx cy w h` normalised, 6 decimals."""
    w, h = image.width, image.height
    rows = [f"{c} {(x1 + x2) / 2 / w:.6f} {(y1 + y2) / 2 / h:.6f} {(x2 - x1) / w:.6f} {(y2 - y1) / h:.6f}" for c, x1, y1, x2, y2 in image.boxes]
    return "".join(row + "\n" for row in rows)


def link_or_copy(src: Path, dst: Path) -> str:
    """`dst` made a symbolic link to `src`; a copy where links cannot be made. Returns 'link' or 'copy'."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.symlink(src.resolve(), dst)
        return "link"
    except OSError:
        shutil.copy2(src, dst)
        return "copy"


def new_temp_folder(final: Path) -> Path:
    """A new empty folder beside `final` (mode from the umask, as the folder it becomes), to be renamed to `final`."""
    for n in range(1000):
        tmp = final.parent / f".{final.name}.tmp{os.getpid()}-{n}"
        try:
            tmp.mkdir()
            return tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temp name beside {final}")


def write_split(split: Split, root: Path, name: str) -> Counter:
    """Write `split` as ``root/images/<name>/`` (image links) and ``root/labels/<name>/`` (txt, empty for a background).
    Returns how many images were linked and copied."""
    done: Counter = Counter()
    for image in split.images:
        dst = root / "images" / name / image.name
        done[link_or_copy(image.path, dst)] += 1
        label = Path(img2label_path(str(dst)))
        label.parent.mkdir(parents=True, exist_ok=True)
        label.write_text(yolo_lines(image), encoding="utf-8")
    return done


COUNT_WORDS = {
    "crowd_skipped": "iscrowd boxes skipped",
    "difficult_skipped": "difficult boxes skipped",
    "clipped": "boxes clipped to the image",
    "dropped_zero_area": "boxes without area dropped",
    "dropped_outside": "boxes wholly outside the image dropped",
    "missing_images": "images whose file is missing skipped",
    "outside_root": "images whose path leaves the dataset root skipped",
    "duplicate_ids": "image ids listed twice read once",
    "backgrounds": "images without boxes kept as backgrounds",
    "unsupported_shapes": "shapes that are not boxes or polygons skipped",
}


def summary(split: Split) -> str:
    """One line: images, boxes, and every non-zero count in words."""
    n_boxes = sum(len(i.boxes) for i in split.images)
    counts = Counter(split.counts, backgrounds=sum(not i.boxes for i in split.images))
    said = ", ".join(f"{counts[k]} {words}" for k, words in COUNT_WORDS.items() if counts.get(k))
    return f"{split.source}: {len(split.images)} images, {n_boxes} boxes" + (f"; {said}" if said else "")
