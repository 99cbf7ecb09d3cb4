"""Detector networks: YOLOX (CSPDarknet, PAFPN, decoupled head) and YOLOCB (split-CSP, PAN, distribution head, task-aligned
loss), one package each (`yolox`, `yolocb`), both `Detector`s; `build_model` makes either from a model YAML; post-processing and size summary."""

from .build import build_model, load_model_cfg, with_current_names
from .detector import Detector
from .postprocess import postprocess, scale_boxes
from .summary import model_info
from .yolocb.model import YOLOCB
from .yolox.model import YOLOX

__all__ = ["YOLOCB", "YOLOX", "Detector", "build_model", "load_model_cfg", "model_info", "postprocess", "scale_boxes", "with_current_names"]
