"""Ultralytics habits that used to be silently ignored or misleading (issue #42), each checked against Ultralytics 8.4.190's
behaviour: save_txt's columns (save_conf off by default), predict's batch= on folders, val's classes=, Results.to_df() /
to_csv() columns, exporter.file at the export events, PIL images and BCHW tensors as sources, and the refusal of an
Ultralytics setting yolo-cb lacks from the Python API. One tiny model, trained once, serves every test."""

from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import yaml

from yolo_cb import YOLO
from yolo_cb.settings.config import ConfigError

CONF = 1e-4  # low: the one-epoch model's scores are weak (~0.003), and every test needs some boxes


@pytest.fixture(scope="module")
def trained(tmp_path_factory, shapes_small_yaml, trained_copy):
    """best.pt of a one-epoch training on shapes_small, and six of its validation images."""
    root = tmp_path_factory.mktemp("silent")
    run = trained_copy(root / "runs", model="yolocb-n.yaml", name="exp")  # trained once per test run
    weights, data = run / "weights" / "best.pt", yaml.safe_load((run / "args.yaml").read_text())["data"]  # the 32 / 16 images it trained on
    images = root / "images"
    images.mkdir()
    val = [Path(p) for p in Path(str(shapes_small_yaml).replace("shapes_small.yaml", "val.txt")).read_text().split()]
    for p in val[:6]:
        shutil.copy(p, images / p.name)
    return {"weights": str(weights), "images": images, "data": data, "root": root}


def boxes_of(results) -> list[np.ndarray]:
    return [np.asarray(r.numpy().boxes.data) for r in results]


def assert_same_detections(a, b) -> None:
    assert len(a) == len(b)
    for x, y in zip(boxes_of(a), boxes_of(b), strict=True):
        assert x.shape == y.shape and np.allclose(x, y, atol=1e-3, rtol=1e-4)


# --- 1. save_txt writes 5 columns unless save_conf=True --------------------------------------------------------------------
def test_save_txt_has_no_confidence_unless_save_conf(trained, tmp_path):
    from yolo_cb.settings.config import load_defaults

    assert load_defaults()["save_conf"] is False
    model = YOLO(trained["weights"])
    for save_conf, columns in ((None, 5), (True, 6)):
        extra = {} if save_conf is None else {"save_conf": save_conf}
        results = model.predict(trained["images"], save_txt=True, conf=CONF, imgsz=64, project=str(tmp_path), name=f"c{columns}", **extra)
        assert sum(len(r) for r in results) > 0
        lines = [line for f in sorted((tmp_path / f"c{columns}" / "labels").glob("*.txt")) for line in f.read_text().splitlines()]
        assert lines and {len(line.split()) for line in lines} == {columns}
        assert all(0.0 <= float(v) <= 1.0 for line in lines for v in line.split()[1:5])  # cx cy w h, normalised


# --- 2. predict honours batch= on a folder ---------------------------------------------------------------------------------
def test_predict_runs_batches_of_batch(trained):
    sizes = []
    model = YOLO(trained["weights"])
    model.add_callback("on_predict_batch_start", lambda p: sizes.append(len(p.batch[0])))
    batched = model.predict(trained["images"], batch=4, conf=CONF, imgsz=64)
    assert sizes == [4, 2]
    sizes.clear()
    single = model.predict(trained["images"], conf=CONF, imgsz=64)  # Ultralytics' predict default: batch 1
    assert sizes == [1] * 6
    assert [r.path for r in batched] == [r.path for r in single]
    assert_same_detections(batched, single)
    sizes.clear()
    model.predict(sorted(map(str, trained["images"].iterdir())), batch=3, conf=CONF, imgsz=64)  # a list of images too
    assert sizes == [3, 3]


# --- 3. val(classes=...) evaluates only those classes -----------------------------------------------------------------------
def test_val_classes_filters_predictions_and_classes(trained):
    model = YOLO(trained["weights"])
    kept = set()
    model.add_callback("on_val_batch_end", lambda v: kept.update(int(c) for p in v.preds for c in p[:, 5]))
    every = model.val(data=trained["data"], imgsz=64, batch=8, plots=False, project=str(trained["root"] / "val"), name="all")
    assert list(every.ap_class_index) == [0, 1, 2, 3] and len(kept) > 1
    kept.clear()
    only = model.val(data=trained["data"], imgsz=64, batch=8, plots=False, classes=[0], project=str(trained["root"] / "val"), name="c0")
    assert list(only.ap_class_index) == [0] and kept == {0}  # predictions of class 0 only
    assert only.box.map == pytest.approx(only.box.maps[0])
    assert only.box.map == pytest.approx(every.box.maps[0], abs=1e-6)  # class 0's mAP50-95, not the mean over classes
    assert only.box.map50 == pytest.approx(float(every.box.all_ap[0, 0]), abs=1e-6)


