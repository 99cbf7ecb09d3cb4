"""Building blocks of the YOLOX network: convolutions, bottlenecks, CSP layers, SPP and Focus."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_weights

BN_EPS = 1e-3  # BatchNorm epsilon used by YOLOX
BN_MOMENTUM = 0.03  # BatchNorm running-statistics momentum used by YOLOX


ACTIVATIONS = ("silu", "relu", "lrelu")  # the activations a model config's `act:` may name


def make_activation(name: str) -> nn.Module:
    """The activation module called `name`: silu | relu | lrelu."""
    if name == "silu":
        return nn.SiLU(inplace=True)
    if name == "relu":
        return nn.ReLU(inplace=True)
    if name == "lrelu":
        return nn.LeakyReLU(0.1, inplace=True)
    raise ValueError(f"unknown activation '{name}' (expected silu, relu or lrelu)")


class ConvBNAct(nn.Module):
    """Conv2d (no bias, 'same' padding) -> BatchNorm -> activation; `fuse()` folds the BatchNorm away."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1, groups: int = 1, act: str = "silu"):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, s, padding=(k - 1) // 2, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(c_out, eps=BN_EPS, momentum=BN_MOMENTUM)
        self.act = make_activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))

    @torch.no_grad()
    def fuse(self) -> None:
        """Fold the BatchNorm's running statistics into the convolution (inference only)."""
        if isinstance(self.bn, nn.Identity):
            return
        conv, bn = self.conv, self.bn
        fused = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, groups=conv.groups, bias=True).to(
            device=conv.weight.device, dtype=conv.weight.dtype
        )
        weight, bias = fuse_conv_bn_weights(conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias)
        fused.weight.copy_(weight)
        fused.bias.copy_(bias)
        self.conv = fused
        self.bn = nn.Identity()


class DWConv(nn.Module):
    """Depthwise-separable convolution: a depthwise k x k ConvBNAct then a pointwise 1x1 ConvBNAct."""

    def __init__(self, c_in: int, c_out: int, k: int = 3, s: int = 1, act: str = "silu"):
        super().__init__()
        self.dconv = ConvBNAct(c_in, c_in, k, s, groups=c_in, act=act)
        self.pconv = ConvBNAct(c_in, c_out, 1, 1, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pconv(self.dconv(x))


def conv3x3(c_in: int, c_out: int, s: int = 1, depthwise: bool = False, act: str = "silu") -> nn.Module:
    """The 3x3 convolution of the network: depthwise-separable or dense."""
    return DWConv(c_in, c_out, 3, s, act=act) if depthwise else ConvBNAct(c_in, c_out, 3, s, act=act)


class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3, with a residual add when shapes allow and `shortcut` is set."""

    def __init__(self, c_in: int, c_out: int, shortcut: bool = True, expansion: float = 0.5, depthwise: bool = False, act: str = "silu"):
        super().__init__()
        hidden = int(c_out * expansion)
        self.conv1 = ConvBNAct(c_in, hidden, 1, 1, act=act)
        self.conv2 = conv3x3(hidden, c_out, 1, depthwise, act)
        self.add = shortcut and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.conv1(x))
        return x + y if self.add else y


class CSPLayer(nn.Module):
    """Cross-stage-partial layer: one branch runs `n` bottlenecks, the other is a 1x1 shortcut; both are concatenated and mixed."""

    def __init__(self, c_in: int, c_out: int, n: int = 1, shortcut: bool = True, expansion: float = 0.5, depthwise: bool = False, act: str = "silu"):
        super().__init__()
        hidden = int(c_out * expansion)
        self.conv1 = ConvBNAct(c_in, hidden, 1, 1, act=act)
        self.conv2 = ConvBNAct(c_in, hidden, 1, 1, act=act)
        self.conv3 = ConvBNAct(2 * hidden, c_out, 1, 1, act=act)
        self.m = nn.Sequential(*(Bottleneck(hidden, hidden, shortcut, 1.0, depthwise, act) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv3(torch.cat((self.m(self.conv1(x)), self.conv2(x)), dim=1))


class SPPBottleneck(nn.Module):
    """Spatial pyramid pooling: parallel stride-1 max-pools of several sizes, concatenated with their input."""

    def __init__(self, c_in: int, c_out: int, kernel_sizes: tuple[int, ...] = (5, 9, 13), act: str = "silu"):
        super().__init__()
        hidden = c_in // 2
        self.conv1 = ConvBNAct(c_in, hidden, 1, 1, act=act)
        self.pools = nn.ModuleList(nn.MaxPool2d(k, stride=1, padding=k // 2) for k in kernel_sizes)
        self.conv2 = ConvBNAct(hidden * (len(kernel_sizes) + 1), c_out, 1, 1, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        return self.conv2(torch.cat([x] + [pool(x) for pool in self.pools], dim=1))


class Focus(nn.Module):
    """Space-to-depth: every 2x2 pixel block becomes 4 channels (H and W halve), then a ConvBNAct."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1, act: str = "silu"):
        super().__init__()
        self.conv = ConvBNAct(c_in * 4, c_out, k, s, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Channel order (even row/even col, odd/even, even/odd, odd/odd) matches YOLOX's weights layout.
        top_left = x[..., ::2, ::2]
        bottom_left = x[..., 1::2, ::2]
        top_right = x[..., ::2, 1::2]
        bottom_right = x[..., 1::2, 1::2]
        return self.conv(torch.cat((top_left, bottom_left, top_right, bottom_right), dim=1))
