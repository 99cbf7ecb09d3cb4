"""Detection metrics: box IoU, COCO-exact AP (mAP50, mAP50-95), P/R at the best F1, confusion matrix.

The AP follows pycocotools' COCOeval (bbox, area 'all', maxDets=100) step for step, vectorised with NumPy,
so that `DetMetrics` gives the same mAP50 / mAP50-95 as COCOeval run on the same boxes (see docs/metrics.md):

- IoU with COCO's own formula on xywh boxes: inter / (area_d + area_g - inter), no +1, float64.
- per image and class: detections sorted by score (stable mergesort), the first `max_det` kept (COCO: 100 per
  image *and category*), greedy matching at each IoU threshold .50:.05:.95: a detection takes the unmatched GT
  with the highest IoU >= t; among equal IoUs the last GT in file order wins (COCOeval's `<` test).
- per class, over images in image-id order: concatenated, stable-sorted by score, cumulative TP/FP,
  precision = tp / (tp + fp + eps), the precision envelope, sampled at 101 recall points with
  np.searchsorted(recall, r, side='left') (0 past the last recall), AP = mean of the 101 samples.
- classes without GT are left out of the mean (COCO's -1); a class with GT and no detection has AP 0.
- no crowd / ignore regions: every GT has iscrowd=0 (YOLO labels have no crowd flag).

P and R are reported at the confidence that maximises the mean F1 over classes (Ultralytics' convention).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from yolo_cb.confusion_table import ConfusionTable
from yolo_cb.nn.boxes import box_iou  # noqa: F401  (metrics.box_iou: the IoU matrix AP matching uses)
from yolo_cb.utils.plotting import plot_confusion_matrix

# exactly COCOeval's Params.setDetParams arrays (same float values, so `iou >= t` agrees bit for bit)
IOU_THRESHOLDS = np.linspace(0.5, 0.95, int(np.round((0.95 - 0.5) / 0.05)) + 1, endpoint=True)
RECALL_THRESHOLDS = np.linspace(0.0, 1.00, int(np.round((1.00 - 0.0) / 0.01)) + 1, endpoint=True)
COCO_MAX_DETS = 100  # COCOeval's maxDets[-1]: detections kept per image and category
EPS = np.spacing(1)


def xyxy2xywh(boxes: Any) -> np.ndarray:
    """xyxy -> COCO xywh (top-left corner, width, height) as float64 NumPy."""
    b = np.asarray(boxes.detach().cpu() if isinstance(boxes, torch.Tensor) else boxes, dtype=np.float64).reshape(-1, 4)
    return np.stack((b[:, 0], b[:, 1], b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]), axis=1)


def cxcywh2xyxy(boxes: torch.Tensor) -> torch.Tensor:
    """(..., 4) centre-size boxes -> corners."""
    out = boxes.clone()
    out[..., 0] = boxes[..., 0] - boxes[..., 2] / 2
    out[..., 1] = boxes[..., 1] - boxes[..., 3] / 2
    out[..., 2] = boxes[..., 0] + boxes[..., 2] / 2
    out[..., 3] = boxes[..., 1] + boxes[..., 3] / 2
    return out


def coco_iou(dt: np.ndarray, gt: np.ndarray) -> np.ndarray:
    """(D, 4) x (G, 4) xywh -> (D, G) IoU exactly as pycocotools' bbIou (float64, no +1, non-crowd)."""
    dt = np.asarray(dt, dtype=np.float64).reshape(-1, 4)
    gt = np.asarray(gt, dtype=np.float64).reshape(-1, 4)
    da = dt[:, 2] * dt[:, 3]
    ga = gt[:, 2] * gt[:, 3]
    w = np.minimum((dt[:, 2] + dt[:, 0])[:, None], (gt[:, 2] + gt[:, 0])[None]) - np.maximum(dt[:, 0, None], gt[None, :, 0])
    h = np.minimum((dt[:, 3] + dt[:, 1])[:, None], (gt[:, 3] + gt[:, 1])[None]) - np.maximum(dt[:, 1, None], gt[None, :, 1])
    inter = w * h
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = inter / (da[:, None] + ga[None] - inter)
    return np.where((w > 0) & (h > 0), iou, 0.0)


