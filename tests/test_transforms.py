"""Transforms keep boxes on their pixels: letterbox, mosaic, affine, flip, HSV."""

from __future__ import annotations

import types

import cv2
import numpy as np
import pytest
import yaml

from yolo_cb.data.dataset import YOLODataset
from yolo_cb.data.transforms import RandomHSV, letterbox
from yolo_cb.utils.paths import DEFAULT_CFG

MAGENTA = (255, 0, 255)  # the same in RGB and BGR
BOX_W, BOX_H = 90, 60
TOL = 2.5  # pixels: interpolation softens the edges


def hyp(**overrides):
    cfg = yaml.safe_load(DEFAULT_CFG.read_text())
    cfg.update(hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, fliplr=0.0, flipud=0.0, mixup=0.0)
    cfg.update(overrides)
    return types.SimpleNamespace(**cfg)


@pytest.fixture(scope="module")
def box_dataset(tmp_path_factory):
    """8 grey 320x320 PNGs, each with one magenta rectangle at least 12 px inside the border."""
    root = tmp_path_factory.mktemp("boxes")
    (root / "images").mkdir()
    (root / "labels").mkdir()
    rng = np.random.default_rng(1)
    for i in range(8):
        img = np.full((320, 320, 3), 50, np.uint8)
        x1, y1 = int(rng.integers(12, 320 - BOX_W - 12)), int(rng.integers(12, 320 - BOX_H - 12))
        img[y1 : y1 + BOX_H, x1 : x1 + BOX_W] = MAGENTA
        cv2.imwrite(str(root / "images" / f"{i}.png"), img)
        cx, cy = (x1 + BOX_W / 2) / 320, (y1 + BOX_H / 2) / 320
        (root / "labels" / f"{i}.txt").write_text(f"0 {cx:.6f} {cy:.6f} {BOX_W / 320:.6f} {BOX_H / 320:.6f}\n")
    return root / "images"


def make(box_dataset, augment=True, **overrides):
    return YOLODataset(str(box_dataset), 320, ["thing"], augment, hyp(**overrides), cache="ram", prefix="test: ")


def components(img_rgb: np.ndarray):
    """Bounding boxes (x1, y1, x2, y2) and areas of the magenta regions."""
    mask = (np.abs(img_rgb.astype(np.int16) - np.array(MAGENTA)).max(2) < 60).astype(np.uint8)
    n, _, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
    return [((x, y, x + w, y + h), area) for x, y, w, h, area in stats[1:]]


def boxes_xyxy(sample) -> np.ndarray:
    b = sample["bboxes"].numpy()
    return np.stack([b[:, 0] - b[:, 2] / 2, b[:, 1] - b[:, 3] / 2, b[:, 0] + b[:, 2] / 2, b[:, 1] + b[:, 3] / 2], 1)


def assert_aligned(sample, max_gain=1.0):
    """Every box sits on a magenta region; every unlabelled region is a remnant the filters may drop."""
    img = sample["img"].permute(1, 2, 0).numpy()
    comps = components(img)
    boxes = boxes_xyxy(sample)
    matched = set()
    for box in boxes:
        hits = [k for k, (c, _) in enumerate(comps) if np.abs(np.array(c) - box).max() <= TOL]
        assert hits, f"box {box.round(1)} has no matching magenta region among {[c for c, _ in comps]}"
        matched.add(hits[0])
    for k, ((x1, y1, x2, y2), area) in enumerate(comps):
        if k not in matched:
            small = area < 0.1 * BOX_W * BOX_H * max_gain**2 or min(x2 - x1, y2 - y1) <= 3 or max(x2 - x1, y2 - y1) / max(1, min(x2 - x1, y2 - y1)) > 20
            assert small, f"magenta region {(x1, y1, x2, y2)} (area {area}) has no box"
    return len(boxes)


