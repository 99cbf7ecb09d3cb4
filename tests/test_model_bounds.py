"""Model files that exhaust the machine or never finish (issue 59, section 4), and SIGTERM where Python cannot act.

Each crafted file is a few hundred bytes. Each case runs the real CLI (`python -m yolo_cb predict ...`) in a
subprocess under an address-space cap (RLIMIT_AS, set in the child before exec: no cgroup needed), so a case that
regresses fails in the child instead of swamping the machine. The cap is CAP: 3 GiB above the ~3.8 GiB of address
space that a normal predict maps (PyTorch's CUDA build alone maps 3.1 GiB, so `ulimit -v 3G` cannot import torch at
all); a bomb must stay under 3 GiB of resident memory (the kernel's peak RSS of the CLI and every process it waited for,
from os.wait4) and end with one `yolo-cb: error:` line, exit status 2. Hangs get SIGTERM once they are under way and
must end within 15 s of it.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
import torch
from conftest import wait_with_peak_rss
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from yolo_cb.checkpoints.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from yolo_cb.errors import CheckpointError
from yolo_cb.nn import build_model
from yolo_cb.settings.config import load_defaults

ROOT = Path(__file__).resolve().parents[1]
CAP = 7 * 2**30  # bytes of address space: what a normal predict maps (~3.8 GiB) and 3 GiB more
RSS_LIMIT_KIB = 3 * 2**20  # 3 GiB
SIGTERM_BOUND_S = 15  # the bound: a SIGTERM ends the process within 15 s
TRUST = ["trust=True"] if "trust" in load_defaults() else []  # a TorchScript file we did not write, where trust= exists
N = 60000  # [1, N, N] float32: 14.4 GB


# --- crafted files ---------------------------------------------------------------------------------------------------
def onnx_file(path: Path, nodes: list, inits: list) -> Path:
    """A graph from `images` (1, 3, 64, 64) to `output0` (1, anchors, 6): shaped as a one-class detector."""
    graph = oh.make_graph(nodes, "crafted", [oh.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 64, 64])],
                          [oh.make_tensor_value_info("output0", TensorProto.FLOAT, [1, "anchors", 6])], initializer=inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def first_six(big: str) -> tuple[list, list]:
    """Nodes taking [1, n, n] `big` to output0 [1, n, 6], plus the image's mean (so the graph reads its input)."""
    nodes = [oh.make_node("Slice", [big, "start", "end", "axis"], ["cut"]), oh.make_node("ReduceMean", ["images"], ["mean"]),
             oh.make_node("Reshape", ["mean", "shape3"], ["mean3"]), oh.make_node("Add", ["cut", "mean3"], ["output0"])]
    inits = [const("start", np.array([0], np.int64)), const("end", np.array([6], np.int64)), const("axis", np.array([2], np.int64)),
             const("shape3", np.array([1, 1, 1], np.int64))]
    return nodes, inits


def constant_of_shape(path: Path) -> Path:
    fill = oh.make_tensor("fill", TensorProto.FLOAT, [1], [0.0])
    tail, inits = first_six("big")
    return onnx_file(path, [oh.make_node("ConstantOfShape", ["size"], ["big"], value=fill), *tail],
                     [const("size", np.array([1, N, N], np.int64)), *inits])


def expand(path: Path, n: int = N) -> Path:
    tail, inits = first_six("big")
    nodes = [oh.make_node("ReduceMean", ["images"], ["m"]), oh.make_node("Reshape", ["m", "shape3"], ["m3"]),
             oh.make_node("Expand", ["m3", "size"], ["big"]), *tail]
    return onnx_file(path, nodes, [const("size", np.array([1, n, n], np.int64)), *inits])


