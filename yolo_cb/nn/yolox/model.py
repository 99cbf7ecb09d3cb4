"""The YOLOX detector: CSPDarknet + PAFPN, decoupled head, SimOTA loss (`family: yolox`, the default, in a model YAML)."""

from __future__ import annotations

import torch
from torch import nn

from ...errors import short_repr
from ..blocks import ConvBNAct
from ..summary import log_summary
from .backbone import PAFPN
from .head import STRIDES, YOLOXHead
from .loss import YOLOXLoss

FAMILY = "yolox"  # the `family:` value of a model YAML that builds this detector (also the default when absent)


class YOLOX(nn.Module):
    """PAFPN (CSPDarknet) + decoupled head. Input: (B, 3, H, W) RGB in [0, 1], H and W multiples of 32.

    forward(x, targets) -> loss dict in train mode, (predictions, loss dict) in eval mode; forward(x) -> raw per-level outputs in train mode,
    decoded predictions (B, A, 4 + 1 + nc) in eval mode (see `decode`).
    """

    def __init__(self, depth: float = 1.0, width: float = 1.0, nc: int = 80, depthwise: bool = False, act: str = "silu", name: str = "YOLOX"):
        super().__init__()
        self.name = name
        self.nc = int(nc)
        self.cfg = {"depth": float(depth), "width": float(width), "depthwise": bool(depthwise), "act": str(act), "nc": self.nc}
        self.names = {i: str(i) for i in range(self.nc)}
        self.register_buffer("stride", torch.tensor(STRIDES, dtype=torch.float32), persistent=False)
        self.backbone = PAFPN(depth, width, depthwise, act)
        self.head = YOLOXHead(self.nc, width, depthwise, act, STRIDES)
        self.criterion = YOLOXLoss(self.nc)

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None):
        raw = self.raw_outputs(x)
        if targets is not None:
            # training: the loss dict; eval (validation with losses): (decoded predictions, loss dict) from one pass
            return self.loss(raw, targets) if self.training else (self.decode(raw), self.loss(raw, targets))
        return raw if self.training else self.decode(raw)

    def raw_outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Per-level head outputs (B, 4 + 1 + nc, H / s, W / s) for s in 8, 16, 32: box regression, obj and class logits."""
        return self.head(self.backbone(x))

    def decode(self, raw: list[torch.Tensor]) -> torch.Tensor:
        """(B, A, 4 + 1 + nc): cx, cy, w, h in input pixels, objectness and class probabilities."""
        return self.head.decode(raw)

    def loss(self, raw: list[torch.Tensor], targets: torch.Tensor) -> dict:
        """The criterion's loss dict for raw outputs and targets (N, 6) [image_index, class, cx, cy, w, h] in input pixels."""
        preds, grid, strides = self.head.flatten(raw)
        return self.criterion(preds, grid, strides, targets)

    @torch.no_grad()
    def fuse(self, verbose: bool = False) -> YOLOX:
        """Fold every BatchNorm into its convolution, in place (for inference); returns self. verbose: log the fused
        model's summary line (layers, parameters, GFLOPs), as Ultralytics' fuse(verbose=True) does."""
        for module in self.modules():
            if isinstance(module, ConvBNAct):
                module.fuse()
        if verbose:
            log_summary(self, suffix=" (fused)")
        return self


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
