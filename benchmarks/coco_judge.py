"""One yardstick for both sides of benchmarks/vs_ultralytics.py: pycocotools' COCOeval on each epoch's validation.

Each library reports its own mAP50-95: ours follows COCOeval step for step (yolo_cb/metrics.py), Ultralytics' is its own
(`ap_per_class`: its precision envelope starts from precision 1 at recall 0 and is integrated with np.trapz over 101
points, over up to max_det=300 detections per image). With `--judge` the benchmark keeps, per epoch, the detections each
side's own validation made during training (the same images, each side's own NMS and settings) and scores both with
pycocotools against ground truth built from the YOLO labels, so the curves differ only by the models.

Two halves, each run in a different process:
- `PredictionCapture` (inside each side's worker, in that side's venv; imports only its own library) writes
  DIR/epoch<N>.json, one detection a row: [image file name, class index, [x, y, w, h] in original pixels, score];
- `judge` (the driver runs `python benchmarks/coco_judge.py --data DATA_YAML DIR...` with our venv, which has
  pycocotools) prints {DIR: {epoch: [mAP50-95, mAP50]}} as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


# --- capture: in a worker ----------------------------------------------------------------------------------------------
class PredictionCapture:
    """Keeps the detections of each validation of a training run and writes them per epoch (`dump`)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.rows: list = []

    def dump(self, epoch: int) -> None:
        """Write the last validation's detections as epoch<N>.json (rounded as Ultralytics rounds its COCO JSON)."""
        rows = [[name, int(c), [round(float(x), 3) for x in box], round(float(s), 5)] for name, c, box, s in self.rows]
        (self.folder / f"epoch{epoch}.json").write_text(json.dumps(rows))

    def install(self, lib: str, model, settings: dict) -> None:
        """Hook this side's validator: ours through an on_val_end callback (validator.stats: COCO xywh, original pixels);
        Ultralytics' through its COCO JSON (save_json=True fills validator.jdict, 1-based classes), whose evaluation with
        faster-coco-eval (a download here) is replaced by keeping the rows."""
        if lib == "ultralytics":
            from ultralytics.models.yolo.detect.val import DetectionValidator

            def keep_rows(validator, stats):
                self.rows = [(d["file_name"], d["category_id"] - 1, d["bbox"], d["score"]) for d in validator.jdict]
                return stats

            DetectionValidator.eval_json = keep_rows
            settings["save_json"] = True
            return

        def on_val_end(validator):
            self.rows = [(Path(r["im_file"]).name, c, box, s) for r in validator.stats
                         for box, s, c in zip(r["pred_boxes"].tolist(), r["pred_scores"].tolist(), r["pred_cls"].tolist(), strict=True)]

        model.add_callback("on_val_end", on_val_end)


# --- judge: in the driver, with pycocotools ----------------------------------------------------------------------------
def val_images(data_yaml: Path) -> list[Path]:
    """The validation images of a data YAML written by vs_ultralytics.dataset_view (`path:` and `val:` lines)."""
    fields = dict(line.split(":", 1) for line in data_yaml.read_text().splitlines() if line and not line.startswith(" "))
    target = Path(fields["path"].strip()) / fields["val"].strip().strip("'\"")
    if target.suffix == ".txt":
        return [Path(line) for line in target.read_text().split()]
    return sorted(p for p in target.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)


def ground_truth(images: list[Path]) -> tuple[dict, dict[str, int]]:
    """(a COCO dataset from the YOLO labels beside `images`, file name -> image id)."""
    from PIL import Image

    gt = {"images": [], "annotations": [], "categories": []}
    ids: dict[str, int] = {}
    classes: set[int] = set()
    for image_id, path in enumerate(images, 1):
        with Image.open(path) as im:
            w, h = im.size
        ids[path.name] = image_id
        gt["images"].append({"id": image_id, "file_name": path.name, "width": w, "height": h})
        label = path.parent.parent.parent / "labels" / path.parent.name / f"{path.stem}.txt"  # images/<split>/x -> labels/<split>/x
        for line in (label.read_text().splitlines() if label.is_file() else []):
            c, cx, cy, bw, bh = line.split()[:5]
            box = [(float(cx) - float(bw) / 2) * w, (float(cy) - float(bh) / 2) * h, float(bw) * w, float(bh) * h]
            gt["annotations"].append({"id": len(gt["annotations"]) + 1, "image_id": image_id, "category_id": int(c),
                                      "bbox": box, "area": box[2] * box[3], "iscrowd": 0})
            classes.add(int(c))
    gt["categories"] = [{"id": c, "name": str(c)} for c in sorted(classes)]
    return gt, ids


def coco_map(gt: dict, ids: dict[str, int], rows: list) -> list[float]:
    """[mAP50-95, mAP50] of `rows` by pycocotools' COCOeval (bbox, all areas, maxDets 100)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    detections = [{"image_id": ids[name], "category_id": c, "bbox": box, "score": s} for name, c, box, s in rows if name in ids]
    if not detections:
        return [0.0, 0.0]
    with contextlib.redirect_stdout(io.StringIO()):
        truth = COCO()
        truth.dataset = json.loads(json.dumps(gt))
        truth.createIndex()
        evaluation = COCOeval(truth, truth.loadRes(detections), "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return [round(float(evaluation.stats[0]), 4), round(float(evaluation.stats[1]), 4)]


def judge(data_yaml: Path, folders: list[Path]) -> dict[str, dict[int, list[float]]]:
    gt, ids = ground_truth(val_images(data_yaml))
    return {str(folder): {int(f.stem[5:]): coco_map(gt, ids, json.loads(f.read_text()))
                          for f in sorted(folder.glob("epoch*.json"), key=lambda p: int(p.stem[5:]))} for folder in folders}


def judge_group(python: str, data: Path, jobs: list[dict], runs: list[dict]) -> None:
    """Each run's epochs scored by pycocotools (benchmarks/coco_judge.py, under `python`): run["judged"][epoch] =
    [mAP50-95, mAP50]."""
    folders = [json.loads(Path(job["spec"]).read_text())["judge"] for job in jobs]
    done = subprocess.run([python, str(Path(__file__).resolve()), "--data", str(data), *folders],
                          capture_output=True, text=True, cwd=str(Path(__file__).resolve().parents[1]))
    if done.returncode:
        print(f"  coco_judge FAILED (rc {done.returncode}):\n{done.stderr[-3000:]}", flush=True)
        return
    scores = json.loads(done.stdout)
    for run, folder in zip(runs, folders, strict=True):
        run["judged"] = {int(k): v for k, v in scores[folder].items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="the data YAML both sides validated on")
    ap.add_argument("folders", type=Path, nargs="+", help="folders of epoch<N>.json written by PredictionCapture")
    a = ap.parse_args()
    json.dump(judge(a.data, a.folders), sys.stdout)


if __name__ == "__main__":
    main()
