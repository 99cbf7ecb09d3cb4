"""Video and real-time use (issue 61, section 2): the predictor is built once across `model(frame)` calls, set-up is not
booked into per-image speeds, `track` (CLI and Python, persist=True, boxes.id, the refusal without the tracker package),
vid_stride, embed, and predictor.dataset read from callbacks. The video is real: written with cv2.VideoWriter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from yolo_cb import YOLO
from yolo_cb.checkpoints.checkpoint import Checkpoint, save_checkpoint
from yolo_cb.nn import build_model

ROOT = Path(__file__).resolve().parents[1]
NAMES = {0: "circle", 1: "square", 2: "triangle", 3: "star"}
FRAMES = 20
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def write_video(path: Path, n: int = FRAMES, size: int = 64) -> Path:
    """n frames of a circle moving right and a square moving left."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 10, (size, size))
    for i in range(n):
        frame = np.full((size, size, 3), 40, np.uint8)
        cv2.circle(frame, (8 + 2 * i, 20), 6, (0, 0, 255), -1)
        cv2.rectangle(frame, (50 - 2 * i, 40), (58 - 2 * i, 50), (0, 255, 0), -1)
        writer.write(frame)
    writer.release()
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("video")
    torch.manual_seed(0)
    model = build_model("yolox-nano", nc=4, verbose=False)
    with torch.no_grad():  # scores above the prior so that an untrained model yields boxes (as tests/test_predict.py)
        for conv in (*model.head.obj_preds, *model.head.cls_preds):
            conv.bias.fill_(0.5)
    state = model.state_dict()
    weights = save_checkpoint(Checkpoint(model=state, ema=state, model_cfg=dict(model.cfg), names=NAMES, train_args={},
                                         epoch=0, version="0", date="2026-01-01"), root / "best.pt")
    video = write_video(root / "clip.mp4")
    capture = cv2.VideoCapture(str(video))
    frames = [capture.read()[1] for _ in range(FRAMES)]
    capture.release()
    return {"root": root, "weights": str(weights), "video": str(video), "frames": frames}


def run_child(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=ENV, timeout=600, cwd=ROOT)


# --- the predictor is built once -------------------------------------------------------------------------------------
def test_repeated_calls_build_the_model_once(setup):
    model = YOLO(setup["weights"])
    frame = setup["frames"][0]
    first = model(frame, imgsz=64, verbose=False)
    predictor, backend, module = model.predictor, model.predictor.backend, model.predictor.backend.model
    for conf in (None, 0.5, 0.3):  # settings that do not touch the model apply to the call as they are
        again = model(frame, imgsz=64, verbose=False, conf=conf)
        assert model.predictor is predictor and model.predictor.backend is backend and model.predictor.backend.model is module
    assert model.predictor.args.conf == 0.3 and all(float(c) >= 0.3 for c in again[0].boxes.conf)
    assert torch.equal(model(frame, imgsz=64, verbose=False)[0].boxes.data, first[0].boxes.data)
    model(frame, imgsz=64, verbose=False, trust=True)  # a setting the loaded model depends on: built anew
    assert model.predictor is not predictor and model.predictor.backend is not backend


def test_each_call_reads_its_own_settings(setup):
    """A call's settings are resolved once for a repeated request: an argument changed in place between calls still counts."""
    model = YOLO(setup["weights"])
    every = {int(c) for c in model(setup["frames"][0], imgsz=64, verbose=False)[0].boxes.cls}
    classes = [c for c in NAMES if c not in every]  # classes the model finds nowhere here: no boxes
    assert len(model(setup["frames"][0], imgsz=64, classes=classes, verbose=False)[0]) == 0
    classes[:] = sorted(every)
    assert {int(c) for c in model(setup["frames"][0], imgsz=64, classes=classes, verbose=False)[0].boxes.cls} == every
    model.predictor.args.conf = 0.99  # a callback's write to the last call's settings is not carried into the next call
    assert model(setup["frames"][0], imgsz=64, classes=classes, verbose=False)[0].boxes.conf.min() < 0.99


def test_a_rewritten_checkpoint_is_loaded_again(setup, tmp_path):
    weights = tmp_path / "w.pt"
    weights.write_bytes(Path(setup["weights"]).read_bytes())
    model = YOLO(str(weights))
    model(setup["frames"][0], imgsz=64, verbose=False)
    backend = model.predictor.backend
    os.utime(weights, ns=(0, os.stat(weights).st_mtime_ns + 10**9))  # as a training that writes a new best.pt there
    model(setup["frames"][0], imgsz=64, verbose=False)
    assert model.predictor.backend is not backend


def test_first_call_books_no_set_up_into_per_image_speeds(setup):
    """In a fresh process (where nothing is imported or loaded yet), the first call's postprocess time is a per-image
    figure: smaller than the one-time set-up the call also did (its wall time less the three per-image stages)."""
    code = ("import sys, time, json, numpy as np\nfrom yolo_cb import YOLO\nfresh = 'torchvision' not in sys.modules\n"
            "model = YOLO(sys.argv[1]); frame = np.full((64, 64, 3), 90, np.uint8)\n"
            "t = time.perf_counter(); r = model(frame, imgsz=64, verbose=False)[0]; wall = (time.perf_counter() - t) * 1e3\n"
            "print(json.dumps({'fresh': fresh, 'wall': wall, 'speed': r.speed}))")
    done = run_child(code, setup["weights"])
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    setup_ms = out["wall"] - sum(out["speed"].values())
    assert out["fresh"], "torchvision was imported before the first call: this test would see nothing"
    assert out["speed"]["postprocess"] < setup_ms, out


