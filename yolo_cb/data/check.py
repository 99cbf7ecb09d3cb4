"""`yolo-cb data check data=...`: what a dataset holds and what is odd about it, before a training finds out.

For each split (train, every validation set, test): images, boxes, backgrounds (images without boxes), images
skipped (unreadable, a bad label file), and boxes per class. Warned about, each with a count and an example:

- images without boxes (backgrounds) and images skipped;
- boxes outside the image (clipped or dropped, by the label check or by the COCO/VOC conversion), boxes without
  area, and what a COCO/VOC conversion skipped or renamed (iscrowd, difficult, missing image files, a file name that
  would share a label file);
- tiny boxes: a side under ``TINY_PX`` pixels of the original image; polygon (segmentation) rows, trained as their boxes;
- the same image (same bytes, by SHA-1) in two splits, or twice in one;
- a class with boxes in a validation or test split and none in train; a class without any box in train.

Only warnings: the check exits 0 whatever it finds; a data YAML that cannot be used is an error (exit 2). Label files
are read, never written (no label cache is saved). :func:`training_summary` is the short form the trainer logs from the
labels it has already loaded.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from yolo_cb.data.formats.cache import conversion_record
from yolo_cb.data.formats.common import COUNT_WORDS
from yolo_cb.data.label_file import polygons_boxed
from yolo_cb.data.resolve import check_data
from yolo_cb.data.verify import img2label_path, list_image_files, verify_all
from yolo_cb.utils.log import printable

LOGGER = logging.getLogger("yolo_cb")
TINY_PX = 3.0  # a box with a side under this many pixels of the original image is called tiny
EXAMPLES = 3  # examples named per warning


@dataclass
class SplitReport:
    name: str
    images: int = 0
    boxes: int = 0
    skipped: list[str] = field(default_factory=list)
    backgrounds: list[str] = field(default_factory=list)
    tiny: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)  # "file: note" of each label file the check fixed
    per_class: Counter = field(default_factory=Counter)
    conversion: dict = field(default_factory=dict)
    conversion_notes: list[str] = field(default_factory=list)  # a renamed duplicate file name, a missing image file
    hashes: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    polygons: int = 0  # polygon rows boxed


def _splits(data: dict) -> dict[str, object]:
    out = {"train": data.get("train")}
    sets = data.get("val_sets") or {"val": data.get("val")}
    out.update({name if name == "val" else f"val:{name}": paths for name, paths in sets.items()})
    out["test"] = data.get("test")
    return {name: paths for name, paths in out.items() if paths}


def _file_hash(path: str) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_split(name: str, paths, nc: int) -> SplitReport:
    """Read one split's images and labels (nothing written) into a SplitReport."""
    report = SplitReport(name)
    for path in [paths] if isinstance(paths, str) else paths:
        record = conversion_record(path)
        if record:
            report.conversion = Counter(report.conversion) + Counter(record.get("counts", {}))
            report.conversion_notes += [str(n) for n in record.get("notes", [])]
    im_files = list_image_files(paths, f"{name}: ")
    entries = verify_all(im_files, [img2label_path(f) for f in im_files], nc, f"{name}: ")
    for entry in entries:
        _add_entry(report, entry)
    return report


def _add_entry(report: SplitReport, entry: dict) -> None:
    im_file = entry["im_file"]
    if entry["corrupt"]:
        report.skipped.append(f"{im_file}: {entry['corrupt']}")
        return
    report.images += 1
    report.polygons += entry["polygons"]
    report.hashes[_file_hash(im_file)].append(im_file)
    report.outside += [f"{img2label_path(im_file)}: {note}" for note in entry["notes"] if "outside" in note]
    labels = np.array(entry["labels"], dtype=np.float64).reshape(-1, 5)
    report.boxes += len(labels)
    if not len(labels):
        report.backgrounds.append(im_file)
    h, w = entry["shape"]
    for c, _, _, bw, bh in labels:
        report.per_class[int(c)] += 1
        if bw * w < TINY_PX or bh * h < TINY_PX:
            report.tiny.append(f"{im_file}: class {int(c)} box {bw * w:.1f}x{bh * h:.1f} px")


def check_dataset(data: str, datasets_dir: str | None = None) -> tuple[dict, list[SplitReport], list[str]]:
    """(the data dict, a report per split, the warnings) of a data YAML."""
    resolved = check_data(data, datasets_dir)
    reports = [check_split(name, paths, resolved["nc"]) for name, paths in _splits(resolved).items()]
    return resolved, reports, warnings(reports, resolved["names"])


def _examples(items: list[str]) -> str:
    more = f" (+{len(items) - EXAMPLES} more)" if len(items) > EXAMPLES else ""
    return "; ".join(items[:EXAMPLES]) + more


