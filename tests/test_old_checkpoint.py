"""A checkpoint written before the redesign (commit a1e3525, tests/fixtures/README.md) still loads and resumes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_resume_safety import cli, write_data

from yolo_cb import YOLO
from yolo_cb.engine.checkpoint import load_checkpoint, model_from_checkpoint
from yolo_cb.nn import YOLOCB

pytestmark = pytest.mark.slow
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "a1e3525_tiny_last.pt"


def test_a_checkpoint_of_a1e3525_loads_without_a_checksum():
    ckpt = load_checkpoint(FIXTURE)
    assert "tensors_crc32" not in ckpt and ckpt["epoch"] == 0 and ckpt["finished"] is False
    model = model_from_checkpoint(ckpt)
    assert model(torch.zeros(1, 3, 64, 64)).shape[-1] == 5 + len(ckpt["names"])


def test_a_checkpoint_of_a1e3525_resumes_to_the_end(tmp_path, shapes_dir):
    data = write_data(tmp_path / "data", shapes_dir)  # the same 8 / 4 shapes images it was trained on
    ckpt = torch.load(FIXTURE, weights_only=True)
    ckpt["train_args"]["data"] = str(data)  # its recorded YAML lies on the machine that wrote it
    old = tmp_path / "old" / "last.pt"
    old.parent.mkdir()
    torch.save(ckpt, old)  # as a1e3525 wrote it: no checksum
    done = cli(tmp_path, f"resume={old}", f"project={tmp_path / 'runs'}", "name=resumed")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    last = load_checkpoint(tmp_path / "runs" / "resumed" / "weights" / "last.pt")
    assert last["epoch"] == 1 and last["finished"] is True and isinstance(last["tensors_crc32"], int)
    assert last["model_cfg"]["width"] == 0.0625


# --- a YOLOCB checkpoint written before its layers were one indexed list (backbone.*, neck.*, head.*) ------------------
YOLOCB_FIXTURE = FIXTURE.parent / "4f22c48_yolocb_tiny_last.pt"
YOLOCB_OUTPUT = FIXTURE.parent / "4f22c48_yolocb_tiny_out.pt"  # its EMA model's eval output, computed by 4f22c48


def fixed_input() -> torch.Tensor:
    return torch.linspace(0, 1, 3 * 64 * 64).reshape(torch.load(YOLOCB_OUTPUT, weights_only=True)["input_linspace"])


def same_as_4f22c48(output) -> bool:
    written = torch.load(YOLOCB_OUTPUT, weights_only=True)["output"]
    output = torch.as_tensor(output[0] if isinstance(output, (list, tuple)) else output).float()
    return output.shape == written.shape and torch.allclose(output, written, rtol=1e-4, atol=1e-5)


def test_a_yolocb_checkpoint_of_4f22c48_loads_under_the_indexed_names_with_the_same_outputs():
    written = torch.load(YOLOCB_FIXTURE, weights_only=True)
    assert next(iter(written["model"])) == "backbone.stem.conv.weight"  # the names it was written with
    ckpt = load_checkpoint(YOLOCB_FIXTURE)  # read as today's names
    assert all(k.startswith("model.") for k in (*ckpt["model"], *ckpt["ema"])) and "model.11.cls_branches.2.2.bias" in ckpt["ema"]
    model = model_from_checkpoint(ckpt)
    with torch.no_grad():
        assert same_as_4f22c48(model(fixed_input()))
    fresh = YOLOCB(**{k: v for k, v in ckpt["model_cfg"].items() if k != "family"}).eval()
    fresh.load_state_dict(written["ema"])  # the old keys straight into load_state_dict (its pre-hook maps them)
    with torch.no_grad():
        assert torch.equal(fresh(fixed_input()), model(fixed_input()))


def test_a_yolocb_checkpoint_of_4f22c48_resumes_to_the_end(tmp_path, shapes_dir):
    data = write_data(tmp_path / "data", shapes_dir)  # the same 8 / 4 shapes images it was trained on
    ckpt = torch.load(YOLOCB_FIXTURE, weights_only=True)
    ckpt["train_args"].update(data=str(data), freeze=["backbone.stem"])  # an old module name in its settings too
    old = tmp_path / "old" / "last.pt"
    old.parent.mkdir()
    torch.save(ckpt, old)
    YOLO(str(old)).train(resume=True, project=str(tmp_path / "runs"), name="resumed")
    last = load_checkpoint(tmp_path / "runs" / "resumed" / "weights" / "last.pt")
    assert last["epoch"] == 1 and last["finished"] is True and next(iter(last["model"])) == "model.0.conv.weight"
    stats = {k: v for k, v in load_checkpoint(YOLOCB_FIXTURE)["model"].items() if k.endswith("running_mean")}
    for key, value in stats.items():  # BatchNorm statistics moved in every layer but the stem, frozen as backbone.stem
        assert torch.equal(value, last["model"][key]) == key.startswith("model.0."), key


def test_a_yolocb_checkpoint_of_4f22c48_exports_to_graphs_with_its_outputs(tmp_path):
    old = tmp_path / "old.pt"
    old.write_bytes(YOLOCB_FIXTURE.read_bytes())
    x = fixed_input()
    onnx_file = Path(YOLO(str(old)).export(format="onnx", imgsz=64))
    onnxruntime = pytest.importorskip("onnxruntime")
    session = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    assert same_as_4f22c48(session.run(None, {session.get_inputs()[0].name: x.numpy()}))
    script = torch.jit.load(YOLO(str(old)).export(format="torchscript", imgsz=64))
    with torch.no_grad():
        assert same_as_4f22c48(script(x))
    openvino = pytest.importorskip("openvino")
    folder = Path(YOLO(str(old)).export(format="openvino", imgsz=64))
    compiled = openvino.Core().compile_model(str(next(folder.glob("*.xml"))), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    assert same_as_4f22c48(compiled(x.numpy())[compiled.output(0)])
