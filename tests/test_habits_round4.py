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
