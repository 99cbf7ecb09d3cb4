"""Security round 4, the last cases: model files we did not write whose metadata or shape is wrong, an OpenVINO export
into a read-only folder, links planted in a predict folder reused with exist_ok=True, class names that are paths or
terminal escapes. Each failed on main before this change (a traceback, a write through a link, a file outside its place).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
import torch
from test_export_hostile import read_only_mount
from test_predict_hostile import tiny_checkpoint

import yolo_cb
from yolo_cb.errors import CheckpointError
from yolo_cb.prediction.backend import load_backend

ROOT = Path(yolo_cb.__file__).resolve().parents[1]  # the checkout under test (its subprocesses run the same code)


def yolo_cb_cli(*argv: str, cwd: Path, wrap: list[str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([*(wrap or []), sys.executable, "-m", "yolo_cb", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL)


def error_line(done: subprocess.CompletedProcess, *pieces: str) -> str:
    """Exit 2, no traceback, one 'yolo-cb: error:' line holding every piece."""
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("yolo-cb: error: ")]
    assert len(errors) == 1, done.stderr[-3000:]
    for piece in pieces:
        assert piece in errors[0], errors[0]
    return errors[0]


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    """m.pt (nc=2, names a, b) and its ONNX, TorchScript and OpenVINO exports at imgsz 64, plus an image."""
    from yolo_cb.export.exporter import Exporter

    folder = tmp_path_factory.mktemp("round4e")
    weights = tiny_checkpoint(folder / "m.pt")
    made = {fmt: Path(Exporter({"imgsz": 64, "format": fmt})(str(weights))) for fmt in ("onnx", "torchscript", "openvino")}
    cv2.imwrite(str(folder / "img.jpg"), np.full((64, 64, 3), 127, np.uint8))
    return {"folder": folder, "pt": weights, "image": folder / "img.jpg", **made}


# --- 1. metadata of ONNX, TorchScript and OpenVINO files -------------------------------------------------------------
def onnx_with(exports: dict, folder: Path, key: str, value: str) -> Path:
    proto = onnx.load(str(exports["onnx"]))
    entry = next(e for e in proto.metadata_props if e.key == key)
    entry.value = value
    onnx.save(proto, str(folder / "crafted.onnx"))
    return folder / "crafted.onnx"


def torchscript_with(exports: dict, folder: Path, text: str) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.load's deprecation notice
        module = torch.jit.load(str(exports["torchscript"]))
    torch.jit.save(module, str(folder / "crafted.torchscript"), _extra_files={"config.txt": text})
    return folder / "crafted.torchscript"


def openvino_with(exports: dict, folder: Path, text: str) -> Path:
    crafted = folder / "crafted_openvino_model"
    shutil.copytree(exports["openvino"], crafted)
    (crafted / "metadata.json").write_text(text)
    return crafted


def good_metadata(exports: dict) -> dict[str, str]:
    return {e.key: e.value for e in onnx.load(str(exports["onnx"])).metadata_props}


ONNX_CASES = [  # key, crafted value, what the line says (each was a SyntaxError / AttributeError / ValueError traceback or taken)
    ("names", "{{{not", "'names' is '{{{not', neither JSON nor a Python literal"),
    ("names", "5", "'names' is int 5; it must map class ids 0..n-1 to names"),
    ("names", '{"0": "a", "7": "b"}', "'names' has the class ids [0, 7]; ids must be the integers 0..n-1"),
    ("stride", "abc", "'stride' is 'abc', neither JSON nor a Python literal"),
    ("stride", "0", "'stride' is 0; it must be an integer from 1 to 256"),
    ("imgsz", "[-5, 1e9]", "'imgsz' is -5; it must be an integer from 1 to 8192"),
    ("imgsz", '"big"', "'imgsz' is 'big'; it must be a size or [height, width]"),
    ("nms", '{"iou": "x"}', "'nms' is {'iou': 'x'}; it must be {}"),
    ("dynamic", "maybe", "'dynamic' is 'maybe', neither JSON"),
    ("names", '{"0": "a"}', "it outputs shape (1, 84, 7), not a detector's (batch, anchors, 5 + classes) = (batch, anchors, 6) "
                            "for its 1 class names"),  # was taken: class 1 predicted with no name
]


@pytest.mark.parametrize("key, value, said", ONNX_CASES)
def test_bad_onnx_metadata_is_one_clear_error(exports, tmp_path, key, value, said):
    crafted = onnx_with(exports, tmp_path, key, value)
    with pytest.raises(CheckpointError) as caught:
        load_backend(crafted)
    assert str(caught.value).startswith(f"model={crafted}: not a usable ONNX model: ") and said in str(caught.value), caught.value


@pytest.mark.parametrize("text, said", [
    ("not json{", "its metadata is not JSON ('not json{')"),
    ("[1, 2]", "its metadata is list [1, 2], not a mapping of keys to values"),
    ("IMGSZ", "'imgsz' is -5; it must be an integer from 1 to 8192"),  # was an OpenCV assertion in the letterbox
    ("STRIDE", "'stride' is 'x', neither JSON nor a Python literal"),
    ("NAMES", "'names' is '[[[', neither JSON nor a Python literal")])
def test_bad_torchscript_metadata_is_one_clear_error(exports, tmp_path, text, said):
    meta = good_metadata(exports)
    text = {"IMGSZ": json.dumps({**meta, "imgsz": "[-5, 64]"}), "STRIDE": json.dumps({**meta, "stride": "x"}),
            "NAMES": json.dumps({**meta, "names": "[[["})}.get(text, text)
    crafted = torchscript_with(exports, tmp_path, text)
    with pytest.raises(CheckpointError) as caught:
        load_backend(crafted, trust=True)  # a file we did not write: trusted, so that its metadata is what is checked
    assert str(caught.value).startswith(f"model={crafted}: not a usable TorchScript model: ") and said in str(caught.value)


@pytest.mark.parametrize("text, said", [
    ("{not json", "its metadata is not JSON ('{not json')"), ("[1]", "its metadata is list [1], not a mapping"),
    ('{"names": 7}', "'names' is int 7; it must map class ids 0..n-1 to names"),
    ('{"stride": "x", "names": {"0": "a", "1": "b"}}', "'stride' is 'x', neither JSON nor a Python literal")])
def test_bad_openvino_metadata_is_one_clear_error(exports, tmp_path, text, said):
    crafted = openvino_with(exports, tmp_path, text)
    with pytest.raises(CheckpointError) as caught:
        load_backend(crafted)
    assert str(caught.value).startswith(f"model={crafted / 'metadata.json'}: not a usable OpenVINO model: ") and said in str(caught.value)


def test_our_exports_and_ultralytics_style_metadata_still_load(exports, tmp_path):
    """The checks refuse nothing we write, nor the Python-literal forms Ultralytics writes (names as a dict's repr, 'False')."""
    for fmt in ("onnx", "torchscript", "openvino"):
        backend = load_backend(exports[fmt])
        assert backend.names == {0: "a", 1: "b"} and backend.stride == 32 and backend(torch.zeros(1, 3, 64, 64)).shape[-1] == 7
    proto = onnx.load(str(exports["onnx"]))
    del proto.metadata_props[:]
    for key, value in {"names": "{0: 'person', 1: 'car'}", "stride": "32", "imgsz": "[64, 64]", "batch": "1", "half": "False",
                       "dynamic": "False", "args": "{'batch': 1}"}.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(proto, str(tmp_path / "ultralytics_style.onnx"))
    assert load_backend(tmp_path / "ultralytics_style.onnx").names == {0: "person", 1: "car"}


def test_bad_metadata_on_the_cli_is_one_line_exit_2(exports, tmp_path):
    crafted = onnx_with(exports, tmp_path, "names", "{{{not")
    error_line(yolo_cb_cli("predict", f"model={crafted}", f"source={exports['image']}", "imgsz=64", cwd=tmp_path),
               f"model={crafted}: not a usable ONNX model: its metadata 'names' is '{{{{{{not'")


def test_a_checkpoint_renamed_torchscript_is_one_line(exports, tmp_path):
    renamed = tmp_path / "m.torchscript"
    shutil.copy(exports["pt"], renamed)
    error_line(yolo_cb_cli("predict", f"model={renamed}", f"source={exports['image']}", "imgsz=64", cwd=tmp_path),
               f"model={renamed}: not a usable TorchScript model: it is a PyTorch checkpoint (torch.save), not a TorchScript "
               f"archive: give it as a .pt file")


@pytest.mark.parametrize("kind", ["onnx", "torchscript"])
def test_a_model_that_is_no_detector_is_refused_naming_the_shape(exports, tmp_path, kind):
    """A one-convolution model loaded, and predict 'detected' boxes in its feature map (exit 0)."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 3).eval()
    model = tmp_path / f"conv.{kind}"
    if kind == "onnx":
        torch.onnx.export(conv, torch.zeros(1, 3, 64, 64), str(model), dynamo=False)
    else:
        torch.jit.save(torch.jit.trace(conv, torch.zeros(1, 3, 64, 64)), str(model))
    label = {"onnx": "ONNX", "torchscript": "TorchScript"}[kind]
    trust = ["trust=True"] if kind == "torchscript" else []  # a TorchScript file we did not write loads only when trusted
    done = yolo_cb_cli("predict", f"model={model}", f"source={exports['image']}", "imgsz=64", f"project={tmp_path / 'runs'}",
                       "save_txt=True", *trust, cwd=tmp_path)
    error_line(done, f"model={model}: not a usable {label} model: it outputs shape (1, 8, 62, 62), not a detector's "
                     f"(batch, anchors, 5 + classes)")
    assert not [p for p in (tmp_path / "runs").rglob("*") if p.is_file()]  # no image, no label of its pixels


# --- 2. an OpenVINO export into a read-only folder -------------------------------------------------------------------
def test_openvino_export_into_a_read_only_mount_is_one_line(exports, tmp_path):
    mount = tmp_path / "ro"
    done = yolo_cb_cli("export", f"model={mount / 'm.pt'}", "format=openvino", "imgsz=64", cwd=tmp_path,
                       wrap=read_only_mount(mount, exports["pt"]))
    error_line(done, f"cannot write the export ({mount / 'm_openvino_model'}): read-only file system",
               f"copy {mount / 'm.pt'} to a folder this process may write to")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a mode-0555 folder; the read-only mount test covers root")
def test_openvino_export_into_a_mode_0555_folder_is_one_line(exports, tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir()
    shutil.copy(exports["pt"], folder / "m.pt")
    folder.chmod(0o555)
    try:
        done = yolo_cb_cli("export", f"model={folder / 'm.pt'}", "format=openvino", "imgsz=64", cwd=tmp_path)
    finally:
        folder.chmod(0o755)
    error_line(done, f"cannot write the export ({folder / 'm_openvino_model'})", "copy")
    assert sorted(p.name for p in folder.iterdir()) == ["m.pt"]


# --- 3. links planted in a predict folder reused with exist_ok=True --------------------------------------------------
def predict_into(exports: dict, tmp_path: Path, plant) -> tuple[subprocess.CompletedProcess, Path]:
    """Predict an image and a 3-frame video into runs/x, after `plant(runs/x)` has planted its links there."""
    source = tmp_path / "src"
    source.mkdir()
    shutil.copy(exports["image"], source / "img.jpg")
    video = cv2.VideoWriter(str(source / "vid.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), 5, (64, 64))
    for _ in range(3):
        video.write(np.full((64, 64, 3), 127, np.uint8))
    video.release()
    out = tmp_path / "runs" / "x"
    out.mkdir(parents=True)
    plant(out)
    done = yolo_cb_cli("predict", f"model={exports['pt']}", f"source={source}", "imgsz=64", "conf=0.01", "save_txt=True",
                       "save_crop=True", f"project={tmp_path / 'runs'}", "name=x", "exist_ok=True", cwd=tmp_path)
    return done, out


def test_links_planted_at_predicts_files_are_not_written_through(exports, tmp_path):
    victims = {name: tmp_path / f"victim_{i}" for i, name in enumerate(
        ("labels/img.txt", "img.jpg", "vid.mp4", "crops/a/img.jpg", "crops/b/img.jpg", "labels/vid_0.txt"))}

    def plant(out: Path) -> None:
        for name, victim in victims.items():
            victim.write_text("VICTIM\n")
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).symlink_to(victim)

    done, out = predict_into(exports, tmp_path, plant)
    assert done.returncode == 0, done.stderr[-3000:]
    assert all(v.read_text() == "VICTIM\n" for v in victims.values()), {n: v.read_text()[:40] for n, v in victims.items()}
    for name in ("labels/img.txt", "img.jpg", "vid.mp4", "labels/vid_0.txt"):
        assert (out / name).is_file() and not (out / name).is_symlink(), name
    assert cv2.imread(str(out / "img.jpg")) is not None and cv2.VideoCapture(str(out / "vid.mp4")).read()[0]
    crops = sorted(p.relative_to(out).as_posix() for p in (out / "crops").rglob("*.jpg") if not p.is_symlink())
    assert crops and all(cv2.imread(str(out / c)) is not None for c in crops), crops


def test_folder_links_planted_in_a_predict_folder_are_not_followed(exports, tmp_path):
    elsewhere = {name: tmp_path / f"elsewhere_{name}" for name in ("labels", "crops")}

    def plant(out: Path) -> None:
        for name, folder in elsewhere.items():
            folder.mkdir()
            (out / name).symlink_to(folder, target_is_directory=True)

    done, out = predict_into(exports, tmp_path, plant)
    assert done.returncode == 0, done.stderr[-3000:]
    assert all(not any(folder.iterdir()) for folder in elsewhere.values()), {n: list(f.rglob("*")) for n, f in elsewhere.items()}
    assert (out / "labels" / "img.txt").is_file() and any((out / "crops").rglob("*.jpg"))


def test_class_names_that_are_paths_keep_crops_inside_their_folder(tmp_path):
    """save_crop made a folder per class name: '../../escape' wrote a crop two levels above crops/."""
    from yolo_cb.prediction.results import Results

    names = {0: "../../escape", 1: "..", 2: "a/b", 3: "\x1b[2J"}
    boxes = torch.tensor([[0, 0, 8, 8, 0.9, c] for c in range(4)], dtype=torch.float32)
    crops = tmp_path / "deep" / "crops"
    written = Results(np.full((16, 16, 3), 99, np.uint8), "im.jpg", names, boxes=boxes).save_crop(crops, file_name="im")
    assert len(written) == 4 and all(Path(p).resolve().parent.parent == crops.resolve() for p in written), written
    assert sorted(p.name for p in crops.iterdir()) == [".._.._escape", "1", "_x1b[2J", "a_b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep"]


# --- 4. class names in plots -----------------------------------------------------------------------------------------
def test_class_names_with_escapes_or_dollars_do_not_break_the_plots(tmp_path, recwarn):
    """'$\\frac{$' made the validation plots raise (matplotlib mathtext); an ESC in a name went raw to the terminal in
    matplotlib's missing-glyph warning."""
    from yolo_cb.utils.plotting import plot_confusion_matrix, plot_pr_curve

    names = {0: "a$b", 1: "\x1b[2Jx", 2: "$\\frac{$"}
    plot_confusion_matrix(np.eye(4), names, tmp_path / "cm.png")
    plot_pr_curve(np.linspace(0, 1, 10), np.ones((3, 10)), np.ones(3), list(names.values()), tmp_path / "pr.png")
    assert cv2.imread(str(tmp_path / "cm.png")) is not None and cv2.imread(str(tmp_path / "pr.png")) is not None
    assert not [w for w in recwarn if "\x1b" in str(w.message)]


def test_val_with_a_dataset_of_another_class_count_is_one_line(exports, tmp_path, shapes_small_yaml):
    """It was a ValueError traceback ('class count mismatch')."""
    error_line(yolo_cb_cli("val", f"model={exports['pt']}", f"data={shapes_small_yaml}", "imgsz=64", f"project={tmp_path}",
                           cwd=tmp_path), "class count mismatch", "predicts 2 classes", "has 4")
