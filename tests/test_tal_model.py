"""YOLOCB family: output contract, task-aligned assigner on hand-made boxes, DFL, loss, checkpoint round trip, export, trainer."""

from __future__ import annotations

import csv

import numpy as np
import onnxruntime as ort
import pytest
import torch

from tests.test_assigner_pairs import pairwise_iou  # the dense IoU the assigner's reference uses
from yolo_cb.checkpoints.checkpoint import Checkpoint, load_checkpoint, model_from_checkpoint, save_checkpoint
from yolo_cb.export.exporter import Exporter
from yolo_cb.nn import YOLOCB, YOLOX, build_model
from yolo_cb.nn.yolocb.assigner import TaskAlignedAssigner, pad_targets
from yolo_cb.nn.yolocb.head import REG_MAX, boxes_to_distances, dfl_expectation, distances_to_boxes
from yolo_cb.nn.yolocb.loss import complete_iou, distribution_focal_loss

NC = 3


@pytest.fixture(scope="module")
def model() -> YOLOCB:
    torch.manual_seed(0)
    return build_model("yolocb-n", nc=NC, verbose=False)


def cells(h: int, w: int, stride: float = 8.0) -> torch.Tensor:
    """Cell centres (h * w, 2) in pixels, row-major."""
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32), indexing="ij")
    return (torch.stack((xs, ys), -1).reshape(-1, 2) + 0.5) * stride


