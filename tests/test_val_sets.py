"""Several validation sets: `val:` as a mapping {name: split}; each set validated, its metrics under `<name>/`, in
results.csv and TensorBoard; `monitor=` naming one set's metric decides best.pt."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from conftest import TINY

from yolo_cb import YOLO
from yolo_cb.data.resolve import DatasetConfigError, check_data
from yolo_cb.engine.checkpoint import load_checkpoint

pytestmark = pytest.mark.slow
MONITOR = "dusk/val/iou_loss"  # a loss: it changes every epoch, so best.pt's epoch says which set decided


@pytest.fixture(scope="module")
def two_sets(tmp_path_factory, shapes_dir) -> Path:
    folder = tmp_path_factory.mktemp("two_sets")
    val = sorted((shapes_dir / "images" / "val").glob("*.jpg"))
    (folder / "train.txt").write_text("\n".join(map(str, sorted((shapes_dir / "images" / "train").glob("*.jpg"))[:16])) + "\n")
    (folder / "day.txt").write_text("\n".join(map(str, val[:8])) + "\n")
    (folder / "dusk.txt").write_text("\n".join(map(str, val[8:16])) + "\n")
    path = folder / "two.yaml"
    path.write_text(f"path: {folder}\ntrain: train.txt\nval: {{day: day.txt, dusk: dusk.txt}}\nnames: [circle, rectangle, triangle, cross]\n")
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory, two_sets) -> Path:
    root = tmp_path_factory.mktemp("val_sets_run")
    YOLO("yolox-nano.yaml").train(**{**TINY, "epochs": 3, "data": str(two_sets), "project": str(root), "name": "exp", "monitor": MONITOR,
                                     "tensorboard": True})
    return root / "exp"


def rows(run: Path) -> list[dict]:
    with open(run / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_the_data_dict_names_the_sets(two_sets):
    data = check_data(str(two_sets))
    assert list(data["val_sets"]) == ["day", "dusk"] and data["val"] == data["val_sets"]["day"]


def test_a_bad_set_name_is_one_clear_line(tmp_path, two_sets):
    bad = tmp_path / "bad.yaml"
    bad.write_text(two_sets.read_text().replace("dusk: dusk.txt", "a/b: dusk.txt"))
    with pytest.raises(DatasetConfigError, match="'a/b' is not a name"):
        check_data(str(bad))


def test_each_set_is_validated_and_logged(run):
    table = rows(run)
    assert len(table) == 3
    for r in table:
        assert r["day/metrics/mAP50(B)"] == r["metrics/mAP50(B)"] and r["day/val/iou_loss"] == r["val/iou_loss"]
        assert "dusk/metrics/mAP50-95(B)" in r and r["dusk/val/iou_loss"] != r["day/val/iou_loss"]  # other images, other losses
    assert (run / "results_per_class_dusk.csv").is_file() and (run / "results_per_class.csv").is_file()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("dusk/metrics/mAP50(B)")] == [0, 1, 2]


def test_best_pt_follows_the_monitored_set(run):
    losses = [float(r[MONITOR]) for r in rows(run)]
    best = load_checkpoint(run / "weights" / "best.pt")
    assert best["epoch"] == losses.index(min(losses))
    assert best["best_fitness"] == pytest.approx(min(losses), rel=1e-5)
