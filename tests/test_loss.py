"""YOLOX loss: SimOTA assignment on hand-made cases, and finite, well-formed losses on edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from yolo_cb.nn.yolox.loss import YOLOXLoss, paired_iou

NC = 3
STRIDES = (8, 16, 32)


def make_grid(h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cell grid (A, 2) and strides (A, 1) for an h x w input, in the head's level order."""
    grids, strides = [], []
    for s in STRIDES:
        ys, xs = torch.meshgrid(torch.arange(h // s), torch.arange(w // s), indexing="ij")
        grids.append(torch.stack((xs, ys), -1).reshape(-1, 2).float())
        strides.append(torch.full((grids[-1].shape[0], 1), float(s)))
    return torch.cat(grids), torch.cat(strides)


def random_preds(batch: int, cells: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, cells, 5 + NC, generator=g) * 0.5).requires_grad_(True)


def assign(criterion: YOLOXLoss, gt: torch.Tensor, preds: torch.Tensor, grid, strides):
    """Run SimOTA for one image on raw preds (A, 5 + nc) and boxes gt (G, 5) [cls, cx, cy, w, h]."""
    boxes = torch.cat(((preds[:, :2] + grid) * strides, preds[:, 2:4].exp() * strides), 1)
    return criterion.assign(gt[:, 1:5], gt[:, 0].long(), boxes, preds[:, 5:], preds[:, 4], grid, strides)


# Hand-made scenes on a 128 x 128 input: separate boxes, overlapping boxes of different sizes, a box tinier
# than the finest stride, many boxes sharing one region, a box at the image corner.
SCENES = {
    "separate": [[0, 30, 30, 24, 20], [1, 96, 90, 40, 50]],
    "overlapping": [[0, 64, 64, 100, 100], [2, 60, 66, 20, 18], [1, 70, 60, 12, 40]],
    "tiny": [[1, 41, 77, 2, 3], [0, 64, 64, 60, 60]],
    "crowded": [[i % NC, 60 + 2 * i, 62 - i, 16 + i, 14 + 2 * i] for i in range(8)],
    "corner": [[2, 3, 3, 6, 6], [0, 124, 125, 8, 6]],
}


@pytest.mark.parametrize("scene", list(SCENES))
@pytest.mark.parametrize("seed", [0, 1])
def test_every_box_gets_a_positive_in_its_region_and_no_cell_is_shared(scene, seed):
    criterion = YOLOXLoss(NC)
    grid, strides = make_grid(128, 128)
    gt = torch.tensor(SCENES[scene], dtype=torch.float32)
    preds = random_preds(1, grid.shape[0], seed)[0].detach()
    a = assign(criterion, gt, preds, grid, strides)
    num_fg = int(a.fg_mask.sum())
    assert a.matched_gt.shape == (num_fg,) and a.matched_iou.shape == (num_fg,)  # one box per foreground cell
    in_box, in_center = criterion.geometry(gt[:, 1:5], grid, strides)
    region = (in_box | in_center)[:, a.fg_mask]  # (G, F)
    for g in range(len(gt)):
        mine = a.matched_gt == g
        assert mine.any(), f"box {g} got no positive"
        assert region[g, mine].all(), f"box {g} got a positive outside its box and centre region"
    assert ((a.matched_iou >= 0) & (a.matched_iou <= 1)).all()


def test_dynamic_k_matching_resolves_conflicts_by_cost():
    cost = torch.tensor([[1.0, 2.0, 9.0], [0.5, 8.0, 1.0]])
    ious = torch.tensor([[0.9, 0.6, 0.0], [0.9, 0.0, 0.2]])  # k = 1 for both
    matching = YOLOXLoss.dynamic_k_matching(cost, ious)
    # both want cell 0; box 1 is cheaper there, so box 0 falls back to its cheapest free cell (1)
    assert matching.tolist() == [[False, True, False], [True, False, False]]
    ious = torch.tensor([[0.9, 0.9, 0.0], [0.9, 0.0, 0.9]])  # k = 1 (sum 1.8 -> int 1) for both
    assert YOLOXLoss.dynamic_k_matching(cost, ious).sum(0).max() <= 1
    ious = torch.full((2, 3), 0.9)  # k = 2 (sum of top-3 = 2.7)
    matching = YOLOXLoss.dynamic_k_matching(cost, ious)
    assert matching.sum(0).max() <= 1 and matching.sum().item() == 3


def test_classification_cost_equals_bce():
    g = torch.Generator().manual_seed(0)
    cls_logits, obj_logits = torch.randn(5, NC, generator=g), torch.randn(5, generator=g)
    gt_cls = torch.tensor([2, 0])
    cost = YOLOXLoss.classification_cost(cls_logits, obj_logits, gt_cls)
    p = (cls_logits.sigmoid() * obj_logits.sigmoid()[:, None]).sqrt()
    for i, c in enumerate(gt_cls):
        target = torch.nn.functional.one_hot(c, NC).float().expand(5, NC)
        expected = torch.nn.functional.binary_cross_entropy(p, target, reduction="none").sum(1)
        assert torch.allclose(cost[i], expected, atol=1e-5)


def batch_targets() -> torch.Tensor:
    return torch.tensor([[0, 0, 30, 30, 24, 20], [0, 1, 96, 90, 40, 50], [2, 2, 64, 64, 10, 12]], dtype=torch.float32)


def check_finite(out: dict) -> None:
    assert set(out) == {"total", "iou", "obj", "cls", "l1", "num_fg"}
    for key in ("total", "iou", "obj", "cls", "l1"):
        assert torch.isfinite(out[key]).all(), key
    assert math.isclose(float(out["total"].detach()), float(out["iou"] + out["obj"] + out["cls"] + out["l1"]), rel_tol=1e-5)


@pytest.mark.parametrize("loss_type", ["iou", "giou"])
def test_loss_with_empty_images_is_finite_and_differentiable(loss_type):
    grid, strides = make_grid(128, 128)
    preds = random_preds(3, grid.shape[0])  # image 1 has no boxes
    out = YOLOXLoss(NC, loss_type=loss_type)(preds, grid, strides, batch_targets())
    check_finite(out)
    assert out["num_fg"] >= 3 and out["iou"] > 0 and out["cls"] > 0
    out["total"].backward()
    assert torch.isfinite(preds.grad).all()
    assert preds.grad[1, :, 5:].abs().sum() == 0  # no class gradient where there is no box
    assert preds.grad[1, :, 4].abs().sum() > 0  # but objectness still learns background


def test_loss_on_a_batch_without_boxes():
    grid, strides = make_grid(64, 96)
    preds = random_preds(2, grid.shape[0])
    for targets in (torch.zeros(0, 6), torch.zeros(0)):
        out = YOLOXLoss(NC, use_l1=True)(preds, grid, strides, targets)
        check_finite(out)
        assert out["num_fg"] == 0 and out["iou"] == 0 and out["cls"] == 0 and out["l1"] == 0 and out["obj"] > 0
        out["total"].backward()


@pytest.mark.parametrize("loss_type", ["iou", "giou"])
def test_degenerate_boxes_give_finite_losses(loss_type):
    grid, strides = make_grid(128, 128)
    preds = random_preds(1, grid.shape[0])
    targets = torch.tensor([[0, 0, 40, 40, 0, 10], [0, 1, 80, 80, 12, 0], [0, 2, 10, 100, 0, 0], [0, 1, 64, 64, 1e-4, 1e-4]])
    out = YOLOXLoss(NC, loss_type=loss_type, use_l1=True)(preds, grid, strides, targets)
    check_finite(out)
    assert out["num_fg"] >= 4
    out["total"].backward()
    assert torch.isfinite(preds.grad).all()


def test_extreme_predictions_stay_finite():
    grid, strides = make_grid(64, 64)
    preds = (torch.randn(1, grid.shape[0], 5 + NC) * 100).requires_grad_(True)
    out = YOLOXLoss(NC, use_l1=True)(preds, grid, strides, torch.tensor([[0, 1, 32, 32, 20, 20]]))
    check_finite(out)
    out["total"].backward()
    assert torch.isfinite(preds.grad).all()


def test_l1_term_follows_use_l1():
    grid, strides = make_grid(128, 128)
    preds = random_preds(3, grid.shape[0])
    criterion = YOLOXLoss(NC)
    assert criterion.use_l1 is False
    off = criterion(preds, grid, strides, batch_targets())
    assert off["l1"] == 0
    criterion.use_l1 = True
    on = criterion(preds, grid, strides, batch_targets())
    assert on["l1"] > 0
    assert torch.isclose(on["total"] - on["l1"], off["total"])  # the other terms do not change


def test_l1_target_inverts_decoding():
    grid = torch.tensor([[3.0, 5.0]])
    strides = torch.tensor([[16.0]])
    gt = torch.tensor([[60.0, 90.0, 32.0, 8.0]])
    encoded = YOLOXLoss.encode_l1_target(gt, grid, strides)
    decoded = torch.cat(((encoded[:, :2] + grid) * strides, encoded[:, 2:].exp() * strides), 1)
    assert torch.allclose(decoded, gt, atol=1e-4)


def test_perfect_predictions_have_small_box_loss():
    grid, strides = make_grid(64, 64)
    target = torch.tensor([[0, 1, 30.0, 34.0, 20.0, 16.0]])
    preds = torch.full((1, grid.shape[0], 5 + NC), -8.0)
    preds[0, :, :4] = YOLOXLoss.encode_l1_target(target[:, 2:6].expand(grid.shape[0], 4), grid, strides)
    out = YOLOXLoss(NC, use_l1=True)(preds, grid, strides, target)
    assert out["iou"] < 1e-4 and out["l1"] < 1e-4


def test_paired_iou():
    a = torch.tensor([[0.0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 0, 0]])
    b = torch.tensor([[0.0, 0, 10, 10], [5, 0, 15, 10], [0, 0, 0, 0]])
    assert torch.allclose(paired_iou(a, b), torch.tensor([1.0, 1 / 3, 0.0]))


def test_rejects_out_of_range_class_and_bad_loss_type():
    grid, strides = make_grid(64, 64)
    with pytest.raises(ValueError):
        YOLOXLoss(NC)(random_preds(1, grid.shape[0]), grid, strides, torch.tensor([[0, NC, 32, 32, 10, 10]]))
    with pytest.raises(ValueError):
        YOLOXLoss(NC, loss_type="ciou")


def test_loss_under_autocast_is_float32():
    grid, strides = make_grid(64, 64)
    preds = random_preds(1, grid.shape[0])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = YOLOXLoss(NC)(preds.bfloat16(), grid, strides, torch.tensor([[0, 1, 32, 32, 20, 20]]))
    assert out["total"].dtype == torch.float32
    check_finite(out)


# --- SimOTA presets and switches (yolo_cb.nn.yolox.loss.ASSIGNERS); parity with Megvii itself is tests/test_loss_parity.py ---


def test_assigner_presets_and_switches():
    from yolo_cb.nn.yolox.loss import ASSIGNERS

    assert YOLOXLoss(NC).switches() == ASSIGNERS["yolo-cb"]
    assert YOLOXLoss(NC, assigner="megvii").switches() == ASSIGNERS["megvii"]
    assert set(ASSIGNERS["megvii"]) == set(ASSIGNERS["yolo-cb"])
    one = YOLOXLoss(NC, rescue_unmatched=False)  # one switch off, the rest as the preset
    assert one.switches() == {**ASSIGNERS["yolo-cb"], "rescue_unmatched": False}
    with pytest.raises(ValueError):
        YOLOXLoss(NC, assigner="ultralytics")
    with pytest.raises(TypeError):
        YOLOXLoss(NC, centre_radius=1.5)  # misspelt switch: loud, not ignored


def test_dynamic_k_matching_without_rescue_leaves_the_loser_unmatched():
    cost = torch.tensor([[1.0, 2.0, 9.0], [0.5, 8.0, 1.0]])
    ious = torch.tensor([[0.9, 0.6, 0.0], [0.9, 0.0, 0.2]])  # k = 1 for both; both want cell 0, box 1 is cheaper
    matching = YOLOXLoss.dynamic_k_matching(cost, ious, rescue_unmatched=False)
    assert matching.tolist() == [[False, False, False], [True, False, False]]


def test_center_radius_and_box_prior_set_the_candidates():
    grid, strides = make_grid(128, 128)
    gt = torch.tensor([[0, 64.0, 64.0, 100.0, 100.0]])  # a large box: its inside reaches far beyond 2.5 strides
    preds = random_preds(1, grid.shape[0])[0].detach()
    boxes = torch.cat(((preds[:, :2] + grid) * strides, preds[:, 2:4].exp() * strides), 1)
    args = (gt[:, 1:5], gt[:, 0].long(), boxes, preds[:, 5:], preds[:, 4], grid, strides)
    ours, megvii = YOLOXLoss(NC), YOLOXLoss(NC, assigner="megvii")
    cand_ours = ours.matching_cost(*args)[0]
    cand_megvii = megvii.matching_cost(*args)[0]
    in_box, in_center = ours.geometry(gt[:, 1:5], grid, strides)
    assert cand_ours.tolist() == (in_box | in_center)[0].nonzero().flatten().tolist()
    in_center_15 = megvii.geometry(gt[:, 1:5], grid, strides)[1]
    assert cand_megvii.tolist() == in_center_15[0].nonzero().flatten().tolist()
    # 1.5 strides: at most 3 x 3 cells per level around the centre
    assert len(cand_megvii) <= 27 < len(cand_ours)
    assert set(cand_megvii.tolist()) < set(cand_ours.tolist())
    box_only = YOLOXLoss(NC, assigner="megvii", box_prior=True).matching_cost(*args)[0]
    assert set(box_only.tolist()) == set(((in_box | in_center_15)[0]).nonzero().flatten().tolist())


def test_max_log_wh_none_does_not_clamp():
    grid, strides = torch.zeros(1, 2), torch.ones(1, 1)
    raw = torch.tensor([[0.0, 0.0, 12.0, 1.0]])
    assert YOLOXLoss(NC).decode_boxes(raw, grid, strides)[0, 2] == pytest.approx(math.exp(10.0))
    assert YOLOXLoss(NC, assigner="megvii").decode_boxes(raw, grid, strides)[0, 2] == pytest.approx(math.exp(12.0))


@pytest.mark.parametrize("assigner", ["yolo-cb", "megvii"])
def test_loss_runs_in_float64_when_given_float64(assigner):
    grid, strides = make_grid(128, 128)
    preds = random_preds(3, grid.shape[0]).double()
    out = YOLOXLoss(NC, use_l1=True, assigner=assigner)(preds, grid.double(), strides.double(), batch_targets())
    assert out["total"].dtype == torch.float64
    check_finite(out)
    out32 = YOLOXLoss(NC, use_l1=True, assigner=assigner)(preds.float(), grid, strides, batch_targets())
    assert out32["total"].dtype == torch.float32
    assert math.isclose(float(out["total"].detach()), float(out32["total"].detach()), rel_tol=1e-4)
