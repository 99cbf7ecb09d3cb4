"""Turn decoded predictions into final detections, and map boxes back from the letterboxed input."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from .boxes import cxcywh_to_xyxy

MAX_NMS_INPUT = 30000  # highest-scoring boxes per image kept before NMS (bounds NMS time on an untrained model)


def postprocess(
    preds,
    conf: float = 0.25,
    iou: float = 0.45,
    max_det: int = 300,
    agnostic: bool = False,
    classes: Sequence[int] | None = None,
    end2end: dict | None = None,
    multi_label: bool = False,
    single_cls: bool = False,
) -> list[torch.Tensor]:
    """Per image, a (n, 6) tensor of [x1, y1, x2, y2, score, cls] sorted by score.

    preds: (B, A, 4 + 1 + nc) decoded model output (cx, cy, w, h, objectness, class probabilities), a tensor or
    anything torch.as_tensor accepts (e.g. an ONNX Runtime numpy array); a single (A, 5 + nc) image is accepted too.
    score = objectness * best class probability; boxes below `conf` are dropped, then NMS at `iou`, per class
    unless `agnostic`; `classes` keeps only those class ids.
    multi_label: a box is a candidate once for every class it scores above `conf` (objectness * that class's
    probability), not only for its best class; validation uses it, as Ultralytics' and YOLOv5's do (a box whose class
    is uncertain is counted under each class it might be, at that class's score).
    end2end: the {"iou", "max_det"} of a model exported with NMS in its graph (preds (B, max_det, 6)): see end2end_detections.
    single_cls: every class is one (Ultralytics' val single_cls=True): one candidate per anchor, class-agnostic NMS, class 0.
    """
    from torchvision.ops import batched_nms  # its C++ kernel; imported here, not with the module (nn/boxes.py says why)

    preds = torch.as_tensor(preds)
    if preds.dim() == 2:
        preds = preds[None]
    if end2end is not None:
        return end2end_detections(preds, end2end, conf, iou, max_det, agnostic, classes)
    results = []
    for p in preds:
        boxes, score, class_id = _candidates(p.float(), conf, multi_label and not single_cls)
        if classes is not None:
            keep = torch.isin(class_id, torch.as_tensor(list(classes), device=p.device))
            boxes, score, class_id = boxes[keep], score[keep], class_id[keep]
        if score.numel() > MAX_NMS_INPUT:
            top = score.topk(MAX_NMS_INPUT).indices
            boxes, score, class_id = boxes[top], score[top], class_id[top]
        groups = torch.zeros_like(class_id) if agnostic or single_cls else class_id
        kept = batched_nms(boxes, score, groups, iou)[:max_det]  # sorted by decreasing score
        results.append(torch.cat((boxes[kept], score[kept, None], (groups if single_cls else class_id)[kept, None].float()), dim=1))
    return results


def _candidates(p: torch.Tensor, conf: float, multi_label: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(A, 5 + nc) decoded rows -> the (box xyxy, score, class id) candidates scored above `conf`: one per anchor (its
    best class), or with `multi_label` one per anchor and class."""
    if multi_label:
        scores = p[:, 4:5] * p[:, 5:]
        anchor, class_id = (scores > conf).nonzero(as_tuple=True)
        return cxcywh_to_xyxy(p[anchor, :4]), scores[anchor, class_id], class_id
    class_prob, class_id = p[:, 5:].max(dim=1)
    score = p[:, 4] * class_prob
    keep = score > conf
    return cxcywh_to_xyxy(p[keep, :4]), score[keep], class_id[keep]


def scale_boxes(boxes_xyxy: torch.Tensor, ratio_pad, orig_shape: Sequence[int]) -> torch.Tensor:
    """Boxes (..., >=4, xyxy in letterboxed-input pixels) mapped to the original image and clipped to it.

    ratio_pad = (ratio, (pad_w, pad_h)): the letterbox resized the original by `ratio` (a number, or (ratio_w, ratio_h))
    then padded pad_w pixels on the left and pad_h on the top. orig_shape = (h, w). Columns after the 4th are kept.
    Returns a new tensor.
    """
    ratio, (pad_w, pad_h) = ratio_pad
    r = torch.as_tensor(ratio, dtype=torch.float64).flatten()
    ratio_w, ratio_h = float(r[0]), float(r[-1])
    h, w = int(orig_shape[0]), int(orig_shape[1])
    out = torch.as_tensor(boxes_xyxy).clone()
    out[..., [0, 2]] = ((out[..., [0, 2]] - pad_w) / ratio_w).clamp(0, w)
    out[..., [1, 3]] = ((out[..., [1, 3]] - pad_h) / ratio_h).clamp(0, h)
    return out


def end2end_detections(preds: torch.Tensor, exported: dict, conf: float, iou: float, max_det: int, agnostic: bool,
                       classes: Sequence[int] | None) -> list[torch.Tensor]:
    """Rows of an in-graph-NMS output (B, max_det, 6: x1, y1, x2, y2, score, cls, best first) scored above `conf`.

    What the graph fixed at export cannot change here: a different `iou`, agnostic NMS or a larger `max_det` raise.
    """
    if agnostic or abs(float(iou) - float(exported["iou"])) > 1e-6 or int(max_det) > int(exported["max_det"]):
        raise ValueError(f"this model has NMS inside its graph (per-class, iou={exported['iou']}, max_det={exported['max_det']}): "
                         f"iou={iou}, max_det={max_det}, agnostic_nms={agnostic} cannot be applied; re-export with those settings "
                         f"or with nms=False")
    results = []
    for p in preds.float():
        keep = p[:, 4] > conf
        if classes is not None:
            keep &= torch.isin(p[:, 5].long(), torch.as_tensor(list(classes), device=p.device))
        results.append(p[keep][:max_det])
    return results


# Test-time augmentation (predict / val augment=True), as Ultralytics runs it: the image at three scales, the second one
# flipped left-right; each pass's boxes mapped back to the input and the passes joined before NMS.
TTA_SCALES = (1.0, 0.83, 0.67)
TTA_FLIPS = (False, True, False)  # left-right flip of each pass
TTA_PAD = 0.447  # the grey the smaller passes are padded with to a multiple of the largest stride (Ultralytics' value)


def scale_image(x: torch.Tensor, ratio: float, stride: int) -> torch.Tensor:
    """(B, C, H, W) resized by `ratio` (bilinear), padded on the right and bottom up to multiples of `stride`."""
    if ratio == 1.0:
        return x
    h, w = x.shape[-2:]
    size = (int(h * ratio), int(w * ratio))
    resized = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
    ph, pw = (math.ceil(v * ratio / stride) * stride for v in (h, w))
    return F.pad(resized, [0, pw - size[1], 0, ph - size[0]], value=TTA_PAD)


def augmented_predictions(forward, x: torch.Tensor, strides: Sequence[int]) -> torch.Tensor:
    """Decoded predictions (B, A', 4 + 1 + nc) of `forward` over the TTA passes of `x`, in x's pixels, joined along the
    anchors. forward(image) -> (B, A, 4 + 1 + nc) with the anchors of the levels of `strides` in that order (row-major
    grids). The full-size pass drops its coarsest level (large objects are seen by the smaller passes) and the smallest
    pass its finest level (small objects are seen at full size), as Ultralytics' test-time augmentation does."""
    w = x.shape[-1]
    strides = [int(s) for s in strides]
    passes = []
    for ratio, flip in zip(TTA_SCALES, TTA_FLIPS, strict=True):
        xi = scale_image(x.flip(-1) if flip else x, ratio, max(strides))
        p = torch.as_tensor(forward(xi)).float().clone()
        counts = [(xi.shape[-2] // s) * (xi.shape[-1] // s) for s in strides]
        if p.shape[1] != sum(counts):
            raise ValueError(f"augment=True: the model gave {p.shape[1]} predictions for a {tuple(xi.shape[-2:])} input, not one "
                             f"per cell of its levels (strides {strides}: {sum(counts)})")
        if ratio == TTA_SCALES[0]:
            p = p[:, : sum(counts[:-1])]
        elif ratio == TTA_SCALES[-1]:
            p = p[:, counts[0]:]
        p[..., :4] /= ratio
        if flip:
            p[..., 0] = w - p[..., 0]
        passes.append(p)
    return torch.cat(passes, 1)
