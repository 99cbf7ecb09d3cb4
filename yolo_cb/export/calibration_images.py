"""Images an export is checked on: the first image of the dataset when it is on disk, else a generated test scene."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from yolo_cb.data.dataset_yaml import resolve_datasets_dir
from yolo_cb.data.verify import IMG_SUFFIXES
from yolo_cb.errors import DataError
from yolo_cb.utils.files import LIST_FILE, read_bounded_text
from yolo_cb.utils.paths import find_dataset_cfg
from yolo_cb.utils.yaml_safe import load_yaml


def sample_image(shape: tuple[int, int] = (480, 640), seed: int = 0) -> np.ndarray:
    """A generated, deterministic test scene (HWC BGR uint8): gradient background, texture and filled shapes.

    Used when no dataset image can be found: it exercises the network like a photo does (edges, flat areas,
    colours), unlike uniform noise.
    """
    import cv2

    h, w = shape
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack((60 + 120 * xs / w, 90 + 100 * ys / h, 180 - 80 * (xs + ys) / (w + h)), axis=-1)
    img += rng.normal(0, 6, size=img.shape)
    img = np.clip(img, 0, 255).astype(np.uint8)
    for i in range(12):
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        cx, cy = int(rng.integers(0, w)), int(rng.integers(0, h))
        size = int(rng.integers(min(h, w) // 16, min(h, w) // 4))
        if i % 3 == 0:
            cv2.rectangle(img, (cx - size, cy - size // 2), (cx + size, cy + size // 2), color, -1)
        elif i % 3 == 1:
            cv2.circle(img, (cx, cy), size // 2, color, -1)
        else:
            pts = np.array([[cx, cy - size], [cx - size, cy + size // 2], [cx + size, cy + size // 2]], dtype=np.int32)
            cv2.fillPoly(img, [pts], color)
    cv2.putText(img, "yolo-cb", (w // 10, h // 2), cv2.FONT_HERSHEY_SIMPLEX, max(h, w) / 400, (255, 255, 255), 2)
    return img


def dataset_image(data: Any, datasets_dir: str | None = None) -> Path | None:
    """The first image of a dataset YAML's val (else train) split when it is already on disk; else None (never downloads)."""
    if not data:
        return None
    try:
        yaml_file = find_dataset_cfg(str(data)).resolve()
        cfg = load_yaml(yaml_file, DataError, "dataset YAML") or {}  # the bounded loader: an alias bomb is refused here too
        base = str(cfg.get("path") or "")
        if not base:
            roots = [yaml_file.parent]
        elif Path(base).expanduser().is_absolute():
            roots = [Path(base).expanduser()]
        else:
            roots = [Path.cwd() / base, yaml_file.parent / base, resolve_datasets_dir(datasets_dir) / base]  # as check_data
    except Exception:  # an unresolvable dataset only means: use the generated test scene
        return None
    for split in ("val", "train", "test"):
        entries = cfg.get(split)
        for entry in entries if isinstance(entries, list) else [entries]:
            if not entry:
                continue
            for root in roots:
                found = _first_image(Path(entry).expanduser() if Path(entry).expanduser().is_absolute() else root / entry)
                if found is not None:
                    return found
    return None


def _first_image(candidate: Path) -> Path | None:
    if candidate.is_dir():
        return next((p for p in sorted(candidate.rglob("*")) if p.suffix.lower() in IMG_SUFFIXES), None)
    if candidate.is_file() and candidate.suffix.lower() in IMG_SUFFIXES:
        return candidate
    if candidate.is_file() and candidate.suffix.lower() == ".txt":
        try:
            lines = read_bounded_text(candidate, LIST_FILE, "image list").splitlines()[:100]
        except (DataError, OSError, UnicodeDecodeError):  # not a list it can use: the generated scene is used instead
            return None
        for line in lines:
            path = Path(line.strip())
            path = path if path.is_absolute() else candidate.parent / path
            if line.strip() and path.is_file() and path.suffix.lower() in IMG_SUFFIXES:
                return path
    return None
