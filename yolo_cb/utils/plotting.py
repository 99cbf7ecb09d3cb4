"""Validation plots: confusion matrix, PR curve, F1/P/R-confidence curves.

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
