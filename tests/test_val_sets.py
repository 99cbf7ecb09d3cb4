"""Several validation sets: `val:` as a mapping {name: split} or a list of splits (each named by its stem); each set
validated, its metrics under `<name>/`, in results.csv and TensorBoard; `monitor=` naming one set's metric decides
best.pt. The other readers of `val` (yolo-cb val, resume's dataset fingerprint, the tuner's, int8 calibration) work
with a list."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from conftest import TINY

from yolo_cb import YOLO
from yolo_cb.checkpoints.checkpoint import load_checkpoint
from yolo_cb.data.resolve import DatasetConfigError, check_data

pytestmark = pytest.mark.slow
MONITOR = "dusk/val/iou_loss"  # a loss: it changes every epoch, so best.pt's epoch says which set decided


@pytest.fixture(scope="module")
def two_sets(tmp_path_factory, shapes_dir) -> Path:
    folder = tmp_path_factory.mktemp("two_sets")
    val = sorted((shapes_dir / "images" / "val").glob("*.jpg"))
    (folder / "train.txt").write_text("\n".join(map(str, sorted((shapes_dir / "images" / "train").glob("*.jpg"))[:16])) + "\n")
    (folder / "day.txt").write_text("\n".join(map(str, val[:8])) + "\n")
    (folder / "dusk.txt").write_text("\n".join(map(str, val[8:16])) + "\n")
    path = folder / "two.yaml"  # the list form: the sets are named day and dusk, by their stems
    path.write_text(f"path: {folder}\ntrain: train.txt\nval: [day.txt, dusk.txt]\nnames: [circle, rectangle, triangle, cross]\n")
    return path


def with_val(two_sets: Path, val: str, name: str) -> Path:
    path = two_sets.parent / f"{name}.yaml"
    path.write_text(two_sets.read_text().replace("val: [day.txt, dusk.txt]", f"val: {val}"))
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
    folder = two_sets.parent
    data = check_data(str(two_sets))
    assert data["val_sets"] == {"day": str(folder / "day.txt"), "dusk": str(folder / "dusk.txt")}
    assert data["val"] == data["val_sets"]["day"]  # the first set: what single-set readers get
    mapping = check_data(str(with_val(two_sets, "{morning: day.txt, dusk: dusk.txt}", "mapping")))
    assert list(mapping["val_sets"]) == ["morning", "dusk"]
    one = check_data(str(with_val(two_sets, "[day.txt]", "one")))  # a list of one path is one set, as before
    assert one["val_sets"] == {"val": [str(folder / "day.txt")]}


def test_list_names_that_clash_get_a_number(two_sets):
    (two_sets.parent / "other").mkdir(exist_ok=True)
    (two_sets.parent / "other" / "day.txt").write_text((two_sets.parent / "dusk.txt").read_text())
    data = check_data(str(with_val(two_sets, "[day.txt, other/day.txt, dusk.txt]", "clash")))
    assert list(data["val_sets"]) == ["day", "day_2", "dusk"]
    assert data["val_sets"]["day_2"] == str(two_sets.parent / "other" / "day.txt")


def test_a_bad_set_name_is_one_clear_line(tmp_path, two_sets):
    bad = tmp_path / "bad.yaml"
    bad.write_text(two_sets.read_text().replace("val: [day.txt, dusk.txt]", "val: {day: day.txt, a/b: dusk.txt}"))
    with pytest.raises(DatasetConfigError, match="'a/b' is not a name"):
        check_data(str(bad))


def test_the_other_readers_of_val_work_with_a_list(run, two_sets):
    """yolo-cb val validates the first set (as its own YAML would); resume's and the tuner's fingerprint counts every
    set's images; int8 calibration reads the train split."""
    from yolo_cb.export.convert import calibration_images
    from yolo_cb.training.resume import dataset_fingerprint

    best = run / "weights" / "best.pt"
    settings = dict(imgsz=64, batch=8, plots=False, project=str(run.parent), name="val", exist_ok=True)
    listed = YOLO(str(best)).val(data=str(two_sets), **settings)
    alone = YOLO(str(best)).val(data=str(with_val(two_sets, "day.txt", "day_only")), **settings)
    assert listed.summary() == alone.summary() and listed.results_dict == alone.results_dict
    day_labels = sum(len(Path(f.replace("/images/", "/labels/")).with_suffix(".txt").read_text().splitlines())
                     for f in (two_sets.parent / "day.txt").read_text().split())
    assert sum(row["Instances"] for row in listed.summary()) == day_labels  # the first set's 8 images, not all 16
    assert dataset_fingerprint(check_data(str(two_sets)))["val_images"] == 16
    assert len(calibration_images(str(two_sets), None, 0.25, (64, 64))) == 4  # a quarter of the 16 train images


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
    assert best.epoch == losses.index(min(losses))
    assert best.best_fitness == pytest.approx(min(losses), rel=1e-5)
