"""YOLODataset: verification of bad images/labels, the label cache, rect batches, image caching."""

from __future__ import annotations

import logging
import shutil
import types
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from shared_data import SHARED

from yolo_cb.data import verify
from yolo_cb.data.dataset import YOLODataset
from yolo_cb.data.loading.loader import build_dataloader
from yolo_cb.utils.paths import DEFAULT_CFG

SHARED_SHAPES = SHARED / "datasets" / "shapes"
NAMES = ["circle", "rectangle", "triangle", "cross"]


def hyp(**overrides):
    cfg = yaml.safe_load(DEFAULT_CFG.read_text())
    cfg.update(overrides)
    return types.SimpleNamespace(**cfg)


@pytest.fixture
def log(caplog):
    """caplog that also sees the yolo_cb logger when another part of the project stops its propagation."""
    logger = logging.getLogger("yolo_cb")
    attach = not logger.propagate
    if attach:
        logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="yolo_cb")
    yield caplog
    if attach:
        logger.removeHandler(caplog.handler)


def copy_shapes(dest: Path, n: int = 8, split: str = "train") -> Path:
    """Copy the first n shared shapes images + labels into dest/images/<split> (never touching shared/)."""
    if not SHARED_SHAPES.is_dir():
        pytest.skip(f"shared shapes dataset not found at {SHARED_SHAPES}")
    for kind, suffix in (("images", ".jpg"), ("labels", ".txt")):
        (dest / kind / split).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            name = f"{split}_{i:05d}{suffix}"
            shutil.copyfile(SHARED_SHAPES / kind / split / name, dest / kind / split / name)
    return dest / "images" / split


def plain_image(path: Path, h: int, w: int, value=90):
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), np.full((h, w, 3), value, np.uint8))


def test_bad_images_and_labels_are_skipped_or_fixed_and_named(tmp_path, log):
    images = copy_shapes(tmp_path, n=9)
    labels = tmp_path / "labels" / "train"
    truncated = images / "train_00000.jpg"
    truncated.write_bytes(truncated.read_bytes()[:3000])
    (labels / "train_00001.txt").write_text("0 0.5 0.5 0.2\n")  # 4 columns
    (labels / "train_00002.txt").write_text("7 0.5 0.5 0.2 0.2\n")  # class 7 >= nc 4
    (labels / "train_00003.txt").write_text("1 1.5 0.5 0.2 0.2\n2 0.5 0.5 0.2 0.2\n")  # far outside: dropped
    (labels / "train_00004.txt").write_text("1 0.5 0.5 0.2 0.2\n1 0.5 0.5 0.2 0.2\n")  # duplicate
    (labels / "train_00005.txt").write_text("1 0.5 0.5 1.01 0.2\n")  # 0.5% outside: clipped
    (labels / "train_00006.txt").write_text("1 0.5 abc 0.2 0.2\n")  # not a number
    (images / "notes.gif").write_bytes(b"GIF89a")  # unsupported suffix
    (labels / "train_00007.txt").unlink()  # missing label: a background image

    ds = YOLODataset(str(images), 160, NAMES, True, hyp(imgsz=160), batch_size=4, prefix="train: ")
    text = log.text
    assert "train: 5 images" in text and "5 corrupt" in text, text
    for name, reason in [
        ("train_00000.jpg", "truncated JPEG"),
        ("train_00001.txt", "4 columns"),
        ("train_00002.txt", "class id 7"),
        ("train_00003.txt", "outside the image"),
        ("train_00004.txt", "duplicate"),
        ("train_00005.txt", "clipped"),
        ("train_00006.txt", "non-number"),
        ("notes.gif", "unsupported image suffix"),
    ]:
        assert any(name in line and reason in line for line in text.splitlines()), f"{name}: '{reason}' not in\n{text}"
    by_name = {Path(r["im_file"]).name: r for r in ds.labels}
    assert len(by_name["train_00003.jpg"]["cls"]) == 1 and len(by_name["train_00004.jpg"]["cls"]) == 1
    assert np.allclose(by_name["train_00005.jpg"]["bboxes"], [[0.5, 0.5, 1.0, 0.2]], atol=1e-6)
    assert len(by_name["train_00007.jpg"]["cls"]) == 0
    batches = list(build_dataloader(ds, 4, 0, shuffle=True))
    assert sum(len(b["im_files"]) for b in batches) == 5 and batches[0]["img"].shape[1:] == (3, 160, 160)


def test_label_cache_reused_then_rebuilt(tmp_path, monkeypatch, log):
    images = copy_shapes(tmp_path, n=6)
    calls = []
    real = verify.verify_pair
    monkeypatch.setattr(verify, "verify_pair", lambda *a: calls.append(a[0]) or real(*a))

    def load():
        calls.clear()
        return YOLODataset(str(images), 160, NAMES, False, hyp(), prefix="val: ")

    first = load()
    assert len(calls) == 6 and not first.report["from_cache"]
    cache = Path(first.report["cache_file"])
    assert cache == tmp_path / "labels" / "train.yolo_cb.cache" and cache.is_file()
    second = load()
    assert calls == [] and second.report["from_cache"]  # no re-verification
    assert [r["im_file"] for r in second.labels] == [r["im_file"] for r in first.labels]
    label = tmp_path / "labels" / "train" / "train_00002.txt"
    label.write_text(label.read_text() + "0 0.5 0.5 0.1 0.1\n")
    third = load()
    assert len(calls) == 6 and not third.report["from_cache"]
    assert sum(len(r["cls"]) for r in third.labels) == sum(len(r["cls"]) for r in first.labels) + 1
    for junk in (b"not json at all", b'{"version": 999, "hash": "x", "entries": []}', b"\x93NUMPY\x01\x00"):
        cache.write_bytes(junk)  # corrupt, foreign version, another tool's cache
        assert not load().report["from_cache"] and len(calls) == 6
    assert load().report["from_cache"]


