"""Prediction results: Results (one image) holding Boxes (its detections), with plotting and YOLO-format text output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch


class Boxes:
    """Detections of one image: data (n, 6) = [x1, y1, x2, y2, conf, cls] in original-image pixels."""

    def __init__(self, data: torch.Tensor, orig_shape: tuple[int, int]):
        data = torch.as_tensor(data, dtype=torch.float32)
        if data.ndim == 1:
            data = data.reshape(-1, 6)
        if data.shape[-1] != 6:
            raise ValueError(f"Boxes expects (n, 6) [x1, y1, x2, y2, conf, cls], got {tuple(data.shape)}")
        self.data = data
        self.orig_shape = tuple(int(v) for v in orig_shape[:2])

    @property
    def xyxy(self) -> torch.Tensor:
        return self.data[:, :4]

    @property
    def conf(self) -> torch.Tensor:
        return self.data[:, 4]

    @property
    def cls(self) -> torch.Tensor:
        return self.data[:, 5]

    @property
    def xywh(self) -> torch.Tensor:
        """Centre x, centre y, width, height in pixels."""
        b = self.xyxy
        return torch.stack(((b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2, b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]), dim=1)

    @property
    def xyxyn(self) -> torch.Tensor:
        h, w = self.orig_shape
        return self.xyxy / torch.tensor([w, h, w, h], dtype=self.data.dtype, device=self.data.device)

    @property
    def xywhn(self) -> torch.Tensor:
        h, w = self.orig_shape
        return self.xywh / torch.tensor([w, h, w, h], dtype=self.data.dtype, device=self.data.device)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    def cpu(self) -> Boxes:
        return Boxes(self.data.cpu(), self.orig_shape)

    def numpy(self) -> np.ndarray:
        return self.data.cpu().numpy()

    def __len__(self) -> int:
        return int(self.data.shape[0])

    def __getitem__(self, index: Any) -> Boxes:
        return Boxes(self.data[index].reshape(-1, 6), self.orig_shape)

    def __repr__(self) -> str:
        return f"Boxes(n={len(self)}, orig_shape={self.orig_shape})"


class Results:
    """One image's detections: boxes, names, orig_img (BGR), orig_shape (h, w), path, speed (ms per stage)."""

    def __init__(self, orig_img: np.ndarray, path: str, names: dict[int, str], boxes: torch.Tensor | None = None,
                 speed: dict[str, float] | None = None, frame: int | None = None):
        self.orig_img = orig_img
        self.orig_shape = tuple(int(v) for v in orig_img.shape[:2])
        self.path = str(path)
        self.names = names
        self.boxes = Boxes(boxes if boxes is not None else torch.zeros(0, 6), self.orig_shape)
        self.speed = speed or {"preprocess": None, "inference": None, "postprocess": None}
        self.frame = frame  # frame index for videos, else None

    def __len__(self) -> int:
        return len(self.boxes)

    def __repr__(self) -> str:
        return f"Results(path={self.path!r}, orig_shape={self.orig_shape}, detections={len(self)})"

    def summary(self) -> str:
        """'2 circles, 1 square' style count of detections by class name."""
        if not len(self):
            return "no detections"
        counts = torch.bincount(self.boxes.cls.long().cpu())
        parts = [f"{int(n)} {self.names.get(i, str(i))}" for i, n in enumerate(counts.tolist()) if n]
        return ", ".join(parts)

    def plot(self, line_width: int | None = None, labels: bool = True, conf: bool = True, img: np.ndarray | None = None) -> np.ndarray:
        """A copy of the original image (BGR) with each box, its class name and score drawn in the class colour."""
        from yolo_cb.utils.draw import draw_detections

        canvas = np.ascontiguousarray((img if img is not None else self.orig_img).copy())
        return draw_detections(canvas, self.boxes.data.cpu().tolist(), self.names, line_width, labels, conf)

    def save(self, filename: str | Path, **plot_kwargs) -> str:
        """Write plot() to `filename`; returns the path."""
        import cv2

        Path(filename).parent.mkdir(parents=True, exist_ok=True)
        if not cv2.imwrite(str(filename), self.plot(**plot_kwargs)):
            raise OSError(f"could not write image {filename}")
        return str(filename)

    def save_txt(self, path: str | Path, save_conf: bool = False) -> str:
        """Append one YOLO-format line per box to `path`: 'cls cx cy w h [conf]', coordinates normalised to [0, 1]."""
        lines = []
        for (cx, cy, w, h), score, cls in zip(self.boxes.xywhn.tolist(), self.boxes.conf.tolist(), self.boxes.cls.tolist(), strict=True):
            line = f"{int(cls)} {cx:.6f} {cy:.6f} {w:.6f} {h:.6f}"
            lines.append(line + (f" {score:.6f}" if save_conf else ""))
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in lines)
        return str(path)
