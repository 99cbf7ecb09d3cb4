"""Ultralytics habits that were missing (issue #42), each checked against Ultralytics 8.4.190's behaviour for the same call:
model.load(weights) (then used by every mode), Results.plot(font_size=, color_mode=), predict(augment=True) (test-time
augmentation), train(single_cls=True), yolo_cb.callbacks.get_default_callbacks() and the validator's loop state read from
callbacks. One tiny model, trained once, serves the tests that need trained weights."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import TINY
from test_ultralytics_silent import assert_same_detections, boxes_of

from yolo_cb import YOLO

CONF = 1e-4  # low: the one-epoch model's scores are weak, and every test needs some boxes
QUICK = {k: v for k, v in TINY.items() if k != "model"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, shapes_small_yaml, trained_copy):
    """best.pt of a one-epoch yolocb-n training on shapes_small, and four of its validation images."""
    root = tmp_path_factory.mktemp("missing")
    run = trained_copy(root / "runs", model="yolocb-n.yaml", name="exp")  # trained once per test run
    weights, data = run / "weights" / "best.pt", yaml.safe_load((run / "args.yaml").read_text())["data"]  # the 32 / 16 images it trained on
    images = root / "images"
    images.mkdir()
    val = [Path(p) for p in Path(str(shapes_small_yaml).replace("shapes_small.yaml", "val.txt")).read_text().split()]
    for p in val[:4]:
        shutil.copy(p, images / p.name)
    return {"weights": str(weights), "images": images, "data": data, "root": root}


@pytest.fixture
def log_lines():
    """The yolo_cb log records of the test, as text."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    handler, logger = Keep(), logging.getLogger("yolo_cb")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)  # as a training sets it (setup_logging): this process may not have trained
    yield lines
    logger.removeHandler(handler)
    logger.setLevel(level)


# --- 1. YOLO(yaml).load(weights): every mode then uses the loaded weights --------------------------------------------------
def test_load_transfers_weights_and_every_mode_uses_them(trained, tmp_path, monkeypatch, log_lines):
    reference = YOLO(trained["weights"])
    model = YOLO("yolocb-n.yaml")
    assert model.load(trained["weights"]) is model  # returns the facade, as Ultralytics
    total = len(reference.model.state_dict())
    assert f"Transferred {total}/{total} items from {trained['weights']}" in log_lines
    assert model.names == reference.names and model.model.nc == 4  # the weights' classes, so the class head transferred
    for key, value in reference.model.state_dict().items():
        assert torch.equal(model.model.state_dict()[key], value), key

    assert_same_detections(model.predict(trained["images"], conf=CONF, imgsz=64), reference.predict(trained["images"], conf=CONF, imgsz=64))
    loaded_val, file_val = model.val(imgsz=64, batch=8, workers=0, plots=False, project=str(tmp_path / "v"), name="a"), \
        reference.val(imgsz=64, batch=8, workers=0, plots=False, project=str(tmp_path / "v"), name="b")
    assert loaded_val.box.map == pytest.approx(file_val.box.map, abs=1e-6) and loaded_val.box.mp == pytest.approx(file_val.box.mp, abs=1e-6)

    monkeypatch.chdir(tmp_path)
    exported = Path(model.export(format="onnx", imgsz=64))
    assert exported.is_file() and exported.resolve().parent == tmp_path.resolve()  # from the in-memory model: no .pt beside which to write
    assert_same_detections(YOLO(str(exported)).predict(trained["images"], conf=CONF, imgsz=64),
                           reference.predict(trained["images"], conf=CONF, imgsz=64))

    start = {}
    model.add_callback("on_train_start", lambda t: start.update({k: v.detach().cpu().clone() for k, v in t.model.state_dict().items()}))
    model.train(**{**QUICK, "data": trained["data"], "project": str(tmp_path / "runs"), "name": "from_loaded"})
    for key, value in reference.model.state_dict().items():
        assert torch.equal(start[key], value), key  # the training started from the loaded weights, not from scratch
    assert model.loaded_module is None and model.source.endswith("best.pt")  # after training: its best.pt, as any training