def match_coco(ious: np.ndarray, iou_thrs: np.ndarray = IOU_THRESHOLDS) -> np.ndarray:
    """Greedy COCOeval matching. ious: (D, G), rows in score order. Returns (D, T) bool: matched at threshold t.

    Detection d takes, among GTs not yet matched at t with IoU >= t, the one with the highest IoU (the last
    one in GT order among equals, like COCOeval). Detections overlapping no GT at IoU >= min(t) are skipped.
    """
    D, G = ious.shape
    T = len(iou_thrs)
    matched = np.zeros((D, T), dtype=bool)
    if D == 0 or G == 0:
        return matched
    thr = np.minimum(iou_thrs, 1 - 1e-10)[:, None]  # (T, 1)
    gt_taken = np.zeros((T, G), dtype=bool)
    candidates = np.nonzero(ious.max(1) >= thr.min())[0]
    for d in candidates:
        valid = (~gt_taken) & (ious[d][None] >= thr)  # (T, G)
        any_valid = valid.any(1)
        if not any_valid.any():
            continue
        vals = np.where(valid, ious[d][None], -1.0)[:, ::-1]
        best = G - 1 - vals.argmax(1)  # last GT among equal maxima
        t_idx = np.nonzero(any_valid)[0]
        gt_taken[t_idx, best[t_idx]] = True
        matched[d, t_idx] = True
    return matched


def coco_ap(tp: np.ndarray, scores: np.ndarray, n_gt: int, rec_thrs: np.ndarray = RECALL_THRESHOLDS) -> tuple[np.ndarray, np.ndarray]:
    """COCOeval.accumulate for one class. tp: (N, T) bool in COCO concatenation order, scores (N,), n_gt > 0.

    Returns (ap (T,), precision (T, R)): the precision envelope sampled at the recall points, and its mean.
    """
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="mergesort")
    tp = np.asarray(tp, dtype=bool)
    tp = (tp[:, None] if tp.ndim == 1 else tp)[order].T  # (T, N)
    T, N = tp.shape
    q = np.zeros((T, len(rec_thrs)))
    if N == 0:
        return q.mean(1), q
    tp_sum = np.cumsum(tp, axis=1).astype(float)
    fp_sum = np.cumsum(~tp, axis=1).astype(float)
    rc = tp_sum / n_gt
    pr = tp_sum / (fp_sum + tp_sum + EPS)
    pr = np.flip(np.maximum.accumulate(np.flip(pr, 1), axis=1), 1)  # precision envelope
    for t in range(T):
        idx = np.searchsorted(rc[t], rec_thrs, side="left")
        ok = idx < N
        q[t, ok] = pr[t, idx[ok]]
    return q.mean(1), q


