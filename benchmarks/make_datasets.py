"""Generated detection datasets of kinds unlike `shapes`, to check that a recipe change is not tuned to one dataset.

    python benchmarks/make_datasets.py [--kinds dense glyphs] [--out ~/.cache/yolo_cb/bench_datasets] [--train 384] [--val 96]

Kinds (each a YOLO folder: data.yaml, images/{train,val}, labels/{train,val}; the same seed gives the same files):
- `dense`: many small objects (12-40 per image, 5-18 px) of 3 classes (disc, square, ring) on a flat noisy background.
- `glyphs`: 10 classes (the digits 0-9 drawn with OpenCV's fonts, stretched to aspect ratios 1:3 to 3:1, 14-90 px)
  on textured backgrounds (stripes, checkerboards and blurred noise in random colours).
The data is written into a cache folder outside the repository (never committed) and reused when it is already
there with the same settings (the settings are kept in the folder's make.json).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import cv2
import numpy as np

CACHE = Path.home() / ".cache" / "yolo_cb" / "bench_datasets"
NAMES = {"dense": ["disc", "square", "ring"], "glyphs": [str(d) for d in range(10)]}


def noisy_flat(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """One random colour with Gaussian noise (the `dense` background)."""
    img = np.full((h, w, 3), rng.integers(30, 226, 3), np.float32) + rng.normal(0, 12, (h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def texture(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Stripes, a checkerboard or blurred noise between two random colours (the `glyphs` background)."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    kind = int(rng.integers(3))
    if kind == 0:
        angle, period = rng.uniform(0, math.pi), rng.uniform(6, 30)
        t = 0.5 + 0.5 * np.sin((xx * math.cos(angle) + yy * math.sin(angle)) * 2 * math.pi / period)
    elif kind == 1:
        cell = int(rng.integers(8, 40))
        t = (((xx // cell) + (yy // cell)) % 2).astype(np.float32)
    else:
        t = cv2.GaussianBlur(rng.random((h, w)).astype(np.float32), (0, 0), float(rng.uniform(2, 8)))
        t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
    c0, c1 = rng.integers(0, 256, 3).astype(np.float32), rng.integers(0, 256, 3).astype(np.float32)
    img = c0 * (1 - t[..., None]) + c1 * t[..., None] + rng.normal(0, 8, (h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def dense_mask(kind: int, h: int, w: int, cx: int, cy: int, s: int) -> np.ndarray:
    mask = np.zeros((h, w), np.uint8)
    if kind == 0:
        cv2.circle(mask, (cx, cy), max(s // 2, 2), 255, -1)
    elif kind == 1:
        cv2.rectangle(mask, (cx - s // 2, cy - s // 2), (cx + s // 2, cy + s // 2), 255, -1)
    else:
        cv2.circle(mask, (cx, cy), max(s // 2, 3), 255, max(s // 5, 1))
    return mask


def glyph_mask(digit: int, h: int, w: int, box: tuple[int, int, int, int], rng: np.random.Generator) -> np.ndarray:
    """The digit rendered large, stretched into `box` (x, y, bw, bh) of an h x w mask."""
    font = [cv2.FONT_HERSHEY_SIMPLEX, cv2.FONT_HERSHEY_DUPLEX, cv2.FONT_HERSHEY_TRIPLEX][int(rng.integers(3))]
    text = str(digit)
    (tw, th), base = cv2.getTextSize(text, font, 3.0, 8)
    tile = np.zeros((th + base + 16, tw + 16), np.uint8)
    cv2.putText(tile, text, (8, th + 8), font, 3.0, 255, 8, cv2.LINE_AA)
    x, y, bw, bh = box
    mask = np.zeros((h, w), np.uint8)
    mask[y:y + bh, x:x + bw] = cv2.resize(tile, (bw, bh), interpolation=cv2.INTER_AREA)
    return mask


def overlaps(box, boxes, limit: float) -> bool:
    x1, y1, x2, y2 = box
    for a1, b1, a2, b2 in boxes:
        inter = max(0, min(x2, a2) - max(x1, a1)) * max(0, min(y2, b2) - max(y1, b1))
        if inter / min((x2 - x1) * (y2 - y1), (a2 - a1) * (b2 - b1)) > limit:
            return True
    return False


def paint(img: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> tuple[int, int, int, int] | None:
    """Fill `mask` with a random colour far from the pixels under it; its tight box, or None when empty."""
    ys, xs = np.nonzero(mask > 127)
    if len(xs) < 4:
        return None
    under = img[ys, xs].mean(axis=0)
    colour = np.where(under > 127, rng.integers(0, 80, 3), rng.integers(176, 256, 3))
    alpha = (mask.astype(np.float32) / 255)[..., None]
    img[:] = (img * (1 - alpha) + colour * alpha).astype(np.uint8)
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


def make_image(kind: str, rng: np.random.Generator) -> tuple[np.ndarray, list[tuple[int, float, float, float, float]]]:
    h, w = int(rng.integers(240, 400)), int(rng.integers(240, 400))
    img = noisy_flat(rng, h, w) if kind == "dense" else texture(rng, h, w)
    count = int(rng.integers(12, 41)) if kind == "dense" else int(rng.integers(1, 9))
    boxes, labels = [], []
    for _ in range(count * 5):
        if len(labels) == count:
            break
        cls = int(rng.integers(len(NAMES[kind])))
        if kind == "dense":
            s = int(rng.integers(5, 19))
            cx, cy = int(rng.integers(s, w - s)), int(rng.integers(s, h - s))
            box = (cx - s // 2 - 1, cy - s // 2 - 1, cx + s // 2 + 1, cy + s // 2 + 1)
        else:
            side, ratio = rng.uniform(14, 90), math.exp(rng.uniform(-math.log(3), math.log(3)))
            bw, bh = max(int(side * math.sqrt(ratio)), 6), max(int(side / math.sqrt(ratio)), 6)
            bw, bh = min(bw, w - 2), min(bh, h - 2)
            x, y = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
            box = (x, y, x + bw, y + bh)
        if overlaps(box, boxes, 0.1):
            continue
        mask = dense_mask(cls, h, w, cx, cy, s) if kind == "dense" else glyph_mask(cls, h, w, (box[0], box[1], bw, bh), rng)
        tight = paint(img, mask, rng)
        if tight is not None:
            boxes.append(box)
            x1, y1, x2, y2 = tight
            labels.append((cls, (x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h))
    return img, labels


def make(kind: str, out: Path, n_train: int, n_val: int, seed: int) -> Path:
    """The dataset folder of `kind` (made unless already there with these settings); returns its data.yaml."""
    folder = out / kind
    recipe = {"kind": kind, "train": n_train, "val": n_val, "seed": seed, "version": 1}
    if (folder / "make.json").is_file() and json.loads((folder / "make.json").read_text()) == recipe:
        return folder / "data.yaml"
    rng = np.random.default_rng([seed, list(NAMES).index(kind)])
    for split, n in (("train", n_train), ("val", n_val)):
        (folder / "images" / split).mkdir(parents=True, exist_ok=True)
        (folder / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            img, labels = make_image(kind, rng)
            cv2.imwrite(str(folder / "images" / split / f"{split}_{i:05d}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, 92])
            (folder / "labels" / split / f"{split}_{i:05d}.txt").write_text(
                "".join(f"{c} {cx:.6f} {cy:.6f} {bw:.6f} {bh:.6f}\n" for c, cx, cy, bw, bh in labels))
    names = "".join(f"  {i}: '{n}'\n" for i, n in enumerate(NAMES[kind]))
    (folder / "data.yaml").write_text(f"path: {folder}\ntrain: images/train\nval: images/val\nnames:\n{names}")
    (folder / "make.json").write_text(json.dumps(recipe))
    return folder / "data.yaml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", nargs="+", choices=sorted(NAMES), default=sorted(NAMES))
    ap.add_argument("--out", type=Path, default=CACHE)
    ap.add_argument("--train", type=int, default=384)
    ap.add_argument("--val", type=int, default=96)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    for kind in a.kinds:
        data = make(kind, a.out.expanduser(), a.train, a.val, a.seed)
        labels = [len(p.read_text().splitlines()) for p in (data.parent / "labels" / "train").glob("*.txt")]
        print(f"{kind}: {data} ({len(labels)} train images, {sum(labels) / max(len(labels), 1):.1f} boxes per image)")


if __name__ == "__main__":
    main()
