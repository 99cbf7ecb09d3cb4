"""The YOLO-CB detector: split-CSP backbone, PAN neck, distribution head, task-aligned loss (`family: yolocb` in a model YAML).

A `Detector` (yolo_cb/nn/detector.py), as YOLOX is, so the trainer, validator, predictor and exporter use it unchanged;
its decoded predictions (B, A, 4 + 1 + nc) have an objectness column of 1 (a YOLO-CB score is its class probability alone).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..detector import Detector
from .backbone import PANNeck, SplitCSPBackbone
from .head import REG_MAX, STRIDES, DistributionHead
from .loss import YOLOCBLoss

FAMILY = "yolocb"  # the `family:` value of a model YAML that builds this detector
MAX_CHANNELS = 1024  # default cap on any layer's channels before the width multiplier


class YOLOCB(Detector):
    """The `Detector` contract (yolo_cb/nn/detector.py). Raw per-level outputs (`head_outputs`) are
    (B, 4 * reg_max + nc, H / s, W / s); decoded predictions (B, A, 4 + 1 + nc) have objectness 1."""

    family = FAMILY
    strides = STRIDES

    def __init__(self, depth: float = 0.33, width: float = 0.25, max_channels: int = MAX_CHANNELS, reg_max: int = REG_MAX,
                 nc: int = 80, act: str = "silu", name: str = "YOLOCB"):
        super().__init__({"family": FAMILY, "depth": float(depth), "width": float(width), "max_channels": int(max_channels),
                          "reg_max": int(reg_max), "act": str(act), "nc": int(nc)}, name)
        self.backbone = SplitCSPBackbone(depth, width, int(max_channels), act)
        self.neck = PANNeck(self.backbone.out_channels, depth, act)
        self.head = DistributionHead(self.nc, self.backbone.out_channels, int(reg_max), act, STRIDES)
        self.build_loss()

    def head_outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Per-level head outputs (B, 4 * reg_max + nc, H / s, W / s) for s in 8, 16, 32: distance-bin and class logits."""
        return self.head(self.neck(self.backbone(x)))

    def raw_outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Per-level outputs in YOLOX's raw layout (B, 4 + 1 + nc, H / s, W / s), for code that decodes YOLOX outputs
        itself (the exporter's dynamic-shape graph); decoding them gives `decode`'s predictions."""
        return self.head.yolox_layout(self.head_outputs(x))

    def build_loss(self, settings: Mapping[str, Any] | None = None) -> YOLOCBLoss:
        """A YOLOCBLoss (CIoU + DFL with fixed gains: it reads no training setting) as `criterion`."""
        self.criterion = YOLOCBLoss.from_settings(self.nc, int(self.cfg["reg_max"]), settings)
        return self.criterion


def parse_yolocb_cfg(data: dict) -> dict:
    """The architecture dict of a `family: yolocb` config (nc kept when present); depth and width are required."""
    missing = [k for k in ("depth", "width") if k not in data]
    if missing:
        raise KeyError(f"yolocb model config lacks {', '.join(missing)}")
    arch = {
        "family": FAMILY,
        "depth": float(data["depth"]),
        "width": float(data["width"]),
        "max_channels": int(data.get("max_channels", MAX_CHANNELS)),
        "reg_max": int(data.get("reg_max", REG_MAX)),
        "act": str(data.get("act", "silu")),
    }
    if "nc" in data:
        arch["nc"] = int(data["nc"])
    return arch