def smooth(y: np.ndarray, f: float = 0.05) -> np.ndarray:
    """Box filter of fraction f (Ultralytics' smooth)."""
    nf = round(len(y) * f * 2) // 2 + 1
    p = np.ones(nf // 2)
    yp = np.concatenate((p * y[0], y, p * y[-1]), 0)
    return np.convolve(yp, np.ones(nf) / nf, mode="valid")


def _sortable(keys: list) -> bool:
    kinds = {type(k) for k in keys}
    return len(keys) > 0 and None not in keys and (kinds <= {int, np.int64} or kinds == {str})


class DetMetrics:
    """Accumulates per-image detections and GT, then computes COCO-exact AP and P/R at the best mean F1.

        m = DetMetrics(nc=80, names=names)
        m.update(pred_xywh, pred_scores, pred_cls, gt_xywh, gt_cls, key=image_id)   # per image, original pixels
        m.compute(); m.map50, m.map, m.mp, m.mr, m.per_class

    Boxes are COCO xywh (top-left, width, height). Images are evaluated in sorted `key` order when every key
    is given and of one type (as COCOeval orders image ids; this only decides ties in score), else update order.
    """

    def __init__(self, nc: int, names: dict[int, str] | None = None, max_det: int = COCO_MAX_DETS,
                 iou_thrs: np.ndarray = IOU_THRESHOLDS):
        self.nc = int(nc)
        self.names = names or {i: str(i) for i in range(self.nc)}
        self.max_det = int(max_det)
        self.iou_thrs = np.asarray(iou_thrs, dtype=np.float64)
        self.records: list[dict] = []  # per image: key, scores, cls, tp (n, T), gt_cls
        self.px = np.linspace(0, 1, 1000)
        self._reset_results()

    def _reset_results(self) -> None:
        self.ap = np.full((self.nc, len(self.iou_thrs)), np.nan)  # nan = no GT (COCO's -1)
        self.pr_curves = np.zeros((self.nc, len(RECALL_THRESHOLDS)))  # precision envelope at IoU .5
        self.p = np.zeros(self.nc)
        self.r = np.zeros(self.nc)
        self.f1 = np.zeros(self.nc)
        self.p_curve = np.zeros((self.nc, len(self.px)))
        self.r_curve = np.zeros((self.nc, len(self.px)))
        self.f1_curve = np.zeros((self.nc, len(self.px)))
        self.nt = np.zeros(self.nc, dtype=int)  # GT instances per class
        self.n_images = np.zeros(self.nc, dtype=int)  # images containing each class
        self.best_conf = 0.0

    def update(self, pred_boxes: Any, pred_scores: Any, pred_cls: Any, gt_boxes: Any, gt_cls: Any, key: Hashable = None) -> np.ndarray:
        """Match one image's detections (xywh, scores, classes) against its GT (xywh, classes) per class.

        Returns the (n, T) match matrix in the order of the given detections (False for those past max_det).
        """
        pb = np.asarray(pred_boxes, dtype=np.float64).reshape(-1, 4)
        ps = np.asarray(pred_scores, dtype=np.float64).reshape(-1)
        pc = np.asarray(pred_cls).reshape(-1).astype(int)
        gb = np.asarray(gt_boxes, dtype=np.float64).reshape(-1, 4)
        gc = np.asarray(gt_cls).reshape(-1).astype(int)
        T = len(self.iou_thrs)
        tp_all = np.zeros((len(ps), T), dtype=bool)
        scores, classes, tps = [], [], []
        by_class = np.argsort(pc, kind="stable")  # detection indices grouped by class, in input order
        classes_present, starts = np.unique(pc[by_class], return_index=True)
        groups = dict(zip(classes_present.tolist(), np.split(by_class, starts[1:]), strict=True)) if len(pc) else {}
        gt_classes = set(gc.tolist())
        for c in sorted(set(groups) | gt_classes):
            di = groups.get(c, np.zeros(0, dtype=int))
            di = di[np.argsort(-ps[di], kind="mergesort")][: self.max_det]
            if c in gt_classes and len(di):
                tp = match_coco(coco_iou(pb[di], gb[gc == c]), self.iou_thrs)
                tp_all[di] = tp
            else:  # no GT of this class here: every detection is a false positive
                tp = np.zeros((len(di), T), dtype=bool)
            scores.append(ps[di])
            classes.append(np.full(len(di), c))
            tps.append(tp)
        self.records.append({
            "key": key,
            "scores": np.concatenate(scores) if scores else np.zeros(0),
            "cls": np.concatenate(classes).astype(int) if classes else np.zeros(0, dtype=int),
            "tp": np.concatenate(tps) if tps else np.zeros((0, T), dtype=bool),
            "gt_cls": gc,
        })
        return tp_all

    def compute(self) -> DetMetrics:
        """Fill ap, p, r, f1, curves, nt and n_images from the accumulated images."""
        self._reset_results()
        records = self.records
        keys = [r["key"] for r in records]
        if _sortable(keys):
            records = [records[i] for i in sorted(range(len(keys)), key=lambda i: keys[i])]
        T = len(self.iou_thrs)
        scores = np.concatenate([r["scores"] for r in records]) if records else np.zeros(0)
        cls = np.concatenate([r["cls"] for r in records]) if records else np.zeros(0, dtype=int)
        tp = np.concatenate([r["tp"] for r in records]) if records else np.zeros((0, T), dtype=bool)
        for r in records:
            counts = np.bincount(r["gt_cls"][(r["gt_cls"] >= 0) & (r["gt_cls"] < self.nc)], minlength=self.nc)
            self.nt += counts
            self.n_images += counts > 0
        for c in range(self.nc):
            if self.nt[c] == 0:
                continue
            i = cls == c
            ap, q = coco_ap(tp[i], scores[i], int(self.nt[c]))
            self.ap[c], self.pr_curves[c] = ap, q[0]
            if i.any():  # P / R against confidence at IoU .5 (Ultralytics ap_per_class)
                order = np.argsort(-scores[i], kind="mergesort")
                conf, hit = scores[i][order], tp[i][order, 0]
                tpc, fpc = np.cumsum(hit), np.cumsum(~hit)
                recall = tpc / (self.nt[c] + 1e-16)
                precision = tpc / (tpc + fpc)
                self.r_curve[c] = np.interp(-self.px, -conf, recall, left=0)
                self.p_curve[c] = np.interp(-self.px, -conf, precision, left=1)
        self.f1_curve = 2 * self.p_curve * self.r_curve / (self.p_curve + self.r_curve + 1e-16)
        has_gt = self.nt > 0
        if has_gt.any():
            best = int(smooth(self.f1_curve[has_gt].mean(0), 0.1).argmax())
            self.best_conf = float(self.px[best])
            self.p, self.r, self.f1 = self.p_curve[:, best].copy(), self.r_curve[:, best].copy(), self.f1_curve[:, best].copy()
            self.p[~has_gt] = self.r[~has_gt] = self.f1[~has_gt] = 0.0
        return self

    # --- summaries ------------------------------------------------------------------------
    @property
    def classes_with_gt(self) -> np.ndarray:
        return np.nonzero(self.nt > 0)[0]

    def _mean(self, values: np.ndarray) -> float:
        valid = self.classes_with_gt
        return float(np.mean(values[valid])) if len(valid) else 0.0

    @property
    def map50(self) -> float:
        """COCO AP at IoU .50 (mean over classes with GT; 0 when there is no GT at all, where COCO says -1)."""
        return self._mean(self.ap[:, 0])

    @property
    def map75(self) -> float:
        return self._mean(self.ap[:, 5])

    @property
    def map(self) -> float:
        """COCO AP averaged over IoU .50:.05:.95 (mAP50-95)."""
        return self._mean(self.ap.mean(1))

    @property
    def mp(self) -> float:
        return self._mean(self.p)

    @property
    def mr(self) -> float:
        return self._mean(self.r)

    @property
    def fitness(self) -> float:
        """The score best.pt is chosen by: mAP50-95."""
        return self.map

    @property
    def results_dict(self) -> dict[str, float]:
        return {"metrics/precision(B)": self.mp, "metrics/recall(B)": self.mr, "metrics/mAP50(B)": self.map50,
                "metrics/mAP50-95(B)": self.map, "fitness": self.fitness}

    @property
    def per_class(self) -> list[dict]:
        """One dict per class with GT: class, name, images, instances, precision, recall, mAP50, mAP50-95."""
        return [{"class": int(c), "name": self.names.get(int(c), str(c)), "images": int(self.n_images[c]),
                 "instances": int(self.nt[c]), "precision": float(self.p[c]), "recall": float(self.r[c]),
                 "mAP50": float(self.ap[c, 0]), "mAP50-95": float(self.ap[c].mean())} for c in self.classes_with_gt]


class ConfusionMatrix(ConfusionTable):
    """(nc + 1) x (nc + 1) counts, rows = predicted class, columns = true class; index nc = background.

    summary() / to_csv() / to_json() / to_df(): yolo_cb/confusion_table.py. Ultralytics' rules: detections with score > conf (0.25) are matched class-agnostically to GT with IoU > iou_thres
    (0.45), each GT and each detection at most once (highest IoU first). A matched pair adds to [pred, true];
    an unmatched GT to [background, true]; an unmatched detection to [pred, background].
    """

    def __init__(self, nc: int, conf: float = 0.25, iou_thres: float = 0.45, names: dict[int, str] | None = None):
        self.nc = int(nc)
        self.conf = conf
        self.iou_thres = iou_thres
        self.names = dict(names) if names else {i: str(i) for i in range(self.nc)}  # class id -> name, for plot()
        self.matrix = np.zeros((self.nc + 1, self.nc + 1), dtype=np.int64)

    def plot(self, normalize: bool = True, save_dir: str | Path = "", names: dict[int, str] | None = None) -> Path:
        """Ultralytics' confusion_matrix.plot(normalize=, save_dir=): confusion_matrix[_normalized].png in save_dir."""
        file = Path(save_dir) / ("confusion_matrix_normalized.png" if normalize else "confusion_matrix.png")
        return plot_confusion_matrix(self.matrix, names or self.names, file, normalize=normalize)

    def process_batch(self, detections: torch.Tensor | None, gt_boxes: torch.Tensor, gt_cls: torch.Tensor) -> None:
        """detections (n, 6) [x1, y1, x2, y2, score, cls]; gt_boxes (m, 4) xyxy; gt_cls (m,) — one image."""
        gt_cls = torch.as_tensor(gt_cls).reshape(-1).long().cpu()
        if detections is not None:
            detections = torch.as_tensor(detections).reshape(-1, 6).float().cpu()
            detections = detections[detections[:, 4] > self.conf]
        dc = detections[:, 5].long() if detections is not None else torch.zeros(0, dtype=torch.long)
        if gt_cls.numel() == 0:
            np.add.at(self.matrix, (dc.numpy(), self.nc), 1)
            return
        if detections is None or len(detections) == 0:
            np.add.at(self.matrix, (self.nc, gt_cls.numpy()), 1)
            return
        iou = box_iou(torch.as_tensor(gt_boxes).reshape(-1, 4).float().cpu(), detections[:, :4])
        gi, di = torch.where(iou > self.iou_thres)
        if len(gi):
            m = torch.stack((gi.double(), di.double(), iou[gi, di].double()), 1).numpy()
            if len(m) > 1:
                m = m[m[:, 2].argsort()[::-1]]
                m = m[np.unique(m[:, 1], return_index=True)[1]]
                m = m[m[:, 2].argsort()[::-1]]
                m = m[np.unique(m[:, 0], return_index=True)[1]]
        else:
            m = np.zeros((0, 3))
        m0, m1 = m[:, 0].astype(int), m[:, 1].astype(int)
        dcn, gcn = dc.numpy(), gt_cls.numpy()
        for i, g in enumerate(gcn):
            j = m0 == i
            if j.sum() == 1:
                self.matrix[dcn[m1[j][0]], g] += 1
            else:
                self.matrix[self.nc, g] += 1
        for i, d in enumerate(dcn):
            if not (m1 == i).any():
                self.matrix[d, self.nc] += 1

    def normalized(self) -> np.ndarray:
        """Column-normalised (each true class sums to 1)."""
        return self.matrix / (self.matrix.sum(0, keepdims=True) + 1e-9)

    def tp_fp(self) -> tuple[np.ndarray, np.ndarray]:
        tp = np.diag(self.matrix)[:-1]
        fp = self.matrix.sum(1)[:-1] - tp
        return tp, fp


def coco_summary_keys() -> Sequence[str]:
    """Names of COCOeval.stats, in order."""
    return ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")
