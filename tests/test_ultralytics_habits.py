"""Code written the way Ultralytics' docs write it runs here and does what it says (issue 15).

One tiny training (module fixture, run from a temporary working directory with Ultralytics' default run folders) is
read by most tests; the rest need no training. docs/ultralytics.md's examples are executed as written.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from shared_data import SHARED

from yolo_cb import YOLO
from yolo_cb.callbacks import CallbackError, Callbacks
from yolo_cb.evaluation.val_metrics import DetectionMetrics
from yolo_cb.training.trainer import Trainer

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
QUICK = dict(model="yolox-nano.yaml", imgsz=64, batch=8, epochs=2, workers=0, mosaic=0.0, mlflow=False, tensorboard=False,
             onnx_check=False, plots=False, no_aug_epochs=0, warmup_epochs=0.0, optimizer="AdamW", lr0=0.002)


class RecordingTrainer(Trainer):
    """A Trainer subclass as in Ultralytics' custom-trainer guide: it overrides a step and keeps what it saw."""

    def label_loss_items(self, items=None, prefix: str = "train"):
        self.labelled = getattr(self, "labelled", 0) + 1
        return super().label_loss_items(items, prefix)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, shapes_dir):
    """Train once from a fresh working directory, with no project=/name=, registering callbacks Ultralytics' way."""
    work = tmp_path_factory.mktemp("ul_work")
    for split, n in (("train", 16), ("val", 8)):  # 16 / 8 images of shapes: two batches an epoch
        files = sorted((shapes_dir / "images" / split).glob("*.jpg"))[:n]
        (work / f"{split}.txt").write_text("\n".join(map(str, files)) + "\n")
    data = work / "shapes16.yaml"
    data.write_text(f"path: {work}\ntrain: train.txt\nval: val.txt\nnames: [circle, rectangle, triangle, cross]\n")
    seen: dict = {"ran": [], "epoch_times": [], "in_model_list": None}

    def on_train_start(trainer):
        seen["ran"].append("on_train_start")
        # Ultralytics' TensorBoard callback traces the model under inference_mode here; training must go on afterwards
        with torch.inference_mode():
            trainer.model.eval()
            trainer.model(torch.zeros(1, 3, 64, 64))
        trainer.callbacks["on_train_epoch_end"].append(lambda t: seen["ran"].append("appended_in_run"))
        trainer.add_callback("on_train_end", lambda t: seen["ran"].append("trainer.add_callback"))

    def on_fit_epoch_end(trainer):
        seen["epoch_times"].append(trainer.epoch_time)
        seen["args"] = dict(trainer.args)
        seen["vars"] = dict(vars(trainer.args))
        seen["paths"] = (trainer.best, trainer.last, trainer.best.is_file(), trainer.last.is_file())
        seen["batch_size"] = trainer.batch_size
        seen["data_train"] = trainer.data["train"]
        seen["plots"] = trainer.plots
        v = trainer.validator.metrics
        seen["validator_metrics"] = (type(v), v.box.map, trainer.metrics["metrics/mAP50-95(B)"], v.results_dict)

    def never(trainer):
        seen["ran"].append("removed_but_ran")

    model = YOLO("yolox-nano.yaml")
    model.callbacks["on_train_start"].append(on_train_start)
    model.callbacks["on_fit_epoch_end"] += [on_fit_epoch_end]
    model.callbacks["on_train_epoch_start"].append(never)
    model.callbacks["on_train_epoch_start"].remove(never)
    seen["in_model_list"] = on_train_start in model.callbacks["on_train_start"]
    old = Path.cwd()
    os.chdir(work)
    try:
        metrics = model.train(data=str(data), trainer=RecordingTrainer, **QUICK)
    finally:
        os.chdir(old)
    return {"model": model, "metrics": metrics, "seen": seen, "work": work, "data": data}


