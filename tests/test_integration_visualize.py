"""Visualisation: batch grids with boxes where the labels say, and the files a training writes."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from yolo_cb import YOLO
from yolo_cb.integrations.visualize import Visualize, image_tag
from yolo_cb.utils.draw import class_color, plot_batch, targets_to_boxes

NAMES = {0: "circle", 1: "rectangle", 2: "triangle"}


def test_box_edges_have_the_class_colour_where_the_labels_say(tmp_path):
    images = torch.full((2, 3, 64, 64), 114, dtype=torch.uint8)  # flat grey
    targets = torch.tensor([[0, 1, 32, 32, 32, 24],  # image 0, class 1: xyxy (16, 20, 48, 44)
                            [1, 2, 20, 30, 16, 20]], dtype=torch.float32)  # image 1, class 2: xyxy (12, 20, 28, 40)
    path = tmp_path / "batch.jpg"
    grid = plot_batch(images, targets_to_boxes(targets, 2), NAMES, path, tile=5)  # 2 tiles of 320 px, 2 px apart
    assert grid.shape == (320, 642, 3)

    def edges(x1, y1, x2, y2, dx):
        x1, y1, x2, y2 = 5 * x1 + dx, 5 * y1, 5 * x2 + dx, 5 * y2
        mx, my = (x1 + x2) // 2, (y1 + y2) // 2
        return [(x1, my), (x2, my), (mx, y2)], (mx, my)  # left, right, bottom edge midpoints; the box centre

    for (x1, y1, x2, y2, dx), cls in (((16, 20, 48, 44, 0), 1), ((12, 20, 28, 40, 322), 2)):
        points, centre = edges(x1, y1, x2, y2, dx)
        colour = np.array(class_color(cls))
        for x, y in points:
            assert (grid[y, x] == colour).all(), (cls, x, y, grid[y, x], colour)
        assert (grid[centre[1], centre[0]] == 114).all()  # inside the box: still the grey image
    saved = cv2.imread(str(path))
    assert saved.shape == grid.shape
    for x, y in edges(16, 20, 48, 44, 0)[0]:
        assert np.abs(saved[y, x].astype(int) - np.array(class_color(1))).max() < 40  # JPEG keeps the colour


def test_predictions_below_conf_are_not_drawn(tmp_path):
    images = torch.full((1, 3, 64, 64), 114, dtype=torch.uint8)
    preds = torch.tensor([[10, 10, 30, 30, 0.9, 0], [40, 40, 60, 60, 0.1, 2]])
    kept = [preds[preds[:, 4] >= 0.25]]
    grid = plot_batch(images, kept, NAMES, tile=5, scores=True)
    assert (grid[100, 50] == class_color(0)).all()  # left edge of the 0.9 box (x 10*5, y between 50 and 150)
    assert (grid[250, 200] == 114).all()  # where the left edge of the dropped 0.1 box would be


def test_plot_period():
    vis = Visualize()
    vis.epochs, vis.period = 5, 2
    due = []
    for epoch in range(5):
        vis.epoch = epoch
        due.append(vis.due())
    assert due == [False, True, False, True, True]  # epochs 2 and 4, and the last one


def test_image_tag():
    assert image_tag(Path("val_batch0_pred_epoch3.jpg"), 7) == ("val_batch0_pred", 2)
    assert image_tag(Path("train_batch1.jpg"), 7) == ("train_batch1", 7)


@pytest.mark.slow
def test_training_writes_visualisations(tiny):
    model, listed = YOLO("yolox-nano.yaml"), []
    model.add_callback("on_fit_epoch_end", lambda trainer: listed.append(sorted(p.name for p in trainer.new_images)))
    model.train(**{**tiny, "epochs": 2, "plots": True, "plot_period": 1})
    run = Path(tiny["project"]) / tiny["name"]
    assert listed == [["train_batch0.jpg", "train_batch1.jpg", "train_batch2.jpg", "val_batch0_labels.jpg", "val_batch0_pred_epoch1.jpg"],
                      ["val_batch0_pred_epoch2.jpg"]]  # each file in trainer.new_images of the epoch that wrote it
    expected = ["train_batch0.jpg", "train_batch1.jpg", "train_batch2.jpg", "val_batch0_labels.jpg",
                "val_batch0_pred_epoch1.jpg", "val_batch0_pred_epoch2.jpg"]
    for name in expected:
        img = cv2.imread(str(run / name))
        assert img is not None, f"{name} missing or unreadable"
        assert min(img.shape[:2]) >= 320  # 64 px images are enlarged for readability
    assert not (run / "train_batch3.jpg").exists()
    assert not list(run.glob("val_batch0_pred_epoch3*"))  # the final validation of best.pt draws nothing
