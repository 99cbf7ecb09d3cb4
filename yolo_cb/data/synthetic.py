"""A synthetic, deterministic YOLO-format dataset: filled shapes on cluttered backgrounds.

Classes: circle, rectangle, triangle, cross. Each image has a gradient + noise background with
distractor lines, and several non-touching shapes of varied size, aspect ratio and rotation.
Boxes are tight: computed from the pixels each shape covers. The same seed always gives the
same files (each image has its own generator seeded from (seed, split, index)).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

LOGGER = logging.getLogger("yolo_cb")

SHAPE_NAMES = ("circle", "rectangle", "triangle", "cross")
SPLITS = ("train", "val")
MIN_SIZE, MAX_SIZE = 200, 420  # default image height/width range, pixels
MAX_OBJECTS = 6  # default: up to this many shapes per image
JPEG_QUALITY = 90  # default JPEG quality
# A noisy shapes JPEG holds at most this fraction of its raw bytes (measured at 420 px: 0.11 at quality 90, 0.39 at 100)
JPEG_FRACTION = 0.5
FILE_OVERHEAD = 8192  # bytes per image beyond its JPEG: its label file, and both files' last file-system blocks


def estimated_bytes(images: int, max_size: int) -> int:
    """An upper estimate of the disk space `images` generated images of at most max_size x max_size pixels take."""
    return images * (int(max_size * max_size * 3 * JPEG_FRACTION) + FILE_OVERHEAD)


def cluttered_background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A two-colour linear gradient at a random angle, Gaussian noise and a few random lines."""
    import cv2  # here: reading a data YAML's generate: settings loads no OpenCV (yolo_cb/data/data_yaml.py)
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    angle = rng.uniform(0, 2 * math.pi)
    ramp = np.cos(angle) * np.arange(w, dtype=np.float32)[None, :] + np.sin(angle) * np.arange(h, dtype=np.float32)[:, None]
    ramp = (ramp - ramp.min()) / max(float(np.ptp(ramp)), 1e-6)
    img = c0.astype(np.float32) + (c1 - c0).astype(np.float32) * ramp[..., None]
    img += rng.normal(0, rng.uniform(3, 16), (h, w, 3)).astype(np.float32)
    img = np.clip(img, 0, 255).astype(np.uint8)
    for _ in range(int(rng.integers(2, 9))):
        p1 = (int(rng.integers(0, w)), int(rng.integers(0, h)))
        p2 = (int(rng.integers(0, w)), int(rng.integers(0, h)))
        cv2.line(img, p1, p2, [int(v) for v in rng.integers(0, 256, 3)], int(rng.integers(1, 4)), cv2.LINE_AA)
    return img


