"""Predictor and Results: sources, skipping unreadable files, saving, events, and .pt vs .onnx agreement."""

from __future__ import annotations

import json
import logging
import re

import cv2
import numpy as np
import pytest
import torch

from yolo_cb.callbacks import Callbacks
from yolo_cb.callbacks.events import PREDICTOR_EVENTS
from yolo_cb.checkpoints.checkpoint import Checkpoint, model_from_checkpoint, save_checkpoint
from yolo_cb.export.exporter import export_onnx, sample_image
from yolo_cb.nn import build_model
from yolo_cb.prediction.predictor import Predictor
from yolo_cb.prediction.results import Results

NAMES = {0: "circle", 1: "square", 2: "triangle", 3: "star"}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("predict")
    torch.manual_seed(0)
    model = build_model("yolox-nano", nc=4, verbose=False)
    with torch.no_grad():  # scores well above the 0.01 prior so an untrained model yields boxes at conf 0.25
        for conv in (*model.head.obj_preds, *model.head.cls_preds):
            conv.bias.fill_(0.5)
    state = model.state_dict()
    weights = save_checkpoint(Checkpoint(model=state, ema=state, model_cfg=dict(model.cfg), names=NAMES, train_args={},
                                         epoch=0, version="0", date="2026-01-01"), root / "best.pt")
    onnx_file = export_onnx(model_from_checkpoint(weights).fuse(), root / "best.onnx", (64, 64), simplify=False,
                            metadata={"names": json.dumps(NAMES), "imgsz": [64, 64], "stride": 32, "batch": 1})
    images = root / "images"
    images.mkdir()
    cv2.imwrite(str(images / "a.jpg"), sample_image((120, 160), seed=1))
    cv2.imwrite(str(images / "b.png"), sample_image((90, 70), seed=2))
    (images / "broken.jpg").write_bytes(b"not an image at all")
    (images / "notes.md").write_text("ignored: not an image")
    return {"root": root, "weights": weights, "onnx": onnx_file, "images": images}


def test_folder_skips_unreadable_saves_and_fires_events(setup, tmp_path, caplog):
    events = []
    callbacks = Callbacks()
    for event in PREDICTOR_EVENTS:
        callbacks.add_callback(event, lambda p, e=event: events.append((e, len(p.results))))
    predictor = Predictor({"imgsz": 64, "project": str(tmp_path), "name": "run", "save_txt": True, "save_conf": True}, callbacks=callbacks)
    with caplog.at_level(logging.WARNING, logger="yolo_cb"):
        results = predictor(str(setup["images"]), model=str(setup["weights"]))
    assert [r.path.rsplit("/", 1)[-1] for r in results] == ["a.jpg", "b.png"]
    assert any("broken.jpg" in rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING)
    names = [e for e, _ in events]
    assert names[0] == "on_predict_start" and names[-1] == "on_predict_end"
    assert names[1:4] == ["on_predict_batch_start", "on_predict_postprocess_end", "on_predict_batch_end"] and len(names) == 2 + 3 * 2
    assert events[2][1] == 1  # predictor.results holds the batch's results at on_predict_postprocess_end
    save_dir = tmp_path / "run"
    assert predictor.save_dir == save_dir and (save_dir / "a.jpg").is_file() and (save_dir / "b.png").is_file()
    r = results[0]
    assert len(r) > 0 and r.orig_shape == (120, 160) and r.names == NAMES and set(r.speed) == {"preprocess", "inference", "postprocess"}
    lines = (save_dir / "labels" / "a.txt").read_text().splitlines()
    assert len(lines) == len(r)
    for line in lines:
        assert re.fullmatch(r"[0-3]( (0|1)\.\d{6}){4} [01]\.\d{6}", line), line
    assert torch.all((r.boxes.xyxy[:, 0] >= 0) & (r.boxes.xyxy[:, 2] <= 160) & (r.boxes.xyxy[:, 3] <= 120))


def test_pt_and_onnx_predictions_match(setup):
    args = {"save": False, "imgsz": 64}
    pt = Predictor(args)(str(setup["images"]), model=str(setup["weights"]))
    ox = Predictor(args)(str(setup["images"]), model=str(setup["onnx"]))
    assert len(pt) == len(ox) == 2
    for a, b in zip(pt, ox, strict=True):
        assert len(a) == len(b) > 0
        assert torch.allclose(a.boxes.data, b.boxes.data, atol=1e-3)


def test_sources_and_stream(setup, tmp_path):
    images = setup["images"]
    listing = tmp_path / "list.txt"
    listing.write_text(f"{images / 'a.jpg'}\n\n{images / 'b.png'}\n")
    video = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 5, (80, 64))
    for i in range(3):
        writer.write(np.roll(sample_image((64, 80), seed=4), 5 * i, axis=1))
    writer.release()
    predictor = Predictor({"save": False, "classes": [1, 2], "max_det": 5})
    frame = cv2.imread(str(images / "a.jpg"))
    assert len(predictor(frame, model=str(setup["onnx"]))) == 1
    assert len(predictor(str(images / "*.png"), model=str(setup["onnx"]))) == 1
    assert len(predictor(str(listing), model=str(setup["onnx"]))) == 2
    stream = predictor([str(video), frame], model=str(setup["onnx"]), stream=True)
    assert not isinstance(stream, list)
    results = list(stream)
    assert [r.frame for r in results] == [0, 1, 2, None]
    assert all(len(r) <= 5 and set(r.boxes.cls.tolist()) <= {1.0, 2.0} for r in results)
    with pytest.raises(FileNotFoundError):
        predictor(str(tmp_path / "missing.jpg"), model=str(setup["onnx"]))


def test_results_boxes_plot_and_save_txt(tmp_path):
    img = np.zeros((100, 200, 3), np.uint8)
    r = Results(img, "x.jpg", {0: "cat", 1: "dog"}, boxes=torch.tensor([[20.0, 10.0, 60.0, 50.0, 0.9, 1.0]]))
    assert len(r) == 1 and r.boxes.cls.tolist() == [1.0] and r.boxes.conf.tolist() == pytest.approx([0.9])
    assert r.boxes.xywh.tolist() == [[40.0, 30.0, 40.0, 40.0]] and r.boxes.data.shape == (1, 6)
    plotted = r.plot()
    assert plotted.shape == img.shape and plotted.any() and not img.any()
    r.save_txt(tmp_path / "x.txt", save_conf=True)
    r.save_txt(tmp_path / "y.txt")
    assert (tmp_path / "x.txt").read_text() == "1 0.200000 0.300000 0.200000 0.400000 0.900000\n"
    assert (tmp_path / "y.txt").read_text() == "1 0.200000 0.300000 0.200000 0.400000\n"
    assert len(Results(img, "e.jpg", {0: "cat"})) == 0
