"""Batching and data loaders: seeded workers, DDP sampling, and a mosaic switch that reaches the workers."""

from __future__ import annotations

import logging
import os
import random

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler

from yolo_cb.data.batch import ultralytics_keys
from yolo_cb.data.dataset import YOLODataset
from yolo_cb.data.dataset_yaml import resolve_datasets_dir

LOGGER = logging.getLogger("yolo_cb")


def collate_fn(samples: list[dict]) -> dict:
    """Stack samples into a batch.

    ``img`` uint8 (B, 3, H, W) RGB; ``targets`` float32 (N, 6) rows ``[image index, class, cx, cy, w, h]``
    in pixels of ``img``, and Ultralytics' ``batch_idx``, ``cls``, ``bboxes`` (normalised) from it; ``im_files``; ``ori_shapes`` [(h0, w0)]; ``ratio_pad`` [(ratio, (pad_w, pad_h))]
    mapping ``img`` back to the original image with ``(xy - pad) / ratio``.
    """
    # copied with numpy: torch.stack on uint8 goes through OpenMP, which crawls on a busy 2-core machine
    shape = tuple(samples[0]["img"].shape)
    img = torch.empty((len(samples), *shape), dtype=torch.uint8)
    if torch.utils.data.get_worker_info() is not None:
        img.share_memory_()  # in a loader worker: fill shared memory directly, saving a copy on the way out
    buffer = img.numpy()
    rows = []
    for i, s in enumerate(samples):
        if tuple(s["img"].shape) != shape:
            raise ValueError(f"images in one batch must share a shape: {s['im_file']} is {tuple(s['img'].shape)}, not {shape}")
        buffer[i] = s["img"].numpy()
        n = len(s["cls"])
        rows.append(np.concatenate([np.full((n, 1), i), s["cls"].numpy().reshape(n, 1), s["bboxes"].numpy().reshape(n, 4)], 1))
    targets = torch.from_numpy(np.concatenate(rows).astype(np.float32))
    return {
        "img": img,
        "targets": targets,
        **ultralytics_keys(targets, shape[1], shape[2]),  # batch_idx, cls, bboxes: data/batch.py
        "im_files": [s["im_file"] for s in samples],
        "ori_shapes": [tuple(s["ori_shape"]) for s in samples],
        "ratio_pad": [s["ratio_pad"] for s in samples],
    }


def seed_worker(worker_id: int) -> None:
    """Seed numpy and random in each loader worker from torch's per-worker seed; keep OpenCV single-threaded."""
    import cv2

    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)
    cv2.setNumThreads(0)


class YOLODataLoader(DataLoader):
    """A DataLoader with ``set_epoch`` (DDP shuffling) and ``close_mosaic`` (reaches persistent workers)."""

    def set_epoch(self, epoch: int) -> None:
        """Shuffle order and worker seeds depend only on (seed, epoch): a resumed run replays the same epochs."""
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)
        if self.generator is not None and hasattr(self, "base_seed"):
            self.generator.manual_seed(self.base_seed + epoch)

    def skip_next(self, batches: int) -> None:
        """The next iteration (only) starts after `batches` batches: their indices are drawn, in the same order as
        without the skip, but nothing is loaded (a mid-epoch resume). Call it after ``set_epoch``."""
        self.batch_sampler.sampler = _SkipFirst(self.batch_sampler, batches * self.batch_size)

    def close_mosaic(self) -> None:
        """Switch off mosaic/mixup/affine; the next ``iter(loader)`` starts fresh workers that see it."""
        self.dataset.close_mosaic()
        self.reset_workers()

    def reset_workers(self) -> None:
        """Shut down persistent workers so the next iteration forks new ones from the current dataset."""
        iterator, self._iterator = self._iterator, None
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()


def close_loaders(*loaders) -> None:
    """End the persistent workers of these loaders (None and plain DataLoaders are skipped): left alive, they were reaped
    whenever garbage collection found them, taking up to 5 s per worker then; a loader stays usable (new workers)."""
    for loader in loaders:
        if isinstance(loader, YOLODataLoader):
            loader.reset_workers()


class _SkipFirst(torch.utils.data.Sampler):
    """Wraps a batch sampler's sampler for one iteration: drops its first `count` indices, then puts the original back."""

    def __init__(self, batch_sampler, count: int):
        self.batch_sampler, self.inner, self.count = batch_sampler, batch_sampler.sampler, count

    def __iter__(self):
        self.batch_sampler.sampler = self.inner
        indices = iter(self.inner)
        for _ in range(self.count):
            next(indices, None)
        yield from indices

    def __len__(self) -> int:
        return len(self.inner)


def build_dataloader(dataset, batch_size: int, workers: int, shuffle: bool, rank: int = -1, seed: int = 0,
                     pin_memory: bool | None = None) -> YOLODataLoader:
    """A seeded loader over ``dataset``; DistributedSampler when ``rank != -1``; pinned memory on CUDA only."""
    if shuffle and getattr(dataset, "rect", False):
        LOGGER.warning("rectangular batches cannot be shuffled: shuffle=False")
        shuffle = False
    if getattr(dataset, "rect", False) and getattr(dataset, "batch_size", batch_size) != batch_size:
        LOGGER.warning(f"dataset planned rectangular batches of {dataset.batch_size} but the loader uses {batch_size}")
    workers = max(0, min(int(workers), os.cpu_count() or 1))
    sampler = DistributedSampler(dataset, rank=rank, shuffle=shuffle, seed=seed) if rank != -1 else None
    generator = torch.Generator()
    base_seed = seed + 100003 * (max(rank, 0) + 1)
    generator.manual_seed(base_seed)
    loader = YOLODataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle and sampler is None,
        sampler=sampler,
        num_workers=workers,
        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
        collate_fn=collate_fn,
        worker_init_fn=seed_worker,
        generator=generator,
        persistent_workers=workers > 0,
    )
    loader.base_seed = base_seed
    return loader


def build_yolo_dataset(args, img_path, mode: str = "train", names=None, stride: int = 32, batch: int | None = None,
                       write_caches: bool = True) -> YOLODataset:
    """A YOLODataset from settings (``args`` has the keys of cfg/default.yaml).

    ``mode='train'`` augments (and uses ``args.rect``, ``args.fraction``); ``'val'`` letterboxes
    rectangular batches, with all images.
    ``write_caches=False`` (DDP ranks > 0) only reads label and .npy caches, never writes them.
    """
    if mode not in ("train", "val"):
        raise ValueError(f"mode={mode!r} must be 'train' or 'val'")
    train = mode == "train"
    return YOLODataset(
        img_path,
        imgsz=args.imgsz,
        names=names,
        augment=train,
        hyp=args,
        rect=bool(args.rect) if train else True,
        batch_size=batch or args.batch,
        stride=stride,
        cache=args.cache,
        fraction=float(args.fraction) if train else 1.0,
        prefix=f"{mode}: ",
        write_caches=write_caches,
        datasets_dir=resolve_datasets_dir(getattr(args, "datasets_dir", None)),
    )
