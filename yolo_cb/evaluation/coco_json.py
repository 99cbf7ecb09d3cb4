"""COCO-format outputs of a validation (save_json=True): predictions.json, ground_truth.json, and pycocotools' COCOeval."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from yolo_cb.utils.files import atomic_write_text
from yolo_cb.utils.log import LOGGER


def _category(category_ids: list | None, c: int) -> int:
    return int(category_ids[c]) if category_ids else int(c)


def write(stats: list[dict], names: dict[int, str], category_ids: list | None, save_dir: Path) -> tuple[list[dict], Path, Path]:
    """(detections, predictions.json, ground_truth.json): the COCO results and the COCO dataset built from the YOLO labels."""
    images, annotations, detections = [], [], []
    for s in stats:
        h, w = s["ori_shape"]
        images.append({"id": s["image_id"], "file_name": Path(s["im_file"]).name, "height": h, "width": w})
        for box, c in zip(s["gt_boxes"].tolist(), s["gt_cls"].tolist(), strict=True):
            annotations.append({"id": len(annotations) + 1, "image_id": s["image_id"], "category_id": _category(category_ids, c),
                                "bbox": box, "area": box[2] * box[3], "iscrowd": 0})
        for box, score, c in zip(s["pred_boxes"].tolist(), s["pred_scores"].tolist(), s["pred_cls"].tolist(), strict=True):
            detections.append({"image_id": s["image_id"], "category_id": _category(category_ids, c), "bbox": box, "score": score})
    categories = [{"id": _category(category_ids, c), "name": names[c]} for c in sorted(names)]
    gt = {"info": {"description": "yolo-cb ground truth from YOLO labels"}, "images": images, "annotations": annotations,
          "categories": categories}
    pred_file, gt_file = save_dir / "predictions.json", save_dir / "ground_truth.json"
    atomic_write_text(pred_file, json.dumps(detections))
    atomic_write_text(gt_file, json.dumps(gt))
    LOGGER.info(f"saved {pred_file} ({len(detections)} detections) and {gt_file}")
    return detections, pred_file, gt_file


def evaluate(save_dir: Path, detections: list[dict]) -> list[float] | None:
    """COCOeval's 12 summary numbers for the json files in save_dir (logged), or None without pycocotools or detections."""
    try:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
    except ImportError:
        LOGGER.info("pycocotools not installed: COCOeval on predictions.json skipped")
        return None
    if not detections:
        LOGGER.warning("WARNING no detections: COCOeval on predictions.json skipped")
        return None
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            gt = COCO(str(save_dir / "ground_truth.json"))
            evaluator = COCOeval(gt, gt.loadRes(str(save_dir / "predictions.json")), "bbox")
            evaluator.evaluate()
            evaluator.accumulate()
            evaluator.summarize()
    except Exception as error:
        LOGGER.warning(f"WARNING COCOeval failed: {type(error).__name__}: {error}")
        return None
    summary = [line for line in buffer.getvalue().splitlines() if "Average" in line]
    LOGGER.info("pycocotools COCOeval:\n" + "\n".join(summary))
    return [float(v) for v in evaluator.stats]