def one_image(*boxes) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(classes, boxes, valid) for one image of xyxy boxes, class i for box i."""
    targets = torch.tensor([[0, i, (b[0] + b[2]) / 2, (b[1] + b[3]) / 2, b[2] - b[0], b[3] - b[1]] for i, b in enumerate(boxes)])
    return pad_targets(targets.float(), 1)


# --- the module's contract ------------------------------------------------------------------
def test_output_shapes_and_contract(model):
    x = torch.rand(2, 3, 64, 96)
    targets = torch.tensor([[0, 1, 30.0, 30.0, 20.0, 24.0], [1, 2, 50.0, 20.0, 30.0, 16.0]])
    model.train()
    raw = model(x)
    assert [tuple(o.shape) for o in raw] == [(2, 4 * REG_MAX + NC, 64 // s, 96 // s) for s in (8, 16, 32)]
    losses = model(x, targets)
    assert set(losses) == {"total", "box", "cls", "dfl", "num_fg"} and model.criterion.loss_names == ("box", "cls", "dfl")
    assert torch.isfinite(losses["total"]) and losses["num_fg"] > 0
    assert torch.allclose(losses["total"].detach(), losses["box"] + losses["cls"] + losses["dfl"])
    model.eval()
    with torch.no_grad():
        preds, eval_losses = model(x, targets)
        alone = model(x)
    anchors = sum((64 // s) * (96 // s) for s in (8, 16, 32))
    assert preds.shape == alone.shape == (2, anchors, 4 + 1 + NC) and torch.equal(preds, alone)
    assert torch.all(preds[..., 4] == 1.0)  # objectness column: score = class probability
    assert torch.all((preds[..., 5:] > 0) & (preds[..., 5:] < 1)) and torch.all(preds[..., 2:4] >= 0)
    assert set(eval_losses) == set(losses)
    assert torch.equal(model.stride, torch.tensor([8.0, 16.0, 32.0])) and model.names == {i: str(i) for i in range(NC)}


def test_initial_biases_follow_the_priors(model):
    box, cls = model.head.box_branches[0][-1], model.head.cls_branches[0][-1]
    assert torch.all(box.bias == 1.0)
    assert cls.bias[0].item() == pytest.approx(np.log(5 / NC / (640 / 8) ** 2), rel=1e-5)


def test_raw_outputs_decode_like_yolox(model):
    """The exporter's dynamic graph decodes `raw_outputs` as YOLOX outputs: that must give the model's own predictions."""
    model.eval()
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        expected = model(x)
        decoded = []
        for o, s in zip(model.raw_outputs(x), (8, 16, 32), strict=True):
            grid = torch.from_numpy(np.stack(np.meshgrid(np.arange(o.shape[3]), np.arange(o.shape[2])), -1).reshape(1, -1, 2)).float()
            p = o.flatten(2).transpose(1, 2)
            decoded.append(torch.cat(((p[..., :2] + grid) * s, p[..., 2:4].exp() * s, p[..., 4:].sigmoid()), -1))
    assert torch.allclose(torch.cat(decoded, 1), expected, atol=1e-4)


def test_fuse_keeps_predictions():
    torch.manual_seed(1)
    net = build_model("yolocb-n", nc=NC, verbose=False)
    for m in net.modules():  # non-trivial BatchNorm statistics, so fusing is exercised
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    net.eval()
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        before = net(x)
        after = net.fuse()(x)
    assert torch.allclose(before, after, atol=1e-4)


# --- the assigner on hand-made boxes --------------------------------------------------------
def test_ground_truth_takes_the_cells_inside_it():
    centers = cells(4, 4)  # centres at 4, 12, 20, 28 px
    classes, boxes, valid = one_image((0.0, 0.0, 16.0, 16.0))  # holds the centres (4, 4), (12, 4), (4, 12), (12, 12)
    pred = torch.cat((centers - 6, centers + 6), -1)[None]  # a 12 px box around every cell
    scores = torch.full((1, 16, NC), 0.5)
    out = TaskAlignedAssigner(topk=10)(scores, pred, centers, classes, boxes, valid)
    assert out.fg_mask[0].nonzero().flatten().tolist() == [0, 1, 4, 5]
    assert torch.equal(out.boxes[0, out.fg_mask[0]], boxes[0, [0, 0, 0, 0]])
    assert torch.all(out.scores[0, ~out.fg_mask[0]] == 0) and torch.all(out.scores[0, out.fg_mask[0], 1:] == 0)
    # normalisation: the best-aligned cell of a ground truth gets that ground truth's best IoU
    best_iou = pairwise_iou(boxes, pred)[0, 0, out.fg_mask[0]].max()
    assert out.scores[0, :, 0].max().item() == pytest.approx(best_iou.item(), rel=1e-5)


def test_topk_keeps_the_best_aligned_cells():
    centers = cells(4, 4)
    classes, boxes, valid = one_image((0.0, 0.0, 32.0, 32.0))  # every centre is inside
    pred = torch.cat((centers - 6, centers + 6), -1)[None]
    scores = torch.full((1, 16, NC), 1e-4)
    scores[0, [3, 7, 9], 0] = 0.9  # these cells are by far the most confident in the box's class
    out = TaskAlignedAssigner(topk=3)(scores, pred, centers, classes, boxes, valid)
    assert out.fg_mask[0].nonzero().flatten().tolist() == [3, 7, 9]


def test_a_shared_cell_goes_to_the_highest_iou():
    centers = cells(4, 4)
    # both boxes hold the centre (12, 12) of cell 5; that cell's predicted box matches the second one better
    classes, boxes, valid = one_image((0.0, 0.0, 16.0, 16.0), (8.0, 8.0, 28.0, 28.0))
    pred = torch.cat((centers - 6, centers + 6), -1)[None].clone()
    pred[0, 5] = torch.tensor([8.0, 8.0, 27.0, 27.0])
    scores = torch.full((1, 16, NC), 0.5)
    out = TaskAlignedAssigner(topk=10)(scores, pred, centers, classes, boxes, valid)
    assert out.fg_mask[0, 5] and out.gt_index[0, 5].item() == 1
    assert out.scores[0, 5, 1] > 0 and out.scores[0, 5, 0] == 0
    assert out.fg_mask[0].nonzero().flatten().tolist() == [0, 1, 4, 5, 6, 9, 10]
    assert out.gt_index[0, [0, 1, 4]].tolist() == [0, 0, 0] and out.gt_index[0, [6, 9, 10]].tolist() == [1, 1, 1]


def test_images_without_boxes_and_padding():
    targets = torch.tensor([[1, 2, 10.0, 10.0, 4.0, 6.0], [1, 0, 20.0, 20.0, 2.0, 2.0], [3, 1, 5.0, 5.0, 2.0, 2.0]])
    classes, boxes, valid = pad_targets(targets, 4)
    assert valid.tolist() == [[False, False], [True, True], [False, False], [True, False]]
    assert classes[1].tolist() == [2, 0] and boxes[1, 0].tolist() == [8.0, 7.0, 12.0, 13.0]
    empty = pad_targets(torch.zeros((0, 6)), 2)
    assert empty[1].shape == (2, 0, 4)
    out = TaskAlignedAssigner()(torch.rand(2, 16, NC), torch.rand(2, 16, 4), cells(4, 4), *empty)
    assert not out.fg_mask.any() and torch.all(out.scores == 0)


# --- DFL and box terms ------------------------------------------------------------------------
def test_dfl_decode_round_trip():
    torch.manual_seed(0)
    target = torch.rand(50, 4) * (REG_MAX - 1)
    left = target.floor().long().clamp(max=REG_MAX - 2)
    probs = torch.zeros(50, 4, REG_MAX)
    probs.scatter_(-1, left[..., None], (left + 1 - target)[..., None])
    probs.scatter_(-1, left[..., None] + 1, (target - left)[..., None])
    assert torch.allclose(dfl_expectation(probs.clamp(min=1e-12).log()), target, atol=1e-4)
    centers = torch.rand(50, 2) * 40
    assert torch.allclose(boxes_to_distances(distances_to_boxes(target, centers), centers), target, atol=1e-4)


def test_dfl_is_lowest_at_the_two_point_distribution():
    target = torch.tensor([[3.25, 0.0, 7.5, 14.0]])
    left = target.floor().long()
    exact = torch.full((1, 4, REG_MAX), -30.0)
    exact.scatter_(-1, left[..., None], (left + 1 - target).clamp(min=1e-9).log()[..., None])
    exact.scatter_(-1, left[..., None] + 1, (target - left).clamp(min=1e-9).log()[..., None])
    best = distribution_focal_loss(exact, target)
    for other in (torch.zeros(1, 4, REG_MAX), exact.roll(1, dims=-1)):
        assert distribution_focal_loss(other, target) > best


def test_complete_iou():
    a = torch.tensor([[0.0, 0.0, 10.0, 20.0]])
    assert complete_iou(a, a).item() == pytest.approx(1.0, abs=1e-5)
    shifted = a + torch.tensor([[5.0, 0.0, 5.0, 0.0]])
    iou = pairwise_iou(a[None], shifted[None]).item()
    assert complete_iou(shifted, a).item() < iou  # the centre-distance penalty


# --- learning, checkpoints, export, trainer ----------------------------------------------------
def test_loss_is_finite_and_decreases_on_a_tiny_overfit():
    """Task-aligned targets grow with the predictions' quality (a cell's soft class target is its normalised alignment),
    so the loss first rises from its initial value as boxes improve, then falls: it must end well below its peak."""
    torch.manual_seed(0)
    images = torch.full((4, 3, 64, 64), 0.2)
    rows = []
    for i in range(4):  # one bright rectangle per image
        x1, y1, w, h = 8 + 6 * i, 10 + 4 * i, 24 - 2 * i, 20 + 3 * i
        images[i, :, y1 : y1 + h, x1 : x1 + w] = 0.9
        rows.append([i, i % NC, x1 + w / 2, y1 + h / 2, w, h])
    targets = torch.tensor(rows)
    net = build_model("yolocb-n", nc=NC, verbose=False).train()
    optimizer = torch.optim.AdamW(net.parameters(), lr=0.002)
    losses = []
    for _ in range(30):
        loss = net(images, targets)["total"]
        assert torch.isfinite(loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert np.mean(losses[-5:]) < 0.5 * max(losses), losses


def test_build_model_round_trip_from_a_checkpoint(model, tmp_path):
    assert model.cfg == {"family": "yolocb", "depth": 0.33, "width": 0.25, "max_channels": 1024, "reg_max": 16, "act": "silu", "cls_branch": "full", "body": "split_csp", "nc": NC}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    path = save_checkpoint(Checkpoint(model=state, ema=state, model_cfg=dict(model.cfg), names={0: "a", 1: "b", 2: "c"},
                                      epoch=0, version="0", date="2026-01-01T00:00:00"), tmp_path / "best.pt")
    ckpt = load_checkpoint(path)  # weights_only: the cfg is plain data
    rebuilt = model_from_checkpoint(ckpt)
    assert isinstance(rebuilt, YOLOCB) and rebuilt.name == "YOLOCB-n" and rebuilt.cfg == model.cfg
    assert rebuilt.names == {0: "a", 1: "b", 2: "c"}
    x = torch.rand(1, 3, 64, 64)
    model.eval()
    with torch.no_grad():
        assert torch.allclose(rebuilt(x), model(x))
    # a YOLOX config with the same depth and width stays a YOLOX, and vice versa
    nano = build_model("yolox-nano", nc=NC, verbose=False)
    assert isinstance(build_model(nano.cfg, nc=NC, verbose=False), YOLOX)
    assert build_model({**model.cfg, "width": 0.5}, nc=NC, verbose=False).name == "YOLOCB-s"
    with pytest.raises(ValueError, match="family"):
        build_model({**model.cfg, "family": "nope"}, nc=NC, verbose=False)


@pytest.mark.parametrize("dynamic", [False, True])
def test_onnx_export_with_the_exporter(model, tmp_path, dynamic):
    model.eval()
    path = Exporter({"format": "onnx", "imgsz": 64, "dynamic": dynamic, "project": str(tmp_path)})(model)
    session = ort.InferenceSession(str(path))
    size = (96, 64) if dynamic else (64, 64)
    x = torch.rand(2 if dynamic else 1, 3, *size)
    with torch.no_grad():
        expected = model(x).numpy()
    out = session.run(None, {"images": x.numpy()})[0]
    assert out.shape == expected.shape and np.abs(out - expected).max() < 1e-3


def test_trainer_reports_the_family_losses(tiny):
    from yolo_cb import YOLO

    yolo = YOLO("yolocb-n.yaml")
    metrics = yolo.train(**{**tiny, "model": "yolocb-n.yaml", "epochs": 2, "no_aug_epochs": 1})  # the stage switch runs on a model without L1
    assert yolo.trainer.loss_names == ("box_loss", "cls_loss", "dfl_loss")
    assert "metrics/mAP50-95(B)" in metrics
    with open(yolo.trainer.save_dir / "results.csv") as f:
        header = next(csv.reader(f))
    assert {"train/box_loss", "train/cls_loss", "train/dfl_loss", "val/box_loss", "val/cls_loss", "val/dfl_loss"} <= {h.strip() for h in header}
    ckpt = load_checkpoint(yolo.trainer.wdir / "last.pt")
    assert ckpt.model_cfg["family"] == "yolocb" and ckpt.loss == {}  # the YOLO-CB loss has no training state
