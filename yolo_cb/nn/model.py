"""The YOLOX detector module and `build_model`, which makes a YOLOX or a YOLOCB from a model YAML, a bundled name or a dict."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import yaml
from torch import nn

from ..errors import ConfigError, load_yaml, short_repr
from ..paths import MODELS_DIR, find_model_cfg
from .backbone import PAFPN
from .blocks import ConvBNAct
from .head import STRIDES, YOLOXHead
from .loss import YOLOXLoss
from .summary import log_summary
from .yolocb_model import FAMILY as YOLOCB_FAMILY
from .yolocb_model import YOLOCB, parse_yolocb_cfg

LOGGER = logging.getLogger("yolo_cb")
ARCH_KEYS = ("depth", "width", "depthwise", "act")  # the settings that define the architecture (besides nc)
FAMILIES = {"yolox": "YOLOX", YOLOCB_FAMILY: "YOLOCB"}  # `family:` value -> display-name prefix


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


def load_model_cfg(cfg: str | Path | dict) -> tuple[dict, str]:
    """The architecture dict and a display name (e.g. 'YOLOX-nano', 'YOLOCB-n') from a YAML path, a bundled name or a dict.

    The `family:` key picks the detector: yolox (the default when absent) or yolocb.
    """
    if isinstance(cfg, dict):
        data = dict(cfg)
        path = next((p for p in sorted(MODELS_DIR.glob("*.yaml")) if _same_arch(yaml.safe_load(p.read_text()) or {}, data)), None)
    else:
        path = find_model_cfg(str(cfg))
        if path.suffix.lower() not in (".yaml", ".yml"):
            raise ConfigError(f"model={cfg}: {path} is neither a yolo-cb checkpoint (.pt) nor a model YAML (.yaml, e.g. yolox-nano.yaml)")
        data = load_yaml(path, ConfigError, "model YAML")
        if not isinstance(data, dict):
            raise ConfigError(f"model={cfg}: {path} holds a {type(data).__name__}, not a mapping of model settings (depth, width, ...)")
    family = _family(data)
    if family not in FAMILIES:
        raise ValueError(f"model config {short_repr(cfg)}: unknown family '{family}' (expected {' or '.join(FAMILIES)})")
    if path is None:
        name = str(data.get("name", FAMILIES[family]))
    elif path.stem.lower().startswith(family + "-"):
        name = FAMILIES[family] + "-" + path.stem.split("-", 1)[1]
    else:
        name = path.stem
    if family == YOLOCB_FAMILY:
        return parse_yolocb_cfg(data), name
    missing = [k for k in ("depth", "width") if k not in data]
    if missing:
        raise KeyError(f"model config {short_repr(cfg)} lacks {', '.join(missing)}")
    arch = {
        "depth": float(data["depth"]),
        "width": float(data["width"]),
        "depthwise": bool(data.get("depthwise", False)),
        "act": str(data.get("act", "silu")),
    }
    if "nc" in data:
        arch["nc"] = int(data["nc"])
    return arch, name


def _family(data: dict) -> str:
    """The detector family a config dict names (`family:`), yolox when absent."""
    return str(data.get("family") or "yolox").lower()


def _same_arch(a: dict, b: dict) -> bool:
    """Whether two config dicts describe the same architecture (so a stored cfg dict gets its bundled name back)."""
    try:
        if _family(a) != _family(b):
            return False
        if _family(a) == YOLOCB_FAMILY:
            a, b = parse_yolocb_cfg(a), parse_yolocb_cfg(b)
            return all(a[k] == b[k] for k in ("max_channels", "reg_max", "act")) and all(abs(a[k] - b[k]) < 1e-9 for k in ("depth", "width"))
        return all(str(a.get(k)) == str(b.get(k)) for k in ("depthwise", "act")) and all(
            abs(float(a[k]) - float(b[k])) < 1e-9 for k in ("depth", "width")
        )
    except (KeyError, TypeError, ValueError):
        return False


def build_model(cfg: str | Path | dict, nc: int, verbose: bool = True, imgsz: int = 640) -> YOLOX | YOLOCB:
    """A freshly initialised detector from `cfg` (path, bundled name like 'yolox-nano' or 'yolocb-n', or dict), with `nc`
    classes: a YOLOX, or a YOLOCB when the config says `family: yolocb`.

    When verbose, logs one summary line (layers, parameters, GFLOPs at `imgsz`) to the 'yolo_cb' logger.
    """
    arch, name = load_model_cfg(cfg)
    arch.pop("nc", None)
    if arch.pop("family", None) == YOLOCB_FAMILY:
        model = YOLOCB(nc=nc, name=name, **arch)
    else:
        model = YOLOX(nc=nc, name=name, **arch)
    if verbose:
        log_summary(model, imgsz)
    return model
