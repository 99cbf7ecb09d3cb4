"""Task-aligned label assignment (TOOD, as used by PP-YOLOE): cells whose class score and box agree with a ground truth learn it.

For a ground truth g and a cell a whose centre lies inside g, the alignment is t = s^alpha * IoU^beta, with s the
cell's predicted probability of g's class and IoU that of the cell's predicted box with g. Each ground truth takes
its top-k aligned cells; a cell taken by several keeps the one its box overlaps most. A foreground cell's
classification target is soft: t normalised so that g's best-aligned cell gets g's best IoU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

TOPK = 10  # foreground cells a ground truth takes at most (its best-aligned candidates)
ALPHA = 0.5  # exponent of the class score in the alignment metric
BETA = 6.0  # exponent of the IoU in the alignment metric (localisation dominates)
EPS = 1e-9  # strictness margin of "centre inside the box" and guard of divisions


@dataclass
class TaskAlignedTargets:
    """Per cell of every image (B images, A cells): what it learns."""

    fg_mask: torch.Tensor  # (B, A) bool: the cell learns a box
    boxes: torch.Tensor  # (B, A, 4) x1, y1, x2, y2 of its ground truth (pixels; meaningful where fg_mask)
    scores: torch.Tensor  # (B, A, nc) soft class targets: one-hot of the ground truth's class times the normalised alignment
    gt_index: torch.Tensor  # (B, A) index of its ground truth in the padded per-image list (meaningful where fg_mask)


def pad_targets(targets: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(N, 6) rows [image, class, cx, cy, w, h] -> per image, padded to the most boxes in one image:
    classes (B, G) long, boxes (B, G, 4) x1 y1 x2 y2, valid (B, G) bool."""
    image = targets[:, 0].long()
    counts = torch.bincount(image, minlength=batch_size) if len(targets) else targets.new_zeros(batch_size, dtype=torch.long)
    g = int(counts.max()) if len(targets) else 0
    classes = targets.new_zeros((batch_size, g), dtype=torch.long)
    boxes = targets.new_zeros((batch_size, g, 4))
    valid = torch.zeros((batch_size, g), dtype=torch.bool, device=targets.device)
    if g:
        order = torch.argsort(image, stable=True)
        image, rows = image[order], targets[order]
        first = torch.cumsum(counts, 0) - counts  # index of each image's first row in the sorted list
        slot = torch.arange(len(rows), device=targets.device) - first[image]
        xy, half = rows[:, 2:4], rows[:, 4:6] / 2
        classes[image, slot] = rows[:, 1].long()
        boxes[image, slot] = torch.cat((xy - half, xy + half), dim=1)
        valid[image, slot] = True
    return classes, boxes, valid


def pairwise_iou(gt: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
    """IoU of every ground truth with every prediction of the same image: gt (B, G, 4), pred (B, A, 4) xyxy -> (B, G, A)."""
    gt, pred = gt[:, :, None], pred[:, None]
    wh = (torch.minimum(gt[..., 2:], pred[..., 2:]) - torch.maximum(gt[..., :2], pred[..., :2])).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    area_gt = (gt[..., 2] - gt[..., 0]) * (gt[..., 3] - gt[..., 1])
    area_pred = (pred[..., 2] - pred[..., 0]).clamp(min=0) * (pred[..., 3] - pred[..., 1]).clamp(min=0)
    return inter / (area_gt + area_pred - inter).clamp(min=EPS)


def centers_inside(centers: torch.Tensor, gt_boxes: torch.Tensor) -> torch.Tensor:
    """(B, G, A) whether each cell centre (A, 2) lies strictly inside each ground-truth box (B, G, 4) xyxy."""
    c = centers[None, None]  # (1, 1, A, 2)
    margins = torch.cat((c - gt_boxes[:, :, None, :2], gt_boxes[:, :, None, 2:] - c), dim=-1)  # (B, G, A, 4)
    return margins.amin(dim=-1) > EPS


class TaskAlignedAssigner:
    """Assigns ground truths to cells by the task-alignment metric; see the module docstring. Holds no tensors."""

    def __init__(self, topk: int = TOPK, alpha: float = ALPHA, beta: float = BETA):
        self.topk, self.alpha, self.beta = int(topk), float(alpha), float(beta)

    @torch.no_grad()
    def __call__(
        self,
        scores: torch.Tensor,
        pred_boxes: torch.Tensor,
        centers: torch.Tensor,
        gt_classes: torch.Tensor,
        gt_boxes: torch.Tensor,
        gt_valid: torch.Tensor,
    ) -> TaskAlignedTargets:
        """scores (B, A, nc) class probabilities; pred_boxes (B, A, 4) xyxy; centers (A, 2) cell centres, same units as the
        boxes; gt_classes (B, G); gt_boxes (B, G, 4) xyxy; gt_valid (B, G) bool (False for padding)."""
        b, a, nc = scores.shape
        g = gt_boxes.shape[1]
        if g == 0:
            return TaskAlignedTargets(scores.new_zeros((b, a), dtype=torch.bool), scores.new_zeros((b, a, 4)),
                                      torch.zeros_like(scores), scores.new_zeros((b, a), dtype=torch.long))
        candidate = centers_inside(centers, gt_boxes) & gt_valid[:, :, None]  # (B, G, A)
        ious = pairwise_iou(gt_boxes, pred_boxes) * candidate
        class_scores = scores.gather(2, gt_classes.clamp(0, nc - 1)[:, None, :].expand(b, a, g)).permute(0, 2, 1)  # (B, G, A)
        alignment = class_scores.pow(self.alpha) * ious.pow(self.beta) * candidate

        chosen = self.top_candidates(alignment.masked_fill(~candidate, -1.0)) & candidate
        chosen = self.resolve_conflicts(chosen, ious)
        fg_mask = chosen.any(dim=1)  # (B, A)
        gt_index = chosen.float().argmax(dim=1)  # (B, A); 0 where background

        alignment = alignment * chosen
        best_alignment = alignment.amax(dim=2, keepdim=True)  # (B, G, 1)
        best_iou = (ious * chosen).amax(dim=2, keepdim=True)
        quality = (alignment * best_iou / (best_alignment + EPS)).amax(dim=1)  # (B, A)

        target_classes = gt_classes.gather(1, gt_index)  # (B, A)
        target_boxes = gt_boxes.gather(1, gt_index[..., None].expand(b, a, 4))
        target_scores = F.one_hot(target_classes.clamp(0, nc - 1), nc).to(scores.dtype) * (quality * fg_mask)[..., None]
        return TaskAlignedTargets(fg_mask, target_boxes, target_scores, gt_index)

    def top_candidates(self, alignment: torch.Tensor) -> torch.Tensor:
        """(B, G, A) bool: each ground truth's `topk` cells of highest alignment (non-candidates ranked below, at -1)."""
        k = min(self.topk, alignment.shape[-1])
        index = alignment.topk(k, dim=-1).indices
        return torch.zeros_like(alignment, dtype=torch.bool).scatter_(-1, index, True)

    @staticmethod
    def resolve_conflicts(chosen: torch.Tensor, ious: torch.Tensor) -> torch.Tensor:
        """A cell chosen by several ground truths keeps only the one among them with the highest IoU with its box."""
        shared = chosen.sum(dim=1, keepdim=True) > 1  # (B, 1, A)
        if not bool(shared.any()):
            return chosen
        best = ious.masked_fill(~chosen, -1.0).argmax(dim=1, keepdim=True)  # (B, 1, A)
        winner = torch.zeros_like(chosen).scatter_(1, best, True)
        return torch.where(shared, winner, chosen)
