"""Habits round 4 (issue #61, sections 3 to 5), each checked against Ultralytics 8.4.190's behaviour: silent differences
(train(classes=), benchmark format=, val(save_txt=), run names, an empty predict folder), crashes where Ultralytics code
expects an answer (the model facade's attributes, the confusion matrix's tables, Results.new(), trainer.batch's keys,
a callback's own exception type), and Ultralytics' settings files and names (its default.yaml, perspective=, imgsz=100,
old import paths, the README's commands)."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from yolo_cb import YOLO
from yolo_cb.callbacks import CallbackError
from yolo_cb.settings.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
TINY = dict(imgsz=64, epochs=1, batch=8, workers=0, mosaic=0.0, plots=False, mlflow=False, tensorboard=False, onnx_check=False)
CONF = 1e-4  # the one-epoch model's scores are weak: a low threshold so that every test has boxes


def cli(*args: str, cwd: Path, script: bool = False) -> tuple[int, str]:
    """(exit status, stdout + stderr) of `python -m yolo_cb ARGS`, or of the installed `yolo-cb` script (script=True: the
    working directory is not on its import path, as for a user's console command)."""
    command = [str(Path(sys.executable).parent / "yolo-cb")] if script else [sys.executable, "-m", "yolo_cb"]
    done = subprocess.run([*command, *args], capture_output=True, text=True, cwd=cwd, env=ENV, timeout=600)
    return done.returncode, (done.stdout + done.stderr).strip()


def one_line_error(result: tuple[int, str], *parts: str) -> str:
    status, said = result
    assert status == 2 and said.count("\n") == 0 and said.startswith("yolo-cb: error:"), said[-2000:]
    for part in parts:
        assert part in said, said
    return said


@pytest.fixture(scope="module")
def trained(tmp_path_factory, trained_copy):
    """best.pt of the shared one-epoch training on shapes_small, its data YAML, and four of its validation images."""
    root = tmp_path_factory.mktemp("round4")
    run = trained_copy(root / "runs", model="yolocb-n.yaml", name="exp")
    data = yaml.safe_load((run / "args.yaml").read_text())["data"]
    images = root / "images"
    images.mkdir()
    val = (Path(data).parent / "val.txt").read_text().split()
    for p in val[:4]:
        shutil.copy(p, images / Path(p).name)
    return {"weights": str(run / "weights" / "best.pt"), "data": data, "images": images, "root": root, "val": val}


# --- 3. silent differences --------------------------------------------------------------------------------------------------
def test_train_classes_filters_the_training_labels_too(shapes_small_yaml, tmp_path):
    """Ultralytics drops the other classes' boxes from the training set (images stay, as background); yolo-cb filtered
    validation only."""
    seen: set[int] = set()
    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_train_batch_start", lambda t: seen.update(t.batch["targets"][:, 1].long().tolist()))
    model.train(data=str(shapes_small_yaml), classes=0, project=str(tmp_path), name="c0", **TINY)
    assert seen == {0}


def test_benchmark_format_benchmarks_that_format_only(trained, tmp_path):
    status, out = cli("benchmark", f"model={trained['weights']}", f"data={trained['data']}", "format=onnx", "imgsz=64",
                      f"project={tmp_path}", "name=b", cwd=tmp_path)
    assert status == 0, out[-3000:]
    with open(tmp_path / "b" / "benchmark.csv") as f:
        assert [row["format"] for row in csv.DictReader(f)] == ["pytorch", "onnx"]
    one_line_error(cli("benchmark", f"model={trained['weights']}", f"data={trained['data']}", "format=onnx", "formats=openvino",
                       cwd=tmp_path), "give one")


def test_val_save_txt_writes_ultralytics_label_files(trained, tmp_path):
    model = YOLO(trained["weights"])
    for save_conf, columns in ((False, 5), (True, 6)):
        model.val(data=trained["data"], imgsz=64, save_txt=True, save_conf=save_conf, project=str(tmp_path), name=f"v{columns}", plots=False)
        files = sorted((tmp_path / f"v{columns}" / "labels").glob("*.txt"))
        assert files and {f.stem for f in files} <= {Path(p).stem for p in trained["val"]}
        rows = [line.split() for f in files for line in f.read_text().splitlines()]
        assert rows and {len(r) for r in rows} == {columns}
        assert all(0 <= float(v) <= 1 for r in rows for v in r[1:]) and {int(r[0]) for r in rows} <= {0, 1, 2, 3}


def test_a_run_name_ending_in_digits_increments_as_ultralytics(tmp_path):
    """Ultralytics 8.4.190 appends -2, -3 to the name as given: t10, t10-2 (yolo-cb stripped the digits: t5)."""
    from yolo_cb.settings.config import get_config
    from yolo_cb.utils.files import run_dir

    (tmp_path / "t5").mkdir()
    args = get_config({"project": str(tmp_path), "name": "t10"})
    assert [run_dir(args, "train").name for _ in range(3)] == ["t10", "t10-2", "t10-3"]


def test_predict_on_an_empty_folder_says_so(trained, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.md").write_text("not an image")
    with pytest.raises(FileNotFoundError, match="No images or videos found in"):
        YOLO(trained["weights"]).predict(empty)
    one_line_error(cli("predict", f"model={trained['weights']}", f"source={empty}", cwd=tmp_path), "No images or videos found in", str(empty))


# --- 4. what Ultralytics code expects an answer from --------------------------------------------------------------------------
def test_the_model_facade_answers_as_ultralytics(trained, caplog):
    model = YOLO(trained["weights"], task="detect")
    assert model.ckpt["names"] == model.names and model.ckpt["train_args"]["imgsz"] == 64
    assert YOLO("yolocb-n.yaml").ckpt == {}  # Ultralytics' {} for a YAML
    assert model.model.yaml == model.model.cfg and model.model.yaml["nc"] == 4
    assert sum(p.numel() for p in model.parameters()) == model.info(verbose=False)[1]
    caplog.set_level("INFO", logger="yolo_cb")
    caplog.clear()
    model.info(verbose=True)
    said = caplog.text
    assert "summary" in said and "params" in said and said.count("model.") >= 12, said  # the layer table, then the summary line
    caplog.clear()
    model.info(detailed=True)
    assert "sigma" in caplog.text and "model.0.conv.weight" in caplog.text, caplog.text[:2000]
    before = next(model.parameters()).detach().clone()
    assert model.reset_weights() is model and not torch.equal(next(model.parameters()), before)
    assert model.fuse() is model
    with pytest.raises(ConfigError, match="only detects") as refused:
        YOLO(trained["weights"], task="segment")
    assert "\n" not in str(refused.value)


def test_confusion_matrix_tables_and_results_new(trained, tmp_path):
    metrics = YOLO(trained["weights"]).val(data=trained["data"], imgsz=64, project=str(tmp_path), name="cm", plots=False)
    matrix = metrics.confusion_matrix
    rows = matrix.summary()
    columns = ["circle", "rectangle", "triangle", "cross", "background"]
    assert [r["Predicted"] for r in rows] == columns and list(rows[0]) == ["Predicted", *columns]
    assert np.array_equal([[r[c] for c in columns] for r in rows], matrix.matrix)
    normalised = matrix.summary(normalize=True, decimals=3)
    assert all(abs(sum(r[c] for r in normalised) - 1) < 0.01 for c in columns if matrix.matrix[:, columns.index(c)].sum())
    assert matrix.to_df().shape == (5, 6) and matrix.to_csv().splitlines()[0] == "Predicted," + ",".join(columns)
    result = YOLO(trained["weights"])(trained["images"], conf=CONF, imgsz=64)[0]
    fresh = result.new()
    assert len(fresh) == 0 and fresh.path == result.path and fresh.orig_shape == result.orig_shape and fresh.names == result.names


def test_confusion_matrix_without_pandas(tmp_path):
    """pandas is not a dependency: summary(), to_csv() and to_json() need nothing, to_df() says what to install."""
    code = ("import sys; sys.modules['pandas'] = None\n"
            "from yolo_cb.metrics import ConfusionMatrix\n"
            "m = ConfusionMatrix(2, names={0: 'a b', 1: 'A-b'}); m.matrix[0, 0] = 3\n"
            "print(m.summary()[0], m.to_json()[:1], m.to_csv().splitlines()[0])\n"
            "m.to_df()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=120)
    assert "{'Predicted': 'a_b', 'a_b': 3.0, 'A_b_1': 0.0, 'background': 0.0} [ Predicted,a_b,A_b_1,background" in done.stdout, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("ImportError: confusion_matrix.to_df() needs pandas: pip install pandas")


def test_a_callback_error_keeps_its_own_type(shapes_small_yaml, tmp_path):
    def picky(trainer):
        raise ValueError("lr0 too high for this callback")

    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_pretrain_routine_start", picky)
    with pytest.raises(ValueError, match="lr0 too high") as caught:  # Ultralytics' habit: except ValueError around train()
        model.train(data=str(shapes_small_yaml), project=str(tmp_path), name="v", **TINY)
    error = caught.value
    assert isinstance(error, CallbackError) and type(error).__name__ == "CallbackError"
    assert error.callback_name == "picky" and error.event == "on_pretrain_routine_start" and type(error.error) is ValueError
    assert "callback 'picky'" in str(error)


def test_trainer_batch_has_ultralytics_keys_and_their_edits_train(shapes_small_yaml, tmp_path):
    """trainer.batch["batch_idx"], ["cls"] (N, 1) and ["bboxes"] (N, 4, cx cy w h normalised to the input), as Ultralytics';
    a callback's edit of them is what the loss sees (read back from targets after the loss)."""
    seen = {}

    def read_and_edit(trainer):
        batch = trainer.batch
        targets, (height, width) = batch["targets"], batch["img"].shape[-2:]
        assert torch.equal(batch["batch_idx"], targets[:, 0]) and torch.equal(batch["cls"], targets[:, 1:2])
        assert torch.allclose(batch["bboxes"] * torch.tensor([width, height, width, height]), targets[:, 2:6], atol=1e-4)
        assert 0 <= batch["bboxes"].min() and batch["bboxes"].max() <= 1
        seen["rows"] = len(targets)
        batch["cls"] = torch.zeros_like(batch["cls"])  # a new tensor, not an in-place edit: still what trains
        batch["bboxes"][:, 2:] *= 0.5

    def after_loss(trainer):
        seen["classes"] = set(trainer.batch["targets"][:, 1].tolist())
        seen["boxes"] = trainer.batch["bboxes"].clone()

    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_train_batch_start", read_and_edit)
    model.add_callback("on_train_batch_loss_end", after_loss)
    model.train(data=str(shapes_small_yaml), project=str(tmp_path), name="keys", fraction=0.25, **TINY)
    assert seen["rows"] > 0 and seen["classes"] == {0.0} and seen["boxes"][:, 2:].max() <= 0.5


def test_a_fixed_batch_2_onnx_predicts_a_folder_of_3_images(trained, tmp_path):
    """docs: a fixed-batch export predicts in its own batch; the last, shorter batch failed ('got 1')."""
    model = YOLO(trained["weights"])
    onnx = model.export(format="onnx", batch=2, imgsz=64, project=str(tmp_path))
    images = sorted(trained["images"].glob("*.jpg"))[:3]
    got = YOLO(onnx).predict([str(p) for p in images], batch=2, imgsz=64, conf=CONF)
    want = model.predict([str(p) for p in images], imgsz=64, conf=CONF)
    assert len(got) == 3 and [len(r) for r in got] == [len(r) for r in want]
    for a, b in zip(got, want, strict=True):
        assert np.allclose(a.boxes.xyxy.numpy(), b.boxes.xyxy.numpy(), atol=0.5)


# --- 5. Ultralytics' settings files and names ------------------------------------------------------------------------------
def ultralytics_default_yaml(folder: Path) -> Path:
    """A settings file as `yolo copy-cfg` writes it (Ultralytics 8.4.190's default.yaml): every key yolo-cb lacks at
    Ultralytics' value, the shared ones at Ultralytics' values (its iou 0.7, lr0 0.01, ...), opset/nms/channels_last empty."""
    from yolo_cb.settings.ultralytics_keys import ULTRALYTICS_DEFAULTS

    shared = {"task": "detect", "mode": "train", "model": None, "data": None, "epochs": 100, "batch": 16, "imgsz": 640, "save": True,
              "cache": False, "device": None, "workers": 8, "project": None, "name": None, "exist_ok": False, "optimizer": "auto",
              "close_mosaic": 10, "amp": True, "fraction": 1.0, "iou": 0.7, "max_det": 300, "opset": None, "nms": None,
              "channels_last": None, "lr0": 0.01, "lrf": 0.01, "momentum": 0.937, "nbs": 64, "hsv_h": 0.015, "degrees": 0.0,
              "perspective": 0.0, "mosaic": 1.0, "mixup": 0.0, "vid_stride": 1, "embed": None, "tracker": "botsort.yaml"}
    path = folder / "default.yaml"
    path.write_text(yaml.safe_dump({**shared, **ULTRALYTICS_DEFAULTS}, sort_keys=False))
    return path


def test_ultralytics_default_yaml_is_read_whole(tmp_path, caplog):
    from yolo_cb.settings.config import get_config
    from yolo_cb.settings.ultralytics_keys import ULTRALYTICS_DEFAULTS

    given = ultralytics_default_yaml(tmp_path)
    with caplog.at_level("INFO", logger="yolo_cb"):
        args = get_config({"cfg": str(given)})
        get_config({"cfg": str(given)})  # said once per process
    assert args.iou == 0.7 and args.lr0 == 0.01 and args.channels_last is True  # empty channels_last: yolo-cb's default
    said = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(said) == 1 and all(k in said[0] for k in [*ULTRALYTICS_DEFAULTS, "opset", "nms", "channels_last"]), said
    changed = yaml.safe_load(given.read_text()) | {"dfl": 2.0, "erasing": 0.0, "fooo": 1, "copy_paste_mode": "mixup"}
    (tmp_path / "changed.yaml").write_text(yaml.safe_dump(changed))
    with pytest.raises(ConfigError) as refused:
        get_config({"cfg": str(tmp_path / "changed.yaml")})
    message = str(refused.value)
    assert "\n" not in message and "4 settings" in message
    assert all(part in message for part in ("'dfl: 2.0'", "'erasing: 0.0'", "'fooo'", "'copy_paste_mode: mixup'", "1.5"))


def test_ultralytics_default_yaml_trains_from_the_cli(shapes_small_yaml, tmp_path):
    cfg = ultralytics_default_yaml(tmp_path)
    status, out = cli("train", f"cfg={cfg}", f"data={shapes_small_yaml}", "model=yolox-nano.yaml", "epochs=1", "imgsz=64", "batch=8",
                      "workers=0", "mosaic=0", "plots=False", "mlflow=False", "tensorboard=False", "onnx_check=False",
                      f"project={tmp_path}", "name=ul", cwd=tmp_path)
    assert status == 0, out[-3000:]
    assert sum("left out, as asking for nothing" in line for line in out.splitlines()) == 1, out[-3000:]
    assert yaml.safe_load((tmp_path / "ul" / "args.yaml").read_text())["iou"] == 0.7


def test_perspective_is_a_setting_and_warps(tmp_path):
    from yolo_cb.data.transforms import RandomAffine
    from yolo_cb.settings.config import get_config

    assert get_config({"perspective": 0.0005}).perspective == 0.0005
    with pytest.raises(ConfigError, match="<= 0.001"):
        get_config({"perspective": 0.01})
    np.random.seed(1)
    image = np.full((640, 640, 3), 50, np.uint8)
    image[100:300, 200:500] = 200
    sample = {"img": image, "bboxes": np.array([[200, 100, 500, 300]], np.float32), "areas": np.array([60000.0], np.float32),
              "cls": np.array([1])}
    out = RandomAffine(640, translate=0.0, scale=0.0, perspective=0.001)(sample)
    bright = out["img"][..., 0] > 120
    ys, xs = np.where(bright)
    assert np.allclose(out["bboxes"][0], [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], atol=2)  # the box follows the warp
    rows = np.where(bright.any(1))[0]
    assert abs(int(bright[rows.min() + 2].sum()) - int(bright[rows.max() - 2].sum())) > 20  # a trapezoid: no affine makes one


def test_imgsz_not_a_multiple_of_the_stride_rounds_up_with_a_warning(caplog):
    from yolo_cb.settings.config import get_config

    with caplog.at_level("WARNING", logger="yolo_cb"):
        assert get_config({"imgsz": 100}).imgsz == 128
    assert any("imgsz=100 must be a multiple of 32" in r.getMessage() and "128" in r.getMessage() for r in caplog.records)


def test_old_import_paths_work_with_a_deprecation_warning():
    code = ("import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
            "try:\n    from yolo_cb.engine.trainer import Trainer\nexcept DeprecationWarning as w:\n    print('warned:', w)\n"
            "warnings.simplefilter('ignore', DeprecationWarning)\n"
            "from yolo_cb.engine.trainer import Trainer\nfrom yolo_cb.training.trainer import Trainer as New\n"
            "from yolo_cb.engine.stop import StopCause\nfrom yolo_cb.engine.exporter import Exporter\n"
            "from yolo_cb.engine.backend import load_backend\nfrom yolo_cb.engine.epoch_record import EpochRecord\n"
            "from yolo_cb.engine.run_state import RunState\nfrom yolo_cb.callbacks.engine import Callbacks\n"
            "from yolo_cb.engine import MOVED\nimport importlib\n"
            "print(Trainer is New, all(importlib.import_module('yolo_cb.engine.' + m) is importlib.import_module(n) for m, n in MOVED.items()))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "warned: yolo_cb.engine.trainer is now yolo_cb.training.trainer" in done.stdout and "True True" in done.stdout, done.stdout


def test_readme_callbacks_from_the_folder_holding_the_package(shapes_small_yaml, tmp_path):
    """`yolo-cb train ... callbacks=mypkg.cbs:fn` from the folder that holds mypkg/: the console script does not put the
    working directory on the import path (python -m does); yolo-cb adds it for the user's callbacks= and modules=."""
    script = Path(sys.executable).parent / "yolo-cb"
    if not script.is_file():
        pytest.skip("no yolo-cb console script beside this Python")
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "cbs.py").write_text("def stop_at_target(trainer):\n    print('MYPKG CALLBACK RAN at epoch', trainer.epoch)\n")
    status, out = cli("train", f"data={shapes_small_yaml}", "callbacks=on_fit_epoch_end=mypkg.cbs:stop_at_target", "model=yolox-nano.yaml",
                      *(f"{k}={v}" for k, v in TINY.items()), "fraction=0.25", f"project={tmp_path / 'runs'}", "name=cb", cwd=tmp_path,
                      script=True)
    assert status == 0 and "MYPKG CALLBACK RAN at epoch 0" in out, out[-3000:]


@pytest.mark.slow
def test_readme_torchrun_ends_without_an_mlflow_error(shapes_small_yaml, tmp_path):
    """README's `torchrun --nproc_per_node 2 -m yolo_cb train data=... device=cpu`, MLflow on (its default): rank 1 ended
    the run with "WARNING MLflow: AttributeError: 'NoneType' object has no attribute 'log_artifact'"."""
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.is_file():
        pytest.skip("no torchrun beside this Python")
    settings = {**TINY, "mlflow": True}
    done = subprocess.run([str(torchrun), "--nproc_per_node", "2", "-m", "yolo_cb", "train", f"data={shapes_small_yaml}", "device=cpu",
                           "model=yolox-nano.yaml", *(f"{k}={v}" for k, v in settings.items()), f"project={tmp_path / 'runs'}", "name=ddp"],
                          capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "AttributeError" not in out and "WARNING MLflow" not in out, out[-3000:]
    assert list((tmp_path / "runs" / "mlruns" / "artifacts").rglob("best.pt")), out[-3000:]  # rank 0 still sent its files
