"""Image + box transforms for detection: letterbox, mosaic, affine, mixup, HSV, flips.

Every transform is a small callable on a *sample*, a dict with:

- ``img``: HxWx3 uint8 BGR image (OpenCV order until the dataset formats it);
- ``cls``: (n,) int64 class ids;
- ``bboxes``: (n, 4) float32 boxes, ``x1 y1 x2 y2`` in pixels of ``img``;
- ``areas``: (n,) float32 area of each box before any crop, in pixels of ``img``
  (lets the geometric steps drop boxes that lost most of their object);
- ``im_file``, ``ori_shape`` (h0, w0), ``ratio_pad`` (ratio, (pad_w, pad_h)) mapping ``img``
  back to the original image with ``(xy - pad) / ratio``; ``mosaic`` (bool).

Transforms that are switched off for the final no-augmentation stage have ``close()``.
Randomness comes from ``numpy.random``, which the loader seeds for each sample (data/loading/stream.py); mosaic and mixup
draw their partners with ``dataset.draw_partners``.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

PAD_VALUE = 114  # grey used for padding and empty mosaic areas


def letterbox(img, new_shape=(640, 640), color=(114, 114, 114), auto=False, stride=32, scaleup=True, center=True):
    """Resize ``img`` keeping its aspect ratio, then pad it to ``new_shape`` (h, w).

    ``auto=True`` pads only to the smallest multiple of ``stride`` instead of the full shape;
    ``scaleup=False`` never enlarges; ``center=False`` pads only right/bottom.
    Returns ``(img, ratio, (pad_w, pad_h))``: ratio = new/old size, pads = pixels added on the
    left/top. A point maps back to the original image with ``(xy - pad) / ratio``.
    """
    if isinstance(new_shape, int):
        new_shape = (new_shape, new_shape)
    h, w = img.shape[:2]
    ratio = min(new_shape[0] / h, new_shape[1] / w)
    if not scaleup:
        ratio = min(ratio, 1.0)
    new_w, new_h = max(1, round(w * ratio)), max(1, round(h * ratio))
    pad_w, pad_h = new_shape[1] - new_w, new_shape[0] - new_h
    if auto:
        pad_w, pad_h = pad_w % stride, pad_h % stride
    left, top = (pad_w // 2, pad_h // 2) if center else (0, 0)
    if (new_w, new_h) != (w, h):
        img = cv2.resize(img, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    if pad_w or pad_h:
        img = cv2.copyMakeBorder(img, top, pad_h - top, left, pad_w - left, cv2.BORDER_CONSTANT, value=color)
    return img, ratio, (float(left), float(top))


def keep_boxes(sample: dict, keep: np.ndarray) -> dict:
    """Keep only the boxes selected by the boolean/index array ``keep``."""
    for key in ("cls", "bboxes", "areas"):
        sample[key] = sample[key][keep]
    return sample


def box_candidates(boxes, expected_areas, min_wh=2.0, max_aspect=20.0, min_area_ratio=0.1):
    """Boolean mask of boxes worth keeping after a geometric transform.

    A box is dropped when it is thinner than ``min_wh`` pixels, more elongated than
    ``max_aspect``, or keeps less than ``min_area_ratio`` of the area it would have had uncropped.
    """
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    aspect = np.maximum(w / (h + 1e-9), h / (w + 1e-9))
    return (w > min_wh) & (h > min_wh) & (aspect < max_aspect) & (w * h / (expected_areas + 1e-9) > min_area_ratio)


class Mosaic:
    """Paste 4 images (this one + 3 random) around a random centre on a 2s x 2s grey canvas.

    The canvas is not resized here: RandomAffine crops/warps it to s x s in one warp.
    """

    def __init__(self, dataset, imgsz: int, p: float = 1.0):
        self.dataset, self.imgsz, self.p = dataset, imgsz, p

    def close(self):
        self.p = 0.0

    def __call__(self, sample: dict) -> dict:
        if self.p <= 0 or np.random.rand() >= self.p:
            return sample
        s = self.imgsz
        others = self.dataset.draw_partners(3)
        parts = [sample] + [self.dataset.get_image_and_label(int(i)) for i in others]
        xc, yc = (int(np.random.uniform(0.5 * s, 1.5 * s)) for _ in range(2))
        canvas = np.full((2 * s, 2 * s, 3), PAD_VALUE, dtype=np.uint8)
        cls, boxes, areas = [], [], []
        for k, part in enumerate(parts):
            img = part["img"]
            h, w = img.shape[:2]
            # canvas window (x1a..x2a, y1a..y2a) and the matching image window (x1b.., y1b..)
            if k == 0:  # top left of the centre
                x1a, y1a, x2a, y2a = max(xc - w, 0), max(yc - h, 0), xc, yc
                x1b, y1b = w - (x2a - x1a), h - (y2a - y1a)
            elif k == 1:  # top right
                x1a, y1a, x2a, y2a = xc, max(yc - h, 0), min(xc + w, 2 * s), yc
                x1b, y1b = 0, h - (y2a - y1a)
            elif k == 2:  # bottom left
                x1a, y1a, x2a, y2a = max(xc - w, 0), yc, xc, min(yc + h, 2 * s)
                x1b, y1b = w - (x2a - x1a), 0
            else:  # bottom right
                x1a, y1a, x2a, y2a = xc, yc, min(xc + w, 2 * s), min(yc + h, 2 * s)
                x1b, y1b = 0, 0
            canvas[y1a:y2a, x1a:x2a] = img[y1b : y1b + (y2a - y1a), x1b : x1b + (x2a - x1a)]
            shift = np.array([x1a - x1b, y1a - y1b] * 2, dtype=np.float32)
            cls.append(part["cls"])
            boxes.append(part["bboxes"] + shift)
            areas.append(part["areas"])
        boxes = np.concatenate(boxes).reshape(-1, 4)
        np.clip(boxes, 0, 2 * s, out=boxes)
        out = dict(sample, img=canvas, cls=np.concatenate(cls), bboxes=boxes, areas=np.concatenate(areas))
        out.update(mosaic=True, ratio_pad=(1.0, (0.0, 0.0)))
        return out


class RandomAffine:
    """Random rotation/scale/shear/translation (and perspective) into an s x s output, with one ``cv2.warpAffine``
    (``cv2.warpPerspective`` when ``perspective`` > 0).

    The input (a mosaic canvas or a single image whose long side is s) is centred, transformed
    about its centre, and placed at the output centre +/- ``translate``. Boxes are mapped by
    their 4 corners, clipped, and filtered with :func:`box_candidates`. ``perspective``: the
    +/- range of the two projective terms, as Ultralytics' (0 to 0.001).
    """

    def __init__(self, imgsz: int, degrees=0.0, translate=0.1, scale=0.5, shear=0.0, perspective=0.0):
        self.imgsz = imgsz
        self.degrees, self.translate, self.scale, self.shear, self.perspective = degrees, translate, scale, shear, perspective
        self.enabled = True

    def close(self):
        self.enabled = False

    def matrix(self, h: int, w: int) -> tuple[np.ndarray, float]:
        """The 3x3 matrix (affine unless perspective > 0) for an h x w input, and its scale gain."""
        s = self.imgsz
        centre = np.eye(3)
        centre[:2, 2] = -w / 2, -h / 2
        if self.perspective:  # drawn only when on: a run without it keeps its random sequence
            centre = np.array([[1, 0, 0], [0, 1, 0], np.random.uniform(-self.perspective, self.perspective, 2).tolist() + [1]]) @ centre
        angle = np.random.uniform(-self.degrees, self.degrees)
        gain = np.random.uniform(1 - self.scale, 1 + self.scale)
        rotate = np.eye(3)
        rotate[:2] = cv2.getRotationMatrix2D((0, 0), angle, gain)
        shear = np.eye(3)
        shear[0, 1] = math.tan(math.radians(np.random.uniform(-self.shear, self.shear)))
        shear[1, 0] = math.tan(math.radians(np.random.uniform(-self.shear, self.shear)))
        move = np.eye(3)
        move[0, 2] = np.random.uniform(0.5 - self.translate, 0.5 + self.translate) * s
        move[1, 2] = np.random.uniform(0.5 - self.translate, 0.5 + self.translate) * s
        return move @ shear @ rotate @ centre, gain

    def __call__(self, sample: dict) -> dict:
        if not self.enabled:
            return sample
        s = self.imgsz
        img = sample["img"]
        m, gain = self.matrix(*img.shape[:2])
        if self.perspective:
            img = cv2.warpPerspective(img, m, dsize=(s, s), flags=cv2.INTER_LINEAR, borderValue=(PAD_VALUE,) * 3)
        else:
            img = cv2.warpAffine(img, m[:2], dsize=(s, s), flags=cv2.INTER_LINEAR, borderValue=(PAD_VALUE,) * 3)
        boxes = sample["bboxes"]
        n = len(boxes)
        if n:
            corners = np.ones((n * 4, 3), dtype=np.float32)
            corners[:, :2] = boxes[:, [0, 1, 2, 3, 0, 3, 2, 1]].reshape(n * 4, 2)  # x1y1 x2y2 x1y2 x2y1
            mapped = corners @ m.T.astype(np.float32)
            xy = (mapped[:, :2] / mapped[:, 2:3] if self.perspective else mapped[:, :2]).reshape(n, 8)
            xs, ys = xy[:, 0::2], xy[:, 1::2]
            boxes = np.stack([xs.min(1), ys.min(1), xs.max(1), ys.max(1)], 1).clip(0, s).astype(np.float32)
        areas = sample["areas"] * gain * gain
        out = dict(sample, img=img, bboxes=boxes.reshape(-1, 4), areas=areas, ratio_pad=(1.0, (0.0, 0.0)))
        return keep_boxes(out, box_candidates(out["bboxes"], areas))


class MixUp:
    """Blend with another sample that went through ``pre_transforms`` (mosaic + affine).

    The blend weight is drawn from Beta(32, 32) (close to 0.5); labels of both are kept.
    """

    def __init__(self, dataset, pre_transforms, p: float = 0.0):
        self.dataset, self.pre_transforms, self.p = dataset, pre_transforms, p

    def close(self):
        self.p = 0.0

    def __call__(self, sample: dict) -> dict:
        if self.p <= 0 or np.random.rand() >= self.p:
            return sample
        other = self.dataset.get_image_and_label(int(self.dataset.draw_partners(1)[0]))
        for t in self.pre_transforms:
            other = t(other)
        if other["img"].shape != sample["img"].shape:
            return sample
        r = float(np.random.beta(32.0, 32.0))
        img = cv2.addWeighted(sample["img"], r, other["img"], 1.0 - r, 0.0)
        out = dict(sample, img=img)
        for key in ("cls", "bboxes", "areas"):
            out[key] = np.concatenate([sample[key], other[key]])
        return out


class RandomHSV:
    """Random hue/saturation/value gains applied with three 256-entry lookup tables.

    ``defer=True`` draws the gains the same way (the same numpy calls: the run's random sequence is unchanged) but only
    records them as ``sample["hsv_gains"]`` (float64 (3,), the multipliers): the training device applies them to the
    batch (data/loading/device_colour.py)."""

    def __init__(self, hgain=0.015, sgain=0.7, vgain=0.4, defer: bool = False):
        self.gains = np.array([hgain, sgain, vgain], dtype=np.float64)
        self.defer = bool(defer)

    def __call__(self, sample: dict) -> dict:
        if not self.gains.any():
            return sample
        r = np.random.uniform(-1, 1, 3) * self.gains + 1
        if self.defer:
            return dict(sample, hsv_gains=r)
        x = np.arange(256, dtype=np.float64)
        lut = np.empty((256, 1, 3), dtype=np.uint8)  # one table per channel, applied in one pass (no split / merge)
        lut[:, 0, 0] = np.mod(x * r[0], 180).astype(np.uint8)
        lut[:, 0, 1] = np.clip(x * r[1], 0, 255).astype(np.uint8)
        lut[:, 0, 2] = np.clip(x * r[2], 0, 255).astype(np.uint8)
        hsv = cv2.cvtColor(sample["img"], cv2.COLOR_BGR2HSV)
        cv2.LUT(hsv, lut, dst=hsv)
        return dict(sample, img=cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR, dst=hsv))


class RandomFlip:
    """Horizontal flip with probability ``p_lr``, vertical with ``p_ud``."""

    def __init__(self, p_lr=0.5, p_ud=0.0):
        self.p_lr, self.p_ud = p_lr, p_ud

    def __call__(self, sample: dict) -> dict:
        img, boxes = sample["img"], sample["bboxes"]
        h, w = img.shape[:2]
        lr = self.p_lr > 0 and np.random.rand() < self.p_lr
        ud = self.p_ud > 0 and np.random.rand() < self.p_ud
        if lr or ud:
            img = cv2.flip(img, -1 if lr and ud else 1 if lr else 0)
            boxes = boxes.copy()
            if lr:
                boxes[:, [0, 2]] = w - boxes[:, [2, 0]]
            if ud:
                boxes[:, [1, 3]] = h - boxes[:, [3, 1]]
        return dict(sample, img=img, bboxes=boxes)


class LetterBox:
    """Letterbox to ``new_shape`` (h, w), or to the sample's ``rect_shape`` when it has one.

    Keeps ``ratio_pad`` mapping back to the original image. A no-op when the image already has
    the target shape (e.g. after mosaic + affine).
    """

    def __init__(self, new_shape=(640, 640), scaleup=True, center=True):
        self.new_shape = (new_shape, new_shape) if isinstance(new_shape, int) else tuple(new_shape)
        self.scaleup, self.center = scaleup, center

    def __call__(self, sample: dict) -> dict:
        shape = tuple(sample.get("rect_shape") or self.new_shape)
        img = sample["img"]
        if img.shape[:2] == shape:
            return sample
        img, r, (pad_w, pad_h) = letterbox(img, shape, scaleup=self.scaleup, center=self.center)
        boxes = sample["bboxes"] * r + np.array([pad_w, pad_h, pad_w, pad_h], dtype=np.float32)
        r0, (pw0, ph0) = sample["ratio_pad"]
        ratio_pad = (r0 * r, (pw0 * r + pad_w, ph0 * r + pad_h))
        return dict(sample, img=img, bboxes=boxes.astype(np.float32), areas=sample["areas"] * r * r, ratio_pad=ratio_pad)


def build_transforms(dataset, imgsz: int, hyp, augment: bool, rect: bool = False, defer_colour: bool = False) -> list:
    """The transform list for a dataset: full augmentation for training, letterbox only otherwise.

    Rectangular training batches (``rect=True``) use no mosaic, mixup or affine: they would
    change the image shape the batch was planned for. ``defer_colour``: HSV gains drawn here, applied on the training
    device (RandomHSV's ``defer``).
    """
    if not augment:
        return [LetterBox(imgsz, scaleup=False)]
    geometric = not rect
    mosaic = Mosaic(dataset, imgsz, p=float(hyp.mosaic) if geometric else 0.0)
    affine = RandomAffine(imgsz, float(hyp.degrees), float(hyp.translate), float(hyp.scale), float(hyp.shear),
                          float(getattr(hyp, "perspective", 0.0)))
    if not geometric:
        affine.close()
    mixup = MixUp(dataset, [mosaic, affine], p=float(hyp.mixup) if geometric else 0.0)
    return [
        mosaic,
        affine,
        mixup,
        RandomHSV(float(hyp.hsv_h), float(hyp.hsv_s), float(hyp.hsv_v), defer=defer_colour),
        RandomFlip(float(hyp.fliplr), float(hyp.flipud)),
        LetterBox(imgsz),
    ]
