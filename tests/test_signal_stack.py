"""OpenVINO's CPU plugin replaces the signal stack of the thread that compiles a model and, when its core is freed, puts
back the one it replaced. Two models loaded one after the other leave the thread with the first plugin's stack after it
was unmapped; the next signal with a Python handler (SIGCHLD, once a DataLoader with workers ran) then kills the process
with a SIGSEGV that not even faulthandler reports. The suite's worker processes died that way, at random places, and the
run hung after it. Each case runs in a child process, so that the failure it looks for cannot take the suite with it."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("openvino")

# Two OpenVINO models loaded, freed in the order they were loaded, then a SIGCHLD with a Python handler (what torch's
# DataLoader installs) delivered by a child that exits. LOAD is how a model is loaded: OpenVINO directly, or yolo_cb.
CHILD = """
import gc, signal, subprocess, sys
import numpy as np, openvino as ov, openvino.opset13 as ops
from yolo_cb.utils.signal_stack import current_signal_stack

def save(folder):
    x = ops.parameter([1, 3, 32, 32], np.float32, name="images")
    y = ops.relu(x)
{shape_output}
    model = ov.Model([y], [x])
    ov.save_model(model, f"{{folder}}/m.xml")
    return folder

def load(folder):
{load}

before = current_signal_stack()
first = load(save(sys.argv[1]))
second = load(save(sys.argv[2]))
del first; gc.collect()
del second; gc.collect()
print("stack kept:", current_signal_stack() == before, flush=True)
signal.signal(signal.SIGCHLD, lambda *args: None)
subprocess.run(["true"], check=True)
print("alive after SIGCHLD", flush=True)
"""
RAW = """    core = ov.Core()
    return core, core.compile_model(f"{folder}/m.xml", "CPU")"""
YOLO_CB = """    from yolo_cb.prediction.backend import load_backend
    return load_backend(folder)"""


# yolo-cb loads only a model file shaped as a detector (batch, anchors, 5 + classes): its model's output is reshaped
# (OpenVINO alone, with the plain relu model, is the case known to crash)
AS_DETECTOR = "    y = ops.reshape(y, ops.constant(np.array([1, 512, 6], np.int64)), False)"


def run_child(load: str, tmp_path: Path, shape_output: str = "") -> subprocess.CompletedProcess:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    code = CHILD.format(load=textwrap.indent(textwrap.dedent(load), "    "), shape_output=shape_output)
    return subprocess.run([sys.executable, "-c", code, str(tmp_path / "a"), str(tmp_path / "b")], capture_output=True, text=True, timeout=120)


def test_openvino_alone_leaves_a_dangling_signal_stack(tmp_path):
    """The library's own behaviour, which the fix works around: if a later OpenVINO keeps the stack, this says so. The
    stack it leaves points into unmapped memory: the SIGCHLD that follows crashes the process when that memory was not
    mapped again in between, which is chance (about 1 run in 3 survived here), so only the dangling stack is asserted."""
    raw = run_child(RAW, tmp_path)
    if "stack kept: True" in raw.stdout:
        pytest.skip("this OpenVINO leaves the signal stack as it found it: kept_signal_stack is no longer needed")
    assert "stack kept: False" in raw.stdout, (raw.returncode, raw.stdout, raw.stderr[-2000:])
    assert raw.returncode in (0, -signal.SIGSEGV), (raw.returncode, raw.stdout, raw.stderr[-2000:])


def test_models_loaded_by_yolo_cb_keep_the_signal_stack(tmp_path):
    ours = run_child(YOLO_CB, tmp_path, AS_DETECTOR)
    assert ours.returncode == 0, (ours.returncode, ours.stdout, ours.stderr[-2000:])
    assert "stack kept: True" in ours.stdout and "alive after SIGCHLD" in ours.stdout, ours.stdout