# --- 4. Results.to_df() / to_csv(): name, class, confidence, box ---------------------------------------------------------------
def test_results_to_df_and_to_csv_columns(trained):
    r = YOLO(trained["weights"])(sorted(trained["images"].iterdir())[0], conf=CONF, imgsz=64)[0]
    assert len(r) > 0
    frame = r.to_df()
    assert list(frame.columns) == ["name", "class", "confidence", "box"] and len(frame) == len(r)
    box = frame["box"][0]
    assert set(box) == {"x1", "y1", "x2", "y2"}
    assert box["x1"] == pytest.approx(float(r.boxes.xyxy[0, 0]), abs=1e-4)
    lines = r.to_csv().splitlines()
    assert lines[0] == "name,class,confidence,box" and len(lines) == len(r) + 1
    assert "'x1':" in lines[1]


# --- 5. exporter.file is the source model at both export events ----------------------------------------------------------------
def test_exporter_file_is_the_source_model(trained):
    seen = []
    model = YOLO(trained["weights"])
    for event in ("on_export_start", "on_export_end"):
        model.add_callback(event, lambda e, event=event: seen.append((event, e.file, e.output, Path(e.output).is_file())))
    written = model.export(format="onnx", imgsz=64)
    source = Path(trained["weights"])
    assert written.endswith(".onnx") and Path(written).is_file()
    assert seen == [("on_export_start", source, Path(written), False), ("on_export_end", source, Path(written), True)]


# --- 6. a PIL image and a BCHW tensor as source ------------------------------------------------------------------------------
def test_pil_image_source_equals_its_file(trained, tmp_path):
    from PIL import Image

    png = tmp_path / "scene.png"  # lossless, so that OpenCV and Pillow decode the same pixels
    cv2.imwrite(str(png), cv2.imread(str(sorted(trained["images"].iterdir())[0])))
    model = YOLO(trained["weights"])
    from_file = model(png, conf=CONF, imgsz=64)
    with Image.open(png) as image:
        from_pil = model(image, conf=CONF, imgsz=64)
        assert len(from_file[0]) > 0
        assert_same_detections(from_pil, from_file)
        assert from_pil[0].orig_shape == from_file[0].orig_shape
        assert_same_detections(model([image, image], conf=CONF, imgsz=64), from_file * 2)  # in a list too


def test_tensor_source_gives_one_result_per_batch_item(trained):
    images = [cv2.resize(cv2.imread(str(p)), (64, 64)) for p in sorted(trained["images"].iterdir())[:3]]
    tensor = torch.from_numpy(np.stack([im[..., ::-1].transpose(2, 0, 1) for im in images]).copy()).float() / 255  # BCHW RGB 0..1
    model = YOLO(trained["weights"])
    results = model(tensor, conf=CONF, imgsz=64)
    assert len(results) == 3 and all(r.orig_shape == (64, 64) for r in results)
    assert_same_detections(results, model(images, conf=CONF, imgsz=64))  # the same pixels as BGR arrays, no letterbox needed
    assert len(model([tensor[:1], tensor[1:]], conf=CONF, imgsz=64)) == 3  # tensors in a list
    with pytest.raises(ValueError, match="divisible by"):
        model(torch.rand(1, 3, 50, 64))


# --- 7. an Ultralytics setting yolo-cb lacks: said so from Python as from the CLI --------------------------------------------
@pytest.mark.parametrize("key", ["visualize", "dnn"])  # augment and single_cls exist now (tests/test_ultralytics_missing.py)
def test_python_api_names_ultralytics_settings(key, trained):
    with pytest.raises(ConfigError, match=f"'{key}' is an Ultralytics setting yolo-cb does not have") as error:
        YOLO("yolox-nano.yaml").train(data=trained["data"], **{key: True})
    assert "did you mean" not in str(error.value).lower()
    with pytest.raises(ConfigError, match="is an Ultralytics setting yolo-cb does not have"):
        YOLO(trained["weights"]).predict(trained["images"], **{key: True})


def test_python_api_typo_still_suggests():
    with pytest.raises(ConfigError, match="Did you mean 'epochs'"):
        YOLO("yolox-nano.yaml").train(epoch=3)


# --- Missing attributes Ultralytics users reach for (issue #42): each as Ultralytics 8.4.190 has it --------------------------
def test_model_device_ckpt_path_fuse_to_and_predictor(trained):
    model = YOLO(trained["weights"])
    assert model.ckpt_path == trained["weights"] and model.device == torch.device("cpu")
    assert YOLO("yolocb-n.yaml").ckpt_path is None
    assert model.predictor is None
    model.predict(trained["images"], conf=CONF, imgsz=64)
    assert model.predictor is not None and model.predictor.args.conf == CONF  # the last predict's engine
    assert model.to("cpu") is model and model.device == torch.device("cpu")
    image = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        before = model.model.eval()(image)
        batchnorms = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.model.modules())
        assert model.fuse() is model and batchnorms > 0  # Ultralytics returns the model (issue #61)
        assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.model.modules()) == 0  # folded into the convolutions
        assert torch.allclose(model.model(image), before, rtol=1e-3, atol=1e-4)  # the same function


