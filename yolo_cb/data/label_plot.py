"""labels.jpg, as Ultralytics draws it at the start of training: what the training labels look like.

Four panels on a small Agg canvas (no pyplot, no display): boxes per class (a bar each), the boxes themselves drawn
centred (up to ``MAX_DRAWN``), box centres (x, y) and box sizes (width, height) as 2-D histograms, all in image
fractions. It costs a few hundred milliseconds, whatever the dataset's size: the boxes are one collection (not an artist
each) and the margins are fixed (no tight layout, which measures every label).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from yolo_cb.utils.files import atomic_write_bytes
from yolo_cb.utils.plotting import plot_text

MAX_DRAWN = 500  # boxes drawn in the rectangles panel
BINS = 50  # per axis of the 2-D histograms
MARGINS = dict(left=0.1, right=0.97, bottom=0.08, top=0.97, wspace=0.3, hspace=0.45)  # figure fractions; room for rotated class names


def label_arrays(labels: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(cls (n,), boxes (n, 4) normalised cx cy w h) of every box of the label records."""
    cls = [np.asarray(lb["cls"]).reshape(-1) for lb in labels]
    boxes = [np.asarray(lb["bboxes"], dtype=np.float64).reshape(-1, 4) for lb in labels]
    return (np.concatenate(cls) if cls else np.zeros(0)).astype(int), np.concatenate(boxes) if boxes else np.zeros((0, 4))


def plot_labels(labels: list[dict], names: dict[int, str], path: Path) -> Path:
    """Draw labels.jpg (see the module docstring) from label records (``cls``, ``bboxes`` normalised cx cy w h)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cls, boxes = label_arrays(labels)
    fig = Figure(figsize=(6, 6))
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2, gridspec_kw=MARGINS).ravel()
    counts = np.bincount(cls, minlength=len(names)) if len(cls) else np.zeros(len(names), int)
    axes[0].bar(range(len(counts)), counts, color="#3b75af")
    axes[0].set_ylabel("instances")
    if len(names) <= 30:
        axes[0].set_xticks(range(len(names)), [plot_text(names[c]) for c in sorted(names)], rotation=90, fontsize=7)
    _rectangles(axes[1], boxes[:MAX_DRAWN], cls[:MAX_DRAWN])
    for ax, (i, j), (a, b) in ((axes[2], (0, 1), ("x", "y")), (axes[3], (2, 3), ("width", "height"))):
        ax.hist2d(boxes[:, i], boxes[:, j], bins=BINS, range=[[0, 1], [0, 1]], cmap="Blues")
        ax.set_xlabel(a)
        ax.set_ylabel(b)
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=100, format="jpg")
    atomic_write_bytes(Path(path), buffer.getvalue())
    return Path(path)


def _rectangles(ax, boxes: np.ndarray, cls: np.ndarray) -> None:
    """The boxes drawn centred on (0.5, 0.5), coloured by class: their shapes and sizes at a glance."""
    from matplotlib import colormaps
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle

    colours = colormaps["tab20"]
    rectangles = [Rectangle((0.5 - w / 2, 0.5 - h / 2), w, h) for _, _, w, h in boxes]
    edges = [colours(int(c) % 20) for c in cls]
    ax.add_collection(PatchCollection(rectangles, facecolors="none", edgecolors=edges, linewidths=0.5, alpha=0.4))
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("equal")
    ax.axis("off")