def test_read_only_or_unwritable_folders_skip_writing_with_one_warning(tmp_path, monkeypatch, log):
    images = copy_shapes(tmp_path, n=3)
    monkeypatch.setattr(verify, "_unwritable_warned", set())
    labels_parent, image_folder = tmp_path / "labels", images
    for folder in (labels_parent, image_folder):
        folder.chmod(0o555)  # read-only (root could still write: the mode bits are honoured anyway)
    try:
        for _ in range(2):
            assert len(YOLODataset(str(images), 160, NAMES, False, hyp(), cache="disk")) == 3
    finally:
        for folder in (labels_parent, image_folder):
            folder.chmod(0o755)
    assert log.text.count("label cache not saved") == 1 and "cache=disk needs writable image folders" in log.text
    assert not list(tmp_path.rglob("*.cache")) and not list(tmp_path.rglob("*.npy"))

    def refuse(path, text):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(verify, "atomic_write_text", refuse)
    monkeypatch.setattr(verify, "_unwritable_warned", set())
    log.clear()
    for _ in range(2):
        assert len(YOLODataset(str(images), 160, NAMES, False, hyp())) == 3
    assert log.text.count("label cache not saved") == 1 and "Permission denied" in log.text


def test_split_without_usable_images_names_the_split(tmp_path, log):
    bad = tmp_path / "images" / "val" / "a.jpg"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"val: no usable image in .*images/val"):
        YOLODataset(str(bad.parent), 160, NAMES, False, hyp(), prefix="val: ")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        YOLODataset(str(tmp_path / "nowhere"), 160, NAMES, False, hyp(), prefix="val: ")


def test_exif_rotation_gives_the_shape_opencv_returns(tmp_path):
    from PIL import Image

    path = tmp_path / "images" / "rot.jpg"
    path.parent.mkdir()
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees
    Image.new("RGB", (40, 20), (200, 10, 10)).save(path, exif=exif)
    shape, reason = verify.verify_image(str(path))
    assert reason is None and shape == cv2.imread(str(path)).shape[:2] == (40, 20)


def test_rect_val_batches_pad_at_most_one_stride_per_side(tmp_path):
    # pairs of similar aspect ratios, shuffled: sorting must bring each pair into one batch
    sizes = [(400, 200), (210, 400), (300, 310), (300, 450), (200, 400), (320, 300), (400, 215), (310, 450)]
    for i, (h, w) in enumerate(sizes):
        plain_image(tmp_path / "images" / "val" / f"{i}.png", h, w)
        (tmp_path / "labels" / "val").mkdir(parents=True, exist_ok=True)
        (tmp_path / "labels" / "val" / f"{i}.txt").write_text("0 0.5 0.5 0.5 0.5\n")
    ds = YOLODataset(str(tmp_path / "images" / "val"), 320, NAMES, False, hyp(), rect=True, batch_size=2)
    seen = 0
    for batch in build_dataloader(ds, 2, 0, shuffle=False):
        H, W = batch["img"].shape[2:]
        assert H % 32 == 0 and W % 32 == 0 and max(H, W) == 320
        for k, ((h0, w0), (r, (pw, ph))) in enumerate(zip(batch["ori_shapes"], batch["ratio_pad"], strict=True)):
            content_w, content_h = round(w0 * r), round(h0 * r)
            assert 0 <= pw <= 32 and 0 <= ph <= 32 and W - content_w - pw <= 32 and H - content_h - ph <= 32
            # the label box maps back onto the original image
            t = batch["targets"][batch["targets"][:, 0] == k][0, 2:].numpy()
            back = (np.array([t[0] - pw, t[1] - ph, t[2], t[3]]) / r)
            assert np.allclose(back, [w0 / 2, h0 / 2, w0 / 2, h0 / 2], atol=1.5), (back, (h0, w0))
            seen += 1
    assert seen == len(sizes)


def test_fraction_records_and_image_caches(tmp_path):
    images = copy_shapes(tmp_path, n=8, split="val")
    half = YOLODataset(str(images), 160, NAMES, False, hyp(), fraction=0.5)
    assert [Path(r["im_file"]).name for r in half.labels] == [f"val_{i:05d}.jpg" for i in range(4)]
    rec = half.labels[0]
    assert rec["cls"].dtype == np.int64 and rec["bboxes"].shape == (len(rec["cls"]), 4) and len(rec["shape"]) == 2
    plain = [half[i]["img"] for i in range(4)]
    ram = YOLODataset(str(images), 160, NAMES, False, hyp(), fraction=0.5, cache="ram")
    assert all(im is not None for im in ram.ims)
    disk = YOLODataset(str(images), 160, NAMES, False, hyp(), fraction=0.5, cache="disk")
    assert all(Path(r["im_file"]).with_suffix(".npy").is_file() for r in disk.labels)
    for i in range(4):
        assert np.array_equal(ram[i]["img"], plain[i]) and np.array_equal(disk[i]["img"], plain[i])


def test_long_problem_lists_are_cut_after_ten(tmp_path, log):
    images = copy_shapes(tmp_path, n=1)
    for i in range(12):
        (images / f"empty_{i:02d}.jpg").write_bytes(b"")
    ds = YOLODataset(str(images), 160, NAMES, False, hyp())
    assert len(ds) == 1 and "12 corrupt" in log.text
    assert "empty_09.jpg: skipped, empty image file" in log.text and "empty_10.jpg" not in log.text and "... and 2 more" in log.text
