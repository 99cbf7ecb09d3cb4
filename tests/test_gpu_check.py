"""benchmarks/gpu_check.py --dry-run (issues 34, 58): the GPU check's every part runs on the CPU, as ONE subprocess (it is a
script), records real figures, and can see what it reports: its loader rows are whole epochs (two, the boundary
between them counted), an epoch's time holds its batches', and two rows with a known answer come out at that answer.
The device-side augmentation part runs a stand-in (a flip and /255, written here) through its eager and compiled
(`eager` backend: dynamo traces, no code generation) calls; the DDP part's closure callback runs on both ranks and
rank 1's trainer.stop ends both at the same batch."""

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
PARTS = ("train", "loader", "ultralytics", "augment", "ddp", "export")
STANDIN = '''def augment(batch):
    return batch["img"].flip(-1).float().div_(255)
'''


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("gpu_check")
    (out / "standin_augment.py").write_text(STANDIN)
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--dry-run", "--out", str(out), "--work", str(out / "work"),
               "--augment-fn", "standin_augment:augment"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(out), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md").read_text()


def figure(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def rows(report: dict, part: str, kind: str) -> list[dict]:
    return [r for r in report["parts"][part]["rows"] if r.get("kind") == kind]


def whole_epochs(row: dict, batches: int, images: int) -> None:
    """Two epochs or more, each of every batch, each with its boundary (the wait for its first batch) inside its time."""
    epochs = row["epochs"]
    assert len(epochs) >= 2, row
    for e in epochs:
        assert e["batches"] == batches and e["images"] == images, row
        assert e["first_batch_s"] > 0 and e["epoch_s"] >= e["first_batch_s"] + e["batches_s"], row
    assert row["images"] == images * len(epochs) and math.isclose(row["ips"], row["images"] / sum(e["epoch_s"] for e in epochs)), row
    assert sum(e["epoch_s"] for e in epochs) >= sum(e["batches_s"] for e in epochs), row


def test_every_part_ran_and_training_is_timed_over_whole_epochs(dry_run):
    report, _ = dry_run
    assert report["dry_run"] is True and tuple(report["parts"]) == PARTS
    assert {name: part["status"] for name, part in report["parts"].items()} == dict.fromkeys(PARTS, "ok")
    setup = report["setup"]  # 16 generated train images linked twice: 4 batches of 8 an epoch
    assert setup["generated"] == [16, 8] and setup["repeat"] == 2 and setup["train_entries"] == 32 and figure(setup["generate_cpu_ms_per_image"]), setup
    (train,) = report["parts"]["train"]["rows"]
    assert train["config"] == "amp=on channels_last=on compile=off" and train["compared"] is True, train  # cfg/default.yaml's levers
    assert train["status"] == "ok" and figure(train["ips"]) and figure(train["steady_ips"]) and figure(train["loss"]), train
    whole_epochs(train, batches=4, images=32)
    for e in train["epochs"]:  # validation ran in every epoch and is inside its time
        assert figure(e["val_s"]) and math.isclose(e["epoch_s"], e["train_s"] + e["val_s"]), train
    # amp on a CPU: bf16 autocast where the CPU runs bf16 natively, else off; no GPU memory on the CPU
    assert train["amp"] == ("bfloat16" if cpu_has_native_bf16() else "off") and train["peak_mib"] is None, train
    for row in report["parts"]["ultralytics"]["rows"]:  # present here or not: a figure or the reason
        assert (row["status"] == "ok" and figure(row["ips"])) or (row["status"] == "unavailable" and "ultralytics" in row["note"]), row
    onnx, engine = report["parts"]["export"]["rows"]
    assert onnx["status"] == "ok" and onnx["config"] == "format=onnx", onnx
    assert abs(onnx["map_export"] - onnx["map_torch"]) <= 0.02 + 0.02 * onnx["map_torch"], onnx
    assert engine["config"] == "format=engine" and engine["status"] == "unavailable" and engine["note"], engine


def test_loader_rows_are_whole_epochs_with_the_boundary_counted(dry_run):
    report, _ = dry_run
    loader = rows(report, "loader", "loader")
    assert [r["workers"] for r in loader] == [1, 2], loader
    for row in loader:
        assert row["status"] == "ok" and row["batches_per_epoch"] == 4 and figure(row["steady_ips"]), row
        whole_epochs(row, batches=4, images=32)


def test_the_harness_gives_the_known_answers(dry_run):
    report, _ = dry_run
    stub, slow = rows(report, "loader", "known-answer")
    # a stub loader: 0.3 s at each start, 0.05 s a batch, a 0.1 s consumer: every second of it is in the epoch's time
    # (a sleep only overruns: the measured rate may fall a little short of the answer, never exceed it)
    whole_epochs(stub, batches=4, images=32)
    assert all(e["epoch_s"] >= stub["expected_epoch_s"] * 0.999 for e in stub["epochs"]), stub
    assert stub["ips"] <= 1.001 * stub["expected_ips"], stub  # one-sided: a busy machine only slows it
    # our loader under a consumer sleeping 0.25 s a batch: the loader cannot be the limit, batch / sleep is the rate
    whole_epochs(slow, batches=4, images=32)
    assert slow["steady_ips"] <= 1.001 * slow["expected_steady_ips"], slow
    assert slow["ips"] < slow["steady_ips"], slow  # the whole epochs hold the workers' start too


def test_the_augmentation_part_times_eager_and_compiled_calls(dry_run):
    report, _ = dry_run
    eager, compiled = report["parts"]["augment"]["rows"]
    assert "eager" in eager["config"] and "compiled (eager)" in compiled["config"], (eager, compiled)
    for row in (eager, compiled):
        assert row["status"] == "ok" and figure(row["ms_per_batch"]), row


def test_the_default_augmentation_is_found_or_reported_absent(tmp_path, monkeypatch):
    from benchmarks.gpu_loader import AUGMENT_FN, lookup

    fn, why = lookup(AUGMENT_FN)
    assert callable(fn) or why.startswith("no module") or "has no function" in why, why
    assert lookup("yolo_cb.data.no_such_module:fn") == (None, "no module yolo_cb.data.no_such_module")
    assert lookup("yolo_cb.data.loading.loader:no_such_function") == (None, "yolo_cb.data.loading.loader has no function no_such_function")
    (tmp_path / "broken_augment.py").write_text("import no_such_dependency_here\n")  # present, but its own import fails: an error
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_here"):
        lookup("broken_augment:fn")


def test_the_gpu_run_is_sized_to_see_the_loader_and_to_fit_9_minutes():
    from benchmarks.gpu_check import GPU_SIZES, GPU_TIMEOUTS, GPU_TOTAL_S
    from benchmarks.gpu_check import PARTS as GPU_PARTS

    assert GPU_SIZES["train_entries"] // GPU_SIZES["batch"] >= 64 and GPU_SIZES["imgsz"] == 640, GPU_SIZES
    assert GPU_SIZES["loader_workers"] == [8, 14] and GPU_SIZES["loader_epochs"] >= 2 and GPU_SIZES["epochs"] >= 2, GPU_SIZES
    assert set(GPU_TIMEOUTS) == set(GPU_PARTS) and sum(GPU_TIMEOUTS.values()) + 30 <= GPU_TOTAL_S <= 9 * 60, GPU_TIMEOUTS


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
    n_rows = sum(len(part["rows"]) for part in report["parts"].values())
    assert sum(line.startswith("| ") and not line.startswith("| part ") for line in table.splitlines()) == n_rows
    assert report["summary"]["loader_best_ips"] == max(r["ips"] for r in rows(report, "loader", "loader"))
