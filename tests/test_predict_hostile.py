"""Predict under hostile conditions: many large images, huge images, odd file names, signals, clashing names.

Each case runs the real CLI (`python -m yolo_cb predict ...`) as a subprocess; memory is the child's own peak RSS
as the kernel reports it (os.wait4), never a wall-clock figure.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import wait_with_peak_rss

from yolo_cb import YOLO
from yolo_cb.checkpoints.checkpoint import Checkpoint, save_checkpoint
from yolo_cb.nn import build_model

ROOT = Path(__file__).resolve().parents[1]


def tiny_checkpoint(path: Path) -> Path:
    """A valid yolo-cb checkpoint of a random yolox-nano (nc=2) whose scores give some boxes at conf 0.25."""
    torch.manual_seed(0)
    model = build_model("yolox-nano", nc=2, verbose=False)
    with torch.no_grad():
        for conv in (*model.head.obj_preds, *model.head.cls_preds):
            conv.bias.fill_(0.5)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return save_checkpoint(Checkpoint(model=state, ema=state, model_cfg=dict(model.cfg), names={0: "a", 1: "b"},
                                      train_args={"imgsz": 64}, epoch=0, best_fitness=0.0, version="0.1.0",
                                      date="2026-01-01T00:00:00"), path)


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("hostile_predict") / "m.pt")


def scene(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A textured BGR image (noise compresses badly, so a JPEG of it stays realistic in size)."""
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 256, (h // 8, w // 8, 3), dtype=np.uint8)
    return cv2.resize(img, (w, h), interpolation=cv2.INTER_LINEAR)


PACE = """import time
seen = 0
def pace(predictor):
    global seen
    seen += 1
    if seen == 50:
        open({marker!r}, "w").close()
    if seen >= 50:
        time.sleep(0.05)
"""


def default_signals() -> None:
    """In the child: SIGINT and SIGTERM at their defaults, as in a shell (an ignored SIGINT, left by an earlier test in
    this pytest process, is inherited through exec, and Python then installs no KeyboardInterrupt handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def cli_env(cwd: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(cwd), "OMP_NUM_THREADS": "1", "TMPDIR": str(cwd)}


def cap(address_space: int | None):
    """A preexec_fn setting RLIMIT_AS in the child, or None."""
    if address_space is None:
        return None
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))


def huge_png(path: Path, w: int, h: int) -> Path:
    """A valid 1-bit grayscale PNG of w x h (all black), written row by row: ~100 KB on disk, w*h*3 bytes decoded as BGR."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    packer, row = zlib.compressobj(9), b"\0" * (1 + (w + 7) // 8)  # filter byte 0, then the packed bits
    idat = b"".join(packer.compress(row) for _ in range(h)) + packer.flush()
    header = struct.pack(">IIBBBBB", w, h, 1, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b""))
    return path


def predict_peak_rss(args: list[str], cwd: Path, limit_s: float = 300, address_space: int | None = None) -> tuple[int, str]:
    """(peak RSS in KiB of one `yolo-cb predict` process, its output), from os.wait4 on that very child; `address_space`:
    an RLIMIT_AS cap in bytes, so a runaway allocation fails in the child instead of swamping the machine."""
    log = cwd / f"stderr_{len(list(cwd.glob('stderr_*')))}.txt"
    with open(log, "w") as err:
        child = subprocess.Popen([sys.executable, "-m", "yolo_cb", "predict", *args], cwd=cwd, env=cli_env(cwd),
                                 stdout=err, stderr=subprocess.STDOUT, preexec_fn=cap(address_space))
        code, peak = wait_with_peak_rss(child, limit_s)  # a hung child is killed, not waited on forever
    text = log.read_text()
    assert code == 0, text[-3000:]
    return peak, text


