"""LabelMe (one JSON per image) and Label Studio (a JSON export of tasks) -> Split, read with the standard json module.

LabelMe: every ``*.json`` under the source folder (or the one file given); the image is ``imagePath`` relative to its
JSON, else the file beside the JSON with the same stem. ``rectangle`` and ``polygon`` shapes become their bounding box,
``circle`` (centre, a point on the rim) its square; ``point``, ``line``, ``linestrip`` shapes are skipped and counted.

Label Studio (Export -> JSON): a list of tasks; the image is the last part of ``data.image`` (or of its ``?d=`` path
for local files), looked up beside the export, then in ``images/`` beside it. Of each task the first annotation that
was not cancelled is read; its ``rectanglelabels`` results (percent of ``original_width``/``original_height``, turned
by ``rotation`` degrees about the top-left corner) become the axis-aligned box around them.

Both: classes are the data ``names`` given (a label of another class is an error naming it), else every label met,
sorted; boxes are clipped to the image, boxes without area dropped, images without boxes kept as backgrounds,
images whose file is missing skipped; each counted.
"""

from __future__ import annotations

import math
from pathlib import Path, PurePosixPath
from urllib.parse import parse_qs, unquote, urlparse

from yolo_cb.data.formats.coco import find_image, load_json
from yolo_cb.data.formats.common import Image, Split, bad_input, class_map, clip_box, disambiguate, numbers, safe_name
from yolo_cb.data.verify import IMG_SUFFIXES
from yolo_cb.errors import short_repr

BOX_SHAPES = ("rectangle", "polygon", "circle")


def _labelme_files(source: Path) -> list[Path]:
    return [source] if source.is_file() else sorted(p for p in source.rglob("*.json") if p.is_file())


def _labelme_image(json_file: Path, data: dict) -> Path | None:
    named = data.get("imagePath")
    if isinstance(named, str) and named and (json_file.parent / named.replace("\\", "/")).is_file():
        return (json_file.parent / named.replace("\\", "/")).resolve()
    return next((p.resolve() for p in sorted(json_file.parent.glob(json_file.stem + ".*")) if p.suffix.lower() in IMG_SUFFIXES), None)


def _shape_box(shape: dict, path: Path, entry: str) -> tuple[float, float, float, float]:
    points = shape.get("points")
    if not isinstance(points, list) or not points:
        raise bad_input(path, entry, f"'points' must be a list of [x, y], got {short_repr(points)}")
    xy = [numbers(p, 2, path, entry, "each point") for p in points]
    xs, ys = [p[0] for p in xy], [p[1] for p in xy]
    if shape.get("shape_type") == "circle" and len(xy) == 2:
        r = math.dist(xy[0], xy[1])
        return xs[0] - r, ys[0] - r, xs[0] + r, ys[0] + r
    return min(xs), min(ys), max(xs), max(ys)


def read_labelme(source: Path, names: dict[int, str] | None = None) -> Split:
    """Read a LabelMe folder (see the module docstring)."""
    source = Path(source).resolve()
    files = [(f, load_json(f)) for f in _labelme_files(source)]
    for f, data in files:
        if not isinstance(data, dict) or not isinstance(data.get("shapes", []), list):
            raise bad_input(f, "the top level", "is not a LabelMe annotation (an object with 'shapes')")
    found = sorted({str(s.get("label")) for _, d in files for s in d.get("shapes", []) if isinstance(s, dict)})
    by_name = class_map(found, names, source, "labels")
    out = Split(source, [], dict(names) if names is not None else {i: n for n, i in by_name.items()})
    base = source if source.is_dir() else source.parent
    for f, data in files:
        image_file = _labelme_image(f, data)
        if image_file is None:
            out.counts["missing_images"] += 1
            if out.counts["missing_images"] == 1:
                out.notes.append(f"{f}: its image ({data.get('imagePath')!r}) is missing: skipped")
            continue
        width, height = numbers([data.get("imageWidth"), data.get("imageHeight")], 2, f, "imageWidth, imageHeight", "the image size")
        name = str(PurePosixPath(f.relative_to(base).as_posix()).with_suffix(image_file.suffix))
        image = Image(image_file, name, width, height)
        for k, shape in enumerate(data.get("shapes", [])):
            if not isinstance(shape, dict) or shape.get("shape_type", "polygon") not in BOX_SHAPES:
                out.counts["unsupported_shapes"] += 1
                continue
            box = clip_box(_shape_box(shape, f, f"shapes[{k}] ({shape.get('label')})"), width, height, out.counts)
            if box is not None:
                image.boxes.append((by_name[str(shape.get("label"))], *box))
        out.images.append(image)
    disambiguate(out.images, out.notes)
    return out


