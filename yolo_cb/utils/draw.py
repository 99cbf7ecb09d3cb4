"""Drawing boxes: one image's detections (what `Results.plot()` draws) and a grid of batch images for the
visualisation callback, so saved predictions and training plots look the same: class colours from one palette,
names, scores for predictions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from yolo_cb.utils.files import atomic_write_bytes

if TYPE_CHECKING:  # the functions import torch: the visualisation callbacks are registered before torch loads
    import torch

MAX_IMAGES = 16  # at most this many images of a batch are drawn (a 4 x 4 grid)
MAX_CANVAS = 1920  # the grid's longest side is at most this many pixels
MIN_TILE = 320  # small images are enlarged to about this size so names and scores stay readable
JPEG_QUALITY = 90

# Ultralytics' palette (hex), so plots look familiar; class i gets colour i % 20.
_PALETTE_HEX = ("FF3838", "FF9D97", "FF701F", "FFB21D", "CFD231", "48F90A", "92CC17", "3DDB86", "1A9334", "00D4BB",
                "2C99A8", "00C2FF", "344593", "6473FF", "0018EC", "8438FF", "520085", "CB38FF", "FF95C8", "FF37C7")
PALETTE_BGR = tuple((int(h[4:6], 16), int(h[2:4], 16), int(h[0:2], 16)) for h in _PALETTE_HEX)


COLOR_MODES = ("class", "instance")  # Results.plot(color_mode=): a colour per class, or per detection (Ultralytics' choices)
FONT_PX_PER_SCALE = 30  # a PIL font of size s has capitals about 0.72 s high; OpenCV's simplex font at scale 1, 22 px


def class_color(cls: int) -> tuple[int, int, int]:
    """The BGR colour of class `cls`."""
    return PALETTE_BGR[int(cls) % len(PALETTE_BGR)]


def draw_detections(canvas: np.ndarray, rows: Sequence[Sequence[float]], names: dict[int, str], line_width: int | None = None,
                    labels: bool = True, conf: bool = True, font_size: float | None = None, color_mode: str = "class") -> np.ndarray:
    """Draw `rows` [x1, y1, x2, y2, score, cls] (pixels) onto BGR `canvas` in place: each box, its class name and
    score in the class colour (color_mode="instance": the i-th row's colour of the palette); returns the canvas.
    font_size: the text's size in pixels, as a PIL font size (default: from the line width)."""
    import cv2

    if color_mode not in COLOR_MODES:
        raise ValueError(f"invalid color_mode {color_mode!r}: give one of {', '.join(COLOR_MODES)}")
    if font_size is not None and not (isinstance(font_size, (int, float)) and font_size > 0):
        raise ValueError(f"invalid font_size {font_size!r}: give the text size in pixels, a number > 0")
    lw = line_width or max(round(sum(canvas.shape[:2]) / 2 * 0.003), 2)
    font_scale = lw / 3 if font_size is None else font_size / FONT_PX_PER_SCALE
    thickness = max(lw - 1, 1)
    for i, (x1, y1, x2, y2, score, cls) in enumerate(rows):
        color = class_color(int(cls) if color_mode == "class" else i)
        p1, p2 = (int(round(x1)), int(round(y1))), (int(round(x2)), int(round(y2)))
        cv2.rectangle(canvas, p1, p2, color, lw, cv2.LINE_AA)
        if not labels:
            continue
        label = names.get(int(cls), str(int(cls))) + (f" {score:.2f}" if conf else "")
        (tw, th), base = cv2.getTextSize(label, cv2.FONT_HERSHEY_SIMPLEX, font_scale, thickness)
        outside = p1[1] - th - base - 3 >= 0  # label above the box if it fits, else inside
        top = p1[1] - th - base - 3 if outside else p1[1]
        cv2.rectangle(canvas, (p1[0], top), (p1[0] + tw + 2, top + th + base + 3), color, -1, cv2.LINE_AA)
        text_color = (0, 0, 0) if sum(color) > 382 else (255, 255, 255)
        cv2.putText(canvas, label, (p1[0] + 1, top + th + 1), cv2.FONT_HERSHEY_SIMPLEX, font_scale, text_color, thickness, cv2.LINE_AA)
    return canvas


def tile_scale(image_hw: tuple[int, int], n: int) -> float:
    """The enlargement factor of each tile: tiles of about MIN_TILE px, the whole grid at most MAX_CANVAS px."""
    side = max(image_hw)
    cols = math.ceil(math.sqrt(n))
    return min(MAX_CANVAS / (cols * side), max(1.0, MIN_TILE / side))


def draw_boxes(img: np.ndarray, boxes: np.ndarray | torch.Tensor, names: dict[int, str], scores: bool = False,
               line_width: int | None = None) -> np.ndarray:
    """A copy of BGR `img` with `boxes` (n, 6) [x1, y1, x2, y2, score, cls] (pixels of img) drawn."""
    import torch

    rows = torch.as_tensor(boxes, dtype=torch.float32).reshape(-1, 6).tolist()
    return draw_detections(np.ascontiguousarray(img.copy()), rows, names, line_width, labels=True, conf=scores)


def plot_batch(images: torch.Tensor, boxes: Sequence[np.ndarray | torch.Tensor], names: dict[int, str], path: str | Path | None = None,
               scores: bool = False, tile: float | None = None, max_images: int = MAX_IMAGES) -> np.ndarray:
    """Draw a batch as a grid and optionally save it as a JPEG; returns the BGR grid.

    images: uint8 (B, 3, H, W) RGB (a loader batch's "img"); boxes: per image (n, 6) [x1, y1, x2, y2, score, cls]
    in pixels of `images`; scores: write "name 0.87" instead of "name". Each image is enlarged by `tile`
    (default `tile_scale`) and placed row by row on a white canvas with a 2 px gap.
    """
    import cv2
    import torch

    images = images[:max_images]
    n, _, h, w = images.shape
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    s = tile if tile is not None else tile_scale((h, w), n)
    th, tw = round(h * s), round(w * s)
    gap = 2
    canvas = np.full((rows * th + (rows - 1) * gap, cols * tw + (cols - 1) * gap, 3), 255, dtype=np.uint8)
    for i in range(n):
        img = np.ascontiguousarray(images[i].detach().cpu().numpy().transpose(1, 2, 0)[..., ::-1])  # RGB CHW -> BGR HWC
        if (th, tw) != (h, w):
            img = cv2.resize(img, (tw, th), interpolation=cv2.INTER_LINEAR)
        data = torch.as_tensor(boxes[i] if i < len(boxes) else np.zeros((0, 6)), dtype=torch.float32).reshape(-1, 6).clone()
        data[:, :4] *= torch.tensor([tw / w, th / h, tw / w, th / h])
        img = draw_boxes(img, data, names, scores=scores)
        r, c = divmod(i, cols)
        y, x = r * (th + gap), c * (tw + gap)
        canvas[y : y + th, x : x + tw] = img
    if path is not None:
        write_image(path, canvas)
    return canvas


def write_image(path: str | Path, image: np.ndarray) -> Path:
    """`image` (BGR) encoded by its suffix (.jpg when none) and written as every file of a run: to a new temp name renamed
    over `path`, so a file planted at the name (a link, a hard link) is replaced, never written through."""
    import cv2

    path = Path(path)
    ok, encoded = cv2.imencode(path.suffix or ".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    if not ok:
        raise OSError(f"could not write image {path}")
    atomic_write_bytes(path, encoded.tobytes())
    return path


def targets_to_boxes(targets: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    """Loader targets (N, 6) [image index, cls, cx, cy, w, h] (pixels) -> per image (n, 6) [x1, y1, x2, y2, 1, cls]."""
    import torch

    targets = targets.detach().float().cpu()
    out = []
    for i in range(batch_size):
        t = targets[targets[:, 0] == i]
        cx, cy, bw, bh = t[:, 2], t[:, 3], t[:, 4], t[:, 5]
        out.append(torch.stack((cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2, torch.ones_like(cx), t[:, 1]), 1))
    return out