# --- callbacks: Ultralytics' dict of lists ------------------------------------------------------------------
def test_callbacks_dict_of_live_lists():
    cb, ran = Callbacks(), []
    first, second, third = (lambda o, n=n: ran.append(n) for n in (1, 2, 3))
    cb["on_train_start"].append(first)
    cb["on_train_start"] += [second]
    cb["on_train_start"].extend([third])
    cb.run("on_train_start", None)
    assert ran == [1, 2, 3]
    cb["on_train_start"].remove(second)
    del cb["on_train_start"][0]
    cb.run("on_train_start", None)
    assert ran == [1, 2, 3, 3] and cb["on_train_start"] == [third]
    cb["on_train_start"] = [first]  # item assignment replaces the event's callbacks
    cb["on_train_start"][0] = second
    cb["on_train_start"].insert(0, third)
    cb.run("on_train_start", None)
    assert ran[-2:] == [3, 2]
    assert "on_train_start" in cb and "on_trian_start" not in cb and len(cb) == len(cb.keys()) == len(list(cb))
    as_dict = dict(cb)
    assert as_dict["on_train_start"] == [third, second] and as_dict["on_val_end"] == []
    assert {e: list(f) for e, f in cb.items() if f} == {"on_train_start": [third, second]}
    assert sum(len(f) for f in cb.values()) == 2
    with pytest.raises(ValueError, match="Did you mean 'on_train_start'"):
        cb["on_trian_start"].append(first)
    with pytest.raises(TypeError, match="must be callable"):
        cb["on_train_start"].append(42)


def test_appended_callbacks_ran_and_removed_did_not(trained):
    seen = trained["seen"]
    assert seen["in_model_list"] is True
    assert seen["ran"].count("on_train_start") == 1
    assert seen["ran"].count("appended_in_run") == QUICK["epochs"]  # appended to trainer.callbacks from inside a callback
    assert seen["ran"].count("trainer.add_callback") == 1
    assert "removed_but_ran" not in seen["ran"]


# --- what Ultralytics' integrations read ----------------------------------------------------------------------
def test_trainer_attributes_integrations_read(trained):
    seen, model = trained["seen"], trained["model"]
    assert isinstance(model.trainer, RecordingTrainer) and model.trainer.labelled > 0  # train(trainer=Subclass)
    best, last, best_exists, last_exists = seen["paths"]
    assert isinstance(best, Path) and best.name == "best.pt" and best_exists and last.name == "last.pt" and last_exists
    assert seen["args"]["epochs"] == QUICK["epochs"] and seen["args"] == seen["vars"]  # dict(trainer.args), vars(args)
    assert seen["batch_size"] == QUICK["batch"]
    assert isinstance(seen["data_train"], str) and seen["data_train"].endswith("train.txt")
    assert len(seen["epoch_times"]) == QUICK["epochs"] and all(isinstance(t, float) and t > 0 for t in seen["epoch_times"])
    assert seen["plots"] == {}  # plots=False: no image in the run folder
    trainer = Trainer(model.trainer.args)
    trainer._place.save_dir = trained["work"] / "plots_probe"
    trainer.save_dir.mkdir()
    for name in ("results.png", "train_batch0.jpg", "results.csv"):
        (trainer.save_dir / name).write_bytes(b"x")
    assert sorted(p.name for p in trainer.plots) == ["results.png", "train_batch0.jpg"]
    assert all(set(v) == {"data", "timestamp"} for v in trainer.plots.values())
    kind, box_map, dict_map, results = seen["validator_metrics"]
    assert kind is DetectionMetrics and box_map == dict_map and set(results) >= {"metrics/mAP50(B)", "fitness"}


