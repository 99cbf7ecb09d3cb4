"""What `val()` and `train()` return and `validator.metrics` holds: a mapping of today's metric keys that also has
Ultralytics' DetMetrics attributes, so that code written for either runs.

    metrics = model.val(data="coco8.yaml")
    metrics["metrics/mAP50-95(B)"] == metrics.box.map        # the same number: COCO-exact mAP (yolo_cb.metrics)
    metrics.box.map50, metrics.box.maps, metrics.results_dict, metrics.fitness, metrics.speed, metrics.summary()

Every value is read from the `yolo_cb.metrics.DetMetrics` that computed the mapping; nothing is recomputed here.
Without it (a DDP run or a finished-run resume, where only the numbers travel), the means and `results_dict` still
come from the mapping, and the per-class attributes are empty.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from yolo_cb.metrics import RECALL_THRESHOLDS, DetMetrics

KEYS = ("metrics/precision(B)", "metrics/recall(B)", "metrics/mAP50(B)", "metrics/mAP50-95(B)")
CURVES = ("Precision-Recall(B)", "F1-Confidence(B)", "Precision-Confidence(B)", "Recall-Confidence(B)")
SPEED_KEYS = ("preprocess", "inference", "loss", "postprocess")


class BoxMetric:
    """`metrics.box`: Ultralytics' Metric attributes over the classes that have labels (`ap_class_index`)."""

    def __init__(self, det: DetMetrics | None, values: dict[str, float]):
        self._det, self._values = det, values

    @property
    def ap_class_index(self) -> np.ndarray:
        """Ids of the classes with labels in the validation set; the per-class arrays follow this order."""
        return self._det.classes_with_gt if self._det is not None else np.zeros(0, dtype=int)

    @property
    def nc(self) -> int:
        return self._det.nc if self._det is not None else 0

    def _per_class(self, array: np.ndarray | None) -> np.ndarray:
        return array[self.ap_class_index] if self._det is not None else np.zeros(0)

    @property
    def p(self) -> np.ndarray:
        return self._per_class(self._det.p if self._det is not None else None)

    @property
    def r(self) -> np.ndarray:
        return self._per_class(self._det.r if self._det is not None else None)

    @property
    def f1(self) -> np.ndarray:
        return self._per_class(self._det.f1 if self._det is not None else None)

    @property
    def all_ap(self) -> np.ndarray:
        """(classes with labels, 10): COCO AP at IoU .50, .55, ..., .95."""
        return self._det.ap[self.ap_class_index] if self._det is not None else np.zeros((0, 10))

    @property
    def ap50(self) -> np.ndarray:
        return self.all_ap[:, 0]

    @property
    def ap(self) -> np.ndarray:
        """Per class mAP50-95."""
        return self.all_ap.mean(1)

    @property
    def mp(self) -> float:
        return float(self._values.get(KEYS[0], 0.0))

    @property
    def mr(self) -> float:
        return float(self._values.get(KEYS[1], 0.0))

    @property
    def map50(self) -> float:
        return float(self._values.get(KEYS[2], 0.0))

    @property
    def map(self) -> float:
        return float(self._values.get(KEYS[3], 0.0))

    @property
    def map75(self) -> float:
        return self._det.map75 if self._det is not None else float("nan")

    @property
    def maps(self) -> np.ndarray:
        """mAP50-95 of every class id 0..nc-1; a class without labels gets the overall mAP (as Ultralytics)."""
        maps = np.full(self.nc, self.map)
        maps[self.ap_class_index] = self.ap
        return maps

    def mean_results(self) -> list[float]:
        return [self.mp, self.mr, self.map50, self.map]

    def class_result(self, i: int) -> tuple[float, float, float, float]:
        """(P, R, AP50, AP50-95) of the i-th class in `ap_class_index` order."""
        return float(self.p[i]), float(self.r[i]), float(self.ap50[i]), float(self.ap[i])

    def fitness(self) -> float:
        return self.map

    @property
    def curves_results(self) -> list[list]:
        """[x, y (classes x points), x label, y label] for PR (101 COCO recall points), F1, P and R against confidence."""
        if self._det is None:
            return []
        d, idx = self._det, self.ap_class_index
        return [[RECALL_THRESHOLDS, d.pr_curves[idx], "Recall", "Precision"], [d.px, d.f1_curve[idx], "Confidence", "F1"],
                [d.px, d.p_curve[idx], "Confidence", "Precision"], [d.px, d.r_curve[idx], "Confidence", "Recall"]]


