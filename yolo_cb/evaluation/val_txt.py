"""val(save_txt=True): the detections of each validated image as Ultralytics writes them, <save_dir>/labels/<image stem>.txt,
one 'cls cx cy w h [conf]' line per box (normalised to the original image; conf with save_conf=True). An image without
detections gets no file, and images sharing a stem share one file, as in Ultralytics."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from yolo_cb.utils.files import atomic_write_text


def label_lines(stat: dict, save_conf: bool) -> list[str]:
    """The lines of one image's record (validator.stats: COCO xywh boxes in original pixels, scores, classes)."""
    h, w = stat["ori_shape"]
    lines = []
    for (x, y, bw, bh), score, cls in zip(stat["pred_boxes"].tolist(), stat["pred_scores"].tolist(), stat["pred_cls"].tolist(), strict=True):
        line = f"{int(cls)} {(x + bw / 2) / w:.6f} {(y + bh / 2) / h:.6f} {bw / w:.6f} {bh / h:.6f}"
        lines.append(line + (f" {score:.6f}" if save_conf else ""))
    return lines


def write(stats: list[dict], folder: Path, save_conf: bool) -> list[Path]:
    """The label files of `stats` written into `folder` (created), each atomically; returns their paths."""
    per_stem: dict[str, list[str]] = defaultdict(list)
    for stat in stats:
        per_stem[Path(stat["im_file"]).stem].extend(label_lines(stat, save_conf))
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, lines in per_stem.items():
        if lines:
            written.append(folder / f"{stem}.txt")
            atomic_write_text(written[-1], "".join(line + "\n" for line in lines))
    return written