def test_letterbox_ratio_and_padding_map_back():
    img = np.zeros((200, 100, 3), np.uint8)
    img[50:100, 20:60] = 255
    out, r, (pw, ph) = letterbox(img, (320, 320))
    assert out.shape == (320, 320, 3) and r == pytest.approx(1.6) and (pw, ph) == (80.0, 0.0)
    ys, xs = np.nonzero(out[..., 0] > 127)
    back = (np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]) - [pw, ph, pw, ph]) / r
    assert np.abs(back - [20, 50, 60, 100]).max() < 1
    out, r, (pw, ph) = letterbox(img, (320, 320), auto=True)  # minimal stride multiple
    assert out.shape == (320, 160, 3) and (pw, ph) == (0.0, 0.0)
    out, r, pad = letterbox(img, (640, 640), scaleup=False)
    assert r == 1.0 and out.shape == (640, 640, 3) and pad == (270.0, 220.0)
    out, r, pad = letterbox(img, 320, center=False)
    assert pad == (0.0, 0.0) and out[:, 200:].max() == 114


def test_mosaic_boxes_stay_on_pixels(box_dataset):
    ds = make(box_dataset, mosaic=1.0, degrees=0.0, translate=0.0, scale=0.0, shear=0.0)
    np.random.seed(0)
    n = 0
    for i in range(8):
        sample = ds[i]
        assert sample["img"].shape == (3, 320, 320) and sample["mosaic"]
        n += assert_aligned(sample)
    assert n >= 8  # mosaics show several boxes


def test_mosaic_plus_affine_boxes_stay_on_pixels(box_dataset):
    ds = make(box_dataset, mosaic=1.0, degrees=0.0, translate=0.1, scale=0.5, shear=0.0)
    np.random.seed(1)
    for i in range(8):
        assert_aligned(ds[i], max_gain=1.5)


def test_affine_alone_and_flips(box_dataset):
    ds = make(box_dataset, mosaic=0.0, degrees=0.0, translate=0.2, scale=0.5, fliplr=0.5, flipud=0.5)
    np.random.seed(2)
    for i in range(8):
        assert_aligned(ds[i], max_gain=1.5)
    flips = make(box_dataset, mosaic=0.0, fliplr=1.0, flipud=1.0)
    flips.close_mosaic()  # letterbox + flip + hsv only
    for i in range(4):
        sample = flips[i]
        assert assert_aligned(sample) == 1
        plain = make(box_dataset, augment=False)[i]
        (bx,) = boxes_xyxy(sample)
        (px,) = boxes_xyxy(plain)
        assert np.allclose(bx, [320 - px[2], 320 - px[3], 320 - px[0], 320 - px[1]], atol=0.01)


def test_rotation_box_encloses_the_rotated_object(box_dataset):
    ds = make(box_dataset, mosaic=0.0, degrees=40.0, translate=0.0, scale=0.0)
    np.random.seed(3)
    for i in range(6):
        sample = ds[i]
        ((comp, _),) = components(sample["img"].permute(1, 2, 0).numpy())
        (box,) = boxes_xyxy(sample)
        assert np.abs(np.array(comp) - box).max() <= 3, (comp, box)  # a rectangle's corners give its tight box


def test_letterbox_val_and_closed_pipeline(box_dataset):
    val = make(box_dataset, augment=False)
    for i in range(3):
        sample = val[i]
        assert sample["img"].shape == (3, 320, 320) and assert_aligned(sample) == 1
    closed = make(box_dataset, mosaic=1.0, mixup=1.0)
    closed.close_mosaic()
    for i in range(3):
        sample = closed[i]
        assert not sample["mosaic"] and assert_aligned(sample) == 1


def test_mixup_keeps_both_label_sets(box_dataset):
    ds = make(box_dataset, mosaic=0.0, mixup=1.0, translate=0.0, scale=0.0)
    np.random.seed(4)
    sample = ds[0]
    assert len(sample["cls"]) == 2 and sample["img"].shape == (3, 320, 320)


def test_hsv_changes_colours_not_shape():
    img = np.random.default_rng(0).integers(0, 256, (64, 48, 3), dtype=np.uint8)
    assert RandomHSV(0, 0, 0)({"img": img})["img"] is img
    np.random.seed(0)
    out = RandomHSV(0.5, 0.7, 0.4)({"img": img})["img"]
    assert out.shape == img.shape and out.dtype == np.uint8 and not np.array_equal(out, img)
