"""Exact resume, SIGINT handling, and refusing unsafe checkpoints."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from yolo_cb import YOLO
from yolo_cb.checkpoints.checkpoint import UnsafeCheckpointError, load_checkpoint
from yolo_cb.settings.config import ConfigError

pytestmark = pytest.mark.slow
EXACT = dict(deterministic=True, workers=0, mosaic=1.0, fliplr=0.5, warmup_epochs=1.0)


def rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k: v for k, v in r.items() if k != "time" and not k.startswith("time/")} for r in csv.DictReader(f)]  # wall times differ


@pytest.mark.parametrize("workers", [0, 2])  # 2: the workers' draws come from per-sample seeds, not from a worker's RNG
def test_resume_is_exact(tiny, tmp_path, workers):
    straight = YOLO("yolox-nano.yaml")
    straight.train(**{**tiny, **EXACT, "workers": workers, "epochs": 2, "name": "straight"})

    first = YOLO("yolox-nano.yaml")
    first.add_callback("on_fit_epoch_end", lambda t: setattr(t, "stop", True))
    first.train(**{**tiny, **EXACT, "workers": workers, "epochs": 2, "name": "split"})
    last = tmp_path / "runs" / "split" / "weights" / "last.pt"
    assert load_checkpoint(last).epoch == 0
    YOLO("yolox-nano.yaml").train(resume=str(last))

    a = load_checkpoint(tmp_path / "runs" / "straight" / "weights" / "last.pt")
    b = load_checkpoint(last)
    for key, one, other in (("model", a.model, b.model), ("ema", a.ema, b.ema)):
        diff = max((one[k].float() - other[k].float()).abs().max().item() for k in one)
        assert diff <= 1e-6, (key, diff)
    assert rows(tmp_path / "runs" / "straight" / "results.csv") == rows(tmp_path / "runs" / "split" / "results.csv")


def test_resume_refuses_changes_to_what_is_trained(tiny, tmp_path):
    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_train_batch_end", lambda t: setattr(t, "stop", True))
    model.train(**{**tiny, "epochs": 2})
    last = tmp_path / "runs" / "exp" / "weights" / "last.pt"
    with pytest.raises(ConfigError, match=r"cannot change imgsz=128 \(was 64\).*may change on resume: .*batch.*device.*epochs"):
        YOLO().train(resume=str(last), imgsz=128)


def test_sigint_stops_within_a_batch_and_resumes(tiny, tmp_path, monkeypatch):
    batches = tmp_path / "batches.log"
    args = [f"{k}={v}" for k, v in {**tiny, "epochs": 500, "callbacks": "on_train_batch_end=cbpkg:log_batch"}.items()]
    log = tmp_path / "train.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CBPKG_LOG": str(batches),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "yolo_cb", "train", *args], stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 300
        while "2/500" not in log.read_text() and time.monotonic() < deadline and proc.poll() is None:  # epoch 1 saved, epoch 2 under way
            time.sleep(0.05)
        seen_before = len(batches.read_text().split())
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=120)
    text = log.read_text()
    assert rc == 130, text[-2000:]
    assert "SIGINT received" in text and "Traceback" not in text
    # the batch running when the signal came finishes; at most one more can slip in between our count and the signal
    assert len(batches.read_text().split()) - seen_before <= 2
    last = tmp_path / "runs" / "exp" / "weights" / "last.pt"
    ckpt = load_checkpoint(last)
    assert ckpt.optimizer is not None and ckpt.epoch >= 1
    monkeypatch.setenv("CBPKG_LOG", str(batches))  # the resumed run gets cbpkg:log_batch again (a checkpoint names no code)
    resumed = YOLO()
    resumed.add_callback("on_fit_epoch_end", lambda t: setattr(t, "stop", True))
    metrics = resumed.train(resume=str(last), callbacks="on_train_batch_end=cbpkg:log_batch")
    assert "metrics/mAP50-95(B)" in metrics and resumed.trainer.start_epoch == ckpt.epoch + 1


class Payload:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_pickled_objects_are_refused_and_never_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    evil = tmp_path / "evil.pt"
    torch.save({"model": {}, "payload": Payload()}, evil)
    with pytest.raises(UnsafeCheckpointError, match="refused to load .*evil.pt"):
        load_checkpoint(evil)
    assert not (tmp_path / "PWNED").exists()
    module = tmp_path / "module.pt"
    torch.save({"model": torch.nn.Conv2d(3, 3, 1)}, module)
    with pytest.raises(UnsafeCheckpointError, match="pickled Python objects"):
        load_checkpoint(module)
    with pytest.raises(UnsafeCheckpointError):
        YOLO(str(module))