def warnings(reports: list[SplitReport], names: dict[int, str]) -> list[str]:
    """Every warning, one line each (see the module docstring)."""
    out: list[str] = []
    for r in reports:
        for items, what in ((r.skipped, "image(s) skipped"), (r.backgrounds, "image(s) without boxes (kept as backgrounds)"),
                            (r.outside, "label file(s) with boxes outside the image (clipped or dropped)"),
                            (r.tiny, f"tiny box(es) (a side under {TINY_PX:g} px)")):
            if items:
                out.append(f"{r.name}: {len(items)} {what}: {_examples(items)}")
        if r.polygons:
            out.append(f"{r.name}: {polygons_boxed(r.polygons)}")
        if r.conversion:
            said = ", ".join(f"{n} {COUNT_WORDS.get(k, k)}" for k, n in r.conversion.items() if n)
            if said:
                out.append(f"{r.name}: the COCO/VOC conversion: {said}")
        out += [f"{r.name}: the COCO/VOC conversion: {note}" for note in r.conversion_notes]
    out += _duplicates(reports)
    out += class_warnings({r.name: r.per_class for r in reports}, names)
    return out


def _duplicates(reports: list[SplitReport]) -> list[str]:
    where: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for r in reports:
        for digest, files in r.hashes.items():
            where[digest] += [(r.name, f) for f in files]
    across = [v for v in where.values() if len({s for s, _ in v}) > 1]
    within = [v for v in where.values() if len(v) > len({s for s, _ in v})]
    out = []
    if across:
        shown = [" = ".join(f"{s}:{Path(f).name}" for s, f in v) for v in across]
        out.append(f"{len(across)} image(s) are in more than one split (same content): {_examples(shown)}")
    if within:
        shown = [" = ".join(f"{s}:{Path(f).name}" for s, f in v) for v in within]
        out.append(f"{len(within)} image(s) appear twice in one split (same content): {_examples(shown)}")
    return out


def class_warnings(per_split: dict[str, Counter], names: dict[int, str]) -> list[str]:
    """A class with boxes in another split and none in train; a class with no box in train."""
    train = per_split.get("train", Counter())
    out = []
    for split, counts in per_split.items():
        if split == "train":
            continue
        missing = [f"{names.get(c, c)} ({n})" for c, n in sorted(counts.items()) if n and not train.get(c)]
        if missing:
            out.append(f"{split}: class(es) with boxes here and none in train: {', '.join(missing)}")
    unseen = [str(names[c]) for c in sorted(names) if not any(v.get(c) for v in per_split.values())]
    if "train" in per_split and unseen:
        out.append(f"class(es) without any box in any split: {', '.join(unseen)}")
    return out


def format_report(resolved: dict, reports: list[SplitReport], found: list[str]) -> str:
    """The printed summary: a table of splits, a table of classes, the warnings, a last line."""
    names = {c: printable(n) for c, n in resolved["names"].items()}  # escaped: a newline in a class name forges no line
    lines = [f"data check: {resolved['yaml_file']} ({resolved['nc']} classes)", "",
             f"{'split':<16}{'images':>8}{'boxes':>8}{'backgrounds':>13}{'skipped':>9}"]
    lines += [f"{r.name:<16}{r.images:>8}{r.boxes:>8}{len(r.backgrounds):>13}{len(r.skipped):>9}" for r in reports]
    lines += ["", f"{'class':<20}" + "".join(f"{r.name:>12}" for r in reports)]
    lines += [f"{str(names[c])[:19]:<20}" + "".join(f"{r.per_class.get(c, 0):>12}" for r in reports) for c in sorted(names)]
    lines += [""] + [f"WARNING {printable(w)}" for w in found]
    lines.append(f"{len(found)} warning(s); no errors" if found else "no problems found")
    return "\n".join(lines)


def training_summary(per_split: dict[str, list[dict]], names: dict[int, str]) -> str:
    """Short: boxes per class in each split (from the loaded label records) and the class warnings."""
    counts = {s: Counter(int(c) for lb in labels for c in lb["cls"]) for s, labels in per_split.items()}
    backgrounds = {s: sum(not len(lb["cls"]) for lb in labels) for s, labels in per_split.items()}
    head = ", ".join(f"{s} {len(per_split[s])} images ({backgrounds[s]} backgrounds)" for s in per_split)
    classes = ", ".join(f"{printable(names[c])} " + "/".join(str(counts[s].get(c, 0)) for s in per_split) for c in sorted(names))
    text = f"data: {head}; boxes per class ({'/'.join(per_split)}): {classes}"
    return "\n".join([text] + [f"WARNING {printable(w)}" for w in class_warnings(counts, names)])
