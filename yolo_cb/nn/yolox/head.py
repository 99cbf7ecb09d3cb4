"""Decoupled anchor-free YOLOX head: per level, separate classification and regression branches."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..blocks import ConvBNAct, conv3x3
from ..grid import cell_grid, flatten_levels
from .backbone import FEATURE_CHANNELS

STRIDES = (8, 16, 32)  # downsampling factor of the P3, P4 and P5 feature maps
PRIOR_PROB = 0.01  # initial foreground probability encoded in the objectness and class biases


class YOLOXHead(nn.Module):
    """Maps P3/P4/P5 to raw per-level outputs (B, 4 + 1 + nc, H, W): box regression, objectness logit, class logits.

    Box regression per cell is (dx, dy, log w, log h) in stride units: centre = (cell + d) * stride, size = exp(.) * stride.
    """

    def __init__(self, nc: int, width: float, depthwise: bool = False, act: str = "silu", strides: tuple[int, ...] = STRIDES):
        super().__init__()
        self.nc = nc
        self.strides = tuple(strides)
        hidden = int(256 * width)
        self.stems = nn.ModuleList(ConvBNAct(int(c * width), hidden, 1, 1, act=act) for c in FEATURE_CHANNELS)
        self.cls_convs = nn.ModuleList(self._branch(hidden, depthwise, act) for _ in self.strides)
        self.reg_convs = nn.ModuleList(self._branch(hidden, depthwise, act) for _ in self.strides)
        self.cls_preds = nn.ModuleList(nn.Conv2d(hidden, nc, 1) for _ in self.strides)
        self.reg_preds = nn.ModuleList(nn.Conv2d(hidden, 4, 1) for _ in self.strides)
        self.obj_preds = nn.ModuleList(nn.Conv2d(hidden, 1, 1) for _ in self.strides)
        self._grid_cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self.initialize_biases(PRIOR_PROB)

    @staticmethod
    def _branch(channels: int, depthwise: bool, act: str) -> nn.Sequential:
        return nn.Sequential(conv3x3(channels, channels, 1, depthwise, act), conv3x3(channels, channels, 1, depthwise, act))

    @torch.no_grad()
    def initialize_biases(self, prior_prob: float) -> None:
        """Objectness and class logits start at sigmoid^-1(prior_prob), so early training is not swamped by negatives."""
        bias = -math.log((1 - prior_prob) / prior_prob)
        for conv in (*self.cls_preds, *self.obj_preds):
            conv.bias.fill_(bias)

    def forward(self, feats: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        outputs = []
        for i, x in enumerate(feats):
            x = self.stems[i](x)
            cls_logits = self.cls_preds[i](self.cls_convs[i](x))
            reg_feat = self.reg_convs[i](x)
            outputs.append(torch.cat((self.reg_preds[i](reg_feat), self.obj_preds[i](reg_feat), cls_logits), dim=1))
        return outputs

    def flatten(self, outputs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Raw outputs as (B, A, 5 + nc) over all A cells of all levels, with each cell's grid (A, 2) and stride (A, 1)."""
        return flatten_levels(outputs), *self.grid_for(outputs)

    def grid_for(self, outputs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Cell coordinates (A, 2) as (x, y) and strides (A, 1), cached per feature-map sizes, device and dtype.

        Built with numpy from plain ints so that tracing/ONNX export records them as constants.
        """
        return cell_grid(outputs, self.strides, self._grid_cache)

    def decode(self, outputs: list[torch.Tensor]) -> torch.Tensor:
        """(B, A, 4 + 1 + nc): box cx, cy, w, h in input pixels, then sigmoided objectness and class scores."""
        preds, grid, strides = self.flatten(outputs)
        xy = (preds[..., 0:2] + grid) * strides
        wh = torch.exp(preds[..., 2:4]) * strides
        return torch.cat((xy, wh, torch.sigmoid(preds[..., 4:])), dim=-1)
