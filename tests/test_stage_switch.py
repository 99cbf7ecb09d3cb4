"""YOLOX stage switch: mosaic off (also in loader workers), L1 loss on, validating every epoch — and kept on resume.

The dataset is generated here: every image is one solid colour (64 x 64 = imgsz, so a letterboxed image has no
padding). A mosaic mixes several images (and the affine warp adds grey border), so "every pixel of every batch image
has the same colour" is true exactly when mosaic is off.
"""

from __future__ import annotations

from types import SimpleNamespace

import cv2
import numpy as np
import pytest
import torch

from yolo_cb import YOLO
from yolo_cb.checkpoints.checkpoint import load_checkpoint
from yolo_cb.integrations.stage_switch import start_final_stage, switch_epoch
from yolo_cb.nn.build import build_model

COLOURS = [(b, g, r) for b in (20, 230) for g in (40, 200) for r in (10, 140, 250)]  # 12 distinct BGR colours, none grey


@pytest.fixture
def solid_yaml(tmp_path):
    root = tmp_path / "solid"
    for split, n in (("train", 16), ("val", 4)):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for i in range(n):
            img = np.full((64, 64, 3), COLOURS[i % len(COLOURS)], dtype=np.uint8)
            cv2.imwrite(str(root / "images" / split / f"{i:03d}.png"), img)
            (root / "labels" / split / f"{i:03d}.txt").write_text(f"{i % 2} 0.5 0.5 0.5 0.5\n")
    path = tmp_path / "solid.yaml"
    path.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames: [a, b]\n")
    return path