def loop(path: Path, from_image: bool = False) -> Path:
    """An ONNX Loop of 10^12 iterations; `from_image`: 10^12 x the image's brightest pixel (0 on a black image)."""
    float_1 = oh.make_tensor_value_info
    body = oh.make_graph([oh.make_node("Identity", ["c_in"], ["c_out"]), oh.make_node("Add", ["v_in", "one"], ["v_out"])], "body",
                         [float_1("i", TensorProto.INT64, []), float_1("c_in", TensorProto.BOOL, []), float_1("v_in", TensorProto.FLOAT, [1])],
                         [float_1("c_out", TensorProto.BOOL, []), float_1("v_out", TensorProto.FLOAT, [1])],
                         initializer=[const("one", np.array([1.0], np.float32))])
    if from_image:
        count = [oh.make_node("ReduceMax", ["images"], ["top"], keepdims=0), oh.make_node("Mul", ["top", "scale"], ["trips_f"]),
                 oh.make_node("Cast", ["trips_f"], ["trips"], to=TensorProto.INT64)]
        inits = [const("scale", np.array(1e12, np.float32))]
    else:
        count, inits = [], [const("trips", np.array(10**12, np.int64))]
    nodes = [*count, oh.make_node("Loop", ["trips", "go", "v0"], ["v"], body=body), oh.make_node("Expand", ["v", "out_shape"], ["output0"])]
    return onnx_file(path, nodes, [*inits, const("go", np.array(True)), const("v0", np.array([0.0], np.float32)),
                                   const("out_shape", np.array([1, 100, 6], np.int64))])


class Ones(torch.nn.Module):
    def forward(self, x):
        return torch.ones(60000, 60000)[:100, :6].unsqueeze(0) + x.mean()


class Spin(torch.nn.Module):
    def forward(self, x):
        y = x.mean()
        for _ in range(1000000000000):
            y = y + 1.0
        return y.expand(1, 100, 6)


def torchscript(path: Path, module: torch.nn.Module) -> Path:
    """Allowed ops only (torchscript_check.ALLOWED_OPS), one class in its metadata."""
    torch.jit.save(torch.jit.script(module), str(path), _extra_files={"config.txt": '{"names": {"0": "a"}, "stride": 32}'})
    return path


def ncnn_interp(folder: Path) -> Path:
    """An ncnn model whose Interp scales the image to 30000 x 30000 (10.8 GB) before cutting a detector's output."""
    folder.mkdir()
    (folder / "model.ncnn.param").write_text("7767517\n4 4\nInput images 0 1 images 0=64 1=64 2=3\n"
                                             "Interp interp 1 1 images big 0=1 3=30000 4=30000\n"
                                             "Crop crop 1 1 big cut -23309=2,0,0 -23310=2,6,100 -23311=2,0,1\n"
                                             "Reshape reshape 1 1 cut output0 0=6 1=-1\n")
    (folder / "model.ncnn.bin").write_bytes(b"")
    return folder


def mnn_broadcast(path: Path) -> Path:
    """An MNN model that broadcasts the image's mean to [1, 60000, 60000] before cutting a detector's output."""
    expr = pytest.importorskip("MNN", reason="MNN is not installed: pip install 'yolo-cb[mnn]'").expr
    x = expr.placeholder([1, 3, 64, 64], expr.NCHW, expr.float)
    x.name = "images"
    big = expr.broadcast_to(expr.reshape(expr.reduce_mean(x), [1, 1, 1]), [1, N, N])
    y = expr.slice(big, expr.const(np.array([0, 0, 0], np.int32), [3], expr.NCHW, expr.int),
                   expr.const(np.array([1, 100, 6], np.int32), [3], expr.NCHW, expr.int))
    y.name = "output0"
    expr.save([y], str(path))
    return path


def mnn_trigger(path: Path) -> Path:
    """An MNN model whose work grows with the image's brightest pixel: nothing on a black image, four products of
    [7060, 7060] matrices (minutes) on a gray one."""
    expr = pytest.importorskip("MNN", reason="MNN is not installed: pip install 'yolo-cb[mnn]'").expr

    def scalar(value: float):
        return expr.const(np.array(value, np.float32), [], expr.NCHW, expr.float)

    x = expr.placeholder([1, 3, 64, 64], expr.NCHW, expr.float)
    x.name = "images"
    n = expr.cast(expr.reduce_max(x) * scalar(20000.0) + scalar(1.0), expr.int)
    square = expr.fill(expr.stack([n, n]), scalar(0.5))
    work = expr.matmul(square, square)
    for _ in range(3):
        work = expr.matmul(expr.sin(work), square)
    y = expr.reshape(expr.reduce_sum(work), [1, 1, 1]) + expr.const(np.zeros((1, 100, 6), np.float32), [1, 100, 6], expr.NCHW, expr.float)
    y.name = "output0"
    expr.save([y], str(path))
    return path


