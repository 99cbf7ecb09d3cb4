"""Resume and run safety (issue 13): the run folder and dataset a checkpoint belongs to, best.pt and results.csv
after a kill -9, the model on resume, stale temp files, exit codes for signals at any point, finished runs, and
on_exception callbacks that fail. Kills and resumes run as real `python -m yolo_cb train` subprocesses."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from yolo_cb import YOLO
from yolo_cb.callbacks.dispatch import CallbackError
from yolo_cb.checkpoints.checkpoint import load_checkpoint
from yolo_cb.training.resume import describe_dataset
from yolo_cb.utils.paths import DEFAULT_MODEL

pytestmark = pytest.mark.slow
TESTS = Path(__file__).resolve().parent
NAMES = ["circle", "rectangle", "triangle", "cross"]
# 8 train images (one batch), 4 val images, no validation before the last epoch: a few seconds an epoch on 2 cores
SMALL = dict(imgsz=64, batch=8, workers=0, mosaic=0.0, mlflow=False, tensorboard=False, onnx_check=False, plots=False,
             no_aug_epochs=0, warmup_epochs=0.0, optimizer="AdamW", lr0=0.002, val=False)


def write_data(folder: Path, shapes_dir: Path, n_train: int = 8, n_val: int = 4, name: str = "base.yaml") -> Path:
    """A data YAML in `folder` listing the first n_train / n_val shapes images (in place, read-only)."""
    folder.mkdir(parents=True, exist_ok=True)
    train = sorted((shapes_dir / "images" / "train").glob("*.jpg"))[:n_train]
    val = sorted((shapes_dir / "images" / "val").glob("*.jpg"))[:n_val]
    (folder / f"{name}.train.txt").write_text("\n".join(map(str, train)) + "\n")
    (folder / f"{name}.val.txt").write_text("\n".join(map(str, val)) + "\n")
    path = folder / name
    path.write_text(yaml.safe_dump({"path": str(folder), "train": f"{name}.train.txt", "val": f"{name}.val.txt", "names": NAMES}))
    return path


def cli(tmp_path: Path, *args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m yolo_cb train ARGS` in a subprocess; cbpkg importable, its log in tmp_path."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "CBPKG_LOG": str(tmp_path / "cbpkg.log"),
                "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]), **(env or {})}
    return subprocess.run([sys.executable, "-m", "yolo_cb", "train", *args], cwd=cwd or tmp_path, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def kv(settings: dict) -> list[str]:
    return [f"{k}={v}" for k, v in settings.items()]


def epochs_in(results: Path) -> list[int]:
    with open(results, newline="") as f:
        return [int(float(row["epoch"])) for row in csv.DictReader(f)]


def snapshot(folder: Path) -> dict:
    """{relative path: (bytes, mtime_ns)} of every file under folder."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def data(tmp_path, shapes_dir) -> Path:
    return write_data(tmp_path / "data", shapes_dir)


def test_kill_between_last_and_best_restores_best_and_results_on_resume(tmp_path, data):
    """kill -9 after last.pt (epoch 2, the new best) and before best.pt: resume puts best.pt right and keeps every row."""
    run = tmp_path / "runs" / "exp"
    first = cli(tmp_path, *kv({**SMALL, "data": data, "epochs": 3, "project": tmp_path / "runs", "name": "exp",
                               "callbacks": "on_pretrain_routine_start=cbpkg:kill_before_best"}), env={"CBPKG_KILL_AT_EPOCH": "1"})
    assert first.returncode == -signal.SIGKILL, first.stdout[-3000:] + first.stderr[-3000:]
    assert load_checkpoint(run / "weights" / "last.pt").epoch == 1
    assert load_checkpoint(run / "weights" / "best.pt").epoch == 0  # the kill left best.pt one epoch behind
    assert epochs_in(run / "results.csv") == [1]  # and epoch 2's row unwritten
    stale = [run / "weights" / ".last.pt.k2j3h4g5.tmp", run / "weights" / ".best.pt.a1b2c3d4.tmp", run / ".results.csv.z9y8x7w6.tmp"]
    for path in stale:  # what a kill during an atomic write leaves behind
        path.write_bytes(b"partial")

    second = cli(tmp_path, f"resume={run / 'weights' / 'last.pt'}", "callbacks=on_train_start=cbpkg:log_best_epoch")
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-3000:]
    assert "best.pt at start: 1" in (tmp_path / "cbpkg.log").read_text()  # restored from last.pt before training went on
    assert "restored" in out and "best.pt" in out
    assert epochs_in(run / "results.csv") == [1, 2, 3]
    assert not [p for p in stale if p.exists()], "stale temp files were not cleaned"
    assert load_checkpoint(run / "weights" / "best.pt").epoch >= 1


