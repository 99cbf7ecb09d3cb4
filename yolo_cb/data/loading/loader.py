"""Batching and data loaders: workers that live through the run, per-sample seeds, DDP sampling, the mosaic switch."""

from __future__ import annotations

import logging
import math
import os
import random
from contextlib import contextmanager
from functools import partial

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler

from yolo_cb.data.batch import ultralytics_keys
from yolo_cb.data.dataset import YOLODataset
from yolo_cb.data.dataset_yaml import resolve_datasets_dir
from yolo_cb.data.loading.stream import POOL_BATCHES, EpochStream, TaskDataset
from yolo_cb.data.loading.worker_memory import keep_freed_memory

LOGGER = logging.getLogger("yolo_cb")


def collate_fn(samples: list[dict], channels_last: bool = False) -> dict:
    """Stack samples into a batch.

    ``img`` uint8 (B, 3, H, W) RGB (``channels_last``: in that memory format, which a sample's image already has, so it
    is one plain copy); ``hsv_gains`` (B, 3) float64 when the colour is left to the device (data/loading/device_colour.py); ``targets`` float32 (N, 6) rows ``[image index, class, cx, cy, w, h]`` in pixels of ``img``, and
    Ultralytics' ``batch_idx``, ``cls``, ``bboxes`` (normalised) from it; ``im_files``; ``ori_shapes`` [(h0, w0)]; ``ratio_pad`` [(ratio, (pad_w, pad_h))] mapping ``img`` back to the
    original image with ``(xy - pad) / ratio``.
    """
    # copied with numpy: torch.stack on uint8 goes through OpenMP, which crawls on a busy 2-core machine
    c, h, w = shape = tuple(samples[0]["img"].shape)
    img = batch_buffer((len(samples), h, w, c) if channels_last else (len(samples), c, h, w))
    img = img.permute(0, 3, 1, 2) if channels_last else img
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
        **colour_gains(samples),
        "img": img,
        "targets": targets,
        **ultralytics_keys(targets, shape[1], shape[2]),  # batch_idx, cls, bboxes: data/batch.py
        "im_files": [s["im_file"] for s in samples],
        "ori_shapes": [tuple(s["ori_shape"]) for s in samples],
        "ratio_pad": [s["ratio_pad"] for s in samples],
    }


def colour_gains(samples: list[dict]) -> dict:
    """``{"hsv_gains": (B, 3) float64}`` when the samples' colour is left to the training device, else nothing."""
    carrying = ["hsv_gains" in s for s in samples]
    if not any(carrying):
        return {}
    if not all(carrying):
        raise ValueError("a batch mixes samples with and without HSV gains for the device: one dataset defers colour or not")
    return {"hsv_gains": torch.from_numpy(np.stack([s["hsv_gains"].numpy() for s in samples]))}


