"""YOLOX network: blocks, backbone, head, the detector module, post-processing and size summary."""

from .model import YOLOX, build_model
from .postprocess import postprocess, scale_boxes
from .summary import model_info

__all__ = ["YOLOX", "build_model", "model_info", "postprocess", "scale_boxes"]
