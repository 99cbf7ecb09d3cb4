"""One YOLO label file read and checked: its rows as boxes, what was fixed, or why the whole file is not trusted.

A row is ``class cx cy w h`` (normalised to the image), or a polygon ``class x1 y1 x2 y2 ... xn yn`` (Ultralytics'
segmentation format: an odd number of 7 or more columns), which becomes its bounding box (the minimum and maximum of
its points), as Ultralytics trains a detector on it; polygon rows are counted so that a split says how many it boxed.

A line with another number of columns, a non-number, a non-finite value, or a class id that is not an integer in
``[0, nc)`` makes the whole label untrustworthy (the image is skipped). Boxes whose corners leave ``[0, 1]`` by at most
``COORD_TOLERANCE`` are clipped; boxes further out, or without area, are dropped; duplicate rows are removed.
A missing label file means a background image.
"""

from __future__ import annotations

import numpy as np

from yolo_cb.utils.files import LABEL_FILE, FileRefused, read_bounded_text

COORD_TOLERANCE = 0.01  # box corners may leave [0, 1] by this much (fraction of the image) and are clipped
ROUNDING = 1e-4  # excursions this small come from rounded coordinates: clipped without a note
BOX_COLUMNS = 5  # class cx cy w h
MIN_POLYGON_COLUMNS = 7  # class and 3 points


class BadRow(ValueError):
    """A label line that makes its whole file untrustworthy; the text says which line and why."""


def is_polygon(columns: int) -> bool:
    """Whether a row of `columns` columns is a segmentation polygon (class and 3 or more x y points)."""
    return columns >= MIN_POLYGON_COLUMNS and columns % 2 == 1


def polygons_boxed(count: int) -> str:
    """The line that says how many polygon rows of a split were boxed."""
    return (f"{count} polygon rows boxed (segmentation rows 'class x1 y1 ... xn yn': each is trained as its polygon's "
            f"bounding box, as Ultralytics does)")


def parse_row(line: str, lineno: int, nc: int) -> tuple[float, tuple[float, float, float, float]]:
    """(class id, normalised corners x1 y1 x2 y2) of one label line: a box, or a polygon's bounding box; BadRow why not."""
    parts = line.split()
    if len(parts) != BOX_COLUMNS and not is_polygon(len(parts)):
        raise BadRow(f"line {lineno} has {len(parts)} columns, expected 5 (class cx cy w h) or an odd number of 7 or "
                     f"more (class x1 y1 ... xn yn, a polygon)")
    try:
        values = [float(v) for v in parts]
    except ValueError:
        raise BadRow(f"line {lineno} has a non-number: '{line.strip()}'") from None
    if not np.isfinite(values).all():
        raise BadRow(f"line {lineno} has a non-finite value: '{line.strip()}'")
    c = values[0]
    if c != int(c) or not 0 <= c < nc:
        raise BadRow(f"line {lineno}: class id {parts[0]} is not an integer in [0, {nc}) (nc={nc})")
    if len(parts) == BOX_COLUMNS:
        _, cx, cy, w, h = values
        return c, (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
    xs, ys = values[1::2], values[2::2]
    return c, (min(xs), min(ys), max(xs), max(ys))


def verify_label(lb_file: str, nc: int) -> dict:
    """Parse one label file. Returns ``labels`` ((n, 5) rows ``class cx cy w h``), ``notes``, ``missing``, ``corrupt``
    (the reason, or None) and ``polygons`` (how many rows were polygons, boxed)."""
    out = {"labels": np.zeros((0, 5), np.float32), "notes": [], "missing": False, "corrupt": None, "polygons": 0}
    try:
        text = read_bounded_text(lb_file, LABEL_FILE)  # O_NONBLOCK: a FIFO is refused at once, never waited on
    except FileNotFoundError:
        out["missing"] = True
        return out
    except FileRefused as refused:  # a folder, FIFO, device or socket, or more bytes than any label file holds
        out["corrupt"] = refused.reason.split(";")[0]
        return out
    except (OSError, UnicodeDecodeError) as e:
        out["corrupt"] = f"unreadable ({e})"
        return out
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.split()]
    try:
        parsed = [parse_row(line, n, nc) for n, line in lines]
    except BadRow as error:
        out["corrupt"] = str(error)
        return out
    out["polygons"] = sum(is_polygon(len(line.split())) for _, line in lines)
    rows, dropped, clipped = _kept_rows(parsed)
    if dropped:
        out["notes"].append(f"{dropped} box(es) outside the image by more than {COORD_TOLERANCE:.0%} or without area dropped")
    if clipped:
        out["notes"].append(f"{clipped} box(es) slightly outside the image clipped")
    out["labels"] = _without_duplicates(np.array(rows, dtype=np.float32).reshape(-1, 5), out["notes"])
    return out


def _kept_rows(parsed: list[tuple[float, tuple[float, ...]]]) -> tuple[list[tuple[float, ...]], int, int]:
    """(rows ``class cx cy w h``, how many dropped, how many clipped with a note) of the parsed corners."""
    rows, dropped, clipped = [], 0, 0
    for c, (x1, y1, x2, y2) in parsed:
        if x2 - x1 <= 0 or y2 - y1 <= 0 or min(x1, y1) < -COORD_TOLERANCE or max(x2, y2) > 1 + COORD_TOLERANCE:
            dropped += 1
            continue
        if min(x1, y1) < 0 or max(x2, y2) > 1:
            clipped += min(x1, y1) < -ROUNDING or max(x2, y2) > 1 + ROUNDING  # rounding in the file is not worth a note
            x1, y1, x2, y2 = (min(max(v, 0.0), 1.0) for v in (x1, y1, x2, y2))
            if x2 - x1 <= 0 or y2 - y1 <= 0:
                dropped += 1
                continue
        rows.append((c, (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1))
    return rows, dropped, clipped


def _without_duplicates(labels: np.ndarray, notes: list[str]) -> np.ndarray:
    _, first = np.unique(labels, axis=0, return_index=True)
    if len(first) < len(labels):
        notes.append(f"{len(labels) - len(first)} duplicate row(s) removed")
        return labels[np.sort(first)]
    return labels
