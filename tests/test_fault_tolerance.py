"""Runs that survive faults (issue 20): resume=auto in a job script a scheduler restarts, the SIGUSR1 requeue exit,
an elastic torchrun restart after kill -9 of one worker that ends with the uninterrupted run's weights, and two torchrun
"nodes" on loopback. Real subprocesses, gloo on CPU, one thread each; the workers log through tests/cbpkg:FaultProbe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from yolo_cb.checkpoints.checkpoint import load_checkpoint
from yolo_cb.training.launch import free_port

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
TIMEOUT = 600  # generous: a busy 2-core machine
# 32 train images, batch 8: 4 batches an epoch in one process, 2 per rank under DDP; nbs=8: an optimizer step every batch
SETTINGS = dict(model="yolox-nano.yaml", imgsz=64, batch=8, nbs=8, epochs=2, workers=0, mosaic=0.0, mlflow=False, tensorboard=False,
                onnx_check=False, plots=False, no_aug_epochs=0, warmup_epochs=0.0, optimizer="AdamW", lr0=0.002, val=False,
                callbacks="cbpkg:FaultProbe")


def env_for(log: Path, **extra: str) -> dict:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "CBPKG_LOG": str(log),
            "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")]), **extra}


def train_args(data: Path, project: Path, name: str, **more) -> list[str]:
    return [f"{k}={v}" for k, v in {**SETTINGS, "data": data, "project": project, "name": name, "resume": "auto", **more}.items()]


def lines(log: Path, kind: str) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith(kind + " ")]


def torchrun(*options: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--rdzv-backend=c10d", "--local-addr=127.0.0.1", *options, "-m", "yolo_cb", "train"]


def assert_same_weights(a: Path, b: Path) -> None:
    first, second = load_checkpoint(a), load_checkpoint(b)
    for key, one, other in (("model", first.model, second.model), ("ema", first.ema, second.ema)):
        assert one.keys() == other.keys()
        differ = [k for k in one if not torch.equal(one[k], other[k])]
        assert not differ, f"{key}: {len(differ)} tensors differ, e.g. {differ[:3]}"


@pytest.mark.slow
def test_resume_auto_job_script_started_three_times_finishes_the_run_once(tmp_path, shapes_small_yaml):
    """A job script with resume=auto: the 1st start gets SIGUSR1 mid-epoch (saves, exits 138: requeue), the 2nd continues
    after the last trained batch and finishes, the 3rd finds the finished run and exits 0 without training. The weights
    equal those of an uninterrupted run."""
    job = tmp_path / "job.sh"
    job.write_text('#!/usr/bin/env bash\n"$PYTHON" -m yolo_cb train "$@"\ncode=$?\n'
                   'case $code in 138|143) echo "requeue after exit $code";; esac\nexit $code\n')
    log, project = tmp_path / "probe.log", tmp_path / "runs"
    args = train_args(shapes_small_yaml, project, "job")
    starts = []
    for i in range(3):
        extra = {"CBPKG_KILL_AT": "0,2", "CBPKG_KILL_SIGNAL": "SIGUSR1"} if i == 0 else {}
        starts.append(subprocess.run(["bash", str(job), *args], cwd=tmp_path, env=env_for(log, PYTHON=sys.executable, **extra),
                                     capture_output=True, text=True, timeout=TIMEOUT))
        if i == 0:  # the same folder with other settings: refused, nothing touched
            weights = (project / "job" / "weights" / "last.pt").read_bytes()
            other = subprocess.run(["bash", str(job), *args, "lr0=0.01"], cwd=tmp_path, env=env_for(log, PYTHON=sys.executable),
                                   capture_output=True, text=True, timeout=TIMEOUT)
            assert other.returncode == 2 and "lr0='0.01' (was 0.002)" in other.stderr and "not a run of these settings" in other.stderr, other.stderr[-3000:]
            assert (project / "job" / "weights" / "last.pt").read_bytes() == weights
    outs = [p.stdout + p.stderr for p in starts]
    assert [p.returncode for p in starts] == [138, 0, 0], "\n=====\n".join(o[-3000:] for o in outs)
    assert "no " in outs[0] and "starting a fresh run" in outs[0] and "SIGUSR1 received" in outs[0] and "requeue after exit 138" in outs[0]
    assert "continuing the run" in outs[1] and "resuming from epoch 1 of 2, after batch 3 of 4" in outs[1]
    assert "finished run" in outs[2] and "nothing was changed" in outs[2]
    batches = [line.split()[2] for line in lines(log, "batch")]
    assert batches == [f"{e},{b}" for e in range(2) for b in range(4)]  # every batch trained once: none lost, none repeated
    assert len(lines(log, "start")) == 2 and lines(log, "end") == ["end -1"]  # trained by two starts, finished once
    ckpt = load_checkpoint(project / "job" / "weights" / "last.pt")
    assert ckpt.finished and ckpt.epoch == 1 and ckpt.optimizer_steps == 8
    assert sorted(p.name for p in project.iterdir()) == ["job"]  # one run folder, never job2
    straight = subprocess.run([sys.executable, "-m", "yolo_cb", "train", *train_args(shapes_small_yaml, tmp_path / "straight", "job")],
                              cwd=tmp_path, env=env_for(tmp_path / "straight.log"), capture_output=True, text=True, timeout=TIMEOUT)
    assert straight.returncode == 0, straight.stdout[-3000:] + straight.stderr[-3000:]
    assert_same_weights(project / "job" / "weights" / "last.pt", tmp_path / "straight" / "job" / "weights" / "last.pt")  # the stop was exact


@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory, shapes_small_yaml):
    """An uninterrupted 2-rank run started as two torchrun "nodes" (--nnodes=2, one worker each) on 127.0.0.1."""
    folder = tmp_path_factory.mktemp("two_nodes")
    log, port = folder / "probe.log", free_port()
    cmd = torchrun("--nnodes=2", "--nproc-per-node=1", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=two-nodes")
    args = train_args(shapes_small_yaml, folder / "runs", "reference", save_steps=1)
    nodes = [subprocess.Popen([*cmd, *args], cwd=folder, env=env_for(log, CBPKG_NODE=node), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for node in ("a", "b")]
    outs = []
    for node in nodes:
        try:
            outs.append(node.communicate(timeout=TIMEOUT)[0])
        except subprocess.TimeoutExpired:
            for other in nodes:
                other.kill()
            raise
    return {"codes": [n.returncode for n in nodes], "outs": outs, "log": log, "last": folder / "runs" / "reference" / "weights" / "last.pt"}


@pytest.mark.slow
def test_two_torchrun_nodes_on_loopback_train_together(two_node_run):
    run = two_node_run
    assert run["codes"] == [0, 0], "\n=====\n".join(o[-3000:] for o in run["outs"])
    starts = sorted(line.split()[1:4] for line in lines(run["log"], "start"))
    assert [s[0] for s in starts] == ["a", "b"] and sorted(s[1] for s in starts) == ["0", "1"] and {s[2] for s in starts} == {"2"}
    batches = sorted(line.split(" ", 1)[1] for line in lines(run["log"], "batch"))
    assert batches == sorted(f"{r} {e},{b}" for r in (0, 1) for e in range(2) for b in range(2))
    assert load_checkpoint(run["last"]).finished


@pytest.mark.slow
def test_kill_9_of_a_worker_under_torchrun_restart_ends_with_the_uninterrupted_weights(tmp_path, shapes_small_yaml, two_node_run):
    """Rank 1 is SIGKILLed after batch 1 of epoch 2 (a save_steps=1 checkpoint was just written); torchrun restarts both
    workers, resume=auto continues after that batch, and the finished run has the uninterrupted run's weights exactly."""
    log, port = tmp_path / "probe.log", free_port()
    cmd = torchrun("--nnodes=1:2", "--nproc-per-node=2", "--max-restarts=1", f"--rdzv-endpoint=127.0.0.1:{port}",
                   "--rdzv-conf=last_call_timeout=1", "--rdzv-id=elastic")
    proc = subprocess.run([*cmd, *train_args(shapes_small_yaml, tmp_path / "runs", "elastic", save_steps=1)], cwd=tmp_path,
                          env=env_for(log, CBPKG_KILL_AT="1,0", CBPKG_KILL_RANK="1"), capture_output=True, text=True, timeout=TIMEOUT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    starts = sorted(line.split()[2:] for line in lines(log, "start"))
    assert starts == [["0", "2", "0", "0"], ["0", "2", "1", "1"], ["1", "2", "0", "0"], ["1", "2", "1", "1"]], starts  # rank world start_epoch restart
    assert "resuming from epoch 2 of 2, after batch 1 of 2" in out
    batches = sorted(line.split(" ", 1)[1] for line in lines(log, "batch"))
    assert batches == sorted(f"{r} {e},{b}" for r in (0, 1) for e in range(2) for b in range(2))  # no batch lost or repeated
    assert sorted(lines(log, "end")) == ["end 0", "end 1"]
    assert two_node_run["codes"] == [0, 0], "the reference run failed"
    assert_same_weights(tmp_path / "runs" / "elastic" / "weights" / "last.pt", two_node_run["last"])


def test_skip_next_draws_the_same_order_and_loads_only_the_rest():
    from yolo_cb.data.loading.loader import YOLODataLoader

    loaded = []

    class Recording(list):
        def __getitem__(self, i):
            loaded.append(i)
            return i

    loader = YOLODataLoader(Recording(range(10)), batch_size=3, shuffle=True, base_seed=7, span_epochs=True,
                            collate=torch.utils.data.default_collate)
    loader.set_epoch(2)
    full = [b.tolist() for b in loader]
    loaded.clear()
    loader.set_epoch(2)
    loader.skip_next(2)
    assert [b.tolist() for b in loader] == full[2:]
    assert loaded == [i for b in full[2:] for i in b]  # the skipped batches were never loaded
    loader.set_epoch(2)
    assert [b.tolist() for b in loader] == full  # one iteration only


def test_slurm_example_script_parses():
    script = ROOT / "scripts" / "slurm_train.sh"
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = script.read_text()
    assert "resume=auto" in text and "--rdzv-backend=c10d" in text and "scontrol requeue" in text
    assert "scripts/slurm_train.sh" in (ROOT / "docs" / "distributed.md").read_text()
