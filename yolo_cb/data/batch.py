"""What a loader batch holds, read without torch loaded (the layout is data/loading/loader.py's collate_fn's): the progress line
and the training step ask it for a batch's boxes and image size.

Ultralytics' batch keys beside yolo-cb's `targets` (N, 6) [image index, class, cx, cy, w, h in input pixels]:
`batch_idx` (N,) the image index, `cls` (N, 1) the class, `bboxes` (N, 4) cx cy w h normalised to the input image (0..1),
each a float tensor, as Ultralytics' trainer.batch holds them. `batch_idx` and `cls` are views of `targets` (an in-place
edit is an edit of targets); an edit of any of the three made in on_train_batch_start, in place or by assigning a new
tensor, becomes the batch's targets (`apply_edits`; an edit of `targets` itself wins), so that what a callback writes
is what trains.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def batch_shape(batch: dict | None, imgsz: int) -> tuple[int, int]:
    """(boxes, image side in pixels) of a loader batch: the progress line's Instances and Size; (0, imgsz) before the first."""
    return (int(batch["targets"].shape[0]), int(batch["img"].shape[-1])) if batch else (0, imgsz)


KEYS = ("batch_idx", "cls", "bboxes")


def ultralytics_keys(targets: torch.Tensor, height: int, width: int) -> dict[str, torch.Tensor]:
    import torch  # here: the progress line reads batch_shape with no torch loaded (yolo-cb callbacks)

    scale = torch.tensor([width, height, width, height], dtype=targets.dtype)
    return {"batch_idx": targets[:, 0], "cls": targets[:, 1:2], "bboxes": targets[:, 2:6] / scale}


def snapshot(batch: dict) -> tuple[torch.Tensor, ...] | None:
    """Copies of targets and the three keys, to tell later what a callback edited (None: the batch has no such keys)."""
    return tuple(batch[k].clone() for k in ("targets", *KEYS)) if all(k in batch for k in KEYS) else None


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    import torch

    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)


def apply_edits(batch: dict, before: tuple[torch.Tensor, ...] | None) -> None:
    """After a callback: an edited `targets` wins (the keys are made again from it); else, when it changed batch_idx, cls
    or bboxes, `targets` is rebuilt from those; else the batch stays as it is."""
    if before is None:
        return
    import torch

    height, width = batch["img"].shape[-2:]
    if not _same(batch["targets"], before[0]):
        batch.update(ultralytics_keys(batch["targets"], height, width))
        return
    now = tuple(batch[k] for k in KEYS)
    if all(_same(a, b) for a, b in zip(now, before[1:], strict=True)):
        return
    idx, cls, boxes = (torch.as_tensor(v, dtype=torch.float32).reshape(len(v), -1) for v in now)
    if not len(idx) == len(cls) == len(boxes) or boxes.shape[1] != 4 or idx.shape[1] != 1 or cls.shape[1] != 1:
        raise ValueError(f"trainer.batch: batch_idx (N,), cls (N, 1) and bboxes (N, 4) must have one row per box; got "
                         f"{tuple(idx.shape)}, {tuple(cls.shape)}, {tuple(boxes.shape)}")
    pixels = boxes * torch.tensor([width, height, width, height], dtype=torch.float32)
    batch["targets"] = torch.cat((idx, cls, pixels), 1)
    batch.update(ultralytics_keys(batch["targets"], height, width))