def _rotated(points: np.ndarray, angle: float, cx: float, cy: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    rot = np.array([[c, -s], [s, c]])
    return points @ rot.T + (cx, cy)


def shape_mask(kind: str, h: int, w: int, cx: float, cy: float, size: float, rng: np.random.Generator) -> np.ndarray:
    """A uint8 mask (h, w) of one filled shape of about ``size`` pixels centred at (cx, cy)."""
    import cv2  # here: reading a data YAML's generate: settings loads no OpenCV (yolo_cb/data/data_yaml.py)
    mask = np.zeros((h, w), np.uint8)
    if kind == "circle":
        aspect = rng.uniform(0.85, 1.15)  # nearly round
        axes = (max(2, int(size * aspect / 2)), max(2, int(size / aspect / 2)))
        cv2.ellipse(mask, (int(cx), int(cy)), axes, 0, 0, 360, 255, -1)
        return mask
    if kind == "rectangle":
        aspect = math.exp(rng.uniform(math.log(0.35), math.log(2.8)))
        hw, hh = size * math.sqrt(aspect) / 2, size / math.sqrt(aspect) / 2
        pts = np.array([[-hw, -hh], [hw, -hh], [hw, hh], [-hw, hh]])
        polys = [_rotated(pts, math.radians(rng.uniform(-25, 25)), cx, cy)]
    elif kind == "triangle":
        # three vertices at jittered angles around the centre, any rotation
        base = rng.uniform(0, 2 * math.pi)
        angles = base + np.array([0, 2 * math.pi / 3, 4 * math.pi / 3]) + rng.uniform(-0.35, 0.35, 3)
        radius = size / 2 * rng.uniform(0.8, 1.0, 3)
        polys = [np.stack([cx + radius * np.cos(angles), cy + radius * np.sin(angles)], 1)]
    elif kind == "cross":
        arm = size * rng.uniform(0.12, 0.22)
        long_x, long_y = size / 2, size / 2 * rng.uniform(0.7, 1.3)
        bar_h = np.array([[-long_x, -arm], [long_x, -arm], [long_x, arm], [-long_x, arm]])
        bar_v = np.array([[-arm, -long_y], [arm, -long_y], [arm, long_y], [-arm, long_y]])
        a = math.radians(rng.uniform(-20, 20))
        polys = [_rotated(bar_h, a, cx, cy), _rotated(bar_v, a, cx, cy)]
    else:
        raise ValueError(f"unknown shape '{kind}' (known: {', '.join(SHAPE_NAMES)})")
    for poly in polys:  # one at a time: fillPoly with several polygons leaves their overlap empty
        cv2.fillPoly(mask, [np.round(poly).astype(np.int32)], 255)
    return mask


def _contrasting_colour(rng: np.random.Generator, background: np.ndarray) -> list[int]:
    mean = background.reshape(-1, 3).mean(0)
    for _ in range(20):
        colour = rng.integers(0, 256, 3)
        if np.abs(colour - mean).sum() > 120:
            break
    return [int(v) for v in colour]


def make_shapes_image(rng: np.random.Generator, min_size: int, max_size: int, max_objects: int, names=SHAPE_NAMES):
    """One image and its labels [(class, cx, cy, w, h) normalised]."""
    h, w = (int(rng.integers(min_size, max_size + 1)) for _ in range(2))
    img = cluttered_background(rng, h, w)
    boxes, labels = [], []
    n_objects = 0 if rng.random() < 0.04 else int(rng.integers(1, max_objects + 1))
    for _ in range(n_objects):
        for _attempt in range(30):
            size = float(rng.uniform(0.08, 0.38) * min(h, w))
            half = size * 0.75  # generous bound on the shape's extent (aspect/rotation)
            cx, cy = rng.uniform(half * 0.6, w - half * 0.6), rng.uniform(half * 0.6, h - half * 0.6)
            rough = (cx - half, cy - half, cx + half, cy + half)
            if all(rough[2] < b[0] - 2 or rough[0] > b[2] + 2 or rough[3] < b[1] - 2 or rough[1] > b[3] + 2 for b in boxes):
                break
        else:
            continue
        k = int(rng.integers(len(names)))
        mask = shape_mask(names[k], h, w, cx, cy, size, rng)
        ys, xs = np.nonzero(mask)
        if len(xs) < 16:
            continue
        x1, y1, x2, y2 = int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1
        if any(not (x2 < b[0] or x1 > b[2] or y2 < b[1] or y1 > b[3]) for b in boxes):
            continue  # would touch an earlier shape: boxes must stay tight and unoccluded
        img[mask > 0] = _contrasting_colour(rng, img[y1:y2, x1:x2])
        boxes.append((x1, y1, x2, y2))
        labels.append((k, (x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h))
    return img, labels


def generate_shapes(root, n_train: int, n_val: int, seed: int = 0, min_size: int = MIN_SIZE, max_size: int = MAX_SIZE,
                    max_objects: int = MAX_OBJECTS, names=SHAPE_NAMES, jpeg_quality: int = JPEG_QUALITY) -> Path:
    """Write ``images/{train,val}/*.jpg``, ``labels/{train,val}/*.txt`` and ``data.yaml`` under ``root``.

    Built in a temporary sibling folder and renamed into place at the end, so an interrupted run
    never leaves a half dataset behind. Returns the path of ``data.yaml``.
    """
    import cv2  # here: reading a data YAML's generate: settings loads no OpenCV (yolo_cb/data/data_yaml.py)
    import yaml
    from tqdm import tqdm

    root = Path(root)
    if min_size < 32 or max_size < min_size:
        raise ValueError(f"need 32 <= min_size <= max_size (got {min_size}, {max_size})")
    root.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        for split_id, (split, n) in enumerate(zip(SPLITS, (n_train, n_val), strict=True)):
            (work / "images" / split).mkdir(parents=True)
            (work / "labels" / split).mkdir(parents=True)
            for i in tqdm(range(n), desc=f"generating shapes {split}", leave=False):
                rng = np.random.default_rng([seed, split_id, i])
                img, labels = make_shapes_image(rng, min_size, max_size, max_objects, names)
                stem = f"{split}_{i:05d}"
                cv2.imwrite(str(work / "images" / split / f"{stem}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, jpeg_quality])
                text = "".join(f"{k} {cx:.6f} {cy:.6f} {bw:.6f} {bh:.6f}\n" for k, cx, cy, bw, bh in labels)
                (work / "labels" / split / f"{stem}.txt").write_text(text)
        meta = {"train": "images/train", "val": "images/val", "names": dict(enumerate(names))}
        (work / "data.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
        if root.exists() and not any(root.iterdir()):
            root.rmdir()
        os.rename(work, root)
    except OSError:
        if root.is_dir() and (root / "data.yaml").is_file():  # another process finished first
            shutil.rmtree(work, ignore_errors=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
            raise
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    LOGGER.info(f"generated shapes dataset: {n_train} train + {n_val} val images in {root}")
    return root / "data.yaml"
