"""The YOLOX detector: CSPDarknet + PAFPN, decoupled head, SimOTA loss (`family: yolox`, the default, in a model YAML)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ...errors import short_repr
from ..detector import Detector
from .backbone import PAFPN
from .head import STRIDES, YOLOXHead
from .loss import YOLOXLoss

FAMILY = "yolox"  # the `family:` value of a model YAML that builds this detector (also the default when absent)
# The layers in the order the image flows through them (freeze=N freezes the first N), by Megvii's module names (its
# weights load by them): 1 stem, 2-5 dark2-5 (CSPDarknet), 6-13 the PAFPN, 14 the head.
LAYERS = ("backbone.backbone.stem", "backbone.backbone.dark2", "backbone.backbone.dark3", "backbone.backbone.dark4",
          "backbone.backbone.dark5", "backbone.lateral_conv0", "backbone.C3_p4", "backbone.reduce_conv1", "backbone.C3_p3",
          "backbone.bu_conv2", "backbone.C3_n3", "backbone.bu_conv1", "backbone.C3_n4", "head")


class YOLOX(Detector):
    """PAFPN (CSPDarknet) + decoupled head; the `Detector` contract (yolo_cb/nn/detector.py). Raw per-level outputs are
    (B, 4 + 1 + nc, H / s, W / s): box regression, objectness and class logits; decoded predictions (B, A, 4 + 1 + nc)."""

    family = FAMILY
    strides = STRIDES
    layers = LAYERS

    def __init__(self, depth: float = 1.0, width: float = 1.0, nc: int = 80, depthwise: bool = False, act: str = "silu", name: str = "YOLOX"):
        super().__init__({"depth": float(depth), "width": float(width), "depthwise": bool(depthwise), "act": str(act), "nc": int(nc)}, name)
        self.backbone = PAFPN(depth, width, depthwise, act)
        self.head = YOLOXHead(self.nc, width, depthwise, act, STRIDES)
        self.build_loss()

    def head_outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Per-level head outputs (B, 4 + 1 + nc, H / s, W / s) for s in 8, 16, 32: box regression, obj and class logits."""
        return self.head(self.backbone(x))

    def build_loss(self, settings: Mapping[str, Any] | None = None) -> YOLOXLoss:
        """A YOLOXLoss from the training settings box and iou_type (the defaults when absent), L1 off, as `criterion`."""
        self.criterion = YOLOXLoss.from_settings(self.nc, settings)
        return self.criterion


def parse_yolox_cfg(data: dict, source: object = None) -> dict:
    """The architecture dict of a `family: yolox` config (nc kept when present); depth and width are required."""
    missing = [k for k in ("depth", "width") if k not in data]
    if missing:
        raise KeyError(f"model config {short_repr(source if source is not None else data)} lacks {', '.join(missing)}")
    arch = {
        "depth": float(data["depth"]),
        "width": float(data["width"]),
        "depthwise": bool(data.get("depthwise", False)),
        "act": str(data.get("act", "silu")),
    }
    if "nc" in data:
        arch["nc"] = int(data["nc"])
    return arch
