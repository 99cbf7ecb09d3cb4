"""results.png: one small panel per numeric column of results.csv, against epoch."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from yolo_cb.utils.files import atomic_write_bytes


def plot_results(csv_path: Path) -> Path | None:
    """Draw results.png beside results.csv; returns its path (None when there is nothing to draw)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    csv_path = Path(csv_path)
    if not csv_path.is_file():
        return None
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return None
    columns = [c for c in rows[0] if c not in ("epoch", "time")]
    epochs = [float(r["epoch"]) for r in rows]
    cols = 5
    lines = max(1, -(-len(columns) // cols))
    fig = Figure(figsize=(3 * cols, 2.4 * lines))  # no pyplot: the process's matplotlib backend stays the user's
    FigureCanvasAgg(fig)
    axes = fig.subplots(lines, cols, squeeze=False)
    for ax, column in zip(axes.flat, columns, strict=False):
        values = [float(r[column]) if r.get(column) not in (None, "") else float("nan") for r in rows]
        ax.plot(epochs, values, marker=".", linewidth=1.5)
        ax.set_title(column, fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(columns):]:
        ax.axis("off")
    # fixed margins: tight_layout drew the whole figure once more to measure it (0.6 of the 1 s this plot took)
    fig.subplots_adjust(left=0.04, right=0.99, bottom=0.35 / fig.get_figheight(), top=1 - 0.3 / fig.get_figheight(),
                        wspace=0.25, hspace=0.45)
    out = csv_path.with_name("results.png")
    buffer = io.BytesIO()  # then written atomically, as every file of a run: a link planted at the name is not followed
    fig.savefig(buffer, dpi=120, format="png")
    atomic_write_bytes(out, buffer.getvalue())
    return out
