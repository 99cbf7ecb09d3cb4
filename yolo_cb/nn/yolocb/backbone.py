"""YOLO-CB body: a split-CSP (ELAN-style) backbone ending in fast spatial pyramid pooling, and a PAN neck.

Every stage halves the resolution with a stride-2 3x3 convolution and refines with a split-CSP block, whose
1x1 projection is split in two halves: one half passes straight through, the other runs a chain of residual
bottlenecks, and every intermediate output of the chain is concatenated (many short gradient paths, as in ELAN).
"""

from __future__ import annotations

import math

import torch
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
    """1x1 projection split into halves a, b; b runs n bottlenecks in a chain; [a, b, b1, ..., bn] concatenated, then 1x1."""

    def __init__(self, c_in: int, c_out: int, n: int = 1, shortcut: bool = True, act: str = "silu"):
        super().__init__()
        self.hidden = int(c_out * SPLIT_RATIO)
        self.project = ConvBNAct(c_in, 2 * self.hidden, 1, 1, act=act)
        self.blocks = nn.ModuleList(ResidualBottleneck(self.hidden, shortcut, act) for _ in range(n))
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


class SplitCSPBackbone(nn.Module):
    """Stride-2 stem, then four (downsample, split-CSP) stages, FastSPP at the end; returns the stride 8, 16, 32 maps."""

    def __init__(self, depth: float, width: float, max_channels: int, act: str = "silu"):
        super().__init__()
        c1, c2, c3, c4, c5 = (scaled_channels(c, width, max_channels) for c in STAGE_CHANNELS)
        n2, n3, n4, n5 = (scaled_depth(n, depth) for n in STAGE_BLOCKS)
        self.stem = ConvBNAct(3, c1, 3, 2, act=act)
        self.stage2 = nn.Sequential(ConvBNAct(c1, c2, 3, 2, act=act), SplitCSP(c2, c2, n2, True, act))
        self.stage3 = nn.Sequential(ConvBNAct(c2, c3, 3, 2, act=act), SplitCSP(c3, c3, n3, True, act))
        self.stage4 = nn.Sequential(ConvBNAct(c3, c4, 3, 2, act=act), SplitCSP(c4, c4, n4, True, act))
        self.stage5 = nn.Sequential(ConvBNAct(c4, c5, 3, 2, act=act), SplitCSP(c5, c5, n5, True, act), FastSPP(c5, c5, act=act))
        self.out_channels = (c3, c4, c5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.stage2(self.stem(x))
        c3 = self.stage3(x)
        c4 = self.stage4(c3)
        c5 = self.stage5(c4)
        return c3, c4, c5


class PANNeck(nn.Module):
    """Top-down (upsample, concatenate, split-CSP) then bottom-up (stride-2 conv, concatenate, split-CSP); outputs P3, P4, P5.

    The lateral inputs are concatenated as they come (no 1x1 reduction first); output channels equal the backbone's.
    """

    def __init__(self, channels: tuple[int, int, int], depth: float, act: str = "silu"):
        super().__init__()
        c3, c4, c5 = channels
        n = scaled_depth(NECK_BLOCKS, depth)
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")
        self.top_down4 = SplitCSP(c5 + c4, c4, n, False, act)
        self.top_down3 = SplitCSP(c4 + c3, c3, n, False, act)
        self.down3 = ConvBNAct(c3, c3, 3, 2, act=act)
        self.bottom_up4 = SplitCSP(c3 + c4, c4, n, False, act)
        self.down4 = ConvBNAct(c4, c4, 3, 2, act=act)
        self.bottom_up5 = SplitCSP(c4 + c5, c5, n, False, act)

    def forward(self, feats: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c3, c4, c5 = feats
        t4 = self.top_down4(torch.cat((self.upsample(c5), c4), dim=1))
        p3 = self.top_down3(torch.cat((self.upsample(t4), c3), dim=1))
        p4 = self.bottom_up4(torch.cat((self.down3(p3), t4), dim=1))
        p5 = self.bottom_up5(torch.cat((self.down4(p4), c5), dim=1))
        return p3, p4, p5
