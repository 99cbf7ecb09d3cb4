"""COCO-exact AP against pycocotools' COCOeval on the same boxes; confusion matrix; IoU."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
import torch

from yolo_cb.metrics import ConfusionMatrix, DetMetrics, box_iou, coco_ap, coco_iou, cxcywh2xyxy, match_coco, xyxy2xywh

pycocotools = pytest.importorskip("pycocotools")
TOL = 1e-4


def cocoeval(images: list[dict], nc: int) -> tuple[float, float]:
    """(mAP50, mAP50-95) from COCOeval. images: dicts with id, gt_boxes/gt_cls, dt_boxes/dt_scores/dt_cls (xywh)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    gt = {"images": [{"id": im["id"], "width": 640, "height": 640} for im in images], "categories": [{"id": c, "name": str(c)} for c in range(nc)],
          "annotations": []}
    dets = []
    for im in images:
        for box, c in zip(im["gt_boxes"], im["gt_cls"], strict=True):
            gt["annotations"].append({"id": len(gt["annotations"]) + 1, "image_id": im["id"], "category_id": int(c),
                                      "bbox": [float(v) for v in box], "area": float(box[2] * box[3]), "iscrowd": 0})
        for box, s, c in zip(im["dt_boxes"], im["dt_scores"], im["dt_cls"], strict=True):
            dets.append({"image_id": im["id"], "category_id": int(c), "bbox": [float(v) for v in box], "score": float(s)})
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO()
        coco_gt.dataset = gt
        coco_gt.createIndex()
        if dets:
            coco_dt = coco_gt.loadRes(dets)
        else:  # loadRes cannot take an empty list
            coco_dt = COCO()
            coco_dt.dataset = {"images": gt["images"], "categories": gt["categories"], "annotations": []}
            coco_dt.createIndex()
        evaluator = COCOeval(coco_gt, coco_dt, "bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return float(evaluator.stats[1]), float(evaluator.stats[0])


def ours(images: list[dict], nc: int) -> DetMetrics:
    m = DetMetrics(nc)
    for im in images:
        m.update(im["dt_boxes"], im["dt_scores"], im["dt_cls"], im["gt_boxes"], im["gt_cls"], key=im["id"])
    return m.compute()


def random_images(seed: int, n_images: int = 12, nc: int = 4, max_gt: int = 8) -> list[dict]:
    """Random GT; detections = jittered GT copies (varied IoU), duplicates, and random boxes; coarse scores for ties."""
    rng = np.random.default_rng(seed)
    images = []
    for i in range(n_images):
        n_gt = int(rng.integers(0, max_gt + 1)) if i % 5 else 0  # every 5th image has no GT
        xy = rng.uniform(0, 500, (n_gt, 2))
        wh = rng.uniform(5, 140, (n_gt, 2))
        gt_boxes = np.concatenate((xy, wh), 1)
        if n_gt > 2 and rng.random() < 0.5:
            gt_boxes[1] = gt_boxes[0]  # identical GTs: IoU ties
        gt_cls = rng.integers(0, nc, n_gt)
        dt_boxes, dt_cls = [], []
        if i % 7 != 3:  # some images get no predictions
            for box, c in zip(gt_boxes, gt_cls, strict=True):
                for _ in range(int(rng.integers(0, 3))):
                    jitter = rng.normal(0, 0.15, 4) * np.array([box[2], box[3], box[2], box[3]])
                    b = box + jitter
                    b[2:] = np.abs(b[2:]) + 1
                    dt_boxes.append(b)
                    dt_cls.append(c if rng.random() < 0.85 else rng.integers(0, nc))
            for _ in range(int(rng.integers(0, 10))):
                dt_boxes.append(np.concatenate((rng.uniform(0, 500, 2), rng.uniform(5, 140, 2))))
                dt_cls.append(rng.integers(0, nc))
        n_dt = len(dt_boxes)
        images.append({"id": int(rng.integers(0, 10**6)) * 100 + i, "gt_boxes": gt_boxes, "gt_cls": gt_cls,
                       "dt_boxes": np.array(dt_boxes).reshape(-1, 4), "dt_cls": np.array(dt_cls, dtype=int),
                       "dt_scores": np.round(rng.uniform(0.001, 1, n_dt), 2)})  # 2 decimals: many score ties
    return images


def check(images: list[dict], nc: int) -> float:
    m = ours(images, nc)
    ref50, ref = cocoeval(images, nc)
    diff = max(abs(m.map50 - ref50), abs(m.map - ref))
    assert diff < TOL, (m.map50, ref50, m.map, ref)
    return diff


@pytest.mark.parametrize("seed", range(6))
def test_random_boxes_match_cocoeval(seed):
    check(random_images(seed, nc=2 + seed % 4), nc=2 + seed % 4)


def test_string_image_ids_match_cocoeval():
    images = random_images(21, n_images=15, nc=3)
    for k, im in enumerate(images):
        im["id"] = f"img_{(k * 7) % 15}"  # string ids, not in update order: COCO sorts them
    check(images, 3)


def test_many_detections_per_image_and_class_are_capped_like_coco():
    rng = np.random.default_rng(7)
    gt = np.array([[10, 10, 50, 50], [100, 100, 40, 60], [300, 200, 80, 80]], dtype=float)
    dt = np.concatenate([gt + rng.normal(0, 4, gt.shape) for _ in range(60)])  # 180 dets of one class in one image
    images = [{"id": 1, "gt_boxes": gt, "gt_cls": np.zeros(3, int), "dt_boxes": dt, "dt_cls": np.zeros(len(dt), int),
               "dt_scores": rng.uniform(0, 1, len(dt))},
              {"id": 2, "gt_boxes": gt, "gt_cls": np.zeros(3, int), "dt_boxes": gt[:1], "dt_cls": np.zeros(1, int), "dt_scores": np.array([0.3])}]
    check(images, 1)


def test_perfect_predictions_give_ap_one():
    images = random_images(11, nc=3)
    for im in images:
        im["dt_boxes"], im["dt_cls"], im["dt_scores"] = im["gt_boxes"].copy(), im["gt_cls"].copy(), np.linspace(0.9, 0.5, len(im["gt_cls"]))
    m = ours(images, 3)
    assert m.map50 == pytest.approx(1.0) and m.map == pytest.approx(1.0)
    check(images, 3)
    assert all(row["precision"] == pytest.approx(1.0) and row["recall"] == pytest.approx(1.0) for row in m.per_class)


def test_no_predictions_give_ap_zero():
    images = random_images(12, nc=3)
    for im in images:
        im["dt_boxes"], im["dt_cls"], im["dt_scores"] = np.zeros((0, 4)), np.zeros(0, int), np.zeros(0)
    m = ours(images, 3)
    assert m.map50 == 0.0 and m.map == 0.0 and m.mp == 0.0 and m.mr == 0.0
    check(images, 3)


def test_class_with_gt_but_no_predictions_counts_zero():
    images = random_images(13, nc=3)
    for im in images:
        keep = im["dt_cls"] != 2
        im["dt_boxes"], im["dt_cls"], im["dt_scores"] = im["dt_boxes"][keep], im["dt_cls"][keep], im["dt_scores"][keep]
    m = ours(images, 3)
    assert m.nt[2] > 0 and np.all(m.ap[2] == 0)
    check(images, 3)


def test_predictions_for_a_class_without_gt_are_left_out():
    images = random_images(14, nc=4)
    for im in images:  # no GT of class 3, but predictions of it
        keep = im["gt_cls"] != 3
        im["gt_boxes"], im["gt_cls"] = im["gt_boxes"][keep], im["gt_cls"][keep]
        im["dt_cls"] = np.where(np.arange(len(im["dt_cls"])) % 3 == 0, 3, im["dt_cls"])
    m = ours(images, 4)
    assert m.nt[3] == 0 and np.isnan(m.ap[3]).all()
    assert 3 not in [row["class"] for row in m.per_class]
    check(images, 4)


def test_coco_iou_matches_torchvision_and_pycocotools():
    from pycocotools import mask as mask_utils

    rng = np.random.default_rng(0)
    a = np.concatenate((rng.uniform(0, 100, (7, 2)), rng.uniform(1, 50, (7, 2))), 1)
    b = np.concatenate((rng.uniform(0, 100, (5, 2)), rng.uniform(1, 50, (5, 2))), 1)
    ours_iou = coco_iou(a, b)
    ref = mask_utils.iou(a.tolist(), b.tolist(), [0] * 5)
    assert np.abs(ours_iou - ref).max() < 1e-12
    to_xyxy = lambda x: torch.tensor(np.concatenate((x[:, :2], x[:, :2] + x[:, 2:]), 1))  # noqa: E731
    assert np.abs(box_iou(to_xyxy(a), to_xyxy(b)).numpy() - ref).max() < 1e-9
    assert np.allclose(xyxy2xywh(to_xyxy(a)), a)
    assert torch.allclose(cxcywh2xyxy(torch.tensor([[10.0, 20.0, 4.0, 6.0]])), torch.tensor([[8.0, 17.0, 12.0, 23.0]]))


def test_matching_prefers_best_iou_and_last_gt_on_ties():
    ious = np.array([[0.6, 0.9, 0.9], [0.7, 0.8, 0.0]])
    m = match_coco(ious)
    assert m[0, 0] and m[1, 0]  # both match at .5
    assert m[0].sum() == 9  # .9 >= every threshold up to .9, not .95
    ap, q = coco_ap(np.ones((2, 10), bool), np.array([0.9, 0.8]), 2)
    assert ap[0] == pytest.approx(1.0) and q.shape == (10, 101)


def test_confusion_matrix_counts():
    cm = ConfusionMatrix(nc=2)
    gt = torch.tensor([[0, 0, 10, 10], [20, 20, 30, 30], [50, 50, 60, 60.0]])
    det = torch.tensor([[0, 0, 10, 10, 0.9, 0], [20, 20, 30, 30, 0.8, 0], [80, 80, 90, 90, 0.7, 1], [50, 50, 60, 60, 0.1, 1]])
    cm.process_batch(det, gt, torch.tensor([0, 1, 1]))
    # [pred, true]: 0->0 correct, class-1 GT predicted as 0, class-1 GT missed (low score), one FP of class 1
    expected = np.array([[1, 1, 0], [0, 0, 1], [0, 1, 0]])
    assert (cm.matrix == expected).all()
    cm.process_batch(None, gt[:1], torch.tensor([1]))
    cm.process_batch(det[:1], torch.zeros(0, 4), torch.zeros(0))
    assert cm.matrix[2, 1] == 2 and cm.matrix[0, 2] == 1
    assert np.allclose(cm.normalized().sum(0)[cm.matrix.sum(0) > 0], 1)