# --- the CLI in a capped child ---------------------------------------------------------------------------------------
def capped_child() -> None:
    """In the child before exec: the address-space cap, and SIGINT / SIGTERM at their defaults (as from a shell)."""
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def start(cwd: Path, mode: str, *args: str) -> subprocess.Popen:
    """`python -m yolo_cb MODE ARGS` under the cap; its output in cwd/out.txt; modules in cwd importable (callbacks)."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join([str(ROOT), str(cwd)]), "HOME": str(cwd), "TMPDIR": str(cwd),
           "OMP_NUM_THREADS": "1", "MARKER": str(cwd / "reached"), "PYTHONUNBUFFERED": "1"}
    with open(cwd / "out.txt", "w") as out:
        return subprocess.Popen([sys.executable, "-m", "yolo_cb", mode, *args], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, preexec_fn=capped_child)


def predict_line(tmp_path: Path, model: Path, *extra: str) -> tuple[str, str]:
    """Predict with `model` under the cap: its one error line (exit 2, peak RSS under 3 GiB) and its output."""
    image = tmp_path / "img.jpg"
    cv2.imwrite(str(image), np.full((64, 64, 3), 90, np.uint8))
    code, peak = wait_with_peak_rss(start(tmp_path, "predict", f"model={model}", f"source={image}", "imgsz=64", "save=False", *extra), 600)
    output = (tmp_path / "out.txt").read_text()
    errors = [line for line in output.splitlines() if line.startswith("yolo-cb: error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in output, (code, output[-3000:])
    assert peak < RSS_LIMIT_KIB, (peak, output[-2000:])
    return errors[0], output


def probe_children(pid: int) -> list[int]:
    """The probe processes that `pid` started (found in /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and b"probe_child" in cmdline:
            found.append(int(stat.parent.name))
    return found


def terminate_when_stuck(child: subprocess.Popen, marker: Path, in_probe: bool = True) -> tuple[int, float]:
    """Once the child is stuck (its probe runs, or a callback marked the point past which it hangs), SIGTERM it once:
    (exit status, seconds from the signal to its end). in_probe=False: only the marker counts (a model that passes its
    probe, whose child would otherwise be taken for the hang and the signal sent while the model still loads)."""
    deadline = time.monotonic() + 300
    while (child.poll() is None and not marker.exists() and not (in_probe and probe_children(child.pid))
           and time.monotonic() < deadline):
        time.sleep(0.2)
    assert child.poll() is None, "the child ended before it was stuck"
    time.sleep(2)  # well inside the loop, or the hung callback
    sent = time.monotonic()
    child.send_signal(signal.SIGTERM)
    code, _ = wait_with_peak_rss(child, 120)
    return code, time.monotonic() - sent


MARK = "import os\n\ndef mark(obj):\n    open(os.environ['MARKER'], 'w').close()\n"
HANG = "import os, threading\n\ndef hang(trainer):\n    open(os.environ['MARKER'], 'w').close()\n    threading.Event().wait()\n"


# --- memory ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("build", [constant_of_shape, expand], ids=["ConstantOfShape", "Expand"])
def test_an_onnx_memory_bomb_is_one_line(tmp_path, build):
    """The report: 400 bytes of ONNX reached 3 GB within 10-20 s (under `ulimit -v`: a traceback)."""
    line, _ = predict_line(tmp_path, build(tmp_path / "bomb.onnx"))
    assert "bomb.onnx: not loaded: it needs more than" in line and "GiB of memory" in line, line


def test_a_torchscript_ones_60000_squared_is_one_line(tmp_path):
    line, _ = predict_line(tmp_path, torchscript(tmp_path / "bomb.torchscript", Ones()), *TRUST)
    assert "bomb.torchscript: not loaded: it needs more than" in line, line


def test_an_ncnn_interp_to_30000_squared_is_one_line(tmp_path):
    pytest.importorskip("ncnn", reason="ncnn is not installed: pip install 'yolo-cb[ncnn]'")
    line, _ = predict_line(tmp_path, ncnn_interp(tmp_path / "bomb_ncnn_model"))
    assert "bomb_ncnn_model: not loaded: it needs more than" in line, line


def test_an_mnn_broadcast_to_60000_squared_is_one_line(tmp_path):
    """MNN does not check the allocation: under the probe's limit it crashes, in the probe."""
    line, _ = predict_line(tmp_path, mnn_broadcast(tmp_path / "bomb.mnn"))
    assert "bomb.mnn: not loaded: " in line and ("needs more than" in line or "MNN crashed on it" in line), line


# --- time and SIGTERM ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("build", ["onnx", "torchscript"])
def test_sigterm_ends_a_predict_stuck_in_a_loop_of_10_12_iterations(tmp_path, build):
    """The report: an ONNX Loop or a TorchScript for of 10^12 iterations hung predict, and SIGTERM was ignored."""
    model = loop(tmp_path / "spin.onnx") if build == "onnx" else torchscript(tmp_path / "spin.torchscript", Spin())
    (tmp_path / "mark.py").write_text(MARK)
    cv2.imwrite(str(tmp_path / "img.jpg"), np.full((64, 64, 3), 90, np.uint8))
    child = start(tmp_path, "predict", f"model={model}", f"source={tmp_path / 'img.jpg'}", "imgsz=64", "save=False",
                  "callbacks=on_predict_batch_start=mark:mark", *(TRUST if build == "torchscript" else []))
    code, seconds = terminate_when_stuck(child, tmp_path / "reached")
    assert seconds < SIGTERM_BOUND_S, (seconds, code, (tmp_path / "out.txt").read_text()[-2000:])
    assert code in (143, -signal.SIGTERM), (code, (tmp_path / "out.txt").read_text()[-2000:])


def test_sigterm_ends_a_predict_stuck_inside_onnx_runtime(tmp_path):
    """A Loop whose trip count comes from the image passes the probe (a black image: 0 trips) and hangs on the real
    image, inside one ONNX Runtime call where Python's SIGTERM handler never runs: the process still ends, status 143."""
    (tmp_path / "mark.py").write_text(MARK)
    cv2.imwrite(str(tmp_path / "img.jpg"), np.full((64, 64, 3), 90, np.uint8))
    child = start(tmp_path, "predict", f"model={loop(tmp_path / 'trigger.onnx', from_image=True)}", f"source={tmp_path / 'img.jpg'}",
                  "imgsz=64", "save=False", "callbacks=on_predict_batch_start=mark:mark")
    code, seconds = terminate_when_stuck(child, tmp_path / "reached", in_probe=False)
    output = (tmp_path / "out.txt").read_text()
    assert seconds < SIGTERM_BOUND_S and code == 143, (seconds, code, output[-2000:])
    assert "SIGTERM received" in output and "has not stopped" in output, output[-2000:]


def test_sigterm_ends_a_predict_stuck_inside_mnn_which_holds_the_gil(tmp_path):
    """MNN keeps Python's lock while it runs, so no thread of ours can act: around its calls the signal goes to the OS."""
    (tmp_path / "mark.py").write_text(MARK)
    cv2.imwrite(str(tmp_path / "img.jpg"), np.full((64, 64, 3), 90, np.uint8))
    child = start(tmp_path, "predict", f"model={mnn_trigger(tmp_path / 'trigger.mnn')}", f"source={tmp_path / 'img.jpg'}",
                  "imgsz=64", "save=False", "callbacks=on_predict_batch_start=mark:mark")
    code, seconds = terminate_when_stuck(child, tmp_path / "reached")
    assert seconds < SIGTERM_BOUND_S and code in (143, -signal.SIGTERM), (seconds, code, (tmp_path / "out.txt").read_text()[-2000:])


LIBRARY = """
import os, signal, time
from yolo_cb.utils.signal_stack import BASE_GRACE_S, signal_deadline
try:
    with signal_deadline():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
except KeyboardInterrupt:
    print("interrupted", flush=True)
time.sleep(BASE_GRACE_S + 3)  # past the grace: the caller that caught the interrupt goes on
signal.signal(signal.SIGTERM, lambda signum, frame: print("the user's handler", flush=True))
with signal_deadline():
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(BASE_GRACE_S + 3)  # a handler of the user's that does not end the process is left to decide
print("alive", flush=True)
"""


def test_the_deadline_leaves_a_caller_that_goes_on_alone(tmp_path):
    """From Python (a notebook's Ctrl-C), the block's end stops the watch; a user's own SIGTERM handler is obeyed."""
    done = subprocess.run([sys.executable, "-c", LIBRARY], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=120, preexec_fn=capped_child)
    assert done.returncode == 0 and done.stdout.split() == ["interrupted", "the", "user's", "handler", "alive"], (done.stdout, done.stderr)


def test_a_probe_that_does_not_finish_refuses_the_file(tmp_path):
    from yolo_cb.prediction.probe import check_model_file

    with pytest.raises(CheckpointError, match=r"spin.onnx: not loaded: it did not finish in 3 s"):
        check_model_file(loop(tmp_path / "spin.onnx"), 64, seconds=3)


def test_a_probe_verdict_is_kept_for_the_same_bytes(tmp_path):
    """A second check of the same file starts no process; the file rewritten in place (same size) is probed again."""
    from yolo_cb.prediction.probe import check_model_file

    model = expand(tmp_path / "small.onnx", n=100)
    check_model_file(model, 64)
    before = os.times()
    check_model_file(model, 64)
    assert os.times().children_user + os.times().children_system == before.children_user + before.children_system
    expand(model, n=200)  # the same size and graph, another shape value
    check_model_file(model, 64)
    assert os.times().children_user + os.times().children_system > before.children_user + before.children_system


# --- training --------------------------------------------------------------------------------------------------------
def small_data(folder: Path) -> Path:
    """8 train images (one batch) and 4 val images of ../shared/datasets/shapes, in place."""
    from shared_data import SHARED

    shapes = SHARED / "datasets" / "shapes"
    if not shapes.exists():
        pytest.skip(f"{shapes} is missing (../shared datasets)")
    folder.mkdir()
    (folder / "train.txt").write_text("\n".join(map(str, sorted((shapes / "images" / "train").glob("*.jpg"))[:8])) + "\n")
    (folder / "val.txt").write_text("\n".join(map(str, sorted((shapes / "images" / "val").glob("*.jpg"))[:4])) + "\n")
    (folder / "data.yaml").write_text(f"path: {folder}\ntrain: train.txt\nval: val.txt\nnames: [circle, rectangle, triangle, cross]\n")
    return folder / "data.yaml"


def test_sigterm_ends_a_training_whose_callback_hangs_and_keeps_the_finished_epoch(tmp_path):
    """The report: a callback that hangs ignored SIGTERM. The hang is in on_fit_epoch_end of epoch 1; SIGTERM ends the
    process within 15 s with status 143, and last.pt holds epoch 1."""
    (tmp_path / "hang.py").write_text(HANG)
    settings = dict(model="yolox-nano.yaml", data=small_data(tmp_path / "data"), imgsz=64, batch=8, epochs=2, workers=0, mosaic=0.0,
                    val=False, mlflow=False, tensorboard=False, onnx_check=False, plots=False, no_aug_epochs=0, warmup_epochs=0.0,
                    project=tmp_path / "runs", name="exp", callbacks="on_fit_epoch_end=hang:hang")
    child = start(tmp_path, "train", *(f"{k}={v}" for k, v in settings.items()))
    code, seconds = terminate_when_stuck(child, tmp_path / "reached")
    output = (tmp_path / "out.txt").read_text()
    assert seconds < SIGTERM_BOUND_S and code == 143, (seconds, code, output[-3000:])
    assert load_checkpoint(tmp_path / "runs" / "exp" / "weights" / "last.pt").epoch == 0  # the first epoch, finished


# --- the normal path under the same cap ------------------------------------------------------------------------------
def test_our_own_onnx_export_predicts_under_the_cap(tmp_path):
    """The cap is no bomb's bound: a real export passes its probe and predicts under it (exit 0)."""
    torch.manual_seed(0)
    model = build_model("yolox-nano", nc=2, verbose=False)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    weights = save_checkpoint(Checkpoint(model=state, ema=state, model_cfg=dict(model.cfg), names={0: "a", 1: "b"}, train_args={"imgsz": 64},
                                         epoch=0, best_fitness=0.0, version="0.1.0", date="2026-01-01T00:00:00"), tmp_path / "m.pt")
    from yolo_cb import YOLO

    exported = YOLO(str(weights)).export(format="onnx", imgsz=64)
    cv2.imwrite(str(tmp_path / "img.jpg"), np.full((64, 64, 3), 90, np.uint8))
    code, peak = wait_with_peak_rss(start(tmp_path, "predict", f"model={exported}", f"source={tmp_path / 'img.jpg'}", "imgsz=64", "save=False"), 600)
    assert code == 0 and peak < RSS_LIMIT_KIB, (code, peak, (tmp_path / "out.txt").read_text()[-3000:])
