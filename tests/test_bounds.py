"""Inputs without bounds (security round 4): a few bytes of model YAML or checkpoint that asked for tens of GB, 100000
classes whose confusion matrix needed 74.5 GiB after the epoch, and memory checks that read free memory but not the
process's own limit. Each is refused in one line before anything is allocated, or bounded."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from yolo_cb import YOLO
from yolo_cb.evaluation.validator import MAX_CONFUSION_CLASSES

AS_LIMIT = 8 * 2**30  # the address space the children may map (ulimit -v): a machine, or a container, with 8 GB


def run_limited(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """A fresh process under an 8 GB address-space limit."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
    return subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=300, preexec_fn=limit, stdin=subprocess.DEVNULL)


def yolo_cb(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_limited(sys.executable, "-m", "yolo_cb", *argv, cwd=cwd)


@pytest.mark.parametrize("text, said", [("depth: 1000\nwidth: 0.25\n", "depth=1000 is not a number in (0, 4]"),
                                        ("depth: 0.33\nwidth: 64\n", "width=64 is not a number in (0, 4]"),
                                        ("depth: 1.33\nwidth: 4.0\n", "more than half the")])
def test_a_model_yaml_beyond_the_bounds_is_refused_before_building(tmp_path, shapes_small_yaml, text, said):
    (tmp_path / "huge.yaml").write_text(text)
    done = yolo_cb("train", "model=huge.yaml", f"data={shapes_small_yaml}", "epochs=1", "imgsz=64", f"project={tmp_path / 'runs'}",
                   cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and said in lines[0] and "model huge" in lines[0], done.stderr[-2000:]
    assert not list(tmp_path.rglob("*.pt"))  # no checkpoint: refused before any weights exist


def test_a_checkpoint_whose_model_record_asks_for_width_64_is_refused(tmp_path, shapes_small_yaml):
    crafted = {"model": {}, "model_cfg": {"depth": 0.33, "width": 64.0, "depthwise": False, "act": "silu"}, "names": {0: "a"},
               "train_args": {}, "epoch": 0}
    torch.save(crafted, tmp_path / "crafted.pt")
    done = yolo_cb("val", "model=crafted.pt", f"data={shapes_small_yaml}", "imgsz=64", cwd=tmp_path)
    assert done.returncode == 2 and "width=64.0 is not a number in (0, 4]" in done.stderr, done.stderr[-2000:]


def test_the_memory_a_process_may_take_counts_its_own_limit(tmp_path):
    code = "from yolo_cb.utils.memory import available_memory; print(available_memory())"
    limited = run_limited(sys.executable, "-c", code, cwd=tmp_path)
    free = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert limited.returncode == 0 and 0 < int(limited.stdout) < AS_LIMIT
    assert int(free.stdout) > 0


@pytest.mark.slow
def test_more_classes_than_a_confusion_matrix_holds_validate_without_one(tmp_path, shapes_small_yaml, tiny, caplog):
    """100000 classes asked for a 74.5 GiB matrix (measured: MemoryError after the epoch); past MAX_CONFUSION_CLASSES
    the matrix is not kept (one line), and the run ends normally with its metrics."""
    text = shapes_small_yaml.read_text().replace("names: [circle, rectangle, triangle, cross]",
                                                 "names: [" + ", ".join(f"c{i}" for i in range(MAX_CONFUSION_CLASSES + 1)) + "]")
    many = tmp_path / "many.yaml"
    many.write_text(text)
    model = YOLO("yolox-nano.yaml")
    metrics = model.train(**{**tiny, "data": str(many)})
    assert model.trainer.validator.confusion_matrix is None and metrics.confusion_matrix is None
    assert f"no confusion matrix: {MAX_CONFUSION_CLASSES + 1} classes" in caplog.text
    assert "metrics/mAP50-95(B)" in metrics
