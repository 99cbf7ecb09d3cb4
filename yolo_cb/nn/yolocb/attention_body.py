"""The `body: c3k2_psa` of a YOLO-CB model YAML: YOLO11's backbone and neck, written from its published structure.

Against the split-CSP body (backbone.py) three things differ, each measured in BENCHMARKS.md ("YOLO11's body"):
- the split-CSP blocks of the first two stages keep a quarter of their output channels per half (not a half), and their
  stage outputs are twice their downsampling convolution's width (P3 has 128 channels at width 0.25, not 64);
- a block's chain links are thinner bottlenecks (3x3 to half width and back) or, in the stride-16 and stride-32 blocks,
  small CSP blocks of two full-width bottlenecks each (`KernelCSP`);
- the stride-32 map ends with self-attention over its positions (`AttentionCSP`) after the fast pyramid pooling.

The layers come in the same flow order and the same eleven places as backbone.py's, so `body_forward` runs either.
"""

from __future__ import annotations

import torch
from torch import nn

from ..blocks import ConvBNAct
from .backbone import FastSPP, ResidualBottleneck, SplitCSP, scaled_channels, scaled_depth

BLOCK_REPEATS = 2  # chain links in every block at depth multiplier 1.0
EARLY_SPLIT = 0.25  # the stride-4 and stride-8 blocks' halves, as a fraction of their output channels
HEAD_CHANNELS = 64  # channels of one attention head
KEY_RATIO = 0.5  # query and key channels of a head, as a fraction of its value channels


def linear_conv(c_in: int, c_out: int, k: int = 1, groups: int = 1) -> ConvBNAct:
    """A ConvBNAct without its activation (a projection, or a depthwise positional encoding)."""
    layer = ConvBNAct(c_in, c_out, k, 1, groups=groups)
    layer.act = nn.Identity()
    return layer


class HalfBottleneck(nn.Module):
    """3x3 to half the channels, 3x3 back, with an identity shortcut when `shortcut` is set."""

    def __init__(self, channels: int, shortcut: bool = True, act: str = "silu"):
        super().__init__()
        self.conv1 = ConvBNAct(channels, channels // 2, 3, 1, act=act)
        self.conv2 = ConvBNAct(channels // 2, channels, 3, 1, act=act)
        self.add = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.conv1(x))
        return x + y if self.add else y


class KernelCSP(nn.Module):
    """A small CSP block: two 1x1 halves, one through two full-width residual bottlenecks, concatenated, then 1x1."""

    def __init__(self, channels: int, shortcut: bool = True, act: str = "silu"):
        super().__init__()
        hidden = channels // 2
        self.conv1 = ConvBNAct(channels, hidden, 1, 1, act=act)
        self.conv2 = ConvBNAct(channels, hidden, 1, 1, act=act)
        self.m = nn.Sequential(ResidualBottleneck(hidden, shortcut, act), ResidualBottleneck(hidden, shortcut, act))
        self.conv3 = ConvBNAct(2 * hidden, channels, 1, 1, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv3(torch.cat((self.m(self.conv1(x)), self.conv2(x)), dim=1))


def chain_csp(c_in: int, c_out: int, n: int, kernel_csp: bool, split: float, act: str) -> SplitCSP:
    """The split-CSP of this body: halves of `split` x c_out channels; the chain's links are thin bottlenecks, or
    KernelCSP blocks with `kernel_csp`."""
    link = (lambda c: KernelCSP(c, True, act)) if kernel_csp else (lambda c: HalfBottleneck(c, True, act))
    return SplitCSP(c_in, c_out, n, act=act, split=split, link=link)


class PositionAttention(nn.Module):
    """Multi-head self-attention over the map's positions (1x1 projections), plus a depthwise 3x3 of the values as a
    positional term."""

    def __init__(self, channels: int, heads: int):
        super().__init__()
        self.heads, self.value_dim = heads, channels // heads
        self.key_dim = int(self.value_dim * KEY_RATIO)
        self.qkv = linear_conv(channels, channels + 2 * self.key_dim * heads)
        self.proj = linear_conv(channels, channels)
        self.position = linear_conv(channels, channels, 3, groups=channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        q, k, v = self.qkv(x).view(b, self.heads, 2 * self.key_dim + self.value_dim, h * w).split(
            [self.key_dim, self.key_dim, self.value_dim], dim=2)
        weights = ((q.transpose(-2, -1) @ k) * self.key_dim ** -0.5).softmax(dim=-1)  # (b, heads, positions, positions)
        out = (v @ weights.transpose(-2, -1)).view(b, c, h, w) + self.position(v.reshape(b, c, h, w))
        return self.proj(out)


class AttentionCSP(nn.Module):
    """1x1 into halves; the second through n (attention, then a 1x1 feed-forward) residual pairs; concatenated, 1x1."""

    def __init__(self, channels: int, n: int = 1, act: str = "silu"):
        super().__init__()
        self.hidden = channels // 2
        self.project = ConvBNAct(channels, 2 * self.hidden, 1, 1, act=act)
        self.attention = nn.ModuleList(PositionAttention(self.hidden, max(self.hidden // HEAD_CHANNELS, 1)) for _ in range(n))
        self.feed_forward = nn.ModuleList(nn.Sequential(ConvBNAct(self.hidden, 2 * self.hidden, 1, 1, act=act),
                                                        linear_conv(2 * self.hidden, self.hidden)) for _ in range(n))
        self.fuse_conv = ConvBNAct(2 * self.hidden, channels, 1, 1, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.project(x).split(self.hidden, dim=1)
        for attention, feed_forward in zip(self.attention, self.feed_forward, strict=True):
            b = b + attention(b)
            b = b + feed_forward(b)
        return self.fuse_conv(torch.cat((a, b), dim=1))


def attention_body_layers(depth: float, width: float, max_channels: int, act: str = "silu") -> tuple[list[nn.Module], tuple[int, int, int]]:
    """The eleven body layers in backbone.py's order (stem, stages 2-5, then the PAN neck's six), and the channels of
    the stride 8, 16, 32 maps the head reads."""
    c1, c2, c3, c4, c5 = (scaled_channels(c, width, max_channels) for c in (64, 128, 256, 512, 1024))
    n = scaled_depth(BLOCK_REPEATS, depth)
    p3, p4, p5 = c4, c4, c5  # YOLO11's map widths: P3 and P4 alike

    def down(c_in: int, c_out: int) -> ConvBNAct:
        return ConvBNAct(c_in, c_out, 3, 2, act=act)

    backbone = [down(3, c1),
                nn.Sequential(down(c1, c2), chain_csp(c2, c3, n, False, EARLY_SPLIT, act)),
                nn.Sequential(down(c3, c3), chain_csp(c3, p3, n, False, EARLY_SPLIT, act)),
                nn.Sequential(down(p3, c4), chain_csp(c4, p4, n, True, 0.5, act)),
                nn.Sequential(down(p4, c5), chain_csp(c5, p5, n, True, 0.5, act), FastSPP(p5, p5, act=act), AttentionCSP(p5, n, act))]
    top4, top3 = c4, c3  # the neck's top-down widths (YOLO11's head: 512 and 256 before the multiplier)
    neck = [chain_csp(p5 + p4, top4, n, False, 0.5, act), chain_csp(top4 + p3, top3, n, False, 0.5, act), down(top3, top3),
            chain_csp(top3 + top4, top4, n, False, 0.5, act), down(top4, top4), chain_csp(top4 + p5, p5, n, True, 0.5, act)]
    return backbone + neck, (top3, top4, p5)
