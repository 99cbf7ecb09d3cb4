"""benchmarks/coco_judge.py, the one yardstick of `vs_ultralytics.py --judge`: ground truth read back from YOLO labels,
pycocotools' score of the captured rows, and the report's table of both figures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import coco_judge  # noqa: E402
from benchmarks.vs_report import judged_table  # noqa: E402

pytest.importorskip("pycocotools")

SIZES = [(64, 48), (80, 80), (40, 100)]  # (width, height): boxes are scaled by each image's own size


@pytest.fixture
def dataset(tmp_path) -> tuple[Path, list]:
    """Three val images with labels, a data YAML as vs_ultralytics.dataset_view writes it, and their boxes in pixels."""
    rng = np.random.default_rng(0)
    (tmp_path / "images" / "val").mkdir(parents=True)
    (tmp_path / "labels" / "val").mkdir(parents=True)
    truth = []
    for i, (w, h) in enumerate(SIZES):
        Image.new("RGB", (w, h)).save(tmp_path / "images" / "val" / f"im{i}.png")
        lines = []
        for _ in range(3):
            c, cx, cy, bw, bh = int(rng.integers(0, 2)), *rng.uniform(0.3, 0.7, 2), *rng.uniform(0.1, 0.3, 2)
            lines.append(f"{c} {cx} {cy} {bw} {bh}")
            truth.append([f"im{i}.png", c, [(cx - bw / 2) * w, (cy - bh / 2) * h, bw * w, bh * h], 0.9])
        (tmp_path / "labels" / "val" / f"im{i}.txt").write_text("\n".join(lines) + "\n")
    data = tmp_path / "data.yaml"
    data.write_text(f"path: {tmp_path}\ntrain: images/val\nval: images/val\nnames:\n  0: a\n  1: b\n")
    return data, truth


def test_the_labels_detected_exactly_score_one_and_a_miss_or_a_shift_scores_less(dataset):
    data, truth = dataset
    gt, ids = coco_judge.ground_truth(coco_judge.val_images(data))
    assert len(gt["images"]) == 3 and len(gt["annotations"]) == 9
    assert coco_judge.coco_map(gt, ids, truth) == [1.0, 1.0]
    assert coco_judge.coco_map(gt, ids, []) == [0.0, 0.0]
    missed = coco_judge.coco_map(gt, ids, truth[3:])
    assert 0.5 < missed[0] < 1.0  # two images of three found: recall 2/3 caps the precision envelope
    shifted = [[n, c, [x + 0.3 * w, y, w, h], s] for n, c, (x, y, w, h), s in truth]  # IoU 0.54: counts at .50 only
    assert coco_judge.coco_map(gt, ids, shifted) == [pytest.approx(0.1, abs=0.01), 1.0]
    wrong_class = [[n, 1 - c, box, s] for n, c, box, s in truth]
    assert coco_judge.coco_map(gt, ids, wrong_class) == [0.0, 0.0]


def test_judge_reads_the_captured_epochs_in_order(dataset, tmp_path):
    data, truth = dataset
    capture = coco_judge.PredictionCapture(tmp_path / "judged")
    for epoch, rows in ((1, truth[:3]), (2, truth), (10, truth)):
        capture.rows = rows
        capture.dump(epoch)
    assert json.loads((tmp_path / "judged" / "epoch2.json").read_text())[0][0] == "im0.png"
    scores = coco_judge.judge(data, [tmp_path / "judged"])[str(tmp_path / "judged")]
    assert list(scores) == [1, 2, 10]
    assert scores[1][0] < scores[2][0] == scores[10][0] == 1.0


def test_the_report_shows_each_library_s_own_figure_beside_the_judged_one():
    runs = [{"curve": [{"epoch": 1, "map": 0.25}], "judged": {1: [0.2, 0.4]}},
            {"curve": [{"epoch": 1, "map": 0.3}], "judged": {"1": [0.1, 0.3]}}]  # keys as results.json reads them back
    table = judged_table(runs, ["ours", "theirs"], 1)
    assert table[-1] == "| 1 | 0.250 -> **0.200** | 0.300 -> **0.100** |"