SUMMARY_FIELDS = ("Class", "Images", "Instances", "Box-P", "Box-R", "Box-F1", "mAP50", "mAP75", "mAP50-95")  # summary()'s columns


class DetectionMetrics(dict):
    """The metrics mapping (metric key -> float, as before) with Ultralytics' DetMetrics attributes; see the module doc."""

    def __init__(self, values: dict[str, float], det: DetMetrics | None = None, speed: dict[str, float] | None = None,
                 names: dict[int, str] | None = None, confusion_matrix: Any = None, stats: Any = None):
        super().__init__(values)
        self.stats = stats  # the validation's per-image stats (an ImageStats; Ultralytics 8.4's metrics.stats); None without
        self.det_metrics = det
        self.confusion_matrix = confusion_matrix  # the validation's yolo_cb.metrics.ConfusionMatrix (.matrix); None without one
        self.box = BoxMetric(det, self)
        self.speed = {k: float((speed or {}).get(k, 0.0)) for k in SPEED_KEYS}
        self.names = dict(names if names is not None else (det.names if det is not None else {}))
        self.save_dir = None  # the validation's folder (plots, predictions.json), set by the validator that made these

    @classmethod
    def of_run(cls, values: dict, validator: Any) -> DetectionMetrics:
        """What a training returns: its final `values`, with the per-class detail of the validation that produced them
        (`validator`'s last metrics; none when they are not these values' own, e.g. val=False) and its folder."""
        last = getattr(validator, "metrics", None)
        if isinstance(last, DetectionMetrics) and all(last.get(k) == values.get(k) for k in ("metrics/mAP50-95(B)", "metrics/mAP50(B)")):
            metrics = cls(values, det=last.det_metrics, speed=last.speed, names=last.names, confusion_matrix=last.confusion_matrix)
        else:
            metrics = cls(values, names=getattr(validator, "names", None) or None)
        metrics.save_dir = getattr(validator, "save_dir", None)  # the run folder, as Ultralytics' train() metrics
        return metrics

    @property
    def fitness(self) -> float:
        """The score best.pt is chosen by (mAP50-95), the mapping's 'fitness'."""
        return float(self.get("fitness", self.box.map))

    @property
    def results_dict(self) -> dict[str, float]:
        """Ultralytics' four metric keys and fitness (no losses), as plain floats."""
        return {**{k: float(self.get(k, 0.0)) for k in KEYS}, "fitness": self.fitness}

    @property
    def maps(self) -> np.ndarray:
        return self.box.maps

    @property
    def ap_class_index(self) -> np.ndarray:
        return self.box.ap_class_index

    @property
    def curves(self) -> list[str]:
        return list(CURVES) if self.det_metrics is not None else []

    @property
    def curves_results(self) -> list[list]:
        return self.box.curves_results

    def mean_results(self) -> list[float]:
        return self.box.mean_results()

    def class_result(self, i: int) -> tuple[float, float, float, float]:
        return self.box.class_result(i)

    def to_json(self, normalize: bool = False, decimals: int = 5) -> str:
        """summary() as a JSON string (Ultralytics' metrics.to_json(); normalize= changes nothing for boxes)."""
        import json

        return json.dumps(self.summary(decimals=decimals), indent=2)

    def to_csv(self, normalize: bool = False, decimals: int = 5) -> str:
        """summary() as CSV text with a header row (Ultralytics' metrics.to_csv())."""
        import csv
        import io

        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=SUMMARY_FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.summary(decimals=decimals))
        return out.getvalue()

    def to_df(self, normalize: bool = False, decimals: int = 5):
        """summary() as a pandas DataFrame (Ultralytics 8.4 returns a polars one of the same columns); needs pandas."""
        try:
            import pandas
        except ImportError as error:
            raise ImportError("metrics.to_df() needs pandas: pip install pandas (to_csv() and summary() need nothing)") from error
        return pandas.DataFrame(self.summary(decimals=decimals), columns=SUMMARY_FIELDS)

    def summary(self, decimals: int = 5) -> list[dict[str, Any]]:
        """One row per class with labels: Class, Images, Instances, Box-P, Box-R, Box-F1, mAP50, mAP75, mAP50-95 (fractions,
        rounded to `decimals`). Ultralytics' `normalize=` is not taken: it changes nothing for boxes."""
        det = self.det_metrics
        if det is None:
            return []
        rows = []
        for i, c in enumerate(self.ap_class_index):
            rows.append({"Class": self.names.get(int(c), str(c)), "Images": int(det.n_images[c]), "Instances": int(det.nt[c]),
                         "Box-P": round(float(self.box.p[i]), decimals), "Box-R": round(float(self.box.r[i]), decimals),
                         "Box-F1": round(float(self.box.f1[i]), decimals), "mAP50": round(float(self.box.ap50[i]), decimals),
                         "mAP75": round(float(self.box.all_ap[i, 5]), decimals), "mAP50-95": round(float(self.box.ap[i]), decimals)})
        return rows

    def __reduce__(self):
        # pickled (DDP broadcast, multiprocessing) as the numbers and the DetMetrics they came from
        return (DetectionMetrics, (dict(self), self.det_metrics, self.speed, self.names))

    def __repr__(self) -> str:
        return f"DetectionMetrics({dict.__repr__(self)})"


