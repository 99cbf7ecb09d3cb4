"""Validation plots: confusion matrix, PR curve, F1/P/R-confidence curves; and labels.jpg, the training labels drawn.

Matplotlib is imported inside each function and drawn on an Agg canvas (no pyplot, no global backend switch,
no display needed).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from yolo_cb.utils.files import atomic_write_bytes
from yolo_cb.utils.log import printable

MAX_LEGEND_CLASSES = 20  # draw one line per class (with a legend) up to this many classes, else grey lines


def plot_text(name: object) -> str:
    """A class name as a plot shows it: control characters escaped (matplotlib printed a raw ESC in its missing-glyph
    warning) and '$' kept literal (two of them started mathtext, which a stray one breaks)."""
    return printable(name).replace("$", r"\$")


def _figure(size=(9, 6)):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, tight_layout=True)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path) -> Path:
    path = Path(path)
    buffer = io.BytesIO()  # then written atomically, as every file of a run: a link planted at the name is not followed
    fig.savefig(buffer, dpi=150, format=path.suffix[1:] or "png")
    atomic_write_bytes(path, buffer.getvalue())
    return path


def plot_confusion_matrix(matrix: np.ndarray, names: dict[int, str] | Sequence[str], save_path: Path, normalize: bool = True) -> Path:
    """(nc + 1, nc + 1) matrix [pred, true] -> PNG; normalised per true class (column) when `normalize`."""
    matrix = np.asarray(matrix, dtype=float)
    if normalize:
        matrix = matrix / (matrix.sum(0, keepdims=True) + 1e-9)
    labels = [plot_text(n) for n in (names.values() if isinstance(names, dict) else names)] + ["background"]
    n = len(matrix)
    fig = _figure((12, 9) if n > 12 else (8, 6.5))
    ax = fig.add_subplot(111)
    shown = np.where(matrix < 0.005, np.nan, matrix) if normalize else np.where(matrix == 0, np.nan, matrix)
    im = ax.imshow(shown, cmap="Blues", vmin=0.0, vmax=1.0 if normalize else None)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    ticks = n <= 30
    if ticks:
        ax.set_xticks(range(n), labels, rotation=90, fontsize=8)
        ax.set_yticks(range(n), labels, fontsize=8)
        if n <= 16:
            for i in range(n):
                for j in range(n):
                    if not np.isnan(shown[i, j]):
                        ax.text(j, i, f"{matrix[i, j]:.2f}" if normalize else f"{int(matrix[i, j])}", ha="center", va="center",
                                fontsize=7, color="white" if shown[i, j] > 0.5 * np.nanmax(shown) else "black")
    ax.set_xlabel("True")
    ax.set_ylabel("Predicted")
    ax.set_title("Confusion Matrix" + (" Normalized" if normalize else ""))
    return _save(fig, save_path)


def plot_pr_curve(recall: np.ndarray, precision: np.ndarray, ap50: np.ndarray, names: Sequence[str], save_path: Path) -> Path:
    """Precision-recall at IoU .5: recall (R,), precision (k, R) per class, ap50 (k,), names (k,)."""
    fig = _figure()
    ax = fig.add_subplot(111)
    precision = np.asarray(precision).reshape(-1, len(recall))
    for y, ap, name in zip(precision, ap50, names, strict=True):
        if len(precision) <= MAX_LEGEND_CLASSES:
            ax.plot(recall, y, linewidth=1, label=f"{plot_text(name)} {ap:.3f}")
        else:
            ax.plot(recall, y, linewidth=1, color="grey")
    if len(precision):
        ax.plot(recall, precision.mean(0), linewidth=3, color="blue", label=f"all classes {np.mean(ap50):.3f} mAP@0.5")
    ax.set_xlabel("Recall")
    ax.set_ylabel("Precision")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.01)
    ax.legend(loc="lower left", fontsize=8)
    ax.set_title("Precision-Recall Curve (COCO envelope, IoU 0.5)")
    return _save(fig, save_path)


def plot_mc_curve(px: np.ndarray, py: np.ndarray, names: Sequence[str], save_path: Path, xlabel: str = "Confidence",
                  ylabel: str = "Metric") -> Path:
    """A metric against confidence: px (N,), py (k, N) per class; the thick line is the class mean."""
    fig = _figure()
    ax = fig.add_subplot(111)
    py = np.asarray(py).reshape(-1, len(px))
    for y, name in zip(py, names, strict=True):
        if len(py) <= MAX_LEGEND_CLASSES:
            ax.plot(px, y, linewidth=1, label=plot_text(name))
        else:
            ax.plot(px, y, linewidth=1, color="grey")
    if len(py):
        mean = py.mean(0)
        i = int(mean.argmax())
        ax.plot(px, mean, linewidth=3, color="blue", label=f"all classes {mean[i]:.2f} at {px[i]:.3f}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.01)
    ax.legend(loc="lower left", fontsize=8)
    ax.set_title(f"{ylabel}-{xlabel} Curve")
    return _save(fig, save_path)


def images_in(folder) -> dict:
    """The plot images (.png, .jpg) directly in `folder`: path -> {"data": None, "timestamp": modification time} (what
    Ultralytics' trainer.plots holds); {} while the folder does not exist."""
    if not folder or not Path(folder).is_dir():
        return {}
    files = sorted(p for p in Path(folder).iterdir() if p.suffix in (".png", ".jpg") and p.is_file())
    return {p: {"data": None, "timestamp": p.stat().st_mtime} for p in files}


# --- labels.jpg -------------------------------------------------------------------------------------------------
# labels.jpg, as Ultralytics draws it at the start of training: what the training labels look like.
#
# Four panels on a small Agg canvas (no pyplot, no display): boxes per class (a bar each), the boxes themselves drawn
# centred (up to ``MAX_DRAWN``), box centres (x, y) and box sizes (width, height) as 2-D histograms, all in image
# fractions. It costs a few hundred milliseconds, whatever the dataset's size: the boxes are one collection (not an artist
# each) and the margins are fixed (no tight layout, which measures every label).

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
