"""YOLO-CB training loss: task-aligned assignment, then CIoU and distribution focal loss on the boxes and BCE on the classes.

Every term is normalised by the sum of the soft class targets over the batch (so well-aligned cells count more), and
the box terms of each foreground cell are weighted by its target score.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from .assigner import TaskAlignedAssigner, pad_targets
from .head import boxes_to_distances, dfl_expectation, distances_to_boxes

BOX_GAIN = 7.5  # weight of the CIoU term
CLS_GAIN = 0.5  # weight of the classification BCE term
DFL_GAIN = 1.5  # weight of the distribution focal loss term
DFL_MARGIN = 0.01  # distance targets stop this far below the last bin, so both neighbouring bins exist
EPS = 1e-7  # guards divisions in the IoU terms


def complete_iou(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """CIoU of row i of pred with row i of target (both xyxy): IoU minus the normalised centre distance and the
    aspect-ratio mismatch term (Zheng et al., Distance-IoU loss)."""
    pw, ph = pred[:, 2] - pred[:, 0], (pred[:, 3] - pred[:, 1]).clamp(min=EPS)
    tw, th = target[:, 2] - target[:, 0], (target[:, 3] - target[:, 1]).clamp(min=EPS)
    iw = (torch.minimum(pred[:, 2], target[:, 2]) - torch.maximum(pred[:, 0], target[:, 0])).clamp(min=0)
    ih = (torch.minimum(pred[:, 3], target[:, 3]) - torch.maximum(pred[:, 1], target[:, 1])).clamp(min=0)
    inter = iw * ih
    iou = inter / (pw * ph + tw * th - inter + EPS)
    enclose_w = torch.maximum(pred[:, 2], target[:, 2]) - torch.minimum(pred[:, 0], target[:, 0])
    enclose_h = torch.maximum(pred[:, 3], target[:, 3]) - torch.minimum(pred[:, 1], target[:, 1])
    diagonal2 = enclose_w**2 + enclose_h**2 + EPS
    center2 = ((pred[:, 0] + pred[:, 2] - target[:, 0] - target[:, 2]) ** 2 + (pred[:, 1] + pred[:, 3] - target[:, 1] - target[:, 3]) ** 2) / 4
    aspect = (4 / math.pi**2) * (torch.atan(tw / th) - torch.atan(pw / ph)) ** 2
    with torch.no_grad():
        trade_off = aspect / (aspect - iou + (1 + EPS))
    return iou - (center2 / diagonal2 + trade_off * aspect)


def distribution_focal_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """GFL's DFL: logits (F, 4, reg_max) and real-valued targets (F, 4) in bin units -> (F,) loss, mean over the 4 sides.

    A target t between bins i = floor(t) and i + 1 is the two-point distribution (i: i + 1 - t, i + 1: t - i); the loss is
    its cross-entropy with the predicted softmax, which pulls the expectation to t while keeping the mass near it."""
    left = target.floor().long()
    right_weight = target - left
    flat = logits.reshape(-1, logits.shape[-1])
    ce_left = F.cross_entropy(flat, left.reshape(-1), reduction="none").view_as(target)
    ce_right = F.cross_entropy(flat, (left + 1).reshape(-1), reduction="none").view_as(target)
    return (ce_left * (1 - right_weight) + ce_right * right_weight).mean(dim=-1)


class YOLOCBLoss:
    """Loss of a YOLO-CB head; not an nn.Module (it holds no tensors or parameters).

    __call__() returns {"total", "box", "cls", "dfl", "num_fg"}: the components are detached and already weighted, so
    total == box + cls + dfl; num_fg is the number of foreground cells in the batch (float).
    """

    loss_names = ("box", "cls", "dfl")  # the loss-dict components the trainer and validator report (as <name>_loss)
    reads_settings = ()  # no loss setting: CIoU + DFL with fixed gains (the trainer refuses box=/iou_type=)

    def __init__(self, nc: int, reg_max: int, box_gain: float = BOX_GAIN, cls_gain: float = CLS_GAIN, dfl_gain: float = DFL_GAIN):
        self.nc, self.reg_max = int(nc), int(reg_max)
        self.box_gain, self.cls_gain, self.dfl_gain = float(box_gain), float(cls_gain), float(dfl_gain)
        self.assigner = TaskAlignedAssigner()

    def start_final_stage(self) -> str:
        """The last, no-augmentation epochs begin (the stage switch calls it): no term of this loss changes."""
        return ""

    def training_state(self) -> dict:
        """What training changes in this loss (a checkpoint keeps it under `loss`): nothing."""
        return {}

    def load_training_state(self, state: dict) -> None:
        """Take back training_state(): there is nothing to take."""

    @classmethod
    def from_settings(cls, nc: int, reg_max: int, settings: Mapping[str, Any] | None = None) -> YOLOCBLoss:
        """The loss for training `settings`: it reads none of them (`reads_settings` is empty; the trainer refuses a
        changed box= or iou_type= for this loss), so this is YOLOCBLoss(nc, reg_max)."""
        return cls(nc, reg_max)

    def __call__(self, dist: torch.Tensor, cls_logits: torch.Tensor, centers: torch.Tensor, strides: torch.Tensor, targets: torch.Tensor) -> dict:
        """dist: distance-bin logits (B, A, 4, reg_max); cls_logits (B, A, nc); centers: cell centres (A, 2) in stride units;
        strides (A, 1); targets (N, 6) rows [image_index, class, cx, cy, w, h] in input pixels."""
        if torch.is_autocast_enabled(dist.device.type):
            with torch.autocast(dist.device.type, enabled=False):  # the loss and assignment run in float32
                return self(dist, cls_logits, centers, strides, targets)
        dist, cls_logits, centers, strides = dist.float(), cls_logits.float(), centers.float(), strides.float()
        targets = targets.to(device=dist.device, dtype=torch.float32).reshape(-1, 6)
        if len(targets) and int(targets[:, 1].max()) >= self.nc:
            raise ValueError(f"target class {int(targets[:, 1].max())} out of range for a model with nc={self.nc}")

        pred_boxes = distances_to_boxes(dfl_expectation(dist), centers) * strides  # (B, A, 4) xyxy pixels
        gt_classes, gt_boxes, gt_valid = pad_targets(targets, dist.shape[0])
        assigned = self.assigner(cls_logits.detach().sigmoid(), pred_boxes.detach(), centers * strides, gt_classes, gt_boxes, gt_valid)
        norm = assigned.scores.sum().clamp(min=1.0)

        loss_cls = F.binary_cross_entropy_with_logits(cls_logits, assigned.scores, reduction="sum") / norm
        fg = assigned.fg_mask
        if bool(fg.any()):
            weight = assigned.scores.sum(dim=-1)[fg]  # (F,)
            loss_box = ((1.0 - complete_iou(pred_boxes[fg], assigned.boxes[fg])) * weight).sum() / norm
            cell_strides = strides.expand(fg.shape[0], -1, -1)[fg]  # (F, 1)
            target_ltrb = boxes_to_distances(assigned.boxes[fg] / cell_strides, centers.expand(fg.shape[0], -1, -1)[fg])
            target_ltrb = target_ltrb.clamp(0, self.reg_max - 1 - DFL_MARGIN)
            loss_dfl = (distribution_focal_loss(dist[fg], target_ltrb) * weight).sum() / norm
        else:
            loss_box = loss_dfl = dist.sum() * 0.0  # keeps every parameter in the graph (DDP) with a zero gradient
        loss_box, loss_cls, loss_dfl = loss_box * self.box_gain, loss_cls * self.cls_gain, loss_dfl * self.dfl_gain
        return {
            "total": loss_box + loss_cls + loss_dfl,
            "box": loss_box.detach(),
            "cls": loss_cls.detach(),
            "dfl": loss_dfl.detach(),
            "num_fg": float(fg.sum()),
        }