# --- track -------------------------------------------------------------------------------------------------------------
def test_track_from_the_cli_writes_ids(setup, tmp_path):
    done = subprocess.run([sys.executable, "-m", "yolo_cb", "track", f"model={setup['weights']}", f"source={setup['video']}",
                           "imgsz=64", "save_txt=True", f"project={tmp_path}", "name=t", "verbose=False"],
                          capture_output=True, text=True, env=ENV, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    labels = sorted((tmp_path / "t" / "labels").glob("clip_*.txt"))
    assert len(labels) == FRAMES and (tmp_path / "t" / "clip.mp4").is_file()
    rows = [line.split() for path in labels for line in path.read_text().splitlines()]
    assert rows and all(len(row) == 6 and row[5].isdigit() and int(row[5]) >= 1 for row in rows)  # cls cx cy w h id


@pytest.mark.parametrize("tracker", ["botsort.yaml", "bytetrack.yaml"])
def test_track_persist_keeps_ids_across_calls(setup, tracker):
    """Frame-by-frame calls with persist=True give the ids of one call over the whole video; without persist each call
    starts new tracks."""
    model = YOLO(setup["weights"])
    whole = model.track(setup["video"], imgsz=64, tracker=tracker, verbose=False)
    assert len(whole) == FRAMES and all(r.boxes.is_track for r in whole)
    assert sum(len(r) for r in whole) > 0 and whole[0].boxes.id.dtype == torch.float32
    model = YOLO(setup["weights"])  # no tracks yet: persist=True keeps those of an earlier call, as in Ultralytics
    step = [model.track(frame, persist=True, imgsz=64, tracker=tracker, verbose=False)[0] for frame in setup["frames"]]
    trackers = model.predictor.trackers
    for a, b in zip(whole, step, strict=True):
        assert torch.equal(a.boxes.id, b.boxes.id) and torch.allclose(a.boxes.xyxy, b.boxes.xyxy)
    model.track(setup["frames"][0], persist=True, imgsz=64, tracker=tracker, verbose=False)
    assert model.predictor.trackers is trackers
    model.track(setup["frames"][0], imgsz=64, tracker=tracker, verbose=False)  # persist=False: new tracks
    assert model.predictor.trackers is not trackers
    assert model(setup["frames"][0], imgsz=64, verbose=False)[0].boxes.id is None  # predict: no ids


def test_track_refused_in_one_line_without_the_tracker_package(setup, tmp_path):
    """The package made unimportable in a child process only (a finder that refuses it, as a missing module is)."""
    block = ("import sys\nclass Block:\n    def find_spec(self, name, path=None, target=None):\n"
             "        if name == 'trackers' or name.startswith('trackers.'):\n"
             "            raise ModuleNotFoundError(f\"No module named '{name}'\", name=name)\n"
             "sys.meta_path.insert(0, Block())\n")
    cli = run_child(block + "from yolo_cb.cli import entrypoint\nentrypoint(sys.argv[1:])", "track", f"model={setup['weights']}",
                    f"source={setup['video']}", f"project={tmp_path}")
    assert cli.returncode == 2, cli.stderr[-2000:]
    message = cli.stderr.strip().splitlines()
    assert len(message) == 1 and "pip install 'yolo-cb[track]'" in message[0], message
    python = run_child(block + "from yolo_cb import YOLO\ntry:\n    YOLO(sys.argv[1]).track(sys.argv[2])\n"
                       "except Exception as error:\n    print(type(error).__name__, error)", setup["weights"], setup["video"])
    assert python.returncode == 0 and "ConfigError" in python.stdout and "yolo-cb[track]" in python.stdout, python.stderr[-2000:]
    assert not list(tmp_path.iterdir())  # refused before any work


# --- vid_stride, embed, predictor.dataset -----------------------------------------------------------------------------
def test_vid_stride_reads_every_nth_frame(setup):
    model = YOLO(setup["weights"])
    results = model(setup["video"], imgsz=64, vid_stride=5, verbose=False)
    assert [r.frame for r in results] == [0, 5, 10, 15]
    every = model(setup["video"], imgsz=64, verbose=False)
    for r in results:
        assert torch.equal(r.boxes.data, every[r.frame].boxes.data)


def test_embed_returns_one_vector_per_image(setup):
    model = YOLO(setup["weights"])
    vectors = model.embed(setup["video"], imgsz=64, verbose=False)  # default: the layer before the head (C3_n4, 256 channels)
    assert len(vectors) == FRAMES and all(v.shape == (256,) for v in vectors)
    assert not torch.equal(vectors[0], vectors[-1])  # the shapes moved
    picked = model.predict(setup["frames"][:3], imgsz=64, embed=[2, 4], verbose=False)  # dark3 (64) + dark5 (256)
    assert len(picked) == 3 and all(v.shape == (64 + 256,) for v in picked)
    assert torch.allclose(model.embed(setup["frames"][0], imgsz=64, embed=[12], verbose=False)[0], vectors[0], atol=1e-5)


def test_predictor_dataset_is_readable_from_callbacks(setup):
    model = YOLO(setup["weights"])
    seen = []
    model.add_callback("on_predict_batch_start", lambda p: seen.append((p.dataset.mode, p.dataset.frame, p.dataset.frames, p.dataset.bs)))
    model(setup["video"], imgsz=64, vid_stride=3, verbose=False)
    assert seen == [("video", i, 7, 1) for i in range(1, 8)]  # 20 frames, every 3rd: 7 read
    seen.clear()
    model(setup["frames"][0], imgsz=64, verbose=False)
    assert seen == [("image", 0, 0, 1)]