def batch_buffer(shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialised uint8 tensor for a batch; in a loader worker made in shared memory, where it goes anyway (as torch's
    default_collate does: share_memory_() on a new tensor would copy it there, twice the page faults of writing it)."""
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=torch.uint8)
    storage = torch.UntypedStorage._new_shared(math.prod(shape))
    return torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)


def init_worker(worker_id: int) -> None:
    """A loader worker: OpenCV single-threaded (the workers are the parallelism); freed image memory kept for the next
    sample (data/loading/worker_memory.py); numpy and random seeded from torch's per-worker seed for anything outside a sample
    (each sample is seeded from its task: data/loading/stream.py)."""
    import cv2

    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)
    cv2.setNumThreads(0)
    keep_freed_memory()


@contextmanager
def opencv_single_thread(active: bool):
    """OpenCV's thread pool off while loader work runs in this process (workers=0), put back afterwards."""
    import cv2

    previous = cv2.getNumThreads()
    if active:
        cv2.setNumThreads(0)
    try:
        yield
    finally:
        if active:
            cv2.setNumThreads(previous)


class YOLODataLoader:
    """Batches of a dataset, one epoch per iteration, from workers that live as long as the loader.

    ``span_epochs=True`` (training): one stream of tasks runs over every epoch (data/loading/stream.py), so the workers go on
    into the next epoch (2 batches each ahead) while the last one ends and validation runs, and a batch depends only on
    (seed, rank, epoch, batch). ``set_epoch(e)`` names the next iteration's epoch (default: the one after the last),
    ``skip_next(n)`` starts it after n batches, ``close_mosaic()`` switches the final stage on for every batch not yet
    delivered: no worker restarts for any of them. ``span_epochs=False`` (validation): torch's persistent workers,
    started again at each iteration.
    """

    def __init__(self, dataset, batch_size: int, workers: int = 0, shuffle: bool = False, sampler=None, base_seed: int = 0,
                 pin_memory: bool = False, channels_last: bool = False, span_epochs: bool = False, collate=collate_fn):
        self.dataset, self.batch_size, self.num_workers = dataset, int(batch_size), int(workers)
        self.sampler = sampler  # DDP: this rank's DistributedSampler (set_epoch reaches it); else None
        self.base_seed, self.span_epochs, self.persistent_workers = int(base_seed), bool(span_epochs), self.num_workers > 0
        self.channels_last = bool(channels_last)  # batches in the channels_last memory format (the model's, where it uses it)
        self.stream = EpochStream(len(dataset), batch_size, shuffle, base_seed, sampler, streams=workers, stage=dataset, span=span_epochs)
        generator = torch.Generator()
        generator.manual_seed(self.base_seed)  # the workers' torch seeds
        self._loader = DataLoader(TaskDataset(dataset), batch_sampler=self.stream, num_workers=self.num_workers, pin_memory=pin_memory,
                                  collate_fn=partial(collate, channels_last=self.channels_last) if collate is collate_fn else collate,
                                  worker_init_fn=init_worker, generator=generator,
                                  persistent_workers=self.persistent_workers and not self.span_epochs)
        self._iterator = None  # the torch iterator that owns the workers
        self._epoch: int | None = None  # the next iteration's epoch (set_epoch); None: the one after the last
        self._last_epoch, self._skip = -1, 0

    def __len__(self) -> int:
        return len(self.stream)

    def set_epoch(self, epoch: int) -> None:
        """The next iteration is `epoch` (its order and draws depend only on (seed, rank, epoch)); DDP's sampler too."""
        self._epoch = int(epoch)
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def skip_next(self, batches: int) -> None:
        """The next iteration (only) starts after `batches` batches, the same ones as without the skip, which are never
        loaded (a mid-epoch resume). Call it after ``set_epoch``."""
        self._skip = int(batches)

    def close_mosaic(self) -> None:
        """Switch off mosaic/mixup/affine from the next batch delivered on; the workers see it in the tasks they get."""
        self.dataset.close_mosaic()

    def reset_workers(self) -> None:
        """End the workers (the next iteration starts new ones); what they had made is dropped."""
        iterator, self._iterator = self._iterator, None
        self._loader._iterator = None  # torch's own handle on persistent workers (validation loaders)
        self.stream.seek(*self.stream.next_delivery())
        self.stream.issued.clear()
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()

    def __iter__(self):
        epoch = self._last_epoch + 1 if self._epoch is None else self._epoch
        start, self._skip, self._epoch, self._last_epoch = self._skip, 0, None, epoch
        with opencv_single_thread(self.num_workers == 0):
            yield from self._epoch_batches(epoch, start)

    def _epoch_batches(self, epoch: int, start: int):
        stream = self.stream
        if self._iterator is None or not self.span_epochs or stream.next_delivery() != (epoch, start):
            stream.seek(epoch, start)
        if self._iterator is None or not self.span_epochs:
            stream.issued.clear()  # a validation loader's new iteration drops what the last one left
            self._iterator = iter(self._loader)
        batch_i = start
        while batch_i < len(stream):
            batch, task = self._receive()
            if task.generation != stream.generation:
                continue  # made before a seek
            if task.closed != bool(getattr(self.dataset, "mosaic_closed", False)):
                stream.seek(epoch, batch_i)  # the final stage began after it was issued: make it again
                continue
            batch_i += 1
            yield batch

    def _receive(self):
        """The next batch from the workers and the task it was made from; after an error (a worker's, an interrupt) the
        workers are ended, as nothing received later could be matched to its task."""
        try:
            batch = next(self._iterator)
            return batch, self.stream.issued.popleft()
        except BaseException:
            self.reset_workers()
            raise


def close_loaders(*loaders) -> None:
    """End the workers of these loaders (None and plain DataLoaders are skipped): left alive, they were reaped whenever
    garbage collection found them, taking up to 5 s per worker then; a loader stays usable (new workers)."""
    for loader in loaders:
        if isinstance(loader, YOLODataLoader):
            loader.reset_workers()


def build_dataloader(dataset, batch_size: int, workers: int, shuffle: bool, rank: int = -1, seed: int = 0,
                     pin_memory: bool | None = None, channels_last: bool = False, span_epochs: bool = False) -> YOLODataLoader:
    """A seeded loader over ``dataset``; DistributedSampler when ``rank != -1``; pinned memory on CUDA only.

    ``span_epochs``: the training loader (its workers run on over epoch ends, see YOLODataLoader); ``channels_last``:
    batches in that memory format; ``pin_memory`` None: when CUDA is available."""
    if shuffle and getattr(dataset, "rect", False):
        LOGGER.warning("rectangular batches cannot be shuffled: shuffle=False")
        shuffle = False
    if getattr(dataset, "rect", False) and getattr(dataset, "batch_size", batch_size) != batch_size:
        LOGGER.warning(f"dataset planned rectangular batches of {dataset.batch_size} but the loader uses {batch_size}")
    workers = max(0, min(int(workers), os.cpu_count() or 1))
    sampler = DistributedSampler(dataset, rank=rank, shuffle=shuffle, seed=seed) if rank != -1 else None
    base_seed = seed + 100003 * (max(rank, 0) + 1)
    if span_epochs and getattr(dataset, "draws_partners", False):
        dataset.keep_decoded((POOL_BATCHES + 1) * batch_size)  # a no-cache process keeps its mosaic partner pool decoded
    return YOLODataLoader(dataset, batch_size, workers, shuffle=shuffle and sampler is None, sampler=sampler, base_seed=base_seed,
                          pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
                          channels_last=channels_last, span_epochs=span_epochs)


def build_yolo_dataset(args, img_path, mode: str = "train", names=None, stride: int = 32, batch: int | None = None,
                       write_caches: bool = True, colour_on_device: bool = False) -> YOLODataset:
    """A YOLODataset from settings (``args`` has the keys of cfg/default.yaml).

    ``mode='train'`` augments (and uses ``args.rect``, ``args.fraction``); ``'val'`` letterboxes
    rectangular batches, with all images.
    ``write_caches=False`` (DDP ranks > 0) only reads label and .npy caches, never writes them.
    ``colour_on_device``: training samples carry their HSV gains, applied on the device (device_colour.py), not colour.
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
        defer_colour=train and colour_on_device,
    )
