"""The YOLO-CB detector: split-CSP backbone, PAN neck, distribution head, task-aligned loss (`family: yolocb` in a model YAML).

It keeps the YOLOX module's contract, so the trainer, validator, predictor and exporter use it unchanged: `.nc`,
`.names`, `.cfg`, `.stride`, `.criterion`, `fuse()`, `raw_outputs()`, and decoded predictions (B, A, 4 + 1 + nc) whose
objectness column is 1 (a YOLO-CB score is its class probability alone).
"""

from __future__ import annotations

import torch
from torch import nn

from ..blocks import ConvBNAct
from ..summary import log_summary
from .backbone import PANNeck, SplitCSPBackbone
from .head import REG_MAX, STRIDES, DistributionHead
from .loss import YOLOCBLoss

FAMILY = "yolocb"  # the `family:` value of a model YAML that builds this detector
MAX_CHANNELS = 1024  # default cap on any layer's channels before the width multiplier


class YOLOCB(nn.Module):
    """Input: (B, 3, H, W) RGB in [0, 1], H and W multiples of 32.

    forward(x, targets) -> loss dict in train mode, (predictions, loss dict) in eval mode; forward(x) -> raw per-level
    outputs (B, 4 * reg_max + nc, H / s, W / s) in train mode, decoded predictions (B, A, 4 + 1 + nc) in eval mode.
    """

    def __init__(self, depth: float = 0.33, width: float = 0.25, max_channels: int = MAX_CHANNELS, reg_max: int = REG_MAX,
                 nc: int = 80, act: str = "silu", name: str = "YOLOCB"):
        super().__init__()
        self.name = name
        self.nc = int(nc)
        self.cfg = {"family": FAMILY, "depth": float(depth), "width": float(width), "max_channels": int(max_channels),
                    "reg_max": int(reg_max), "act": str(act), "nc": self.nc}
        self.names = {i: str(i) for i in range(self.nc)}
        self.register_buffer("stride", torch.tensor(STRIDES, dtype=torch.float32), persistent=False)
        self.backbone = SplitCSPBackbone(depth, width, int(max_channels), act)
        self.neck = PANNeck(self.backbone.out_channels, depth, act)
        self.head = DistributionHead(self.nc, self.backbone.out_channels, int(reg_max), act, STRIDES)
        self.criterion = YOLOCBLoss(self.nc, int(reg_max))

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None):
        raw = self.head_outputs(x)
        if targets is not None:
            # training: the loss dict; eval (validation with losses): (decoded predictions, loss dict) from one pass
            return self.loss(raw, targets) if self.training else (self.decode(raw), self.loss(raw, targets))
        return raw if self.training else self.decode(raw)

    def head_outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Per-level head outputs (B, 4 * reg_max + nc, H / s, W / s) for s in 8, 16, 32: distance-bin and class logits."""
        return self.head(self.neck(self.backbone(x)))

    def raw_outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Per-level outputs in YOLOX's raw layout (B, 4 + 1 + nc, H / s, W / s), for code that decodes YOLOX outputs
        itself (the exporter's dynamic-shape graph); decoding them gives `decode`'s predictions."""
        return self.head.yolox_layout(self.head_outputs(x))

    def decode(self, raw: list[torch.Tensor]) -> torch.Tensor:
        """(B, A, 4 + 1 + nc): cx, cy, w, h in input pixels, objectness 1.0 and class probabilities."""
        return self.head.decode(raw)

    def loss(self, raw: list[torch.Tensor], targets: torch.Tensor) -> dict:
        """The criterion's loss dict for raw outputs and targets (N, 6) [image_index, class, cx, cy, w, h] in input pixels."""
        return self.criterion(*self.head.flatten(raw), targets)

    @torch.no_grad()
    def fuse(self, verbose: bool = False) -> YOLOCB:
        """Fold every BatchNorm into its convolution, in place (for inference); returns self. verbose: log the fused
        model's summary line (layers, parameters, GFLOPs), as Ultralytics' fuse(verbose=True) does."""
        for module in self.modules():
            if isinstance(module, ConvBNAct):
                module.fuse()
        if verbose:
            log_summary(self, suffix=" (fused)")
        return self


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
