"""YOLOX training loss: SimOTA label assignment, then IoU, objectness, classification and optional L1 terms."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..boxes import box_area, box_iou, cxcywh_to_xyxy, giou_loss

BOX_WEIGHT = 5.0  # weight of the IoU term in the total loss
CENTER_RADIUS = 2.5  # centre prior: cells within this many strides of a box centre are candidates for it
TOPK_CANDIDATES = 10  # dynamic k of a box = sum of its this-many best IoUs with candidate predictions
IOU_COST_WEIGHT = 3.0  # weight of -log(IoU) against the classification cost in SimOTA's matching cost
OUTSIDE_PENALTY = 1e5  # cost added when a cell is not in both the box and its centre region (once more if in neither)
MAX_LOG_WH = 10.0  # raw log-size is clamped here before exp so a diverging prediction cannot overflow (e^10 strides)
EPS = 1e-8  # guards log() and divisions against zero

# SimOTA variants. Each key is one switch (an attribute of YOLOXLoss, settable on its own); "megvii" reproduces the
# assignment of Megvii's current YOLOX (main branch, yolox/models/yolo_head.py since PR #1589, Jan 2023) and is checked
# against their losses by tests/test_loss_parity.py; "yolo-cb" is our default. The last tagged YOLOX release, 0.3.0
# (Apr 2022), predates #1589: it is "megvii" with center_radius=2.5, box_prior=True, outside_penalty=1e5 (that
# combination is not checked against a reference). What each switch does and why ours differs:
#
#   center_radius     2.5 | 1.5   Half-width, in strides, of the square around a box centre whose cells may learn the box.
#                                 2.5 is the value of YOLOX up to release 0.3.0; Megvii narrowed it to 1.5 (a
#                                 3x3-cell "centre sampling" region per level, as the paper describes) in PR #1589, which
#                                 reported YOLOX-s 40.1 -> 40.6 COCO mAP (tiny unchanged at 31.6). No reason is recorded
#                                 in our git history: ours follows the older YOLOX code, and was never measured against 1.5.
#   box_prior         True | False  Cells whose centre is inside the box are candidates too (candidates = in box OR in
#                                 centre region), and the cost penalises cells not in box AND centre region. This is the
#                                 YOLOX 0.3.0 rule (same origin as 2.5 above). Megvii replaced it in PR #1589 ("fix
#                                 no-candidate anchor issue for tiny objects": a box containing no cell centre had no cell
#                                 in "box and centre", so all its candidates were penalised). Current Megvii: candidates
#                                 and the penalty both use the centre region only.
#   outside_penalty   1e5 | 1e6   Cost added for a candidate outside the (core) region of that box, so it is taken only
#                                 when the box's k exceeds its in-region candidates. 1e5 is YOLOX 0.3.0's value, 1e6 the
#                                 current one; in float32 it also sets how finely penalised costs are still ordered
#                                 (ulp 0.008 at 1e5, 0.06 at 1e6).
#   neither_penalty   True | False  Ours: the penalty is added once more when the cell is in neither the box nor the
#                                 centre region of that box, so a box whose k exceeds its core cells prefers cells of its
#                                 own prior region over cells that are candidates only because of another box (the reason
#                                 is inferred: git records only the OUTSIDE_PENALTY comment). Neither YOLOX version does
#                                 this. It changes anything only with box_prior (otherwise region == core, and the doubled
#                                 penalty orders nothing differently).
#   rescue_unmatched  True | False  Ours (commit 47a6c15): a box that lost every cell it chose to cheaper claims by other
#                                 boxes takes its cheapest still-unclaimed candidate, so that no box goes unlearned in
#                                 crowded scenes. Megvii leaves such a box without a positive for that iteration.
#   max_log_wh        10.0 | None  Ours: the raw log-size output is clamped at this value before exp(), in the loss and
#                                 the assignment, so a diverging prediction cannot overflow to inf (e^10 strides); the
#                                 clamp also zeroes that output's box gradient while it is above the limit. Megvii: no clamp.
#
# Not switches (identical in both modes): IoU cost weight 3, cost -log(IoU + 1e-8), class cost BCE(sqrt(cls * obj),
# one-hot), dynamic k = max(1, int(sum of the top-10 IoUs over all candidates)), each box's k cheapest candidates,
# a cell claimed by several boxes kept by the cheapest box (over all boxes), obj target 1 on foreground cells, cls
# target one-hot * IoU, IoU loss 1 - IoU^2 summed, L1 on raw outputs, all divided by the batch's foreground count
# (at least 1), IoU term times 5. Float-level differences that remain: we always compute the loss in at least float32
# (Megvii in the outputs' dtype, so partly half under AMP; its class cost always float32) and torchvision's box IoU / log1p forms,
# which agree with Megvii's to rounding; exact cost ties are broken by sort order, which may pick another of the tied
# cells than torch.topk does.
ASSIGNERS: dict[str, dict] = {
    "yolo-cb": {
        "center_radius": CENTER_RADIUS,
        "box_prior": True,
        "outside_penalty": OUTSIDE_PENALTY,
        "neither_penalty": True,
        "rescue_unmatched": True,
        "max_log_wh": MAX_LOG_WH,
    },
    "megvii": {
        "center_radius": 1.5,
        "box_prior": False,
        "outside_penalty": 1e6,
        "neither_penalty": False,
        "rescue_unmatched": False,
        "max_log_wh": None,
    },
}
DEFAULT_ASSIGNER = "yolo-cb"


@dataclass
class Assignment:
    """SimOTA result for one image: which cells are foreground, the box each one learns, and its IoU with that box."""

    fg_mask: torch.Tensor  # (A,) bool
    matched_gt: torch.Tensor  # (F,) index into the image's boxes, for the F foreground cells in cell order
    matched_iou: torch.Tensor  # (F,) IoU between each foreground cell's predicted box and its box


def paired_iou(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """IoU of row i of boxes1 with row i of boxes2 (both xyxy, same length)."""
    top_left = torch.maximum(boxes1[:, :2], boxes2[:, :2])
    bottom_right = torch.minimum(boxes1[:, 2:], boxes2[:, 2:])
    inter = (bottom_right - top_left).clamp(min=0).prod(dim=1)
    union = box_area(boxes1) + box_area(boxes2) - inter
    return inter / union.clamp(min=EPS)


class YOLOXLoss(nn.Module):
    """Loss of a YOLOX head, normalised by the number of foreground cells in the batch.

    forward() returns {"total", "iou", "obj", "cls", "l1", "num_fg"}: the components are detached and already
    weighted, so total == iou + obj + cls + l1; num_fg is the count of foreground cells in the batch (float).
    (Megvii's head reports num_fg divided by the batch's number of boxes instead.)

    The SimOTA assignment follows a preset, `assigner`: "yolo-cb" (default) or "megvii" (Megvii's current YOLOX; on
    their reference batch, tests/test_loss_parity.py reproduces their foreground count and IoU/obj/cls losses to 1e-4,
    and their L1 up to which of several exactly tied cells is taken), with one attribute per departure
    (center_radius, box_prior, outside_penalty, neither_penalty, rescue_unmatched, max_log_wh); ASSIGNERS above
    says what each one does and why ours differs. The loss runs in float32, or float64 when given float64 outputs.
    """

    loss_names = ("iou", "obj", "cls", "l1")  # the loss-dict components the trainer and validator report (as <name>_loss)
    reads_settings = ("box", "iou_type")  # the training settings this loss takes (as box_weight, loss_type)

    def __init__(
        self,
        nc: int,
        box_weight: float = BOX_WEIGHT,
        loss_type: str = "iou",
        use_l1: bool = False,
        assigner: str = DEFAULT_ASSIGNER,
        **switches,
    ):
        """assigner: "yolo-cb" (default) or "megvii" (Megvii's current SimOTA, exactly); switches: any key of
        ASSIGNERS[...] to override that one setting of the chosen preset, e.g. YOLOXLoss(nc, rescue_unmatched=False).
        Each switch is also a plain attribute and may be changed after construction."""
        super().__init__()
        if loss_type not in ("iou", "giou"):
            raise ValueError(f"loss_type must be 'iou' or 'giou', got '{loss_type}'")
        if assigner not in ASSIGNERS:
            raise ValueError(f"assigner must be one of {sorted(ASSIGNERS)}, got '{assigner}'")
        unknown = sorted(set(switches) - set(ASSIGNERS[assigner]))
        if unknown:
            raise TypeError(f"unknown SimOTA switch(es) {unknown}; known: {sorted(ASSIGNERS[assigner])}")
        self.nc = nc
        self.box_weight = box_weight  # weight of the IoU term
        self.loss_type = loss_type  # iou: 1 - IoU^2 (YOLOX); giou: 1 - GIoU
        self.use_l1 = use_l1  # add an L1 loss on raw box outputs (YOLOX turns it on for the last, no-augmentation epochs)
        self.assigner = assigner  # the preset the switches below started from (they may since have been changed)
        settings = {**ASSIGNERS[assigner], **switches}
        self.center_radius: float = float(settings["center_radius"])
        self.box_prior: bool = bool(settings["box_prior"])
        self.outside_penalty: float = float(settings["outside_penalty"])
        self.neither_penalty: bool = bool(settings["neither_penalty"])
        self.rescue_unmatched: bool = bool(settings["rescue_unmatched"])
        self.max_log_wh: float | None = None if settings["max_log_wh"] is None else float(settings["max_log_wh"])

    @classmethod
    def from_settings(cls, nc: int, settings: Mapping[str, Any] | None = None, **kwargs) -> YOLOXLoss:
        """A loss configured by the training settings it reads (`reads_settings`: box -> box_weight, iou_type -> loss_type),
        the defaults for those absent; other keys are not read (the trainer refuses a changed loss setting that the
        model's loss does not read). kwargs: any other constructor argument (assigner, switches)."""
        settings = settings or {}
        return cls(nc, box_weight=float(settings.get("box", BOX_WEIGHT)), loss_type=str(settings.get("iou_type", "iou")), **kwargs)

    def set_l1(self, on: bool = True) -> None:
        """Turn the L1 term on or off (YOLOX's stage switch turns it on for the last, no-augmentation epochs)."""
        self.use_l1 = bool(on)

    def start_final_stage(self) -> str:
        """The last, no-augmentation epochs begin (the stage switch calls it): the L1 term on, as YOLOX does."""
        self.set_l1(True)
        return "L1 loss on"

    def training_state(self) -> dict:
        """What training changes in this loss, as plain data (a checkpoint keeps it under `loss`): the L1 switch. Not
        nn.Module's state_dict, which holds tensors and is part of the model's."""
        return {"use_l1": self.use_l1}

    def load_training_state(self, state: dict) -> None:
        """Take back training_state() (an empty state: the L1 term off, as a run starts)."""
        self.set_l1(bool(state.get("use_l1", False)))

    def switches(self) -> dict:
        """The current value of every SimOTA switch (see ASSIGNERS)."""
        return {key: getattr(self, key) for key in ASSIGNERS[DEFAULT_ASSIGNER]}

    def extra_repr(self) -> str:
        return f"nc={self.nc}, assigner={self.assigner!r}, " + ", ".join(f"{k}={v}" for k, v in self.switches().items())

    def forward(self, preds: torch.Tensor, grid: torch.Tensor, strides: torch.Tensor, targets: torch.Tensor) -> dict:
        """preds: raw head outputs (B, A, 5 + nc); grid: cell (x, y) (A, 2); strides: (A, 1);
        targets: (N, 6) rows [image_index, class, cx, cy, w, h] in input pixels."""
        if torch.is_autocast_enabled(preds.device.type):
            with torch.autocast(preds.device.type, enabled=False):  # the loss and assignment run in float32
                return self.forward(preds, grid, strides, targets)
        dtype = torch.promote_types(preds.dtype, torch.float32)  # float32, or float64 when given float64
        preds, grid, strides = preds.to(dtype), grid.to(dtype), strides.to(dtype)
        raw_box = preds[..., :4]
        boxes = self.decode_boxes(raw_box, grid, strides)
        obj_logits, cls_logits = preds[..., 4], preds[..., 5:]
        targets = targets.to(device=preds.device, dtype=dtype).reshape(-1, 6)
        if len(targets) and int(targets[:, 1].max()) >= self.nc:
            raise ValueError(f"target class {int(targets[:, 1].max())} out of range for a model with nc={self.nc}")

        fg_masks, cls_targets, box_targets, l1_targets = [], [], [], []
        for b in range(preds.shape[0]):
            gt = targets[targets[:, 0] == b]
            if len(gt) == 0:
                fg_masks.append(torch.zeros(preds.shape[1], dtype=torch.bool, device=preds.device))
                continue
            gt_cls, gt_boxes = gt[:, 1].long(), gt[:, 2:6]
            a = self.assign(gt_boxes, gt_cls, boxes[b].detach(), cls_logits[b].detach(), obj_logits[b].detach(), grid, strides)
            fg_masks.append(a.fg_mask)
            cls_targets.append(F.one_hot(gt_cls[a.matched_gt], self.nc).to(dtype) * a.matched_iou[:, None])
            box_targets.append(gt_boxes[a.matched_gt])
            if self.use_l1:
                l1_targets.append(self.encode_l1_target(gt_boxes[a.matched_gt], grid[a.fg_mask], strides[a.fg_mask]))

        fg = torch.stack(fg_masks)
        num_fg = int(fg.sum())
        norm = max(num_fg, 1)
        box_target = torch.cat(box_targets) if box_targets else preds.new_zeros((0, 4))
        cls_target = torch.cat(cls_targets) if cls_targets else preds.new_zeros((0, self.nc))

        loss_iou = self.box_loss(boxes[fg], box_target).sum() / norm * self.box_weight
        loss_obj = F.binary_cross_entropy_with_logits(obj_logits, fg.to(dtype), reduction="sum") / norm
        loss_cls = F.binary_cross_entropy_with_logits(cls_logits[fg], cls_target, reduction="sum") / norm
        if self.use_l1:
            l1_target = torch.cat(l1_targets) if l1_targets else preds.new_zeros((0, 4))
            loss_l1 = F.l1_loss(raw_box[fg], l1_target, reduction="sum") / norm
        else:
            loss_l1 = preds.new_zeros(())
        total = loss_iou + loss_obj + loss_cls + loss_l1
        return {
            "total": total,
            "iou": loss_iou.detach(),
            "obj": loss_obj.detach(),
            "cls": loss_cls.detach(),
            "l1": loss_l1.detach(),
            "num_fg": float(num_fg),
        }

    def decode_boxes(self, raw_box: torch.Tensor, grid: torch.Tensor, strides: torch.Tensor) -> torch.Tensor:
        """Raw box outputs (..., A, 4) -> cx, cy, w, h in input pixels (log-size clamped at max_log_wh unless None)."""
        log_wh = raw_box[..., 2:4] if self.max_log_wh is None else raw_box[..., 2:4].clamp(max=self.max_log_wh)
        return torch.cat(((raw_box[..., :2] + grid) * strides, torch.exp(log_wh) * strides), dim=-1)

    def box_loss(self, pred_cxcywh: torch.Tensor, target_cxcywh: torch.Tensor) -> torch.Tensor:
        """Per-box IoU loss: 1 - IoU^2, or 1 - GIoU."""
        pred = cxcywh_to_xyxy(pred_cxcywh)
        target = cxcywh_to_xyxy(target_cxcywh)
        if self.loss_type == "giou":
            return giou_loss(pred, target)
        return 1.0 - paired_iou(pred, target) ** 2

    @staticmethod
    def encode_l1_target(gt_cxcywh: torch.Tensor, grid: torch.Tensor, strides: torch.Tensor) -> torch.Tensor:
        """Boxes in the head's raw regression space: centre offset from the cell, log size, both in stride units."""
        return torch.cat((gt_cxcywh[:, :2] / strides - grid, torch.log(gt_cxcywh[:, 2:4] / strides + EPS)), dim=1)

    @torch.no_grad()
    def assign(
        self,
        gt_boxes: torch.Tensor,
        gt_cls: torch.Tensor,
        pred_boxes: torch.Tensor,
        cls_logits: torch.Tensor,
        obj_logits: torch.Tensor,
        grid: torch.Tensor,
        strides: torch.Tensor,
    ) -> Assignment:
        """SimOTA for one image. gt_boxes (G, 4) cxcywh pixels, gt_cls (G,); pred_boxes (A, 4) cxcywh pixels;
        cls_logits (A, nc); obj_logits (A,); grid (A, 2); strides (A, 1)."""
        fg_mask = torch.zeros(pred_boxes.shape[0], dtype=torch.bool, device=pred_boxes.device)
        candidates, cost, ious = self.matching_cost(gt_boxes, gt_cls, pred_boxes, cls_logits, obj_logits, grid, strides)
        if candidates.numel() == 0:
            empty = torch.zeros(0, dtype=torch.long, device=pred_boxes.device)
            return Assignment(fg_mask, empty, empty.to(pred_boxes.dtype))
        matching = self.dynamic_k_matching(cost, ious, self.rescue_unmatched)
        is_fg = matching.any(dim=0)
        fg_mask[candidates[is_fg]] = True
        matched_gt = matching[:, is_fg].to(ious.dtype).argmax(dim=0)
        matched_iou = (matching.to(ious.dtype) * ious).sum(dim=0)[is_fg]
        return Assignment(fg_mask, matched_gt, matched_iou)

    @torch.no_grad()
    def matching_cost(
        self,
        gt_boxes: torch.Tensor,
        gt_cls: torch.Tensor,
        pred_boxes: torch.Tensor,
        cls_logits: torch.Tensor,
        obj_logits: torch.Tensor,
        grid: torch.Tensor,
        strides: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """SimOTA's candidates (C,) (indices of the cells in some box's prior region), its cost (G, C) and the IoUs
        (G, C) of each box with each candidate's predicted box. Arguments as for `assign`."""
        in_box, in_center = self.geometry(gt_boxes, grid, strides)
        if self.box_prior:
            in_region, in_core = in_box | in_center, in_box & in_center  # (G, A)
        else:
            in_region = in_core = in_center
        candidates = in_region.any(dim=0).nonzero().squeeze(1)  # cells near at least one box
        gt_xyxy = cxcywh_to_xyxy(gt_boxes)
        ious = box_iou(gt_xyxy, cxcywh_to_xyxy(pred_boxes[candidates])).nan_to_num(0.0)  # (G, C)
        cost = (
            self.classification_cost(cls_logits[candidates], obj_logits[candidates], gt_cls)
            + IOU_COST_WEIGHT * -torch.log(ious + EPS)
            + self.outside_penalty * (~in_core[:, candidates]).to(ious.dtype)
        )
        if self.neither_penalty:
            cost = cost + self.outside_penalty * (~in_region[:, candidates]).to(ious.dtype)
        return candidates, cost, ious

    def geometry(self, gt_boxes: torch.Tensor, grid: torch.Tensor, strides: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(G, A) masks: cell centre strictly inside the box; cell centre strictly within center_radius strides of the
        box centre (both axes)."""
        centers = (grid + 0.5) * strides  # (A, 2) cell centres in pixels
        half = gt_boxes[:, None, 2:4] / 2
        offset = centers[None] - gt_boxes[:, None, :2]  # (G, A, 2)
        in_box = (offset.abs() < half).all(dim=-1)
        in_center = (offset.abs() < self.center_radius * strides[None]).all(dim=-1)
        return in_box, in_center

    @staticmethod
    def classification_cost(cls_logits: torch.Tensor, obj_logits: torch.Tensor, gt_cls: torch.Tensor) -> torch.Tensor:
        """(G, C) BCE between each candidate's joint score sqrt(cls * obj) and each box's one-hot class, summed over classes.

        Computed without a (G, C, nc) tensor: BCE(p, onehot(c)) = sum_k -log(1 - p_k) - (log p_c - log(1 - p_c)).
        """
        p = torch.sqrt(torch.sigmoid(cls_logits) * torch.sigmoid(obj_logits)[:, None])  # (C, nc)
        log_p = torch.log(p).clamp(min=-100)
        log_not_p = torch.log1p(-p).clamp(min=-100)
        all_negative = -log_not_p.sum(dim=1)  # (C,)
        return all_negative[None, :] - (log_p - log_not_p)[:, gt_cls].T

    @staticmethod
    def dynamic_k_matching(cost: torch.Tensor, ious: torch.Tensor, rescue_unmatched: bool = True) -> torch.Tensor:
        """(G, C) bool matching: each box takes its k cheapest candidates, k = clamp(sum of top-10 IoUs, min 1);
        a candidate taken by several boxes keeps only the cheapest one; with rescue_unmatched, a box left with none
        takes its cheapest free one."""
        num_gt, num_cand = cost.shape
        dynamic_k = ious.topk(min(TOPK_CANDIDATES, num_cand), dim=1).values.sum(dim=1).int().clamp(min=1)
        order = cost.argsort(dim=1)
        take = torch.arange(num_cand, device=cost.device)[None, :] < dynamic_k[:, None]  # (G, C) in cost order
        matching = torch.zeros_like(cost, dtype=torch.bool).scatter_(1, order, take)
        shared = matching.sum(dim=0) > 1
        if shared.any():
            cols = shared.nonzero().squeeze(1)
            cheapest = cost[:, cols].argmin(dim=0)
            matching[:, cols] = False
            matching[cheapest, cols] = True
            if not rescue_unmatched:
                return matching
            # A box that lost every candidate to cheaper claims takes its cheapest unclaimed one (a departure from
            # YOLOX, which leaves such boxes unlearned in crowded scenes).
            claimed = matching.any(dim=0)
            for g in (~matching.any(dim=1)).nonzero().flatten().tolist():
                free_cost = cost[g].masked_fill(claimed, float("inf"))
                best = int(free_cost.argmin())
                if torch.isfinite(free_cost[best]):
                    matching[g, best] = True
                    claimed[best] = True
        return matching