def solid_args(tiny, solid_yaml, **over):
    return {**tiny, "data": str(solid_yaml), "mosaic": 1.0, "hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0, "plots": False, **over}


class Recorder:
    """User callbacks: per epoch, whether every batch image was one colour, the l1 loss items, validate_every_epoch."""

    def __init__(self):
        self.uniform: dict[int, list[bool]] = {}
        self.l1: dict[int, list[float]] = {}
        self.validate_every: dict[int, bool] = {}

    def on_train_batch_start(self, trainer):
        img = trainer.batch["img"]
        flat = img.flatten(2)  # (B, 3, H*W)
        same = (flat == flat[:, :, :1]).all(dim=2).all(dim=1)
        self.uniform.setdefault(trainer.epoch, []).extend(bool(v) for v in same)

    def on_train_batch_loss_end(self, trainer):
        self.l1.setdefault(trainer.epoch, []).append(float(trainer.loss_items[3]))

    def on_train_epoch_end(self, trainer):
        self.validate_every[trainer.epoch] = bool(trainer.validate_every_epoch)


def test_the_final_stage_is_the_loss_s_own_business():
    """The switch knows no model family: each loss says what the last stage turns on (the detector contract), and a
    user's loss without the method is left alone."""
    yolox, yolocb = build_model("yolox-nano", nc=2, verbose=False), build_model("yolocb-n", nc=2, verbose=False)
    assert yolox.criterion.use_l1 is False
    assert start_final_stage(yolox.criterion) == "L1 loss on" and yolox.criterion.use_l1 is True
    assert yolox.criterion.training_state() == {"use_l1": True}
    assert start_final_stage(yolocb.criterion) == "" and yolocb.criterion.training_state() == {}
    assert start_final_stage(object()) == "" and start_final_stage(None) == ""


def test_switch_epoch_convention():
    from yolo_cb.settings.config import ConfigError, get_config

    default = get_config({})
    assert default.close_mosaic == default.no_aug_epochs == 15  # the default: YOLOX's 15 last epochs
    assert switch_epoch(default, 100) == 85  # YOLOX: the last 15 of epochs 0..99 are 85..99
    assert switch_epoch(default, 10) == 0  # shorter than close_mosaic: the whole run is the no-aug stage
    assert switch_epoch(get_config({"no_aug_epochs": 3}), 10) == 7  # YOLOX's name for the same setting
    assert switch_epoch(get_config({"close_mosaic": 3}), 10) == 7
    assert get_config({"close_mosaic": 3}).no_aug_epochs == 3 and get_config({"no_aug_epochs": 4, "close_mosaic": 4}).close_mosaic == 4
    assert switch_epoch(get_config({"next_stage_start_epoch": 4}), 100) == 4  # override
    assert switch_epoch(get_config({"close_mosaic": 0}), 10) is None  # Ultralytics: 0 = never close
    assert switch_epoch(get_config({"no_aug_epochs": 0}), 10) is None
    with pytest.raises(ConfigError, match="no_aug_epochs.*close_mosaic"):
        get_config({"close_mosaic": 3, "no_aug_epochs": 5})


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_switch_turns_mosaic_off_and_l1_on(tiny, solid_yaml, workers, caplog):
    caplog.set_level("INFO", logger="yolo_cb")
    rec = Recorder()
    model = YOLO("yolox-nano.yaml")
    model.add_callbacks(rec)
    model.train(**solid_args(tiny, solid_yaml, epochs=2, next_stage_start_epoch=1, workers=workers))

    assert not all(rec.uniform[0]), "epoch 0 (before the switch) should be mosaic batches"
    assert all(v == 0.0 for v in rec.l1[0])
    assert all(rec.uniform[1]), "after the switch every batch image must be a single letterboxed image (no mosaic)"
    assert all(v > 0.0 for v in rec.l1[1]), rec.l1[1]
    assert rec.validate_every == {0: False, 1: True}
    lines = [r.getMessage() for r in caplog.records if "YOLOX stage switch" in r.getMessage()]
    assert lines == ["YOLOX stage switch at epoch 2/2: mosaic and mixup off, L1 loss on, validating every epoch"]


@pytest.mark.slow
def test_switch_survives_resume(tiny, solid_yaml, caplog):
    caplog.set_level("INFO", logger="yolo_cb")

    def stop_after_second_epoch(trainer):
        if trainer.epoch == 1:
            trainer.stop = True

    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_fit_epoch_end", stop_after_second_epoch)
    model.train(**solid_args(tiny, solid_yaml, epochs=3, next_stage_start_epoch=1))
    last = tiny_run_dir(tiny) / "weights" / "last.pt"
    ckpt = load_checkpoint(last)
    assert ckpt.epoch == 1
    assert ckpt.callbacks["stage_switch"] == {"switched": True, "epoch": 1}
    assert ckpt.loss == {"use_l1": True}  # the loss's own state (training_state), not a YOLOX key of the checkpoint

    rec = Recorder()
    resumed = YOLO(str(last))
    resumed.add_callbacks(rec)
    resumed.train(resume=str(last))
    assert list(rec.l1) == [2]
    assert all(v > 0.0 for v in rec.l1[2]), f"L1 must be on from the first resumed batch: {rec.l1[2]}"
    assert all(rec.uniform[2]), "mosaic must stay off after resuming past the switch"
    assert rec.validate_every == {2: True}
    assert any("re-applied on resume at epoch 3/3" in r.getMessage() for r in caplog.records)
    assert load_checkpoint(last).callbacks["stage_switch"] == {"switched": True, "epoch": 1}


def tiny_run_dir(tiny):
    from pathlib import Path

    return Path(tiny["project"]) / tiny["name"]


def test_recorder_detects_mosaic_pixels():
    """The pixel test itself: a solid image is uniform; two colours side by side are not."""
    rec = Recorder()
    img = torch.zeros(2, 3, 8, 8, dtype=torch.uint8)
    img[0] = 50
    img[1, :, :, :4] = 10
    img[1, :, :, 4:] = 200
    rec.on_train_batch_start(SimpleNamespace(batch={"img": img}, epoch=0))
    assert rec.uniform[0] == [True, False]
