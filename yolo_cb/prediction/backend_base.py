"""The base of every inference backend (`Backend`: one call from float BCHW tensors to raw detections) and the helpers
they share: metadata parsing, the model's stride, the one-line error for an unusable model file.

The backends themselves live in `backend` (PyTorch, ONNX, TorchScript, OpenVINO) and `mobile_backends` (ncnn, MNN,
LiteRT, ExecuTorch); `backend.load_backend` picks one from a path.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import torch

from yolo_cb.errors import CheckpointError

DEFAULT_STRIDE = 32


def parse_names(value: Any) -> dict[int, str]:
    """Class names from a dict, a list, or their JSON / Python-literal string form -> {int: str}."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = ast.literal_eval(value)
    if isinstance(value, (list, tuple)):
        value = dict(enumerate(value))
    return {int(k): str(v) for k, v in (value or {}).items()}


def parse_metadata(raw: dict[str, str]) -> dict[str, Any]:
    """ONNX / TorchScript metadata strings -> typed values (names dict, imgsz list, stride int, batch int|None)."""
    meta: dict[str, Any] = dict(raw)
    if "names" in meta:
        meta["names"] = parse_names(meta["names"])
    for key in ("imgsz", "stride", "batch", "dynamic", "half", "nms", "int8"):
        if key in meta and isinstance(meta[key], str):
            try:
                meta[key] = json.loads(meta[key])
            except json.JSONDecodeError:
                try:
                    meta[key] = ast.literal_eval(meta[key])
                except (ValueError, SyntaxError):
                    pass
    return meta


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
        if self.batch is not None and x.shape[0] != self.batch:
            raise ValueError(f"{self.kind} model {self.path or ''} was exported for a fixed batch of {self.batch}, got {x.shape[0]}; "
                             f"re-export with dynamic=True or batch={x.shape[0]}")
        return self.forward(x)

    def warmup(self, imgsz: tuple[int, int] | int | None = None) -> None:
        """One dummy forward pass (first-call allocations, cuDNN autotune, ORT graph init)."""
        size = self.imgsz or ((imgsz, imgsz) if isinstance(imgsz, int) else imgsz) or (64, 64)
        self(torch.zeros(self.batch or 1, 3, *size, device=self.device))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind}, nc={self.nc}, imgsz={self.imgsz}, batch={self.batch}, device={self.device})"


def bad_model_file(path: Path, kind: str, reason: str) -> CheckpointError:
    """The one-line error for a model file that cannot be loaded: the file, why, and what to do."""
    return CheckpointError(f"model={path}: not a usable {kind} model: {reason}; export it again from the .pt checkpoint "
                           f"(yolo-cb export model=path/to/best.pt format={kind.lower()})")
