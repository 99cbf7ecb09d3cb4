"""LabelMe (one JSON per image) and Label Studio (a JSON export of tasks) -> Split, read with the standard json module.

LabelMe: every ``*.json`` under the source folder (or the one file given); the image is ``imagePath`` relative to its
JSON, else the file beside the JSON with the same stem. ``rectangle`` and ``polygon`` shapes become their bounding box,
``circle`` (centre, a point on the rim) its square; ``point``, ``line``, ``linestrip`` shapes are skipped and counted.

Label Studio (Export -> JSON): a list of tasks; the image is the last part of ``data.image`` (or of its ``?d=`` path
for local files), looked up beside the export, then in ``images/`` beside it; a name that keeps Label Studio's upload
prefix (``/data/upload/1/3f2a9c1e-cat.jpg``: 8 hex digits and a dash) is looked up as it is, then as the user's own
file (``cat.jpg``), whose name it then keeps in the YOLO folder. Of each task the first annotation that was not
cancelled is read; its ``rectanglelabels`` results (percent of ``original_width``/``original_height``, turned by
``rotation`` degrees about the top-left corner) become the axis-aligned box around them.

Both: classes are the data ``names`` given (a label of another class is an error naming it), else every label met,
sorted; boxes are clipped to the image, boxes without area dropped, images without boxes kept as backgrounds,
images whose file is missing skipped; each counted; an export where no image is found is a DataError naming the
folders looked in. The dataset root is the LabelMe folder (the JSON's folder when one file is given) or the Label
Studio export's folder: an image whose path resolves outside it (``../``, an absolute path
elsewhere, a link that points out) is skipped, counted and summed up in one note; nothing outside is read. A task,
annotation, result or value of the wrong kind, a rotation that is not a finite number: a DataError naming the task.
"""

from __future__ import annotations

import math
import re
from pathlib import Path, PurePosixPath
from urllib.parse import parse_qs, unquote, urlparse

from yolo_cb.data.formats.coco import load_json
from yolo_cb.data.formats.common import Image, Split, bad_input, class_map, clip_box, finish, finite, locate, numbers, safe_name
from yolo_cb.data.verify import IMG_SUFFIXES
from yolo_cb.errors import short_repr

BOX_SHAPES = ("rectangle", "polygon", "circle")
UPLOADED = re.compile(r"[0-9a-f]{8}-(.+)")  # Label Studio stores an uploaded cat.jpg as 3f2a9c1e-cat.jpg


def _labelme_files(source: Path) -> list[Path]:
    return [source] if source.is_file() else sorted(p for p in source.rglob("*.json") if p.is_file())


def _labelme_image(out: Split, json_file: Path, data: dict) -> tuple[Path, Path] | None:
    """The image of a LabelMe file: ``imagePath`` relative to it, else the image beside it with its stem; inside the root."""
    named = data.get("imagePath")
    given = [json_file.parent / named.replace("\\", "/")] if isinstance(named, str) and named else []
    beside = [p for p in sorted(json_file.parent.glob(json_file.stem + ".*")) if p.suffix.lower() in IMG_SUFFIXES]
    shown = named if given else beside[0].name if beside else json_file.stem
    if json_file.parent not in out.looked[-1:]:  # the files of a folder come together
        out.looked.append(json_file.parent)
    return locate(out, given + beside, shown, f"{json_file.name} imagePath",
                  f"{json_file}: its image ({short_repr(named)}) is missing: skipped")


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
    base = source if source.is_dir() else source.parent
    out = Split(source, [], dict(names) if names is not None else {i: n for n, i in by_name.items()}, root=base)
    out.images = [image for f, data in files if (image := _labelme_entry(out, f, data, by_name)) is not None]
    return finish(out)


def _labelme_entry(out: Split, f: Path, data: dict, by_name: dict[str, int]) -> Image | None:
    """The Image of one LabelMe file (None when its image is missing or outside the root), its shapes as boxes."""
    located = _labelme_image(out, f, data)
    if located is None:
        return None
    width, height = numbers([data.get("imageWidth"), data.get("imageHeight")], 2, f, "imageWidth, imageHeight", "the image size")
    name = str(PurePosixPath(f.relative_to(out.root).as_posix()).with_suffix(located[1].suffix))
    image = Image(located[1], name, width, height)
    for k, shape in enumerate(data.get("shapes", [])):
        if not isinstance(shape, dict) or shape.get("shape_type", "polygon") not in BOX_SHAPES:
            out.counts["unsupported_shapes"] += 1
            continue
        box = clip_box(_shape_box(shape, f, f"shapes[{k}] ({short_repr(shape.get('label'))})"), width, height, out.counts)
        if box is not None:
            image.boxes.append((by_name[str(shape.get("label"))], *box))
    return image


def _task_image_name(task: dict, path: Path, i: int) -> str:
    image = (task.get("data") or {}).get("image") if isinstance(task.get("data"), dict) else None
    entry = f"task {short_repr(task.get('id', i))}"
    if not isinstance(image, str) or not image:
        raise bad_input(path, entry, f"needs data.image (the image's URL or path), got {short_repr(task.get('data'))}")
    try:
        url = urlparse(image)
        local = parse_qs(url.query).get("d")
    except ValueError as error:
        raise bad_input(path, entry, f"data.image {short_repr(image)} is not a valid URL or path ({error})") from None
    return PurePosixPath(unquote(local[0] if local else url.path)).name


