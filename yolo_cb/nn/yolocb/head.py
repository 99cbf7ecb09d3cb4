"""YOLO-CB head: per level, a box branch predicting a distribution over distances and a class branch (no objectness).

Box regression follows Generalized Focal Loss: for each of the four distances from the cell centre to the box sides
(left, top, right, bottom, in stride units) the head outputs `reg_max` logits over the bins 0 .. reg_max - 1; the
distance is the expectation of the softmax over the bins.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..blocks import ConvBNAct, DWConv
from ..grid import cell_grid, flatten_levels

STRIDES = (8, 16, 32)  # downsampling factor of the P3, P4 and P5 feature maps
REG_MAX = 16  # bins per box side: distances 0 .. REG_MAX - 1 strides can be represented
BOX_BIAS = 1.0  # initial bias of every distance-bin logit (uniform distributions: every box starts mid-range)
PRIOR_OBJECTS = 5.0  # class-bias prior: about this many objects per image ...
PRIOR_IMGSZ = 640  # ... of this many pixels square, spread over all classes and cells of a level
MIN_BOX_HIDDEN = 16  # the box branch is never narrower than this
MAX_CLASS_HIDDEN = 100  # the class branch widens to the class count, up to this many channels
# The class branch's two 3x3 layers: full = two dense 3x3 ConvBNAct (ours since the start); depthwise = each a depthwise
# 3x3 then a pointwise 1x1, both with BatchNorm and activation (the shape of YOLO11's class branch; issue 44 measured it)
CLS_BRANCHES = ("full", "depthwise")
OBJECTNESS_LOGIT = 40.0  # sigmoid(40) rounds to exactly 1.0 in float32 and float16: the objectness of `yolox_layout`


def dfl_expectation(logits: torch.Tensor) -> torch.Tensor:
    """(..., 4, reg_max) bin logits -> (..., 4) distances in stride units: the softmax-weighted mean bin."""
    bins = torch.arange(logits.shape[-1], device=logits.device, dtype=logits.dtype)
    # a (reg_max, 1) matrix, not a vector: MatMul with a 1-D operand is mis-converted by MNN and refused by coremltools
    return (logits.softmax(dim=-1) @ bins[:, None]).squeeze(-1)


def distances_to_boxes(ltrb: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    """Distances (..., 4) left, top, right, bottom from `centers` (..., 2) -> boxes (..., 4) x1, y1, x2, y2, same units."""
    return torch.cat((centers - ltrb[..., :2], centers + ltrb[..., 2:]), dim=-1)


def boxes_to_distances(boxes_xyxy: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    """Inverse of `distances_to_boxes`: (left, top, right, bottom) from each centre to its box's sides."""
    return torch.cat((centers - boxes_xyxy[..., :2], boxes_xyxy[..., 2:] - centers), dim=-1)


class DistributionHead(nn.Module):
    """Maps P3/P4/P5 to raw per-level outputs (B, 4 * reg_max + nc, H, W): distance-bin logits then class logits."""

    def __init__(self, nc: int, in_channels: tuple[int, ...], reg_max: int = REG_MAX, act: str = "silu", strides: tuple[int, ...] = STRIDES,
                 cls_branch: str = "full"):
        super().__init__()
        if cls_branch not in CLS_BRANCHES:
            raise ValueError(f"unknown cls_branch '{cls_branch}' (expected {' or '.join(CLS_BRANCHES)})")
        self.nc, self.reg_max, self.strides = int(nc), int(reg_max), tuple(strides)
        box_hidden = max(MIN_BOX_HIDDEN, in_channels[0] // 4, 4 * self.reg_max)
        cls_hidden = max(in_channels[0], min(self.nc, MAX_CLASS_HIDDEN))
        self.box_branches = nn.ModuleList(self._branch(c, box_hidden, 4 * self.reg_max, act) for c in in_channels)
        self.cls_branches = nn.ModuleList(self._branch(c, cls_hidden, self.nc, act, cls_branch == "depthwise") for c in in_channels)
        self._grid_cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self.initialize_biases()

    @staticmethod
    def _branch(c_in: int, hidden: int, c_out: int, act: str, depthwise: bool = False) -> nn.Sequential:
        """Two 3x3 layers (dense, or depthwise 3x3 + pointwise 1x1 each) then a 1x1 convolution to `c_out` logits."""
        layer = DWConv if depthwise else ConvBNAct
        return nn.Sequential(layer(c_in, hidden, 3, 1, act=act), layer(hidden, hidden, 3, 1, act=act), nn.Conv2d(hidden, c_out, 1))

    @torch.no_grad()
    def initialize_biases(self) -> None:
        """Distance logits start equal; class logits start near log(prior), the chance that a given cell holds a given class."""
        for box, cls, stride in zip(self.box_branches, self.cls_branches, self.strides, strict=True):
            box[-1].bias.fill_(BOX_BIAS)
            cells = (PRIOR_IMGSZ / stride) ** 2
            cls[-1].bias.fill_(math.log(PRIOR_OBJECTS / max(self.nc, 1) / cells))

    def forward(self, feats: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        return [torch.cat((box(x), cls(x)), dim=1) for x, box, cls in zip(feats, self.box_branches, self.cls_branches, strict=True)]

    def flatten(self, outputs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(distance logits (B, A, 4, reg_max), class logits (B, A, nc), cell centres (A, 2) in stride units, strides (A, 1))."""
        preds = flatten_levels(outputs)
        dist = preds[..., : 4 * self.reg_max].reshape(preds.shape[0], preds.shape[1], 4, self.reg_max)
        centers, strides = self.centers_for(outputs)
        return dist, preds[..., 4 * self.reg_max :], centers, strides

    def centers_for(self, outputs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Cell centres (A, 2) as (x, y) in stride units (column + 0.5, row + 0.5) and strides (A, 1), cached per sizes.

        Built with numpy from plain ints so that tracing/ONNX export records them as constants.
        """
        return cell_grid(outputs, self.strides, self._grid_cache, offset=0.5)

    def decode(self, outputs: list[torch.Tensor]) -> torch.Tensor:
        """(B, A, 4 + 1 + nc): box cx, cy, w, h in input pixels, an objectness column of ones, sigmoided class scores."""
        dist, cls_logits, centers, strides = self.flatten(outputs)
        ltrb = dfl_expectation(dist)
        xy = (centers + (ltrb[..., 2:] - ltrb[..., :2]) / 2) * strides
        wh = (ltrb[..., :2] + ltrb[..., 2:]) * strides
        return torch.cat((xy, wh, torch.ones_like(cls_logits[..., :1]), cls_logits.sigmoid()), dim=-1)

    def yolox_layout(self, outputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The same predictions as YOLOX raw outputs (B, 4 + 1 + nc, H, W): (dx, dy, log w, log h) in stride units from the
        cell's corner, an objectness logit that sigmoids to 1, class logits; any YOLOX decoder then gives `decode`'s boxes."""
        converted = []
        for o in outputs:
            b, _, h, w = o.shape
            ltrb = dfl_expectation(o[:, : 4 * self.reg_max].reshape(b, 4, self.reg_max, h, w).movedim(2, -1))  # (B, 4, H, W)
            dxy = 0.5 + (ltrb[:, 2:] - ltrb[:, :2]) / 2  # centre offset from the cell corner
            log_wh = torch.log(ltrb[:, :2] + ltrb[:, 2:])
            certain = torch.full_like(o[:, :1], OBJECTNESS_LOGIT)
            converted.append(torch.cat((dxy, log_wh, certain, o[:, 4 * self.reg_max :]), dim=1))
        return converted