# --- 3. predict / val augment=True: test-time augmentation ------------------------------------------------------------------
def test_tta_maps_every_pass_back_to_the_input():
    """A stand-in detector that finds the bright rectangle of its input: after the three passes (one flipped, two smaller,
    padded) are mapped back, every prediction is the rectangle in the input's pixels; the level drops follow the strides."""
    from yolo_cb.nn.postprocess import augmented_predictions

    strides, inputs = (8, 16, 32), []
    x = torch.zeros(1, 3, 96, 128)
    x[..., 20:50, 10:40] = 1.0  # x1 y1 x2 y2 = 10 20 40 50: left of centre, so a wrong flip shows

    def detector(image):
        inputs.append(tuple(image.shape[-2:]))
        ys, xs = (image[0, 0] > 0.9).nonzero(as_tuple=True)
        box = torch.tensor([(xs.min() + xs.max() + 1) / 2, (ys.min() + ys.max() + 1) / 2, xs.max() - xs.min() + 1, ys.max() - ys.min() + 1])
        a = sum((image.shape[-2] // s) * (image.shape[-1] // s) for s in strides)
        return torch.cat((box.expand(1, a, 4), torch.ones(1, a, 2)), -1)

    preds = augmented_predictions(detector, x, strides)
    assert inputs == [(96, 128), (96, 128), (96, 96)]  # 0.83 and 0.67 of 96x128, padded up to multiples of 32

    def cells(h, w, levels):
        return sum((h // s) * (w // s) for s in levels)

    full, flipped, small = cells(96, 128, (8, 16)), cells(96, 128, strides), cells(96, 96, (16, 32))  # coarsest / finest dropped
    assert preds.shape == (1, full + flipped + small, 6)
    assert torch.allclose(preds[0, :, :4], torch.tensor([25.0, 35.0, 30.0, 30.0]).expand(preds.shape[1], 4), atol=2.0)
    with pytest.raises(ValueError, match="one per cell"):
        augmented_predictions(lambda image: torch.zeros(1, 7, 6), x, strides)


def test_predict_and_val_augment(trained, tmp_path):
    model = YOLO(trained["weights"])
    plain = model.predict(trained["images"], conf=CONF, imgsz=64)
    augmented = model.predict(trained["images"], conf=CONF, imgsz=64, augment=True)
    assert any(b.shape != a.shape or not np.allclose(b, a) for a, b in zip(boxes_of(plain), boxes_of(augmented), strict=True))
    for r in augmented:
        h, w = r.orig_shape
        xyxy = r.boxes.xyxy
        assert len(r) > 0 and (xyxy >= 0).all() and (xyxy[:, [0, 2]] <= w).all() and (xyxy[:, [1, 3]] <= h).all()
        assert (xyxy[:, 2] > xyxy[:, 0]).all() and (xyxy[:, 3] > xyxy[:, 1]).all()

    counts = {}
    model.add_callback("on_val_batch_end", lambda v: counts.setdefault(bool(v.args.augment), []).append(torch.cat(v.preds).cpu()))
    common = dict(imgsz=64, batch=8, workers=0, plots=False, project=str(tmp_path / "v"))
    assert model.val(**common, name="plain").box.map >= 0 and model.val(**common, name="tta", augment=True).box.map >= 0
    plain_val, tta_val = torch.cat(counts[False]), torch.cat(counts[True])
    assert plain_val.shape != tta_val.shape or not torch.allclose(plain_val, tta_val)  # val(augment=True) validates the
    # augmented predictions (as Ultralytics' val does)

    onnx = YOLO(model.export(format="onnx", imgsz=64))
    with pytest.raises(Exception, match="augment=True .* needs a PyTorch model") as refused:
        onnx.predict(trained["images"], augment=True, imgsz=64)
    assert "\n" not in str(refused.value)
    with pytest.raises(Exception, match="augment=True is a predict / track / val setting; train does not read it"):
        YOLO("yolocb-n.yaml").train(**{**QUICK, "data": trained["data"], "project": str(tmp_path / "r")}, augment=True)


# --- 4. train(single_cls=True): every class is one, 'item' --------------------------------------------------------------------
def test_single_cls_trains_one_class_item(trained, tmp_path):
    from yolo_cb.checkpoints.checkpoint import load_checkpoint

    seen = {}
    model = YOLO("yolocb-n.yaml")
    model.add_callback("on_val_end", lambda v: seen.update(nc=v.nc, names=dict(v.names), classes={int(c) for s in v.stats for c in s["gt_cls"]}))
    metrics = model.train(**{**QUICK, "data": trained["data"], "project": str(tmp_path / "runs"), "name": "single"}, single_cls=True)
    ckpt = load_checkpoint(model.source)
    assert ckpt.names == {0: "item"} and ckpt.model_cfg.get("nc", 1) == 1 and model.model.nc == 1  # shapes has 4 classes
    with torch.no_grad():
        assert YOLO(model.source).model.eval()(torch.rand(1, 3, 64, 64)).shape[-1] == 4 + 1 + 1  # box, objectness, one class
    assert seen == {"nc": 1, "names": {0: "item"}, "classes": {0}}  # the labels of all 4 shapes counted as 'item'
    assert metrics.names == {0: "item"} and len(metrics.box.maps) == 1
    assert model.val(imgsz=64, batch=8, workers=0, plots=False, project=str(tmp_path / "v")).names == {0: "item"}  # from the checkpoint

    four = YOLO(trained["weights"]).val(single_cls=True, imgsz=64, batch=8, workers=0, plots=False, project=str(tmp_path / "v"))
    assert four.names == {0: "item"} and [row["Class"] for row in four.summary()] == ["item"]  # a 4-class model, scored as one class
    with pytest.raises(Exception, match="single_cls=True is a train / val / tune setting") as refused:
        YOLO(trained["weights"]).predict(trained["images"], single_cls=True)
    assert "\n" not in str(refused.value)


# --- 2. Results.plot(font_size=, color_mode=) -----------------------------------------------------------------------------------
def test_plot_font_size_and_color_mode_change_pixels(tmp_path):
    from yolo_cb.prediction.results import Results
    from yolo_cb.utils.draw import class_color

    image = np.full((200, 300, 3), 114, np.uint8)
    r = Results(image, "scene.jpg", {0: "circle", 1: "cross"}, boxes=torch.tensor([[10, 60, 100, 150, 0.9, 0], [150, 40, 280, 180, 0.8, 0]]))
    bare, default = r.plot(labels=False), r.plot()

    def text_pixels(drawn):
        return int((drawn != bare).any(-1).sum())

    small, large = r.plot(font_size=8), r.plot(font_size=40)
    assert text_pixels(small) < text_pixels(default) < text_pixels(large)  # the label's text (and its background) grows
    assert (r.plot(font_size=40, pil=True).size == (300, 200)) and Path(r.save(tmp_path / "big.png", font_size=40)).is_file()

    by_class, by_instance = r.plot(labels=False), r.plot(labels=False, color_mode="instance")
    edge = (110, 150)  # (row, column) on the left edge of the second box
    assert tuple(by_class[edge]) == class_color(0) and tuple(by_instance[edge]) == class_color(1)  # both class 0: per detection
    assert tuple(by_instance[(100, 10)]) == class_color(0)  # the first detection keeps the first colour

    with pytest.raises(TypeError, match=r"does not take: font \(the font is OpenCV's\), txt_color \(") as refused:
        r.plot(font="Arial.ttf", txt_color=(0, 0, 0))
    assert "\n" not in str(refused.value)
    with pytest.raises(ValueError, match="invalid color_mode 'rainbow'"):
        r.plot(color_mode="rainbow")


# --- 5. from yolo_cb.callbacks import get_default_callbacks -----------------------------------------------------------------
def test_get_default_callbacks_from_the_callbacks_package(trained, tmp_path):
    from yolo_cb.callbacks import EVENTS, Callbacks, get_default_callbacks
    from yolo_cb.model import DetectionTrainer

    callbacks = get_default_callbacks()
    assert isinstance(callbacks, Callbacks) and set(callbacks.keys()) == set(EVENTS) and all(v == [] for v in callbacks.values())
    assert get_default_callbacks() is not callbacks  # a fresh dict each call, as Ultralytics'
    ends = []
    callbacks["on_train_end"].append(lambda t: ends.append(t.best))  # Ultralytics' habit: fill it, hand it to the trainer
    trainer = DetectionTrainer(overrides={**QUICK, "model": "yolocb-n.yaml", "data": trained["data"], "project": str(tmp_path / "runs"),
                                          "name": "direct"}, _callbacks=callbacks)
    trainer.train()
    assert ends == [trainer.best] and Path(trainer.best).is_file()
    built_in = {type(e.owner).__name__ for e in trainer.callbacks.entries("on_train_epoch_end")}
    assert "Progress" in built_in  # the trainer added its own built-ins around them


# --- 6. the validator's loop state, read from callbacks as Ultralytics' docs do ----------------------------------------------
def test_validator_loop_state_read_from_callbacks(trained, tmp_path):
    model = YOLO(trained["weights"])
    model.val(imgsz=64, batch=8, workers=0, plots=False, project=str(tmp_path / "v"), name="first")  # a previous validation
    seen = {"batches": []}

    def on_val_start(v):
        seen.update(start_metrics=dict(v.metrics), batches_total=len(v.dataloader), data=v.args.data, save_dir=v.save_dir)

    def on_val_batch_end(v):
        tp = v.stats["tp"]
        seen["batches"].append({"batch_i": v.batch_i, "seen": v.seen, "images": len(tp), "same": v.metrics.stats is v.stats,
                                "tp_columns": {t.shape[1] for t in tp}, "conf": sum(len(c) for c in v.stats["conf"]),
                                "preds": sum(len(p) for p in v.preds), "keys": list(v.stats.keys()), "so_far": v.get_stats()})

    def on_val_end(v):
        seen.update(end=v.get_stats(), metrics=v.metrics.results_dict)

    for event, fn in (("on_val_start", on_val_start), ("on_val_batch_end", on_val_batch_end), ("on_val_end", on_val_end)):
        model.add_callback(event, fn)
    model.val(imgsz=64, batch=8, workers=0, plots=False, project=str(tmp_path / "v"), name="second", conf=CONF)

    assert seen["start_metrics"] == {} and seen["batches_total"] == 2 and seen["data"] == trained["data"]  # this validation's
    assert Path(seen["save_dir"]).name == "second"
    assert [(b["batch_i"], b["seen"], b["images"]) for b in seen["batches"]] == [(0, 8, 8), (1, 16, 16)]
    for b in seen["batches"]:
        assert b["same"] and b["tp_columns"] <= {10} and b["conf"] >= b["preds"] > 0  # IoU 0.50 ... 0.95, one row per detection
        assert b["keys"] == ["tp", "conf", "pred_cls", "target_cls", "target_img"] and "metrics/mAP50-95(B)" in b["so_far"]
    assert seen["end"] == pytest.approx(seen["metrics"], abs=1e-9)  # get_stats() over every image is the validation's metrics
    from yolo_cb.evaluation.val_metrics import ImageStats

    with pytest.raises(KeyError, match="Ultralytics' keys tp, conf"):
        ImageStats(1)["boxes"]
