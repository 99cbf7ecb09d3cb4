"""Prediction results: Results (one image) holding Boxes (its detections), with plotting and YOLO-format text output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

# Ultralytics' palette (hex), so plots look familiar; class i gets colour i % 20.
_PALETTE_HEX = ("FF3838", "FF9D97", "FF701F", "FFB21D", "CFD231", "48F90A", "92CC17", "3DDB86", "1A9334", "00D4BB",
                "2C99A8", "00C2FF", "344593", "6473FF", "0018EC", "8438FF", "520085", "CB38FF", "FF95C8", "FF37C7")
PALETTE_BGR = tuple((int(h[4:6], 16), int(h[2:4], 16), int(h[0:2], 16)) for h in _PALETTE_HEX)


def class_color(cls: int) -> tuple[int, int, int]:
    """The BGR colour of class `cls`."""
    return PALETTE_BGR[int(cls) % len(PALETTE_BGR)]


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
        import cv2

        canvas = np.ascontiguousarray((img if img is not None else self.orig_img).copy())
        lw = line_width or max(round(sum(canvas.shape[:2]) / 2 * 0.003), 2)
        font_scale = lw / 3
        thickness = max(lw - 1, 1)
        for x1, y1, x2, y2, score, cls in self.boxes.data.cpu().tolist():
            color = class_color(int(cls))
            p1, p2 = (int(round(x1)), int(round(y1))), (int(round(x2)), int(round(y2)))
            cv2.rectangle(canvas, p1, p2, color, lw, cv2.LINE_AA)
            if not labels:
                continue
            label = self.names.get(int(cls), str(int(cls))) + (f" {score:.2f}" if conf else "")
            (tw, th), base = cv2.getTextSize(label, cv2.FONT_HERSHEY_SIMPLEX, font_scale, thickness)
            outside = p1[1] - th - base - 3 >= 0  # label above the box if it fits, else inside
            top = p1[1] - th - base - 3 if outside else p1[1]
            cv2.rectangle(canvas, (p1[0], top), (p1[0] + tw + 2, top + th + base + 3), color, -1, cv2.LINE_AA)
            text_color = (0, 0, 0) if sum(color) > 382 else (255, 255, 255)
            cv2.putText(canvas, label, (p1[0] + 1, top + th + 1), cv2.FONT_HERSHEY_SIMPLEX, font_scale, text_color, thickness, cv2.LINE_AA)
        return canvas

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