def test_cli_predict_memory_is_flat_in_the_number_of_images(weights, tmp_path):
    """The report: 40 images of 3000x3000 took 2.02 GB against 1.08 GB for 4 (every decoded image was kept)."""
    jpg = tmp_path / "big.jpg"
    cv2.imwrite(str(jpg), scene(2400, 2400), [cv2.IMWRITE_JPEG_QUALITY, 90])  # 17 MB decoded
    peaks = {}
    for n in (4, 40):
        folder = tmp_path / f"images{n}"
        folder.mkdir()
        for i in range(n):
            (folder / f"im{i:02d}.jpg").write_bytes(jpg.read_bytes())
        peaks[n], _ = predict_peak_rss([f"model={weights}", f"source={folder}", "imgsz=64", "save=False", "save_txt=True",
                                        f"project={tmp_path / 'runs'}", f"name=n{n}"], tmp_path)
        assert len(list((tmp_path / "runs" / f"n{n}" / "labels").glob("*.txt"))) == n  # every image was predicted
    # kept images would add 36 x 17 MB = 620 MB to the ~1.1 GB of the libraries (torch, onnxruntime, OpenCV)
    assert peaks[40] < 1.15 * peaks[4], peaks


def test_cli_predict_memory_is_flat_in_the_number_of_video_frames(weights, tmp_path):
    """The report: a 600-frame 720p video took 2.57 GB (every frame was kept)."""
    peaks = {}
    for n in (20, 200):
        video = tmp_path / f"clip{n}.avi"
        writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 30.0, (1280, 720))
        frame = scene(720, 1280)
        for i in range(n):
            writer.write(np.roll(frame, 8 * i, axis=1))
        writer.release()
        peaks[n], _ = predict_peak_rss([f"model={weights}", f"source={video}", "imgsz=64", "save=False", "save_txt=True",
                                        f"project={tmp_path / 'runs'}", f"name=v{n}"], tmp_path)
        assert len(list((tmp_path / "runs" / f"v{n}" / "labels").glob("*.txt"))) == n  # every frame was predicted
    # kept frames would add 180 x 2.8 MB = 500 MB to the ~1.1 GB of the libraries
    assert peaks[200] < 1.1 * peaks[20], peaks


def test_predict_refuses_the_pixels_training_refuses(weights, tmp_path):
    """The report: predict decoded the 30000x30000 PNG that training refuses (6.2 GB RSS). Now it is skipped from its
    header with one warning naming the file and the limit, and the other images are predicted."""
    from PIL import Image

    from yolo_cb.data.verify import verify_image

    folder = tmp_path / "images"
    folder.mkdir()
    bomb = huge_png(folder / "bomb.png", 30000, 30000)
    cv2.imwrite(str(folder / "ok.jpg"), scene(64, 64))
    assert verify_image(str(bomb))[0] is None  # training refuses it
    limit = 2 * Image.MAX_IMAGE_PIXELS
    peak, stderr = predict_peak_rss([f"model={weights}", f"source={folder}", "imgsz=64", "save=False", "save_txt=True",
                                     f"project={tmp_path / 'runs'}", "name=p"], tmp_path, address_space=6 * 2**30)
    line = next((x for x in stderr.splitlines() if "bomb.png" in x), stderr[-2000:])
    assert "skipping" in line and "900,000,000 pixels" in line and f"{limit:,}" in line, line
    assert sorted(p.name for p in (tmp_path / "runs" / "p" / "labels").iterdir()) == ["ok.txt"]
    assert peak < 2 * 2**20, peak  # KiB: the libraries (~1.1 GB), not the 2.7 GB a decode of the bomb takes


