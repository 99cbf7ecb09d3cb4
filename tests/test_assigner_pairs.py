"""The task-aligned assigner works on the (image, ground truth, cell) pairs whose cell centre lies inside the box. It must
give what the dense (B, G, A) formulation of the method gives, written out below as the reference: the same
foreground, ground-truth index and target boxes exactly, ties included (equal predictions at initialisation, equal
scores), and the same soft scores up to one rounding (torch.pow's vectorised and scalar loops may differ in the last
bit, and which one an element takes depends on the tensor's shape), on boxes of every size, padding and empty images."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from yolo_cb.nn.yolocb.assigner import ALPHA, BETA, EPS, TOPK, TaskAlignedAssigner, pad_targets


def pairwise_iou(gt: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
    """IoU of every ground truth with every prediction of the same image: gt (B, G, 4), pred (B, A, 4) -> (B, G, A)."""
    gt, pred = gt[:, :, None], pred[:, None]
    wh = (torch.minimum(gt[..., 2:], pred[..., 2:]) - torch.maximum(gt[..., :2], pred[..., :2])).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    area_gt = (gt[..., 2] - gt[..., 0]) * (gt[..., 3] - gt[..., 1])
    area_pred = (pred[..., 2] - pred[..., 0]).clamp(min=0) * (pred[..., 3] - pred[..., 1]).clamp(min=0)
    return inter / (area_gt + area_pred - inter).clamp(min=EPS)


def dense_reference(scores, pred_boxes, centers, gt_classes, gt_boxes, gt_valid, topk=TOPK, alpha=ALPHA, beta=BETA):
    """The method on (B, G, A) arrays: alignment s^alpha * IoU^beta of the candidates, each ground truth's top-k, a
    shared cell to the highest IoU (the first ground truth among equals), soft scores normalised to the best IoU."""
    b, a, nc = scores.shape
    c = centers[None, None]
    margins = torch.cat((c - gt_boxes[:, :, None, :2], gt_boxes[:, :, None, 2:] - c), dim=-1)
    candidate = (margins.amin(dim=-1) > EPS) & gt_valid[:, :, None]
    ious = pairwise_iou(gt_boxes, pred_boxes) * candidate
    g = gt_boxes.shape[1]
    class_scores = scores.gather(2, gt_classes.clamp(0, nc - 1)[:, None, :].expand(b, a, g)).permute(0, 2, 1)
    alignment = class_scores.pow(alpha) * ious.pow(beta) * candidate
    index = alignment.masked_fill(~candidate, -1.0).topk(min(topk, a), dim=-1).indices
    chosen = torch.zeros_like(candidate).scatter_(-1, index, True) & candidate
    shared = chosen.sum(dim=1, keepdim=True) > 1
    best = ious.masked_fill(~chosen, -1.0).argmax(dim=1, keepdim=True)
    chosen = torch.where(shared, torch.zeros_like(chosen).scatter_(1, best, True), chosen)
    fg_mask = chosen.any(dim=1)
    gt_index = chosen.float().argmax(dim=1)
    alignment = alignment * chosen
    best_alignment = alignment.amax(dim=2, keepdim=True)
    best_iou = (ious * chosen).amax(dim=2, keepdim=True)
    quality = (alignment * best_iou / (best_alignment + EPS)).amax(dim=1)
    target_classes = gt_classes.gather(1, gt_index)
    target_boxes = gt_boxes.gather(1, gt_index[..., None].expand(b, a, 4))
    target_scores = F.one_hot(target_classes.clamp(0, nc - 1), nc).to(scores.dtype) * (quality * fg_mask)[..., None]
    return fg_mask, gt_index, target_boxes, target_scores


def grid(imgsz: int) -> torch.Tensor:
    """The cell centres (A, 2) of strides 8, 16, 32 at `imgsz`, in pixels."""
    levels = []
    for stride in (8, 16, 32):
        n = imgsz // stride
        ys, xs = torch.meshgrid(torch.arange(n, dtype=torch.float32), torch.arange(n, dtype=torch.float32), indexing="ij")
        levels.append((torch.stack((xs, ys), -1).reshape(-1, 2) + 0.5) * stride)
    return torch.cat(levels)


def batch(seed: int, imgsz: int, per_image: int, sizes: tuple[float, float], nc: int, tied: bool):
    """A random batch of 4 images (the last without boxes) and predictions: `tied` gives every cell the same box around
    its centre and every class the same score (as at initialisation), else random boxes and scores."""
    gen = torch.Generator().manual_seed(seed)
    centers = grid(imgsz)
    rows = []
    for image in range(3):
        n = int(torch.randint(1, per_image + 1, (1,), generator=gen))
        wh = sizes[0] + torch.rand(n, 2, generator=gen) * (sizes[1] - sizes[0])
        xy = wh / 2 + torch.rand(n, 2, generator=gen) * (imgsz - wh)
        cls = torch.randint(0, nc, (n, 1), generator=gen).float()
        rows.append(torch.cat((torch.full((n, 1), float(image)), cls, xy, wh), 1))
    classes, boxes, valid = pad_targets(torch.cat(rows), 4)
    a = len(centers)
    if tied:
        pred = torch.cat((centers - 12, centers + 12), -1).expand(4, a, 4).contiguous()
        scores = torch.full((4, a, nc), 0.01)
    else:
        half = 2 + torch.rand(4, a, 2, generator=gen) * 30
        pred = torch.cat((centers - half, centers + half), -1)
        scores = torch.rand(4, a, nc, generator=gen)
    return scores, pred, centers, classes, boxes, valid


CASES = [(seed, imgsz, per_image, sizes, tied) for seed, (imgsz, per_image, sizes) in enumerate(
    [(320, 80, (3.0, 18.0)), (320, 12, (10.0, 200.0)), (128, 30, (4.0, 120.0)), (640, 6, (300.0, 600.0))]) for tied in (False, True)]


@pytest.mark.parametrize("seed, imgsz, per_image, sizes, tied", CASES)
def test_the_pairs_give_what_the_dense_method_gives(seed, imgsz, per_image, sizes, tied):
    inputs = batch(seed, imgsz, per_image, sizes, nc=5, tied=tied)
    out = TaskAlignedAssigner()(*inputs)
    fg_mask, gt_index, target_boxes, target_scores = dense_reference(*inputs)
    assert fg_mask.any() and torch.equal(out.fg_mask, fg_mask)
    assert torch.equal(out.gt_index[fg_mask], gt_index[fg_mask])
    assert torch.equal(out.boxes[fg_mask], target_boxes[fg_mask])
    torch.testing.assert_close(out.scores, target_scores, rtol=1e-6, atol=1e-7)
    assert not out.fg_mask[3].any()  # the image without boxes


@pytest.mark.parametrize("topk", [1, 3, 13])
def test_other_topk_values_agree_too(topk):
    inputs = batch(7, 320, 20, (20.0, 150.0), nc=3, tied=True)
    out = TaskAlignedAssigner(topk=topk)(*inputs)
    fg_mask, _, _, target_scores = dense_reference(*inputs, topk=topk)
    assert torch.equal(out.fg_mask, fg_mask)
    torch.testing.assert_close(out.scores, target_scores, rtol=1e-6, atol=1e-7)


def test_no_cell_centre_inside_any_box():
    scores, pred, centers, classes, _, valid = batch(3, 128, 3, (4.0, 8.0), nc=2, tied=False)
    boxes = torch.tensor([[[0.5, 0.5, 2.0, 2.0]]]).expand(4, classes.shape[1], 4).contiguous()  # left of the first centre
    out = TaskAlignedAssigner()(scores, pred, centers, classes, boxes, valid)
    assert not out.fg_mask.any() and torch.all(out.scores == 0)
