"""YOLO-CB body: a split-CSP (ELAN-style) backbone ending in fast spatial pyramid pooling, and a PAN neck, built as
lists of layers in the order the image flows through them (the detector holds them in one indexed list, `model`).

Every stage halves the resolution with a stride-2 3x3 convolution and refines with a split-CSP block, whose
1x1 projection is split in two halves: one half passes straight through, the other runs a chain of residual
bottlenecks, and every intermediate output of the chain is concatenated (many short gradient paths, as in ELAN).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..blocks import ConvBNAct

# Channels of the five stages (strides 2, 4, 8, 16, 32) at width multiplier 1.0, before the max_channels cap.
STAGE_CHANNELS = (64, 128, 256, 512, 1024)
STAGE_BLOCKS = (3, 6, 6, 3)  # split-CSP bottlenecks in the stride 4, 8, 16, 32 stages at depth multiplier 1.0
NECK_BLOCKS = 3  # bottlenecks in every neck split-CSP block at depth multiplier 1.0
SPLIT_RATIO = 0.5  # split-CSP: each of the two halves has this fraction of the block's output channels
POOL_KERNEL = 5  # fast spatial pyramid pooling: three chained max-pools of this size (receptive fields 5, 9, 13)


def scaled_channels(c: int, width: float, max_channels: int) -> int:
    """A layer's channel count at a width multiplier, capped at max_channels, rounded up to a multiple of 8."""
    return int(math.ceil(min(c, max_channels) * width / 8) * 8)


def scaled_depth(n: int, depth: float) -> int:
    """A block's bottleneck count at a depth multiplier (at least one)."""
    return max(round(n * depth), 1)


class ResidualBottleneck(nn.Module):
    """Two 3x3 ConvBNAct at constant width, with an identity shortcut when `shortcut` is set."""

    def __init__(self, channels: int, shortcut: bool = True, act: str = "silu"):
        super().__init__()
        self.conv1 = ConvBNAct(channels, channels, 3, 1, act=act)
        self.conv2 = ConvBNAct(channels, channels, 3, 1, act=act)
        self.add = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.conv1(x))
        return x + y if self.add else y


class SplitCSP(nn.Module):
    """1x1 projection split into halves a, b; b runs n bottlenecks in a chain; [a, b, b1, ..., bn] concatenated, then 1x1.

    `split`: each half's channels as a fraction of c_out; `link`: makes one link of the chain from the half's channels
    (None: a ResidualBottleneck)."""

    def __init__(self, c_in: int, c_out: int, n: int = 1, shortcut: bool = True, act: str = "silu", split: float = SPLIT_RATIO,
                 link: Callable[[int], nn.Module] | None = None):
        super().__init__()
        self.hidden = int(c_out * split)
        self.project = ConvBNAct(c_in, 2 * self.hidden, 1, 1, act=act)
        link = link or (lambda channels: ResidualBottleneck(channels, shortcut, act))
        self.blocks = nn.ModuleList(link(self.hidden) for _ in range(n))
        self.fuse_conv = ConvBNAct((2 + n) * self.hidden, c_out, 1, 1, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(self.project(x).split(self.hidden, dim=1))
        for block in self.blocks:
            parts.append(block(parts[-1]))
        return self.fuse_conv(torch.cat(parts, dim=1))


class FastSPP(nn.Module):
    """Spatial pyramid pooling by three chained stride-1 max-pools (each widens the previous one's field), concatenated."""

    def __init__(self, c_in: int, c_out: int, k: int = POOL_KERNEL, act: str = "silu"):
        super().__init__()
        hidden = c_in // 2
        self.reduce = ConvBNAct(c_in, hidden, 1, 1, act=act)
        self.pool = nn.MaxPool2d(k, stride=1, padding=k // 2)
        self.expand = ConvBNAct(hidden * 4, c_out, 1, 1, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pyramid = [self.reduce(x)]
        for _ in range(3):
            pyramid.append(self.pool(pyramid[-1]))
        return self.expand(torch.cat(pyramid, dim=1))


def backbone_layers(depth: float, width: float, max_channels: int, act: str = "silu") -> tuple[list[nn.Module], tuple[int, int, int]]:
    """The backbone's layers in flow order, [stem, stage2, stage3, stage4, stage5]: a stride-2 stem, four (downsample,
    split-CSP) stages, FastSPP ending the last; and the channels of the stride 8, 16, 32 maps (stages 3, 4, 5)."""
    c1, c2, c3, c4, c5 = (scaled_channels(c, width, max_channels) for c in STAGE_CHANNELS)
    n2, n3, n4, n5 = (scaled_depth(n, depth) for n in STAGE_BLOCKS)
    stem = ConvBNAct(3, c1, 3, 2, act=act)
    stage2 = nn.Sequential(ConvBNAct(c1, c2, 3, 2, act=act), SplitCSP(c2, c2, n2, True, act))
    stage3 = nn.Sequential(ConvBNAct(c2, c3, 3, 2, act=act), SplitCSP(c3, c3, n3, True, act))
    stage4 = nn.Sequential(ConvBNAct(c3, c4, 3, 2, act=act), SplitCSP(c4, c4, n4, True, act))
    stage5 = nn.Sequential(ConvBNAct(c4, c5, 3, 2, act=act), SplitCSP(c5, c5, n5, True, act), FastSPP(c5, c5, act=act))
    return [stem, stage2, stage3, stage4, stage5], (c3, c4, c5)


def neck_layers(channels: tuple[int, int, int], depth: float, act: str = "silu") -> list[nn.Module]:
    """The PAN neck's layers in flow order, [top_down4, top_down3, down3, bottom_up4, down4, bottom_up5]: top-down
    (upsample, concatenate, split-CSP) then bottom-up (stride-2 conv, concatenate, split-CSP); see `pan_forward`.

    The lateral inputs are concatenated as they come (no 1x1 reduction first); output channels equal the backbone's.
    """
    c3, c4, c5 = channels
    n = scaled_depth(NECK_BLOCKS, depth)
    return [SplitCSP(c5 + c4, c4, n, False, act), SplitCSP(c4 + c3, c3, n, False, act), ConvBNAct(c3, c3, 3, 2, act=act),
            SplitCSP(c3 + c4, c4, n, False, act), ConvBNAct(c4, c4, 3, 2, act=act), SplitCSP(c4 + c5, c5, n, False, act)]


def upsample(x: torch.Tensor) -> torch.Tensor:
    """Nearest-neighbour upsampling by 2 (what nn.Upsample(scale_factor=2) computes)."""
    return F.interpolate(x, scale_factor=2.0, mode="nearest")


def body_forward(layers: nn.ModuleList, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backbone then neck over the first eleven layers of `layers` (backbone_layers + neck_layers): P3, P4, P5."""
    stem, stage2, stage3, stage4, stage5, top_down4, top_down3, down3, bottom_up4, down4, bottom_up5 = layers[:11]
    c3 = stage3(stage2(stem(x)))
    c4 = stage4(c3)
    c5 = stage5(c4)
    t4 = top_down4(torch.cat((upsample(c5), c4), dim=1))
    p3 = top_down3(torch.cat((upsample(t4), c3), dim=1))
    p4 = bottom_up4(torch.cat((down3(p3), t4), dim=1))
    p5 = bottom_up5(torch.cat((down4(p4), c5), dim=1))
    return p3, p4, p5
