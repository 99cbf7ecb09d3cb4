"""Detector networks: YOLOX (CSPDarknet, PAFPN, decoupled head) and YOLOCB (split-CSP, PAN, distribution head, task-aligned
loss); `build_model` makes either from a model YAML; post-processing and size summary."""

from .model import YOLOX, build_model
from .postprocess import postprocess, scale_boxes
from .summary import model_info
from .yolocb_model import YOLOCB

__all__ = ["YOLOCB", "YOLOX", "build_model", "model_info", "postprocess", "scale_boxes"]
