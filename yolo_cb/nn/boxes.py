"""Box arithmetic on (N, 4) tensors: the box format change, areas, IoU matrices and the GIoU loss.

Written here rather than taken from torchvision.ops: importing torchvision.ops loads torchvision's models and
torch._dynamo (about 1.5 s of CPU in every process), and none of this needs it. Only non-maximum suppression, a C++
kernel, still comes from torchvision, imported where it runs (nn/postprocess.py). tests/test_nn.py holds each function
equal to torchvision's on random boxes.
"""

from __future__ import annotations

import torch

GIOU_EPS = 1e-7  # keeps IoU and the enclosing-box term finite for empty boxes


def cxcywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    """(..., 4) centre x, centre y, width, height -> x1, y1, x2, y2."""
    centre, size = boxes[..., :2], boxes[..., 2:4]
    return torch.cat((centre - size / 2, centre + size / 2), dim=-1)


def box_area(boxes: torch.Tensor) -> torch.Tensor:
    """(N, 4) xyxy -> (N,) areas."""
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def box_iou(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """(N, 4) and (M, 4) xyxy -> (N, M) IoU of every pair."""
    top_left = torch.maximum(boxes1[:, None, :2], boxes2[None, :, :2])
    bottom_right = torch.minimum(boxes1[:, None, 2:], boxes2[None, :, 2:])
    inter = (bottom_right - top_left).clamp(min=0).prod(dim=2)
    return inter / (box_area(boxes1)[:, None] + box_area(boxes2)[None, :] - inter)


def giou_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(N, 4) and (N, 4) xyxy, row i against row i -> (N,) 1 - generalised IoU."""
    top_left = torch.maximum(pred[:, :2], target[:, :2])
    bottom_right = torch.minimum(pred[:, 2:], target[:, 2:])
    inter = (bottom_right - top_left).clamp(min=0).prod(dim=1)
    union = box_area(pred) + box_area(target) - inter
    iou = inter / (union + GIOU_EPS)
    hull = (torch.maximum(pred[:, 2:], target[:, 2:]) - torch.minimum(pred[:, :2], target[:, :2])).prod(dim=1)
    return 1 - (iou - (hull - union) / (hull + GIOU_EPS))
