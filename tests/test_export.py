"""Exporter: ONNX / TorchScript export of a real checkpoint, verification, OpenCV DNN, dynamic axes, the docs example."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from yolo_cb.callbacks import Callbacks
from yolo_cb.checkpoints.checkpoint import Checkpoint, model_from_checkpoint, save_checkpoint
from yolo_cb.export.exporter import Exporter, ExportError, compare, dataset_image, sample_image, verify_onnx
from yolo_cb.nn import build_model
from yolo_cb.prediction.backend import load_backend
from yolo_cb.prediction.predictor import Predictor, preprocess

NAMES = {0: "circle", 1: "square", 2: "triangle", 3: "star"}
ROOT = Path(__file__).resolve().parents[1]


def make_checkpoint(path: Path, train_args: dict | None = None) -> Path:
    """A minimal valid yolo-cb checkpoint of a random yolox-nano (nc=4) whose scores give some detections."""
    torch.manual_seed(0)
    model = build_model("yolox-nano", nc=len(NAMES), verbose=False)
    with torch.no_grad():  # move the scores off the 0.01 prior so an untrained model yields boxes at conf 0.25
        for conv in (*model.head.obj_preds, *model.head.cls_preds):
            conv.bias.fill_(0.5)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ckpt = Checkpoint(model=state, ema=state, model_cfg=dict(model.cfg), names=NAMES, train_args=train_args or {"imgsz": 96},
                      epoch=0, best_fitness=0.0, version="0.1.0", date="2026-01-01T00:00:00")
    return save_checkpoint(ckpt, path)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    images = root / "shapes" / "images" / "val"
    images.mkdir(parents=True)
    cv2.imwrite(str(images / "scene.jpg"), sample_image((120, 160), seed=3))
    data_yaml = root / "shapes.yaml"
    data_yaml.write_text(f"path: {root / 'shapes'}\ntrain: images/val\nval: images/val\nnames: {json.dumps(list(NAMES.values()))}\n")
    weights = make_checkpoint(root / "weights" / "best.pt", {"imgsz": 96, "data": str(data_yaml)})
    return {"root": root, "weights": weights, "data": data_yaml, "image": images / "scene.jpg"}


@pytest.fixture(scope="module")
def static_onnx(workdir):
    events = []
    callbacks = Callbacks()
    callbacks.add_callback("on_export_start", lambda e: events.append(("start", e.output)))
    callbacks.add_callback("on_export_end", lambda e: events.append(("end", Path(e.output).is_file())))
    exporter = Exporter({"imgsz": 64, "format": "onnx"}, callbacks=callbacks)
    path = exporter(str(workdir["weights"]))
    return {"path": Path(path), "exporter": exporter, "events": events}


def image_tensor(path: Path, size) -> torch.Tensor:
    return preprocess(cv2.imread(str(path)), size)[0][None]


def test_onnx_export_verifies_and_has_metadata(workdir, static_onnx):
    path, exporter = static_onnx["path"], static_onnx["exporter"]
    assert path == workdir["weights"].with_suffix(".onnx") and exporter.output == path and exporter.file == workdir["weights"]
    assert static_onnx["events"] == [("start", path), ("end", True)]
    assert exporter.verification["max_abs"] < 1e-3
    assert exporter.image_path == str(workdir["image"])  # a real image from the checkpoint's dataset
    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert {int(k): v for k, v in json.loads(meta["names"]).items()} == NAMES
    assert json.loads(meta["imgsz"]) == [64, 64] and meta["stride"] == "32" and meta["task"] == "detect" and meta["batch"] == "1"
    assert meta["version"] and meta["date"]
    model = model_from_checkpoint(workdir["weights"])
    result = verify_onnx(path, model, image_tensor(workdir["image"], 64))
    assert result["max_err"] < 1e-3 and set(result) == {"max_abs", "max_rel", "max_err"}


def test_verification_failure_reports_the_difference(workdir, static_onnx):
    exporter = Exporter({"imgsz": 64, "export_tol": 1e-12})
    exporter.image_path = "scene"
    noisy = model_from_checkpoint(workdir["weights"])
    with torch.no_grad():
        noisy.head.reg_preds[0].bias.add_(0.05)
    with pytest.raises(ExportError, match=r"differs from PyTorch by \d"):
        exporter._verify("onnx", static_onnx["path"], noisy, image_tensor(workdir["image"], 64))


def test_tolerance_scales_with_the_value():
    """The demo once failed on float noise: 0.00122 px on a box coordinate of ~300 px (1e-3 abs tolerance)."""
    reference = np.array([[[300.0, 250.0, 40.0, 30.0, 0.9, 0.2]]])
    noisy_box = reference + np.array([[[0.00122, -0.0009, 0.0, 0.0, 0.0, 0.0]]])
    assert compare(noisy_box, reference)["max_abs"] > 1e-3  # what the old absolute rule refused
    assert compare(noisy_box, reference)["max_err"] < 1e-5
    wrong_score = reference + np.array([[[0.0, 0.0, 0.0, 0.0, 0.002, 0.0]]])
    assert compare(wrong_score, reference)["max_err"] == pytest.approx(0.002)  # scores stay absolute


def test_opencv_dnn_matches_onnxruntime(workdir, static_onnx):
    x = image_tensor(workdir["image"], 64).numpy()
    net = cv2.dnn.readNetFromONNX(str(static_onnx["path"]))
    net.setInput(x)
    cv_out = net.forward()
    ort_out = ort.InferenceSession(str(static_onnx["path"])).run(None, {"images": x})[0]
    assert cv_out.shape == ort_out.shape == (1, 8 * 8 + 4 * 4 + 2 * 2, 9)
    assert np.abs(cv_out - ort_out).max() < 1e-3


def test_dynamic_export_batches_and_sizes(workdir, tmp_path):
    weights = tmp_path / "dyn.pt"
    weights.write_bytes(workdir["weights"].read_bytes())
    path = Exporter({"imgsz": 64, "dynamic": True, "simplify": True})(str(weights))
    session = ort.InferenceSession(path)
    model = model_from_checkpoint(weights).fuse()
    scene = sample_image((100, 140), seed=1)
    for batch, size in ((1, (64, 64)), (4, (96, 64))):
        x = torch.stack([preprocess(np.roll(scene, 7 * i, axis=1), size)[0] for i in range(batch)])
        y = session.run(None, {"images": x.numpy()})[0]
        anchors = sum((size[0] // s) * (size[1] // s) for s in (8, 16, 32))
        assert y.shape == (batch, anchors, 9)
        with torch.no_grad():
            assert np.abs(y - model(x).numpy()).max() < 1e-3
    net = cv2.dnn.readNetFromONNX(path)  # OpenCV runs the dynamic graph too, at a size other than the export's
    net.setInput(x.numpy())
    assert np.abs(net.forward() - y).max() < 1e-3
    backend = load_backend(path)
    assert backend.imgsz is None and backend.batch is None and backend.names == NAMES


def test_torchscript_export_of_a_module(workdir, tmp_path):
    model = model_from_checkpoint(workdir["weights"])
    exporter = Exporter({"format": "torchscript", "imgsz": 64, "project": str(tmp_path)})
    path = Path(exporter(model))
    assert path.parent == tmp_path and path.suffix == ".torchscript"
    assert exporter.verification["max_abs"] < 1e-3
    backend = load_backend(path)  # the verification above already ran the file against PyTorch
    assert backend.kind == "torchscript" and backend.names == NAMES and backend.imgsz == (64, 64) and backend.batch == 1


def test_half_torchscript_needs_cuda():
    """fp16 TorchScript holds fp16 weights run by torch: CUDA only (ONNX / OpenVINO fp16 is a CPU conversion, see test_export_formats)."""
    if torch.cuda.is_available():
        pytest.skip("CUDA present: half export is allowed")
    with pytest.raises(ExportError, match="CUDA"):
        Exporter({"half": True, "format": "torchscript"})("missing.pt")


def test_dataset_image_resolution(workdir, tmp_path):
    assert dataset_image(str(workdir["data"])) == workdir["image"]
    assert dataset_image(str(tmp_path / "nope.yaml")) is None
    assert dataset_image(None) is None


def test_docs_example_matches_predict(workdir, static_onnx, tmp_path):
    text = (ROOT / "docs" / "export.md").read_text()
    code = re.search(r"```python\n(import json.*?)```", text, re.S).group(1)
    script = tmp_path / "detect.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script), str(static_onnx["path"]), str(workdir["image"])],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    rows = [line.split(maxsplit=5) for line in out.strip().splitlines()]
    docs = np.array([[float(v) for v in row[:5]] for row in rows])
    docs_names = [row[5] for row in rows]
    result = Predictor({"save": False, "max_det": 10000})(str(workdir["image"]), model=str(static_onnx["path"]))[0]
    assert len(result) == len(docs) > 0
    ours = torch.cat((result.boxes.xyxy, result.boxes.conf[:, None]), 1).numpy()
    order_docs, order_ours = np.lexsort(docs.T[::-1]), np.lexsort(ours.T[::-1])
    assert np.abs(docs[order_docs, :4] - ours[order_ours, :4]).max() < 0.2
    assert np.abs(docs[order_docs, 4] - ours[order_ours, 4]).max() < 1e-3
    assert sorted(docs_names) == sorted(NAMES[int(c)] for c in result.boxes.cls.tolist())