def _task_image_name(task: dict, path: Path, i: int) -> str:
    image = (task.get("data") or {}).get("image") if isinstance(task.get("data"), dict) else None
    if not isinstance(image, str) or not image:
        raise bad_input(path, f"task {task.get('id', i)!r}", f"needs data.image (the image's URL or path), got {short_repr(task.get('data'))}")
    url = urlparse(image)
    local = parse_qs(url.query).get("d")
    return PurePosixPath(unquote(local[0] if local else url.path)).name


def _task_results(task: dict) -> list[dict]:
    annotations = [a for a in task.get("annotations") or [] if isinstance(a, dict) and not a.get("was_cancelled")]
    return [r for r in (annotations[0].get("result") or []) if isinstance(r, dict)] if annotations else []


def _result_box(result: dict, path: Path, entry: str) -> tuple[str, tuple[float, ...], float, float]:
    value = result.get("value") if isinstance(result.get("value"), dict) else {}
    labels = value.get("rectanglelabels")
    if not isinstance(labels, list) or len(labels) != 1:
        raise bad_input(path, entry, f"value.rectanglelabels must name one class, got {short_repr(labels)}")
    x, y, w, h = numbers([value.get(k) for k in ("x", "y", "width", "height")], 4, path, entry, "value x, y, width, height")
    width, height = numbers([result.get("original_width"), result.get("original_height")], 2, path, entry, "original_width, original_height")
    angle = math.radians(float(value.get("rotation") or 0))
    corners = [(x + dx * math.cos(angle) - dy * math.sin(angle), y + dx * math.sin(angle) + dy * math.cos(angle))
               for dx, dy in ((0, 0), (w, 0), (0, h), (w, h))]  # rotation about the top-left corner, in percent units
    xs, ys = [c[0] * width / 100 for c in corners], [c[1] * height / 100 for c in corners]
    return str(labels[0]), (min(xs), min(ys), max(xs), max(ys)), width, height


def read_labelstudio(path: Path, names: dict[int, str] | None = None) -> Split:
    """Read a Label Studio JSON export (see the module docstring)."""
    path = Path(path).resolve()
    tasks = load_json(path)
    if not isinstance(tasks, list) or not all(isinstance(t, dict) for t in tasks):
        raise bad_input(path, "the top level", "is not a Label Studio JSON export (a list of tasks)")
    rects = [[(k, r) for k, r in enumerate(_task_results(t)) if r.get("type") == "rectanglelabels"] for t in tasks]
    found = sorted({str(lb) for task in rects for _, r in task for lb in (r.get("value") or {}).get("rectanglelabels") or []})
    by_name = class_map(found, names, path, "labels")
    out = Split(path, [], dict(names) if names is not None else {i: n for n, i in by_name.items()})
    for i, (task, results) in enumerate(zip(tasks, rects, strict=True)):
        name = _task_image_name(task, path, i)
        image_file = find_image(path.parent, name)
        if image_file is None:
            out.counts["missing_images"] += 1
            if out.counts["missing_images"] == 1:
                out.notes.append(f"{path}: task {task.get('id', i)!r}: image {name} is missing: skipped")
            continue
        image = Image(image_file, safe_name(name, f"{i}.jpg"), *_image_size(image_file))
        for k, result in results:
            label, box, width, height = _result_box(result, path, f"task {task.get('id', i)!r} result {k}")
            image.width, image.height = width, height
            clipped = clip_box(box, width, height, out.counts)
            if clipped is not None:
                image.boxes.append((by_name[label], *clipped))
        out.images.append(image)
    disambiguate(out.images, out.notes)
    return out


def _image_size(path: Path) -> tuple[float, float]:
    """(width, height) from the image header (for a task without boxes, which carries no size)."""
    from PIL import Image as PILImage

    try:
        with PILImage.open(path) as im:
            return float(im.width), float(im.height)
    except Exception as error:  # Pillow raises many types for a bad file
        raise bad_input(path, "the image", f"cannot be read ({type(error).__name__}: {error})") from None