ULTRALYTICS_STATS = {"tp": "tp", "conf": "pred_scores", "pred_cls": "pred_cls", "target_cls": "gt_cls"}  # its key -> a record's


class ImageStats(list):
    """`validator.stats` (also `validator.metrics.stats` during a validation): one record per image validated so far (im_file,
    ori_shape, pred_boxes, pred_scores, pred_cls, gt_boxes, gt_cls, and tp: each detection matched at IoU 0.50 ... 0.95),
    that also reads as Ultralytics' dict of per-image lists: stats["tp"], ["conf"], ["pred_cls"], ["target_cls"],
    ["target_img"] (the classes present), keys(), items()."""

    def __init__(self, nc: int):
        super().__init__()
        self.nc = nc

    def append(self, record: dict) -> None:
        """Add one image's record, with its `tp` matrix (the COCO matching the metrics use, in the record's order)."""
        record["tp"] = DetMetrics(self.nc).update(record["pred_boxes"], record["pred_scores"], record["pred_cls"], record["gt_boxes"],
                                                  record["gt_cls"])
        super().append(record)

    def image_maps(self) -> list[float | None]:
        """Each image's COCO mAP50-95 on its own, in order; None for an image without labels (worst_batches ranks by it)."""
        return [_image_map(r, self.nc) if len(r["gt_cls"]) else None for r in self]

    def __getitem__(self, key):
        if not isinstance(key, str):
            return super().__getitem__(key)
        if key == "target_img":
            return [np.unique(r["gt_cls"]) for r in self]
        if key not in ULTRALYTICS_STATS:
            raise KeyError(f"{key!r}: validator.stats reads by Ultralytics' keys {', '.join(self.keys())}, or by image index")
        return [r[ULTRALYTICS_STATS[key]] for r in self]

    def keys(self) -> list[str]:
        return [*ULTRALYTICS_STATS, "target_img"]

    def items(self) -> list[tuple[str, list]]:
        return [(k, self[k]) for k in self.keys()]


def _image_map(record: dict, nc: int) -> float:
    metrics = DetMetrics(nc)
    metrics.update(record["pred_boxes"], record["pred_scores"], record["pred_cls"], record["gt_boxes"], record["gt_cls"], key=0)
    return float(metrics.compute().map)


def metrics_so_far(stats: ImageStats, names: dict[int, str]) -> DetectionMetrics:
    """The metrics of the images in `stats` (Ultralytics' validator.get_stats() from a batch callback)."""
    det = DetMetrics(len(names), names)
    for i, r in enumerate(stats):
        det.update(r["pred_boxes"], r["pred_scores"], r["pred_cls"], r["gt_boxes"], r["gt_cls"], key=i)
    det.compute()
    return DetectionMetrics(det.results_dict, det=det, names=names)
