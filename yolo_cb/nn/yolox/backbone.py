"""CSPDarknet backbone and the PAFPN neck that fuses its three deepest stages."""

from __future__ import annotations

import torch
from torch import nn

from ..blocks import ConvBNAct, CSPLayer, Focus, SPPBottleneck, conv3x3

# Channels of the three feature maps fed to the head (strides 8, 16, 32) at width multiplier 1.0.
FEATURE_CHANNELS = (256, 512, 1024)


class CSPDarknet(nn.Module):
    """Focus stem then four downsampling stages; returns the stride 8, 16 and 32 feature maps."""

    def __init__(self, depth: float, width: float, depthwise: bool = False, act: str = "silu"):
        super().__init__()
        c = int(width * 64)  # stem channels
        n = max(round(depth * 3), 1)  # bottlenecks in the shallowest CSP layer
        self.stem = Focus(3, c, k=3, act=act)
        self.dark2 = nn.Sequential(conv3x3(c, c * 2, 2, depthwise, act), CSPLayer(c * 2, c * 2, n, depthwise=depthwise, act=act))
        self.dark3 = nn.Sequential(conv3x3(c * 2, c * 4, 2, depthwise, act), CSPLayer(c * 4, c * 4, n * 3, depthwise=depthwise, act=act))
        self.dark4 = nn.Sequential(conv3x3(c * 4, c * 8, 2, depthwise, act), CSPLayer(c * 8, c * 8, n * 3, depthwise=depthwise, act=act))
        self.dark5 = nn.Sequential(
            conv3x3(c * 8, c * 16, 2, depthwise, act),
            SPPBottleneck(c * 16, c * 16, act=act),
            CSPLayer(c * 16, c * 16, n, shortcut=False, depthwise=depthwise, act=act),
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.dark2(self.stem(x))
        c3 = self.dark3(x)
        c4 = self.dark4(c3)
        c5 = self.dark5(c4)
        return c3, c4, c5


class PAFPN(nn.Module):
    """CSPDarknet followed by a top-down (FPN) then bottom-up (PAN) path; outputs P3, P4, P5."""

    def __init__(self, depth: float, width: float, depthwise: bool = False, act: str = "silu"):
        super().__init__()
        self.backbone = CSPDarknet(depth, width, depthwise, act)
        c3, c4, c5 = (int(c * width) for c in FEATURE_CHANNELS)
        n = round(3 * depth)  # bottlenecks per neck CSP layer
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")
        # top-down path
        self.lateral_conv0 = ConvBNAct(c5, c4, 1, 1, act=act)
        self.C3_p4 = CSPLayer(2 * c4, c4, n, shortcut=False, depthwise=depthwise, act=act)
        self.reduce_conv1 = ConvBNAct(c4, c3, 1, 1, act=act)
        self.C3_p3 = CSPLayer(2 * c3, c3, n, shortcut=False, depthwise=depthwise, act=act)
        # bottom-up path
        self.bu_conv2 = conv3x3(c3, c3, 2, depthwise, act)
        self.C3_n3 = CSPLayer(2 * c3, c4, n, shortcut=False, depthwise=depthwise, act=act)
        self.bu_conv1 = conv3x3(c4, c4, 2, depthwise, act)
        self.C3_n4 = CSPLayer(2 * c4, c5, n, shortcut=False, depthwise=depthwise, act=act)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c3, c4, c5 = self.backbone(x)
        top5 = self.lateral_conv0(c5)
        p4 = self.C3_p4(torch.cat((self.upsample(top5), c4), dim=1))
        top4 = self.reduce_conv1(p4)
        out3 = self.C3_p3(torch.cat((self.upsample(top4), c3), dim=1))
        out4 = self.C3_n3(torch.cat((self.bu_conv2(out3), top4), dim=1))
        out5 = self.C3_n4(torch.cat((self.bu_conv1(out4), top5), dim=1))
        return out3, out4, out5