def test_run_folders_are_runs_detect_train_and_increment(trained, tmp_path, monkeypatch):
    work = trained["work"]
    assert (work / "runs" / "detect" / "train" / "weights" / "best.pt").is_file()  # no project=/name=: Ultralytics' layout
    assert trained["model"].trainer.save_dir == Path("runs") / "detect" / "train"
    from yolo_cb.settings.config import get_config
    from yolo_cb.utils.files import run_dir

    monkeypatch.chdir(tmp_path)
    assert [run_dir(get_config({}), "train").as_posix() for _ in range(3)] == ["runs/detect/train", "runs/detect/train-2", "runs/detect/train-3"]
    assert run_dir(get_config({"project": "p", "name": "n"}), "val").as_posix() == "p/n"


# --- metrics -------------------------------------------------------------------------------------------------
def test_train_and_val_return_ultralytics_metrics(trained, monkeypatch):
    metrics, model = trained["metrics"], trained["model"]
    assert isinstance(metrics, DetectionMetrics) and metrics["metrics/mAP50-95(B)"] == metrics.box.map
    monkeypatch.chdir(trained["work"])
    captured = {}
    model.add_callback("on_val_end", lambda v: captured.update(validator=v))
    val = model.val(plots=True)  # after train(): the best.pt and dataset of the run
    model.callbacks["on_val_end"].clear()
    assert (trained["work"] / "runs" / "detect" / "val").is_dir()
    assert captured["validator"].metrics is val and captured["validator"].plots  # validator.metrics, validator.plots
    assert all(Path(p).is_file() for p in captured["validator"].plots)
    box = val.box
    assert box.map == val["metrics/mAP50-95(B)"] and box.map50 == val["metrics/mAP50(B)"]
    assert box.mp == val["metrics/precision(B)"] and box.mr == val["metrics/recall(B)"]
    assert val.fitness == val["fitness"] and val.results_dict == {k: val[k] for k in val.results_dict}
    assert box.all_ap.shape == (len(val.ap_class_index), 10) and np.isclose(box.all_ap[:, 0].mean(), box.map50)
    assert np.isclose(box.all_ap.mean(), box.map) and np.isclose(box.all_ap[:, 5].mean(), box.map75)
    assert box.maps.shape == (4,) and np.allclose(box.maps[val.ap_class_index], box.ap)
    assert set(val.speed) == {"preprocess", "inference", "loss", "postprocess"} and val.speed["inference"] > 0
    assert val.names == {0: "circle", 1: "rectangle", 2: "triangle", 3: "cross"}
    assert len(val.curves) == len(val.curves_results) == 4 and val.curves_results[0][1].shape[0] == len(val.ap_class_index)
    rows = val.summary()
    assert [r["Class"] for r in rows] == [val.names[int(c)] for c in val.ap_class_index]
    assert rows[0]["mAP50-95"] == round(float(box.ap[0]), 5) and rows[0]["Instances"] > 0
    assert json.loads(json.dumps(val)) == dict(val)  # still a plain mapping of the metric keys


# --- the model facade and predict ------------------------------------------------------------------------------
def test_model_facade_names_task_model_info_fuse(caplog):
    model = YOLO("yolox-nano.yaml")
    assert model.task == "detect" and isinstance(model.model, torch.nn.Module) and len(model.names) == 80
    layers, params, gradients, gflops = model.info(verbose=False)
    assert params == sum(p.numel() for p in model.model.parameters()) == gradients and layers > 0 and gflops > 0
    x = torch.rand(1, 3, 64, 64)
    before = model.model.eval()(x)
    with caplog.at_level("INFO", logger="yolo_cb"):
        fused = model.model.fuse(verbose=True)  # Ultralytics' TensorBoard fallback calls fuse(verbose=False)
    assert fused is model.model and any("(fused)" in r.getMessage() for r in caplog.records)
    assert torch.allclose(before, fused(x), atol=1e-3, rtol=1e-3)


