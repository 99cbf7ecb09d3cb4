"""load_backend: an nn.Module, a .pt checkpoint and an .onnx file give the same outputs and metadata."""

from __future__ import annotations

import json

import pytest
import torch

from yolo_cb.checkpoints.checkpoint import Checkpoint, model_from_checkpoint, save_checkpoint
from yolo_cb.export.exporter import export_onnx
from yolo_cb.nn import build_model
from yolo_cb.prediction.backend import load_backend, parse_names
from yolo_cb.utils.device import select_device

NAMES = {0: "a", 1: "b", 2: "c"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("backend")
    torch.manual_seed(1)
    model = build_model("yolox-nano", nc=3, verbose=False)
    state = model.state_dict()
    weights = save_checkpoint(Checkpoint(model=state, ema=state, model_cfg=dict(model.cfg), names=NAMES, train_args={},
                                         epoch=0, version="0", date="2026-01-01"), root / "best.pt")
    fused = model_from_checkpoint(weights).fuse()
    metadata = {"names": json.dumps(NAMES), "imgsz": [64, 64], "stride": 32, "batch": 1}
    onnx_file = export_onnx(fused, root / "best.onnx", (64, 64), opset=17, simplify=False, metadata=metadata)
    return {"weights": weights, "onnx": onnx_file}


def test_module_backend_leaves_the_model_alone():
    model = build_model("yolox-nano", nc=2, verbose=False).eval()
    backend = load_backend(model)
    assert backend.kind == "pytorch" and backend.nc == 2 and backend.stride == 32 and backend.names == {0: "0", 1: "1"}
    assert backend.imgsz is None and backend.batch is None and backend.device == torch.device("cpu")
    x = torch.rand(1, 3, 64, 64)
    y = backend(x)
    assert y.shape == (1, 84, 7)
    assert not isinstance(model.backbone.backbone.stem.conv.bn, torch.nn.Identity)  # not fused in place


def test_pt_and_onnx_backends_agree(files):
    pt = load_backend(files["weights"])
    onnx = load_backend(str(files["onnx"]))
    assert pt.kind == "pytorch" and onnx.kind == "onnx"
    assert pt.names == onnx.names == NAMES and pt.nc == onnx.nc == 3 and pt.stride == onnx.stride == 32
    assert onnx.imgsz == (64, 64) and onnx.batch == 1
    x = torch.rand(1, 3, 64, 64)
    a, b = pt(x), onnx(x)
    assert a.shape == b.shape == (1, 84, 8) and isinstance(b, torch.Tensor)
    assert (a - b).abs().max() < 1e-4
    with pytest.raises(ValueError, match="fixed image size"):
        onnx(torch.rand(1, 3, 96, 96))
    with pytest.raises(ValueError, match="fixed batch"):
        onnx(torch.rand(2, 3, 64, 64))


def test_errors_and_helpers(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_backend(tmp_path / "missing.pt")
    bad = tmp_path / "model.bin"
    bad.write_bytes(b"x")
    with pytest.raises(ValueError, match="unsupported"):
        load_backend(bad)
    assert parse_names('{"0": "cat", "1": "dog"}') == {0: "cat", 1: "dog"}
    assert parse_names("{0: 'cat'}") == {0: "cat"} and parse_names(["x", "y"]) == {0: "x", 1: "y"}
    assert select_device("cpu") == torch.device("cpu")
