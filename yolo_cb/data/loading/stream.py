"""The loader's sampler for a whole run: batch tasks epoch after epoch, each sample with a seed of its own.

A task names its epoch and batch, the dataset indices of its samples, one seed per sample (numpy's global RNG is
seeded with it just before that sample is made, in whichever process makes it), the pool its mosaic / mixup partners
are drawn from, and whether the final no-mosaic stage applies. A batch is therefore a function of (seed, rank, epoch,
batch) alone: the same with 0, 1 or 8 workers, whatever a worker made before, and after a resume. The order of an
epoch is the one the loader always had: ``torch.randperm`` seeded with ``base_seed + epoch`` (DDP: the rank's
``DistributedSampler`` shard for that epoch).

Tasks are issued lazily, as torch's DataLoader asks for them (2 per worker ahead), so workers that never stop run on
across an epoch's end. A ``seek`` (another epoch, a mid-epoch resume, a stage switch) bumps ``generation``: the tasks
already issued are stale, and the loader drops their batches when they arrive.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

POOL_BATCHES = 4  # a batch's mosaic / mixup partners come from its own images and those of the 3 batches its worker made just before (~4x batch images, kept decoded without a cache)


@dataclass(frozen=True)
class BatchTask:
    """One batch to make: what a loader worker receives (through torch's ``__getitems__``)."""

    generation: int  # the stream's generation when issued; an older one's batch is dropped on arrival
    epoch: int
    batch: int  # the batch's position in its epoch
    indices: tuple[int, ...]  # dataset indices of the samples
    seeds: tuple[int, ...]  # numpy's global RNG is seeded with seeds[k] just before sample k is made
    partners: np.ndarray | None  # dataset indices mosaic / mixup partners are drawn from; None: any index
    closed: bool  # the final stage (no mosaic, mixup, affine) applies

    def __len__(self) -> int:
        return len(self.indices)


class EpochStream(torch.utils.data.Sampler):
    """A batch sampler over epochs: ``len`` is the batches of one epoch; iterating issues tasks from the cursor on.

    ``span=True`` (training): the iteration never ends; it runs into the next epochs. ``span=False`` (validation): one
    iteration issues the rest of the cursor's epoch. ``stage`` is read when a task is issued: the dataset (its
    ``mosaic_closed`` and ``draws_partners``). ``streams``: how many workers take the tasks in turn (1 for none): a
    task's partner pool is made of the batches ``streams`` apart, so that one worker made them all.
    """

    def __init__(self, size: int, batch_size: int, shuffle: bool, base_seed: int, sampler=None, streams: int = 1,
                 stage=None, span: bool = True):
        self.size, self.batch_size, self.shuffle, self.base_seed = int(size), int(batch_size), bool(shuffle), int(base_seed)
        self.sampler = copy.copy(sampler)  # a private copy: its set_epoch here never moves the one the user sees
        self.streams, self.stage, self.span = max(int(streams), 1), stage, bool(span)
        per_epoch = len(sampler) if sampler is not None else self.size
        self.batches = math.ceil(per_epoch / self.batch_size)
        self.epoch, self.batch, self.generation = 0, 0, 0  # the cursor: the next task to issue
        self.issued: deque[BatchTask] = deque()  # issued, not yet delivered: the loader pops one per batch it receives
        self._orders: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[BatchTask]:
        while self.span or self.batch < self.batches:
            yield self._issue()

    def seek(self, epoch: int, batch: int) -> None:
        """The next task issued is (epoch, batch); every task issued before is stale."""
        self.epoch, self.batch, self.generation = int(epoch), int(batch), self.generation + 1

    def next_delivery(self) -> tuple[int, int]:
        """(epoch, batch) of the next batch the loader will keep: the first live task issued, else the cursor."""
        live = next((t for t in self.issued if t.generation == self.generation), None)
        return (live.epoch, live.batch) if live else (self.epoch, self.batch)

    def order(self, epoch: int) -> list[int]:
        """The dataset indices of `epoch` in the order they are batched (the epochs a pool reaches back to are kept)."""
        if epoch not in self._orders:
            keep = 2 + POOL_BATCHES * self.streams // self.batches
            for old in [e for e in self._orders if abs(e - epoch) >= keep]:
                del self._orders[old]
            self._orders[epoch] = self._draw_order(epoch)
        return self._orders[epoch]

    def _draw_order(self, epoch: int) -> list[int]:
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)
            return list(self.sampler)
        if not self.shuffle:
            return list(range(self.size))
        generator = torch.Generator()
        generator.manual_seed(self.base_seed + epoch)
        return torch.randperm(self.size, generator=generator).tolist()

    def indices(self, epoch: int, batch: int) -> list[int]:
        return self.order(epoch)[batch * self.batch_size : (batch + 1) * self.batch_size]

    def _issue(self) -> BatchTask:
        epoch, batch = self.epoch, self.batch
        indices = self.indices(epoch, batch)
        seeds = np.random.SeedSequence([self.base_seed % 2**63, epoch, batch]).generate_state(len(indices))
        closed, pooled = bool(getattr(self.stage, "mosaic_closed", False)), bool(getattr(self.stage, "draws_partners", False))
        task = BatchTask(self.generation, epoch, batch, tuple(indices), tuple(int(s) for s in seeds),
                         self._pool(epoch, batch) if pooled and not closed else None, closed)
        self.issued.append(task)
        self.batch += 1
        if self.span and self.batch >= self.batches:
            self.epoch, self.batch = self.epoch + 1, 0
        return task

    def _pool(self, epoch: int, batch: int) -> np.ndarray:
        """This batch's indices and those of the POOL_BATCHES - 1 batches `streams` before it (over epoch ends; none
        before the run's first batch)."""
        position = epoch * self.batches + batch
        parts = [self.indices(*divmod(p, self.batches)) for p in range(position, position - POOL_BATCHES * self.streams, -self.streams) if p >= 0]
        return np.asarray([i for part in parts for i in part], dtype=np.int64)


class TaskDataset(torch.utils.data.Dataset):
    """What the loader's workers index: `dataset`, handed a whole BatchTask at once (torch's ``__getitems__``).

    Each sample is made with numpy's global RNG seeded from the task (the caller's RNG state is put back after), by
    ``dataset.loader_item(index, partners, closed)`` when the dataset has it, else by ``dataset[index]``.
    """

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        return self.dataset[index]

    def __getitems__(self, task: BatchTask) -> list:
        make = getattr(self.dataset, "loader_item", None)
        state = np.random.get_state()
        try:
            samples = []
            for index, seed in zip(task.indices, task.seeds, strict=True):
                np.random.seed(seed)
                samples.append(make(index, task.partners, task.closed) if make else self.dataset[index])
            return samples
        finally:
            np.random.set_state(state)
