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


def centers_inside(centers: torch.Tensor, gt_boxes: torch.Tensor) -> torch.Tensor:
    """(B, G, A) whether each cell centre (A, 2) lies strictly inside each ground-truth box (B, G, 4) xyxy: each of the
    four margins (centre minus top-left corner, bottom-right corner minus centre) above EPS, compared one at a time."""
    cx, cy = centers[:, 0], centers[:, 1]
    x1, y1, x2, y2 = (gt_boxes[..., i, None] for i in range(4))
    return ((cx - x1) > EPS) & ((cy - y1) > EPS) & ((x2 - cx) > EPS) & ((y2 - cy) > EPS)


def box_iou_pairs(gt: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
    """IoU of row i of gt with row i of pred (both (P, 4) xyxy), the same arithmetic as a dense (B, G, A) IoU, so the same value."""
    wh = (torch.minimum(gt[:, 2:], pred[:, 2:]) - torch.maximum(gt[:, :2], pred[:, :2])).clamp(min=0)
    inter = wh[:, 0] * wh[:, 1]
    area_gt = (gt[:, 2] - gt[:, 0]) * (gt[:, 3] - gt[:, 1])
    area_pred = (pred[:, 2] - pred[:, 0]).clamp(min=0) * (pred[:, 3] - pred[:, 1]).clamp(min=0)
    return inter / (area_gt + area_pred - inter).clamp(min=EPS)


def best_of_each_group(keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """(P,) bool: the entry of highest `values` in each group of equal `keys`; among equal values the one listed first
    (as torch.argmax, which returns the first maximum)."""
    by_value = torch.sort(values, descending=True, stable=True).indices
    order = by_value[torch.sort(keys[by_value], stable=True).indices]  # grouped by key, best first within a group
    first = torch.ones(len(order), dtype=torch.bool, device=keys.device)
    first[1:] = keys[order][1:] != keys[order][:-1]
    best = torch.zeros_like(first)
    best[order] = first
    return best


class TaskAlignedAssigner:
    """Assigns ground truths to cells by the task-alignment metric; see the module docstring. Holds no tensors.

    Only the (image, ground truth, cell) pairs whose cell centre lies inside the box can be chosen, and they are few (a
    box covers a few cells), so after the inside test the IoUs, alignments, conflicts and targets are computed on those
    pairs alone; only the inside test and the top-k ranking see (B, G, A) arrays. On a set of many small objects the
    all-dense form was 95 % of the loss and a fifth of a training step (BENCHMARKS.md); tests/test_assigner_pairs.py
    holds it as the reference this must agree with."""

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
        fg_mask = scores.new_zeros((b, a), dtype=torch.bool)
        gt_index = scores.new_zeros((b, a), dtype=torch.long)
        if g == 0:
            return TaskAlignedTargets(fg_mask, scores.new_zeros((b, a, 4)), torch.zeros_like(scores), gt_index)
        image, gt, cell = (centers_inside(centers, gt_boxes) & gt_valid[:, :, None]).nonzero(as_tuple=True)  # candidates
        ious = box_iou_pairs(gt_boxes[image, gt], pred_boxes[image, cell])
        class_scores = scores[image, cell, gt_classes[image, gt].clamp(0, nc - 1)]
        alignment = class_scores.pow(self.alpha) * ious.pow(self.beta)
        kept = self.top_candidates(image, gt, cell, alignment, (b, g, a)).nonzero().squeeze(1)
        kept = kept[best_of_each_group((image * a + cell)[kept], ious[kept])]  # a cell chosen twice: the best IoU keeps it
        image, gt, cell, ious, alignment = (t[kept] for t in (image, gt, cell, ious, alignment))
        pair_gt = image * g + gt
        best_alignment = scores.new_zeros(b * g).scatter_reduce_(0, pair_gt, alignment, "amax")[pair_gt]
        best_iou = scores.new_zeros(b * g).scatter_reduce_(0, pair_gt, ious, "amax")[pair_gt]
        fg_mask[image, cell] = True
        gt_index[image, cell] = gt
        quality = scores.new_zeros((b, a))
        quality[image, cell] = alignment * best_iou / (best_alignment + EPS)
        target_classes = gt_classes.gather(1, gt_index)  # (B, A)
        target_boxes = gt_boxes.gather(1, gt_index[..., None].expand(b, a, 4))
        target_scores = F.one_hot(target_classes.clamp(0, nc - 1), nc).to(scores.dtype) * (quality * fg_mask)[..., None]
        return TaskAlignedTargets(fg_mask, target_boxes, target_scores, gt_index)

    def top_candidates(self, image: torch.Tensor, gt: torch.Tensor, cell: torch.Tensor, alignment: torch.Tensor,
                       shape: tuple[int, int, int]) -> torch.Tensor:
        """(P,) bool: whether each candidate pair is among its ground truth's `topk` of highest alignment. Ranked with
        torch.topk over a (B, G, A) row of the alignments (-1 where no candidate), so that equal alignments (every cell
        predicts alike at initialisation) are broken exactly as topk breaks them."""
        ranked = alignment.new_full(shape, -1.0).index_put_((image, gt, cell), alignment)
        top = ranked.topk(min(self.topk, shape[2]), dim=-1).indices
        return torch.zeros(shape, dtype=torch.bool, device=alignment.device).scatter_(-1, top, True)[image, gt, cell]
