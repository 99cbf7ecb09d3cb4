"""benchmarks/gpu_check.py --dry-run (issue 34): the GPU check's every part runs on the CPU, as ONE subprocess (it is a
script), and records real figures; the DDP part's closure callback runs on both ranks and rank 1's trainer.stop ends
both at the same batch. compile rows run with compile=false here: dynamo's tracing of the model alone costs 15-40 s
of CPU (the dry run's default, compile=eager, is run by hand: BENCHMARKS.md)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from yolo_cb.training.step import cpu_has_native_bf16

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("train", "loader", "ultralytics", "ddp", "export")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory, shapes_dir) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("gpu_check")
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--dry-run", "--out", str(out), "--work", str(out / "work"),
               "--data", str(shapes_dir), "--compile", "false"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md").read_text()


def figure(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_every_part_ran_with_real_figures(dry_run):
    report, _ = dry_run
    assert report["dry_run"] is True and tuple(report["parts"]) == PARTS
    assert {name: part["status"] for name, part in report["parts"].items()} == dict.fromkeys(PARTS, "ok")
    train = report["parts"]["train"]["rows"]
    assert [r["config"] for r in train] == ["amp=on channels_last=off compile=off", "amp=on channels_last=on compile=off"]
    for row in train:
        assert row["status"] == "ok" and figure(row["ips"]) and figure(row["loss"]) and row["timed_batches"] >= 1, row
        # amp on a CPU: bf16 autocast where the CPU runs bf16 natively, else off; no GPU memory on the CPU
        assert row["amp"] == ("bfloat16" if cpu_has_native_bf16() else "off") and row["peak_mib"] is None, row
    loader = report["parts"]["loader"]["rows"]
    assert [r["config"].split()[0] for r in loader] == ["workers=0", "workers=1"]
    assert all(r["status"] == "ok" and figure(r["ips"]) and r["images"] == 4 * 8 for r in loader), loader
    for row in report["parts"]["ultralytics"]["rows"]:  # present here or not: a figure or the reason
        assert (row["status"] == "ok" and figure(row["ips"])) or (row["status"] == "unavailable" and "ultralytics" in row["note"]), row
    onnx, engine = report["parts"]["export"]["rows"]
    assert onnx["status"] == "ok" and onnx["config"] == "format=onnx", onnx
    assert abs(onnx["map_export"] - onnx["map_torch"]) <= 0.02 + 0.02 * onnx["map_torch"], onnx
    assert engine["config"] == "format=engine" and engine["status"] == "unavailable" and engine["note"], engine


def test_ddp_runs_the_closure_on_both_ranks_and_stops_both_from_rank_1(dry_run):
    report, _ = dry_run
    part = report["parts"]["ddp"]
    (row,) = part["rows"]
    assert row["status"] == "ok" and row["backend"] == "gloo", row
    checks = part["checks"]
    assert checks["stop_set_on_rank1"] is True and checks["stopped_together"] is True, checks
    assert checks["last_batch"] == {"0": [0, 1], "1": [0, 1]}, checks  # both ranks ended after batch 1 of epoch 1
    assert checks["calls"] == {"0": 2, "1": 2} and checks["epochs_trained"] == 1, checks  # 1 of 2 epochs: the stop held
    assert checks["callbacks_json"]["world_size"] == 2 and checks["callbacks_json"]["closure_calls_by_rank"] == {"0": 2, "1": 2}, checks


def test_the_table_says_it_is_a_cpu_dry_run(dry_run):
    report, table = dry_run
    assert "CPU DRY RUN" in table and "not GPU figures" in table
    rows = sum(len(part["rows"]) for part in report["parts"].values())
    assert sum(line.startswith("| ") and not line.startswith("| part ") for line in table.splitlines()) == rows
    assert report["summary"]["loader_best_ips"] == max(r["ips"] for r in report["parts"]["loader"]["rows"])