def test_save_writes_a_checkpoint_yolo_loads_back(trained, tmp_path):
    """model.save(path), as Ultralytics: the loaded model's weights, architecture and names in a checkpoint that YOLO(path)
    loads to the same function; marked finished (not a run to resume); a fused model is refused, nothing written."""
    from yolo_cb.checkpoints.checkpoint import load_checkpoint

    model = YOLO(trained["weights"])
    saved = model.save(tmp_path / "copy.pt")
    assert saved == tmp_path / "copy.pt" and sorted(p.name for p in tmp_path.iterdir()) == ["copy.pt"]  # no temp file left
    again = YOLO(str(saved))
    image = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(again.model.eval()(image), model.model.eval()(image))
    assert again.names == model.names and load_checkpoint(saved).finished is True
    built = YOLO("yolocb-n.yaml")  # a model YAML: its random weights, 80 classes
    assert len(YOLO(str(built.save(tmp_path / "fresh.pt"))).names) == 80
    model.fuse()
    with pytest.raises(ValueError, match="unfused"):
        model.save(tmp_path / "fused.pt")
    assert not (tmp_path / "fused.pt").exists()


def test_metrics_save_dir_is_the_validation_folder(trained, tmp_path):
    metrics = YOLO(trained["weights"]).val(data=trained["data"], imgsz=64, plots=False, project=str(tmp_path), name="v")
    assert metrics.save_dir == tmp_path / "v"


def test_fuse_and_device_of_an_export_say_what_they_need(trained, tmp_path):
    onnx = YOLO(trained["weights"]).export(format="onnx", imgsz=64, project=str(tmp_path))
    exported = YOLO(onnx)
    assert exported.device is None and exported.ckpt_path is None
    with pytest.raises(TypeError, match="needs a PyTorch model"):
        exported.fuse()


def test_show_save_crop_and_show_conf_in_predict(trained, tmp_path, monkeypatch, caplog):
    """predict(show=True) and r.show() without a display: nothing shown, one warning, as Ultralytics; save_crop=True writes
    <run>/crops/<class>/<stem>.jpg; show_conf=False draws the boxes without their scores."""
    from yolo_cb.prediction.results import warn_no_display

    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    warn_no_display.cache_clear()  # once per process: another test in this process may have had it already
    model = YOLO(trained["weights"])
    with caplog.at_level("WARNING", logger="yolo_cb"):
        results = model.predict(trained["images"], conf=CONF, imgsz=64, show=True, save_crop=True, project=str(tmp_path), name="p")
        results[0].show()
    assert sum("no display" in r.getMessage() for r in caplog.records) <= 1 and any("no display" in r.getMessage() for r in caplog.records)
    crops = list((tmp_path / "p" / "crops").rglob("*.jpg"))
    assert len(crops) == sum(len(r) for r in results) > 0
    assert {c.parent.name for c in crops} <= set(model.names.values())
    with_conf = results[0].plot(conf=True)
    assert not np.array_equal(with_conf, results[0].plot(conf=False))  # show_conf=False draws less
    saved = model.predict(trained["images"], conf=CONF, imgsz=64, save=True, show_conf=False, project=str(tmp_path), name="nc")
    first = saved[0]
    drawn = cv2.imread(str(tmp_path / "nc" / Path(first.path).name))
    gap = lambda a, b: float(np.abs(a.astype(int) - b.astype(int)).mean())  # noqa: E731 (the saved file is a JPEG: near, not equal)
    assert gap(drawn, first.plot(conf=False)) < gap(drawn, first.plot(conf=True))


def test_metrics_table_exports_and_confusion_matrix_plot(trained, tmp_path):
    """metrics.to_df() / to_csv() / to_json() (the per-class summary) and confusion_matrix.plot(save_dir=, normalize=)."""
    import json

    metrics = YOLO(trained["weights"]).val(data=trained["data"], imgsz=64, plots=False, project=str(tmp_path), name="v")
    rows = metrics.summary()
    assert rows and json.loads(metrics.to_json()) == rows
    lines = metrics.to_csv().splitlines()
    assert lines[0] == "Class,Images,Instances,Box-P,Box-R,Box-F1,mAP50,mAP75,mAP50-95" and len(lines) == len(rows) + 1
    frame = metrics.to_df()
    assert list(frame["Class"]) == [r["Class"] for r in rows]
    for normalize, name in ((True, "confusion_matrix_normalized.png"), (False, "confusion_matrix.png")):
        path = metrics.confusion_matrix.plot(save_dir=tmp_path / "cm", normalize=normalize)
        assert path == tmp_path / "cm" / name and cv2.imread(str(path)) is not None