def test_a_file_name_that_is_not_utf8_is_skipped_with_one_line(weights, tmp_path):
    """The report: such a name in a predict folder was a segmentation fault with no message (OpenCV on the path)."""
    folder = tmp_path / "images"
    folder.mkdir()
    cv2.imwrite(str(folder / "ok.jpg"), scene(64, 64))
    os.rename(folder / "ok.jpg", os.fsencode(folder) + b"/caf\xe9.jpg")  # Latin-1 bytes: not UTF-8
    cv2.imwrite(str(folder / "ok.jpg"), scene(64, 64, seed=1))
    _, output = predict_peak_rss([f"model={weights}", f"source={folder}", "imgsz=64", "save_txt=True",
                                  f"project={tmp_path / 'runs'}", "name=p"], tmp_path)
    line = next(x for x in output.splitlines() if "not valid UTF-8" in x)
    assert "skipping" in line and "caf\\xe9.jpg" in line, line
    run = tmp_path / "runs" / "p"
    assert sorted(p.name for p in (run / "labels").iterdir()) == ["ok.txt"] and (run / "ok.jpg").is_file()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_video_predict_leaves_a_readable_video(weights, tmp_path, sig):
    """The report: SIGTERM during video predict left an unreadable file (SIGINT kept it): both finalise the video."""
    video = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 30.0, (320, 240))
    frame = scene(240, 320)
    for i in range(1500):  # far more than are predicted before the signal
        writer.write(np.roll(frame, 4 * i, axis=1))
    writer.release()
    out = tmp_path / "runs" / "p" / "clip.mp4"
    # a callback marks the 50th frame and then paces the rest, so the signal lands mid-video however busy the machine is
    (tmp_path / "pace.py").write_text(PACE.format(marker=str(tmp_path / "frames_written")))
    env = {**cli_env(tmp_path), "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    child = subprocess.Popen([sys.executable, "-m", "yolo_cb", "predict", f"model={weights}", f"source={video}", "imgsz=64",
                              f"project={tmp_path / 'runs'}", "name=p", "callbacks=on_predict_batch_end=pace:pace"],
                             cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             preexec_fn=default_signals)
    try:
        while child.poll() is None and not (tmp_path / "frames_written").exists():  # 50 frames are written
            threading.Event().wait(0.02)
        child.send_signal(sig)
        _, stderr = child.communicate(timeout=120)
    finally:
        child.kill()
    capture = cv2.VideoCapture(str(out))
    frames = 0
    while capture.read()[0]:
        frames += 1
    capture.release()
    assert 0 < frames < 1500, (frames, child.returncode)
    assert child.returncode == {signal.SIGTERM: 143, signal.SIGINT: 130}[sig], stderr[-3000:]  # stopped, not finished


def test_images_sharing_a_stem_keep_their_own_label_files(weights, tmp_path):
    """The report: a.jpg and a.png in one folder shared labels/a.txt in predict's save_txt (the last one won)."""
    folder = tmp_path / "images"
    folder.mkdir()
    cv2.imwrite(str(folder / "a.jpg"), scene(64, 64, seed=1))
    cv2.imwrite(str(folder / "a.png"), scene(96, 64, seed=2))
    _, output = predict_peak_rss([f"model={weights}", f"source={folder}", "imgsz=64", "save_txt=True", "save_conf=True",
                                  f"project={tmp_path / 'runs'}", "name=p"], tmp_path)
    labels = tmp_path / "runs" / "p" / "labels"
    assert sorted(p.name for p in labels.iterdir()) == ["a.txt", "a_png.txt"]
    assert any("a_png.txt" in x and "a.png" in x for x in output.splitlines()), output[-2000:]
    assert sorted(p.name for p in (tmp_path / "runs" / "p").glob("a.*")) == ["a.jpg", "a.png"]


def test_a_recursive_glob_streams_its_matches(tmp_path, weights):
    """`source=/**/*.jpg` globbed the whole tree before the first image (still at 120 s): a recursive glob predicts its
    first match at once, and the images of a deep tree all come through, each once."""
    from yolo_cb.prediction.sources import expand

    for depth in range(3):
        folder = tmp_path.joinpath(*[f"d{i}" for i in range(depth + 1)])
        folder.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(folder / f"im{depth}.jpg"), np.full((64, 64, 3), 90 * depth, np.uint8))
    streamed = expand(str(tmp_path / "**" / "*.jpg"))
    assert not isinstance(streamed, list) and next(streamed).endswith(".jpg")  # an iterator: the first match without the rest
    results = YOLO(str(weights)).predict(source=str(tmp_path / "**" / "*.jpg"), imgsz=64, save=False)
    assert sorted(Path(r.path).name for r in results) == ["im0.jpg", "im1.jpg", "im2.jpg"]
    with pytest.raises(FileNotFoundError, match="matched no files"):
        YOLO(str(weights)).predict(source=str(tmp_path / "**" / "*.png"), imgsz=64, save=False)
