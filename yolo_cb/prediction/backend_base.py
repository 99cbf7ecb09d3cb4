"""The base of every inference backend (`Backend`: one call from float BCHW tensors to raw detections) and what they
share: the model's stride, and (from model_metadata) the checked metadata and the one-line error for an unusable file.

The backends themselves live in `backend` (PyTorch, ONNX, TorchScript, OpenVINO) and `mobile_backends` (ncnn, MNN,
LiteRT, ExecuTorch); `backend.load_backend` picks one from a path.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch

from yolo_cb.prediction.model_metadata import bad_model_file, refuse_non_detector
from yolo_cb.utils.signal_stack import signals_to_the_os

DEFAULT_STRIDE = 32


def max_stride(model: Any) -> int:
    """The largest stride of a model (`.stride` may be an int, a sequence or a tensor); 32 when unknown."""
    stride = getattr(model, "stride", None)
    if stride is None:
        return DEFAULT_STRIDE
    if isinstance(stride, torch.Tensor):
        return int(stride.max())
    if isinstance(stride, (list, tuple)):
        return int(max(stride)) if stride else DEFAULT_STRIDE
    return int(stride)


class Backend:
    """Runs a detector of any supported kind on float BCHW tensors; see the module docstring."""

    kind: str = "pytorch"
    label: str = "PyTorch"  # the kind as a message names it
    holds_gil = False  # its runtime keeps Python's lock while it runs: a signal then goes to the OS (utils/signal_stack.py)

    def __init__(self, *, names: dict[int, str], stride: int = DEFAULT_STRIDE, imgsz: tuple[int, int] | None = None,
                 batch: int | None = None, device: torch.device = torch.device("cpu"), fp16: bool = False,
                 metadata: dict[str, Any] | None = None, path: str | None = None):
        self.names = names
        self.nc = len(names)
        self.stride = int(stride)
        self.imgsz = tuple(int(v) for v in imgsz) if imgsz else None
        self.batch = int(batch) if batch else None
        self.device = device
        self.fp16 = fp16
        self.metadata = metadata or {}
        self.path = path
        nms = self.metadata.get("nms")  # set by an nms=True export: {"iou": ..., "max_det": ...}
        self.end2end: dict | None = nms if isinstance(nms, dict) and nms else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - overridden
        raise NotImplementedError

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim == 3:
            x = x.unsqueeze(0)
        if self.imgsz is not None and tuple(x.shape[2:]) != self.imgsz:
            raise ValueError(f"{self.kind} model {self.path or ''} was exported for a fixed image size {self.imgsz} (h, w), "
                             f"got input {tuple(x.shape[2:])}; letterbox to {self.imgsz} or re-export with dynamic=True")
        n = x.shape[0]
        if self.batch is not None and n > self.batch:
            raise ValueError(f"{self.kind} model {self.path or ''} was exported for a fixed batch of {self.batch}, got {n}; "
                             f"re-export with dynamic=True or batch={n}")
        if self.batch is not None and n < self.batch:  # the last, shorter batch of a folder: padded with blank images, cut after
            x = torch.cat((x, x.new_zeros((self.batch - n, *x.shape[1:]))))
        with signals_to_the_os() if self.holds_gil else contextlib.nullcontext():
            y = self.forward(x)
        y = y[:n] if isinstance(y, torch.Tensor) and n < len(x) else y
        if self.kind != "pytorch":  # a file we did not write: it must compute detections, not anything of any shape
            self.check_detector(None, tuple(y.shape) if isinstance(y, torch.Tensor) else f"a {type(y).__name__}")
        return y

    def check_detector(self, input_shape: Any, output_shape: Any) -> None:
        """CheckpointError naming the file when it takes no image batch or returns no detector's output (None: unknown)."""
        if isinstance(output_shape, str):
            raise bad_model_file(Path(self.path or ""), self.label, f"it returns {output_shape}, not a detector's output tensor")
        refuse_non_detector(Path(self.path or ""), self.label, input_shape, output_shape, self.nc, self.end2end is not None)

    def warmup(self, imgsz: tuple[int, int] | int | None = None) -> None:
        """One dummy forward pass (first-call allocations, cuDNN autotune, ORT graph init)."""
        size = self.imgsz or ((imgsz, imgsz) if isinstance(imgsz, int) else imgsz) or (64, 64)
        self(torch.zeros(self.batch or 1, 3, *size, device=self.device))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind}, nc={self.nc}, imgsz={self.imgsz}, batch={self.batch}, device={self.device})"
