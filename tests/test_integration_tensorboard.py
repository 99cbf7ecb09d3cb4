"""TensorBoard: a tiny training writes real event files; read them back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

from pathlib import Path

import pytest

from yolo_cb import YOLO


@pytest.mark.slow
def test_event_files_hold_scalars_graph_and_images(tiny):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    YOLO("yolox-nano.yaml").train(**{**tiny, "epochs": 2, "tensorboard": True, "plots": True, "fraction": 0.25})  # 1 train batch
    run = Path(tiny["project"]) / tiny["name"]
    assert list(run.glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0, "images": 0, "graph": 0})
    acc.Reload()
    tags = acc.Tags()

    for key in ("train/iou_loss", "train/obj_loss", "train/cls_loss", "train/l1_loss", "lr/pg0", "lr/pg1", "lr/pg2",
                "metrics/precision(B)", "metrics/recall(B)", "metrics/mAP50(B)", "metrics/mAP50-95(B)", "fitness", "val/iou_loss"):
        assert key in tags["scalars"], f"{key} not in {tags['scalars']}"
        assert [e.step for e in acc.Scalars(key)] == [0, 1], key  # one point per epoch, step = 0-based epoch
    csv_rows = (run / "results.csv").read_text().splitlines()
    header, first = csv_rows[0].split(","), csv_rows[1].split(",")
    assert acc.Scalars("train/iou_loss")[0].value == pytest.approx(float(first[header.index("train/iou_loss")]), rel=1e-3)
    for phase in ("data", "forward", "backward", "optimizer", "callbacks", "val", "epoch"):  # phase timings, as results.csv has them
        key = f"time/{phase}_ms"
        assert [e.step for e in acc.Scalars(key)] == [0, 1], key
        assert acc.Scalars(key)[0].value == pytest.approx(float(first[header.index(key)]), rel=1e-3, abs=1e-3), key

    assert tags["graph"] is True
    assert "head" in str(acc.Graph())  # the traced YOLOX graph, down to its modules

    assert {"train_batch0", "val_batch0_labels", "val_batch0_pred"} <= set(tags["images"])
    assert [e.step for e in acc.Images("val_batch0_pred")] == [0, 1]
    image = acc.Images("train_batch0")[0]
    assert image.width >= 320 and image.height >= 320
    # stored as the visualisation file's own JPEG bytes (no decode, no PNG encoding), its size from the file's header
    assert image.encoded_image_string == (run / "train_batch0.jpg").read_bytes()
    from PIL import Image

    with Image.open(run / "train_batch0.jpg") as jpeg:
        assert (image.width, image.height) == jpeg.size