def _objects(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) for v in value)


def _task_results(task: dict, path: Path, i: int) -> list[tuple[int, dict]]:
    """(index, result) of each rectangle of the task's first annotation not cancelled; a DataError naming the task when
    its annotations, their result or a rectangle's value is of the wrong kind."""
    entry = f"task {short_repr(task.get('id', i))}"
    annotations = [] if task.get("annotations") is None else task["annotations"]
    if not _objects(annotations):
        raise bad_input(path, entry, f"'annotations' must be a list of objects, got {short_repr(annotations)}")
    kept = [k for k, a in enumerate(annotations) if not a.get("was_cancelled")]
    if not kept:
        return []
    results = [] if annotations[kept[0]].get("result") is None else annotations[kept[0]]["result"]
    if not _objects(results):
        raise bad_input(path, f"{entry} annotation {kept[0]}", f"'result' must be a list of objects, got {short_repr(results)}")
    rects = [(k, r) for k, r in enumerate(results) if r.get("type") == "rectanglelabels"]
    for k, result in rects:
        value = result.get("value")
        if not isinstance(value, dict):
            raise bad_input(path, f"{entry} result {k}", f"'value' must be an object, got {short_repr(value)}")
        labels = value.get("rectanglelabels")
        if not isinstance(labels, list) or len(labels) != 1 or not isinstance(labels[0], str):
            raise bad_input(path, f"{entry} result {k}", f"value.rectanglelabels must name one class, got {short_repr(labels)}")
    return rects


def _rotation(value: dict, path: Path, entry: str) -> float:
    """The rectangle's rotation in radians (0 when not given); a DataError unless a finite number of degrees."""
    raw = value.get("rotation")
    degrees = 0.0 if raw is None else finite(raw)
    if degrees is None:
        raise bad_input(path, entry, f"value.rotation must be a number (degrees), got {short_repr(raw)}")
    return math.radians(degrees % 360)


def _result_box(result: dict, path: Path, entry: str) -> tuple[str, tuple[float, ...], float, float]:
    value = result["value"]
    x, y, w, h = numbers([value.get(k) for k in ("x", "y", "width", "height")], 4, path, entry, "value x, y, width, height")
    width, height = numbers([result.get("original_width"), result.get("original_height")], 2, path, entry, "original_width, original_height")
    angle = _rotation(value, path, entry)
    corners = [(x + dx * math.cos(angle) - dy * math.sin(angle), y + dx * math.sin(angle) + dy * math.cos(angle))
               for dx, dy in ((0, 0), (w, 0), (0, h), (w, h))]  # rotation about the top-left corner, in percent units
    xs, ys = [c[0] * width / 100 for c in corners], [c[1] * height / 100 for c in corners]
    return value["rectanglelabels"][0], (min(xs), min(ys), max(xs), max(ys)), width, height


def read_labelstudio(path: Path, names: dict[int, str] | None = None) -> Split:
    """Read a Label Studio JSON export (see the module docstring)."""
    path = Path(path).resolve()
    tasks = load_json(path)
    if not isinstance(tasks, list) or not all(isinstance(t, dict) for t in tasks):
        raise bad_input(path, "the top level", "is not a Label Studio JSON export (a list of tasks)")
    rects = [_task_results(t, path, i) for i, t in enumerate(tasks)]
    found = sorted({r["value"]["rectanglelabels"][0] for task in rects for _, r in task})
    by_name = class_map(found, names, path, "labels")
    out = Split(path, [], dict(names) if names is not None else {i: n for n, i in by_name.items()}, root=path.parent,
                looked=[path.parent, path.parent / "images"])
    for i, (task, results) in enumerate(zip(tasks, rects, strict=True)):
        image = _task_image(out, task, i)
        if image is None:
            continue
        for k, result in results:
            label, box, width, height = _result_box(result, path, f"task {short_repr(task.get('id', i))} result {k}")
            image.width, image.height = width, height
            clipped = clip_box(box, width, height, out.counts)
            if clipped is not None:
                image.boxes.append((by_name[label], *clipped))
        out.images.append(image)
    return finish(out)


def _task_image(out: Split, task: dict, i: int) -> Image | None:
    """The Image of a task (no boxes yet): its file beside the export or in images/ there, by its name, then by the
    name without Label Studio's upload prefix; None when missing or outside."""
    name = _task_image_name(task, out.source, i)
    uploaded = UPLOADED.fullmatch(name)
    names = [name, uploaded.group(1)] if uploaded else [name]
    entry = f"task {short_repr(task.get('id', i))}"
    shown = short_repr(name) + (f" (or {short_repr(names[1])}, without the upload prefix)" if len(names) > 1 else "")
    located = locate(out, [folder / n for n in names for folder in out.looked], name, f"{entry} data.image",
                     f"{out.source}: {entry}: image {shown} is in neither {' nor '.join(str(f) for f in out.looked)}: skipped")
    return None if located is None else Image(located[1], safe_name(located[0].name, f"{i}.jpg"), *_image_size(located[1]))


def _image_size(path: Path) -> tuple[float, float]:
    """(width, height) from the image header (for a task without boxes, which carries no size)."""
    from PIL import Image as PILImage

    try:
        with PILImage.open(path) as im:
            return float(im.width), float(im.height)
    except Exception as error:  # Pillow raises many types for a bad file
        raise bad_input(path, "the image", f"cannot be read ({type(error).__name__}: {error})") from None
