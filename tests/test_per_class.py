"""Per-class metrics every validated epoch: results_per_class.csv equals the validator's per-class table, trainer.metrics
carries them under per_class/, TensorBoard logs them, results.csv leaves them out, `yolo-cb val` writes the same CSV."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TINY

from yolo_cb import YOLO
from yolo_cb.evaluation.per_class import AUTO_MAX_CLASSES, wanted

pytestmark = pytest.mark.slow


def read(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def run(tmp_path_factory, shapes_small_yaml) -> dict:
    """A two-epoch run with TensorBoard on; what the validator's per-class table was at each validation in training."""
    root = tmp_path_factory.mktemp("per_class")
    tables, metrics = {}, {}
    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_val_end", lambda v: v.training and tables.__setitem__(v.epoch + 1, [dict(r) for r in v.per_class]))
    model.add_callback("on_fit_epoch_end", lambda t: metrics.__setitem__(t.epoch + 1, dict(t.metrics)))
    model.train(**{**TINY, "epochs": 2, "data": str(shapes_small_yaml), "project": str(root / "runs"), "name": "exp", "tensorboard": True})
    return {"dir": root / "runs" / "exp", "tables": tables, "metrics": metrics, "data": shapes_small_yaml, "root": root}


def test_the_csv_holds_the_validators_table_of_every_epoch(run):
    rows = read(run["dir"] / "results_per_class.csv")
    assert set(run["tables"]) == {1, 2} and all(run["tables"].values())
    expected = [(str(epoch), str(r["class"]), r["name"], str(r["images"]), str(r["instances"]), r["precision"], r["recall"],
                 r["mAP50"], r["mAP50-95"]) for epoch, table in sorted(run["tables"].items()) for r in table]
    assert len(rows) == len(expected)
    for row, want in zip(rows, expected, strict=True):
        assert tuple(row[k] for k in ("epoch", "class", "name", "images", "instances")) == want[:5]
        got = [float(row[k]) for k in ("P", "R", "mAP50", "mAP50-95")]
        assert got == pytest.approx(list(want[5:]), rel=1e-5, abs=1e-9)
    assert sum(int(r["instances"]) for r in rows if r["epoch"] == "1") == 64  # the 16 val images' boxes, by class


def test_trainer_metrics_carry_them_under_one_prefix_and_results_csv_does_not(run):
    for epoch, table in run["tables"].items():
        got = run["metrics"][epoch]
        assert "metrics/mAP50-95(B)" in got
        for r in table:
            assert got[f"per_class/{r['name']}/mAP50-95(B)"] == pytest.approx(r["mAP50-95"])
            assert got[f"per_class/{r['name']}/precision(B)"] == pytest.approx(r["precision"])
    header = (run["dir"] / "results.csv").read_text().splitlines()[0]
    assert "per_class/" not in header and "metrics/mAP50(B)" in header


def test_tensorboard_logs_them(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run["dir"]), size_guidance={"scalars": 0})
    acc.Reload()
    name = run["tables"][2][0]["name"]
    points = acc.Scalars(f"per_class/{name}/mAP50(B)")
    assert [p.step for p in points] == [0, 1]
    assert points[1].value == pytest.approx(run["tables"][2][0]["mAP50"], rel=1e-5, abs=1e-7)


def test_yolo_cb_val_writes_the_same_csv(run):
    out = run["root"] / "val"
    best = run["dir"] / "weights" / "last.pt"
    cmd = [sys.executable, "-m", "yolo_cb", "val", f"model={best}", f"data={run['data']}", "imgsz=64", "batch=16", "workers=0",
           "plots=false", f"project={out}", "name=v"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=run["root"], env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = read(out / "v" / "results_per_class.csv")
    metrics = YOLO(str(best)).val(data=str(run["data"]), imgsz=64, batch=16, workers=0, plots=False, project=str(out), name="py")
    assert rows and all(r["epoch"] == "" for r in rows)
    summary = metrics.summary(decimals=9)  # Ultralytics' per-class table of the same validation, from Python
    assert [r["name"] for r in rows] == [s["Class"] for s in summary]
    for r, s in zip(rows, summary, strict=True):
        assert (int(r["images"]), int(r["instances"])) == (s["Images"], s["Instances"])
        assert float(r["mAP50-95"]) == pytest.approx(s["mAP50-95"], rel=1e-5, abs=1e-8)
        assert float(r["P"]) == pytest.approx(s["Box-P"], rel=1e-5, abs=1e-8)
    assert not any(k.startswith("per_class/") for k in metrics)  # val() returns Ultralytics' keys only


def test_per_class_setting():
    assert wanted("auto", AUTO_MAX_CLASSES) and not wanted("auto", AUTO_MAX_CLASSES + 1)
    assert wanted(True, 1000) and not wanted(False, 2)