def test_head_keeps_no_inference_tensors():
    from yolo_cb.nn import build_model

    for cfg in ("yolox-nano.yaml", "yolocb-n.yaml"):
        model = build_model(cfg, nc=2, verbose=False).eval()
        with torch.inference_mode():
            model(torch.zeros(1, 3, 64, 64))
        model.train()
        loss = model(torch.zeros(1, 3, 64, 64), torch.tensor([[0, 1, 32, 32, 16, 16.0]]))["total"]
        loss.backward()  # "Inference tensors cannot be saved for backward" if a grid built under inference_mode was kept
        assert all(not t.is_inference() for pair in model.head._grid_cache.values() for t in pair)


def test_predict_as_ultralytics(trained, tmp_path, monkeypatch, shapes_dir):
    model = trained["model"]
    image = str(sorted((shapes_dir / "images" / "val").glob("*.jpg"))[0])
    monkeypatch.chdir(tmp_path)
    batches = []
    model.add_callback("on_predict_batch_end", lambda p: batches.append((p.batch, p.model)))
    results = model(image, conf=1e-6)  # model(source) predicts; Python saves nothing unless save=True
    model.callbacks["on_predict_batch_end"].clear()
    assert not (tmp_path / "runs").exists()
    (paths, images, texts), loaded = batches[0]
    assert paths == [image] and images[0].shape == results[0].orig_img.shape and texts[0].startswith("image 1/1 ")
    assert loaded.names == model.names and callable(loaded)  # predictor.model: the loaded model object
    r = results[0]
    assert len(r) > 0
    one = r[0]  # results[0][i]
    assert len(one) == 1 and torch.equal(one.boxes.data[0], r.boxes.data[0])
    parsed = json.loads(r.to_json())
    assert len(parsed) == len(r) and parsed[0]["name"] in model.names.values() and set(parsed[0]["box"]) == {"x1", "y1", "x2", "y2"}
    assert isinstance(r.numpy().boxes.xyxy, np.ndarray) and isinstance(r.cpu().boxes.xyxy, torch.Tensor)
    assert r.verbose().endswith(", ") and re.match(r"^\d+ \w+", r.verbose())
    pil = r.plot(pil=True)
    assert pil.size == (r.orig_shape[1], r.orig_shape[0]) and pil.mode == "RGB"
    saved = Path(r.save())
    assert saved == Path(f"results_{Path(image).name}") and saved.is_file()
    crops = r[:3].save_crop(tmp_path / "crops", file_name="im")
    assert 1 <= len(crops) <= 3 and all(Path(c).is_file() and Path(c).parent.parent == tmp_path / "crops" for c in crops)
    model.predict(image, save=True)
    assert (tmp_path / "runs" / "detect" / "predict" / Path(image).name).is_file()


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "yolo_cb", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_cli_predict_saves_and_export_without_model_is_one_line(trained, tmp_path, shapes_dir):
    image = sorted((shapes_dir / "images" / "val").glob("*.jpg"))[0]
    done = _cli(["predict", f"model={trained['model'].source}", f"source={image}", "imgsz=64"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "runs" / "detect" / "predict" / image.name).is_file()  # the CLI saves by default
    refused = _cli(["export", "format=onnx"], tmp_path)
    said = (refused.stdout + refused.stderr).strip()
    assert refused.returncode == 2 and said.count("\n") == 0 and said.startswith("yolo-cb: error:") and "model=" in said


# --- data YAMLs ------------------------------------------------------------------------------------------------
def test_data_yaml_path_relative_to_working_directory(tmp_path, monkeypatch, shapes_dir):
    from yolo_cb.data.resolve import check_data

    (tmp_path / "work" / "datasets").mkdir(parents=True)
    (tmp_path / "work" / "datasets" / "shapes").symlink_to(shapes_dir)
    yaml_file = tmp_path / "configs" / "shapes.yaml"
    yaml_file.parent.mkdir()
    yaml_file.write_text("path: datasets/shapes\ntrain: images/train\nval: images/val\nnames: [circle, rectangle, triangle, cross]\n")
    monkeypatch.chdir(tmp_path / "work")
    data = check_data(str(yaml_file), datasets_dir=str(tmp_path / "store"))
    assert data["path"] == str((tmp_path / "work" / "datasets" / "shapes").resolve()) and isinstance(data["train"], str)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as error:
        check_data(str(yaml_file), datasets_dir=str(tmp_path / "store"))
    message = str(error.value)
    for place in (tmp_path / "datasets" / "shapes", tmp_path / "configs" / "datasets" / "shapes", tmp_path / "store" / "datasets" / "shapes"):
        assert str(place) in message
    assert "working directory" in message and not (tmp_path / "store").exists()  # nothing downloaded or made


# --- docs/ultralytics.md ---------------------------------------------------------------------------------------
def test_every_example_in_docs_ultralytics_runs(tmp_path, monkeypatch):
    """Each ```python block of docs/ultralytics.md, in order, in one namespace, from an empty working directory."""
    if not (SHARED / "datasets" / "coco8").is_dir():
        pytest.skip("shared coco8 not available")
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "ultralytics.md").read_text(), flags=re.S)
    assert len(blocks) >= 4
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("YOLO_CB_DATASETS", str(SHARED / "datasets"))  # coco8.yaml finds the shared copy: no download
    namespace: dict = {}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"docs/ultralytics.md block {i + 1}", "exec"), namespace)
        except Exception as error:
            raise AssertionError(f"docs/ultralytics.md example {i + 1} failed: {type(error).__name__}: {error}\n{block}") from error
    assert (tmp_path / "runs" / "detect" / "train" / "weights" / "best.pt").is_file()
    frozen, updated = bn_layers(namespace["bn_model"].trainer.model, namespace["FROZEN_BN"])  # the freeze-BN example
    assert len(frozen) > 5 and len(updated) > 5
    for name, bn in frozen.items():  # model.0 ... model.4: never a batch counted, the initial statistics
        assert int(bn.num_batches_tracked) == 0 and torch.equal(bn.running_mean, torch.zeros_like(bn.running_mean)), name
        assert torch.equal(bn.running_var, torch.ones_like(bn.running_var)), name
    for name, bn in updated.items():  # model.5 ... model.11: updated by every training batch
        assert int(bn.num_batches_tracked) > 0 and not torch.equal(bn.running_mean, torch.zeros_like(bn.running_mean)), name


