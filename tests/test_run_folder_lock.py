"""One run, one folder (issue 26.2): a second training in a folder in use is refused and loses nothing; new folders
are claimed atomically by concurrent processes; a kill -9 leaves no lock in the way; name= stays inside project=."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_resume_safety import SMALL, cli, kv, write_data

from yolo_cb.checkpoints.checkpoint import load_checkpoint
from yolo_cb.utils.files import increment_path
from yolo_cb.utils.run_lock import RunFolderInUse, lock_run_folder

GATE = """import os, time
def wait_for_gate(trainer):
    open(os.environ["GATE_DIR"] + "/started", "w").close()
    while not os.path.exists(os.environ["GATE_DIR"] + "/go"):
        time.sleep(0.05)
"""


def wait_for(path: Path, process: subprocess.Popen, limit: float = 300) -> None:
    """Poll until `path` exists (the process still running), or fail with its output."""
    deadline = time.monotonic() + limit
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            out, err = process.communicate()
            pytest.fail(f"{path} never appeared: {out[-2000:]}{err[-2000:]}")
        time.sleep(0.05)


@pytest.mark.slow
def test_a_second_run_in_a_folder_in_use_is_refused_and_the_first_keeps_its_weights(tmp_path, shapes_dir):
    data = write_data(tmp_path / "data", shapes_dir)
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "gate.py").write_text(GATE)
    settings = kv({**SMALL, "data": data, "epochs": 1, "project": tmp_path / "runs", "name": "job", "exist_ok": True})
    env = {**os.environ, "GATE_DIR": str(tmp_path), "PYTHONPATH": os.pathsep.join([str(tmp_path / "mods"), os.environ.get("PYTHONPATH", "")])}
    first = subprocess.Popen([sys.executable, "-m", "yolo_cb", "train", *settings, "callbacks=on_train_start=gate:wait_for_gate"],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(tmp_path / "started", first)  # the first run holds the folder and waits at on_train_start
        second = cli(tmp_path, *settings, "seed=1")
        assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-3000:]
        line = second.stderr.strip().splitlines()[-1]
        assert "in use by another training run" in line and f"PID {first.pid}" in line and "Traceback" not in second.stderr, line
    finally:
        (tmp_path / "go").touch()
        out, err = first.communicate(timeout=600)
    assert first.returncode == 0, out[-2000:] + err[-3000:]
    ckpt = load_checkpoint(tmp_path / "runs" / "job" / "weights" / "last.pt")
    assert ckpt.train_args["seed"] == SMALL.get("seed", 0) and ckpt.epoch == 0  # the first run's, untouched
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["job"]
    after = cli(tmp_path, *settings)  # the folder is free again once the run ended
    assert after.returncode == 0, after.stderr[-3000:]


def _claim(args: tuple[Path, int, object]) -> list[str]:
    root, count, barrier = args
    root.mkdir(exist_ok=True)
    barrier.wait()
    return [increment_path(root / "train").name for _ in range(count)]


def test_concurrent_processes_each_get_their_own_new_folder(tmp_path):
    """Four processes asking for runs/train at the same instant, 20 times each, three times over: 80 distinct folders each
    time (a check-then-create handed one folder to two processes a few times in 80)."""
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(4) as pool:
        for round_ in range(3):
            root = tmp_path / f"round{round_}"
            names = sum(pool.map(_claim, [(root, 20, manager.Barrier(4))] * 4), [])
            assert len(names) == 80 and len(set(names)) == 80, sorted(names)
            assert sorted(p.name for p in root.iterdir()) == sorted(names)


def test_a_lock_left_by_a_killed_run_is_not_in_the_way(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom yolo_cb.utils.run_lock import lock_run_folder\n"
                               f"lock = lock_run_folder({str(tmp_path)!r})\nprint('locked', flush=True)\ntime.sleep(600)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunFolderInUse, match=f"PID {holder.pid}"):
            lock_run_folder(tmp_path)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    lock = lock_run_folder(tmp_path)  # the kernel dropped the dead process's lock
    lock.release()


@pytest.mark.parametrize("name", ["../../escaped", "ABSOLUTE", ".."])
def test_name_cannot_leave_the_project(tmp_path, name):
    name = str(tmp_path / "abs-run") if name == "ABSOLUTE" else name
    result = subprocess.run([sys.executable, "-m", "yolo_cb", "train", f"project={tmp_path / 'runs'}", f"name={name}", "epochs=1",
                             "imgsz=32", "fraction=0.05", "val=False", "mlflow=False", "tensorboard=False", "plots=False", "onnx_check=False"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"name={name}" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "abs-run").exists() and not (tmp_path / "runs").exists()