def test_kill_before_the_first_best_then_resume_finishes_the_run(tmp_path, data):
    """kill -9 after the only epoch's last.pt, before any best.pt: resume writes best.pt and results.csv, then finishes."""
    run = tmp_path / "runs" / "exp"
    first = cli(tmp_path, *kv({**SMALL, "val": True, "data": data, "epochs": 1, "project": tmp_path / "runs", "name": "exp",
                               "callbacks": "on_pretrain_routine_start=cbpkg:kill_before_best"}), env={"CBPKG_KILL_AT_EPOCH": "0"})
    assert first.returncode == -signal.SIGKILL, first.stdout[-3000:] + first.stderr[-3000:]
    assert not (run / "weights" / "best.pt").exists() and not (run / "results.csv").exists()

    second = cli(tmp_path, f"resume={run / 'weights' / 'last.pt'}", "callbacks=")  # a checkpoint names no code: given again, empty
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-3000:]
    assert "resuming from epoch 2 of 1" not in out
    assert load_checkpoint(run / "weights" / "best.pt").epoch == 0
    assert epochs_in(run / "results.csv") == [1]
    assert f"validating {run / 'weights' / 'best.pt'}" in out  # the final validation the kill skipped
    assert load_checkpoint(run / "weights" / "last.pt").optimizer is None  # finished: stripped


def test_checkpoint_outside_its_run_folder_resumes_into_a_new_run(tmp_path, data):
    """A last.pt copied elsewhere (or a moved run folder) never writes next to itself: a new run folder, said so."""
    runs = tmp_path / "runs"
    first = cli(tmp_path, *kv({**SMALL, "data": data, "epochs": 2, "project": runs, "name": "exp", "callbacks": "on_fit_epoch_end=cbpkg:stop_now"}))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    last = runs / "exp" / "weights" / "last.pt"
    assert Path(load_checkpoint(last).save_dir) == (runs / "exp").resolve()
    elsewhere = tmp_path / "somewhere" / "last.pt"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(last.read_bytes())
    (tmp_path / "args.yaml").write_text("unrelated: true\n")  # the grandparent of somewhere/last.pt
    before_outside, before_run = snapshot(tmp_path / "somewhere"), snapshot(runs / "exp")
    before_args = (tmp_path / "args.yaml").read_bytes()

    second = cli(tmp_path, f"resume={elsewhere}", "callbacks=", f"project={runs}", "name=exp")  # places: the user's, never the file's
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-3000:]
    assert (tmp_path / "args.yaml").read_bytes() == before_args
    assert snapshot(tmp_path / "somewhere") == before_outside and snapshot(runs / "exp") == before_run
    new = runs / "exp-2"
    assert "new run folder" in out and str(new) in out
    assert load_checkpoint(new / "weights" / "last.pt").epoch == 1 and (new / "weights" / "best.pt").is_file()
    assert epochs_in(new / "results.csv") == [1, 2] and (new / "args.yaml").is_file()

    # a whole run folder moved: its recorded folder no longer matches, so again a new run, the moved one untouched
    moved = runs / "moved"
    (runs / "exp").rename(moved)
    before_moved = snapshot(moved)
    model = YOLO()
    model.train(resume=str(moved / "weights" / "last.pt"), callbacks=None, project=str(runs))
    assert snapshot(moved) == before_moved
    assert model.trainer.save_dir.resolve() != moved.resolve() and load_checkpoint(model.trainer.wdir / "last.pt").epoch == 1