def bn_layers(model: torch.nn.Module, n: int) -> tuple[dict, dict]:
    """The model's BatchNorm layers by name: those of layers model.0 ... model.<n-1>, and the others."""
    norms = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.BatchNorm2d)}
    first = {name: m for name, m in norms.items() if name.startswith(tuple(f"model.{i}." for i in range(n)))}
    return first, {name: m for name, m in norms.items() if name not in first}


def freeze_bn_callback() -> dict:
    """The freeze-BN callback of docs/ultralytics.md, as written (its block up to the training it starts)."""
    text = (ROOT / "docs" / "ultralytics.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "def freeze_bn_statistics" in b)
    namespace: dict = {}
    exec(compile(block[:block.index("\nbn_model = ")], "docs/ultralytics.md freeze-BN example", "exec"), namespace)
    return namespace


def test_the_freeze_bn_callback_on_yolox_stops_before_the_first_batch_as_the_docs_say(tmp_path, shapes_small_yaml):
    seen = []
    model = YOLO("yolox-nano.yaml")  # Megvii's module names: the index the callback parses is 'backbone'
    model.add_callback("on_train_epoch_start", freeze_bn_callback()["freeze_bn_statistics"])
    model.add_callback("on_train_batch_start", lambda t: seen.append(t.epoch))
    with pytest.raises(CallbackError, match=r"freeze_bn_statistics.*on_train_epoch_start.*ValueError: invalid literal for int"):
        model.train(**{**QUICK, "data": str(shapes_small_yaml), "project": str(tmp_path / "runs"), "name": "yolox"})
    assert seen == [] and (tmp_path / "runs" / "yolox" / "weights" / "last.pt").is_file()
