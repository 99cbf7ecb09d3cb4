"""The YOLO-CB detector: split-CSP backbone, PAN neck, distribution head, task-aligned loss (`family: yolocb` in a model YAML).

A `Detector` (yolo_cb/nn/detector.py), as YOLOX is, so the trainer, validator, predictor and exporter use it unchanged;
its decoded predictions (B, A, 4 + 1 + nc) have an objectness column of 1 (a YOLO-CB score is its class probability alone).

Its layers are one indexed list, `model`, in the order the image flows through them (as Ultralytics' models are), so
module names read `model.<index>.<...>` and the index is the layer freeze=N counts: 0 stem, 1-4 stage2-5 (the backbone),
5 top_down4, 6 top_down3, 7 down3, 8 bottom_up4, 9 down4, 10 bottom_up5 (the neck), 11 head.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..detector import Detector
from .attention_body import attention_body_layers
from .backbone import backbone_layers, body_forward, neck_layers
from .head import CLS_BRANCHES, REG_MAX, STRIDES, DistributionHead
from .loss import YOLOCBLoss

FAMILY = "yolocb"  # the `family:` value of a model YAML that builds this detector
MAX_CHANNELS = 1024  # default cap on any layer's channels before the width multiplier
BODIES = ("split_csp", "c3k2_psa")  # backbone and neck: split-CSP (backbone.py) | YOLO11's (attention_body.py)
# The layers of `model`, each at its index, by the name it had before the layers were one list: checkpoints written
# then, and freeze= / unfreeze names written for them, are read through `current_name`.
OLD_LAYER_NAMES = ("backbone.stem", "backbone.stage2", "backbone.stage3", "backbone.stage4", "backbone.stage5", "neck.top_down4",
                   "neck.top_down3", "neck.down3", "neck.bottom_up4", "neck.down4", "neck.bottom_up5", "head")


def current_name(name: str) -> str:
    """A module or state-dict name as YOLOCB names it now: backbone.stem.bn.weight -> model.0.bn.weight (others unchanged)."""
    for index, old in enumerate(OLD_LAYER_NAMES):
        if name == old or name.startswith(old + "."):
            return f"model.{index}{name[len(old):]}"
    return name


def _old_keys_renamed(module, state_dict, prefix, *args) -> None:
    """load_state_dict pre-hook: keys written before the layers were one list load under their new names."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        new = prefix + current_name(key[len(prefix):])
        if new != key:
            state_dict[new] = state_dict.pop(key)


class YOLOCB(Detector):
    """The `Detector` contract (yolo_cb/nn/detector.py). Raw per-level outputs (`head_outputs`) are
    (B, 4 * reg_max + nc, H / s, W / s); decoded predictions (B, A, 4 + 1 + nc) have objectness 1."""

    family = FAMILY
    strides = STRIDES

    def __init__(self, depth: float = 0.33, width: float = 0.25, max_channels: int = MAX_CHANNELS, reg_max: int = REG_MAX,
                 nc: int = 80, act: str = "silu", name: str = "YOLOCB", cls_branch: str = CLS_BRANCHES[0], body: str = BODIES[0]):
        if body not in BODIES:
            raise ValueError(f"unknown body '{body}' (expected {' or '.join(BODIES)})")
        super().__init__({"family": FAMILY, "depth": float(depth), "width": float(width), "max_channels": int(max_channels),
                          "reg_max": int(reg_max), "act": str(act), "cls_branch": str(cls_branch), "body": str(body), "nc": int(nc)}, name)
        if body == "split_csp":  # the head is made before the neck, as before the body key: a seed draws the same weights
            backbone, channels = backbone_layers(depth, width, int(max_channels), act)
            head = DistributionHead(self.nc, channels, int(reg_max), act, STRIDES, str(cls_branch))
            layers = [*backbone, *neck_layers(channels, depth, act)]
        else:
            layers, channels = attention_body_layers(depth, width, int(max_channels), act)
            head = DistributionHead(self.nc, channels, int(reg_max), act, STRIDES, str(cls_branch))
        self.model = nn.ModuleList([*layers, head])
        self.register_load_state_dict_pre_hook(_old_keys_renamed)
        self.build_loss()

    current_name = staticmethod(current_name)

    @property
    def layers(self) -> tuple[str, ...]:
        """model.0 ... model.11: the layers in flow order (see the module docstring)."""
        return tuple(f"model.{index}" for index in range(len(self.model)))

    @property
    def head(self) -> DistributionHead:
        return self.model[-1]

    def head_outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Per-level head outputs (B, 4 * reg_max + nc, H / s, W / s) for s in 8, 16, 32: distance-bin and class logits."""
        return self.head(body_forward(self.model, x))

    def raw_outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Per-level outputs in YOLOX's raw layout (B, 4 + 1 + nc, H / s, W / s), for code that decodes YOLOX outputs
        itself (the exporter's dynamic-shape graph); decoding them gives `decode`'s predictions."""
        return self.head.yolox_layout(self.head_outputs(x))

    def build_loss(self, settings: Mapping[str, Any] | None = None) -> YOLOCBLoss:
        """A YOLOCBLoss (CIoU + DFL with fixed gains: it reads no training setting) as `criterion`."""
        self.criterion = YOLOCBLoss.from_settings(self.nc, int(self.cfg["reg_max"]), settings)
        return self.criterion


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
        "cls_branch": str(data.get("cls_branch", CLS_BRANCHES[0])),  # checkpoints written before the key have the full branch
        "body": str(data.get("body", BODIES[0])),  # and the split-CSP body
    }
    if "nc" in data:
        arch["nc"] = int(data["nc"])
    return arch
