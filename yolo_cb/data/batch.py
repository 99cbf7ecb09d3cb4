"""What a loader batch holds, read without torch (the layout is data/loader.py's collate_fn's): the progress line and
the training step ask it for a batch's boxes and image size."""

from __future__ import annotations


def batch_shape(batch: dict | None, imgsz: int) -> tuple[int, int]:
    """(boxes, image side in pixels) of a loader batch: the progress line's Instances and Size; (0, imgsz) before the first."""
    return (int(batch["targets"].shape[0]), int(batch["img"].shape[-1])) if batch else (0, imgsz)