def test_resume_uses_the_recorded_dataset_and_model_and_refuses_others(tmp_path, shapes_dir):
    """The CLI records the model and the absolute data YAML; a changed dataset or another model= is refused."""
    a, b = tmp_path / "a", tmp_path / "b"
    write_data(a, shapes_dir)
    first = cli(tmp_path, *kv({**SMALL, "data": "base.yaml", "epochs": 2, "project": tmp_path / "runs", "name": "exp",
                               "callbacks": "on_fit_epoch_end=cbpkg:stop_now"}), cwd=a)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    run = tmp_path / "runs" / "exp"
    last = run / "weights" / "last.pt"
    saved = yaml.safe_load((run / "args.yaml").read_text())
    ckpt = load_checkpoint(last)
    assert saved["model"] == ckpt.train_args["model"] == DEFAULT_MODEL == "yolocb-n.yaml"  # no model= given: the default
    assert saved["data"] == ckpt.train_args["data"] == str((a / "base.yaml").resolve())
    before = snapshot(run)

    other_model = cli(tmp_path, f"resume={last}", "model=yolox-tiny.yaml", "callbacks=")
    assert other_model.returncode == 2, other_model.stdout[-3000:] + other_model.stderr[-3000:]
    assert "yolox-tiny.yaml" in other_model.stderr and DEFAULT_MODEL in other_model.stderr and "Traceback" not in other_model.stderr

    original = (a / "base.yaml").read_text()
    write_data(a, shapes_dir, n_train=4)  # the same YAML now lists another dataset
    changed = cli(tmp_path, f"resume={last}", "callbacks=")
    assert changed.returncode == 2, changed.stdout[-3000:] + changed.stderr[-3000:]
    message = changed.stderr
    assert "dataset" in message and str((a / "base.yaml").resolve()) in message and "8 train" in message and "4 train" in message
    assert "Traceback" not in message
    assert snapshot(run) == before  # refusals touch nothing

    (a / "base.yaml").write_text(original)
    write_data(a, shapes_dir)
    write_data(b, shapes_dir, n_train=4)  # another base.yaml where the resume is started: must not be picked up
    resumed = cli(tmp_path, f"resume={last}", "callbacks=", cwd=b)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    ckpt = load_checkpoint(last)
    assert ckpt.epoch == 1 and ckpt.train_args["data"] == str((a / "base.yaml").resolve())
    assert ckpt.data_fingerprint["train_images"] == 8


@pytest.mark.parametrize("where, sig, code", [("on_val_start=cbpkg:signal_in_final_validation", "SIGTERM", 143),
                                              ("on_train_end=cbpkg:signal_in_train_end", "SIGINT", 130)])
def test_a_signal_after_the_last_epoch_still_exits_with_its_code(tmp_path, data, where, sig, code):
    result = cli(tmp_path, *kv({**SMALL, "val": True, "data": data, "epochs": 1, "project": tmp_path / "runs", "name": "exp", "callbacks": where}),
                 env={"CBPKG_SIGNAL": sig})
    assert result.returncode == code, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"{sig} received" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_resuming_a_finished_run_changes_nothing_and_says_how_to_fine_tune(tmp_path, data):
    runs = tmp_path / "runs"
    YOLO("yolox-nano.yaml").train(**{**SMALL, "val": True}, data=str(data), epochs=1, project=str(runs), name="exp")
    run = runs / "exp"
    before = snapshot(run)
    result = cli(tmp_path, f"resume={run / 'weights' / 'last.pt'}")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert "finished" in out and f"model={run / 'weights' / 'best.pt'}" in out and "epochs=" in out
    assert "resuming from epoch" not in out
    assert snapshot(run) == before
    # resume= with a larger epochs= trains the finished run further: tests/test_resume_epochs.py


def test_a_failing_on_exception_callback_keeps_the_original_error(tmp_path, data, caplog):
    def boom(trainer):
        raise ValueError("the original error")

    def broken_handler(trainer):
        raise RuntimeError("the handler's own error")

    seen = []
    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_pretrain_routine_end", boom)
    model.add_callback("on_exception", broken_handler)
    model.add_callback("on_exception", lambda t: seen.append(type(t.exception).__name__))
    with pytest.raises(CallbackError, match="the original error") as info:
        model.train(**SMALL, data=str(data), epochs=1, project=str(tmp_path / "runs"), name="exp")
    assert isinstance(info.value.error, ValueError)
    assert seen == ["CallbackError"]  # the next on_exception callback still ran
    assert any("the handler's own error" in r.getMessage() for r in caplog.records)


def test_cbpkg_callbacks_refuse_to_write_without_a_tmp_log(monkeypatch, tmp_path):
    import cbpkg

    monkeypatch.delenv("CBPKG_LOG", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuntimeError, match="CBPKG_LOG"):
        cbpkg.log_epoch(type("T", (), {"epoch": 0})())
    assert not list(tmp_path.iterdir())


def test_the_dataset_changed_refusal_counts_the_classes_past_eight_names():
    """The refusal shows the first 8 class names, then how many there are (the count was once lost inside a comment)."""
    many = describe_dataset({"yaml": "big.yaml", "train_images": 3, "val_images": 1, "names": [f"c{i}" for i in range(12)]})
    assert "c7, ... (12 classes)" in many and "c8" not in many
    few = describe_dataset({"yaml": "small.yaml", "train_images": 3, "val_images": 1, "names": NAMES})
    assert few.endswith("names: circle, rectangle, triangle, cross)") and "classes)" not in few
