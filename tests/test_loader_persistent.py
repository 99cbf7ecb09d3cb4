"""The training loader built once per run: workers that live through every epoch and run on over its end, the mosaic
switch reaching them in their tasks, batches that depend only on (seed, rank, epoch, batch), DDP shards."""

from __future__ import annotations

import os
import types

import cv2
import numpy as np
import pytest
import torch
import yaml

from yolo_cb.data.dataset import YOLODataset
from yolo_cb.data.loading.loader import YOLODataLoader, build_dataloader, close_loaders
from yolo_cb.data.loading.stream import POOL_BATCHES
from yolo_cb.data.recent import RecentImages
from yolo_cb.utils.paths import DEFAULT_CFG

N_IMAGES = 12


def settings(**overrides):
    cfg = yaml.safe_load(DEFAULT_CFG.read_text())
    cfg.update(imgsz=64, batch=4, mosaic=1.0, scale=0.5)
    cfg.update(overrides)
    return types.SimpleNamespace(**cfg)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """12 small images of random colour blocks, one box each."""
    root = tmp_path_factory.mktemp("persistent")
    (root / "images").mkdir()
    (root / "labels").mkdir()
    rng = np.random.default_rng(0)
    for i in range(N_IMAGES):
        img = np.repeat(np.repeat(rng.integers(0, 255, (6, 8, 3), dtype=np.uint8), 8, 0), 8, 1)
        cv2.imwrite(str(root / "images" / f"{i}.png"), img)
        (root / "labels" / f"{i}.txt").write_text(f"{i % 2} 0.5 0.5 0.4 0.3\n")
    return root / "images"


class PidDataset(YOLODataset):
    """Writes the process that made each sample into its im_file: 'pid:file'."""

    def loader_item(self, i, partners, closed):
        sample = super().loader_item(i, partners, closed)
        sample["im_file"] = f"{os.getpid()}:{sample['im_file']}"
        return sample


def train_loader(images, workers: int, seed: int = 0, dataset_type=YOLODataset, cache=False, **hyp) -> YOLODataLoader:
    ds = dataset_type(str(images), 64, ["a", "b"], True, settings(**hyp), batch_size=4, cache=cache)
    return build_dataloader(ds, batch_size=4, workers=workers, shuffle=True, seed=seed, span_epochs=True)


def epochs(loader, first: int, last: int) -> list[list[dict]]:
    out = []
    for epoch in range(first, last + 1):
        loader.set_epoch(epoch)
        out.append(list(loader))
    return out


def assert_same(a: list[list[dict]], b: list[list[dict]]) -> None:
    assert len(a) == len(b)
    for ea, eb in zip(a, b, strict=True):
        assert [x["im_files"] for x in ea] == [x["im_files"] for x in eb]
        for x, y in zip(ea, eb, strict=True):
            assert torch.equal(x["img"], y["img"]) and torch.equal(x["targets"], y["targets"])


def test_workers_live_through_epochs_and_run_on_over_their_end(images):
    loader = train_loader(images, workers=2, dataset_type=PidDataset)
    try:
        pids = []
        for epoch in range(3):
            loader.set_epoch(epoch)
            batches = list(loader)
            assert len(batches) == len(loader) == N_IMAGES // 4
            pids.append({f.split(":")[0] for b in batches for f in b["im_files"]})
            assert loader.stream.issued and loader.stream.issued[0].epoch == epoch + 1  # the next epoch's tasks are out
        assert pids[0] == pids[1] == pids[2] and len(pids[0]) == loader.num_workers and str(os.getpid()) not in pids[0]
    finally:
        close_loaders(loader)


def test_the_mosaic_switch_reaches_the_same_workers(images):
    loader = train_loader(images, workers=2, dataset_type=PidDataset, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    try:
        loader.set_epoch(0)
        before = list(loader)
        assert all(mosaics(before))
        loader.close_mosaic()  # the next epoch's first tasks were issued before this: they are made again
        loader.set_epoch(1)
        after = list(loader)
        assert len(after) == len(loader) and not any(mosaics(after))
        assert {f.split(":")[0] for b in before + after for f in b["im_files"]} == {f.split(":")[0] for b in before for f in b["im_files"]}
    finally:
        close_loaders(loader)


def mosaics(batches: list[dict]) -> list[bool]:
    """Whether each image is a mosaic: without one (and with HSV off) an image is the 48x64 picture letterboxed into
    64x64, grey (114) in the 8-px bands above and below and nowhere between."""
    out = []
    for b in batches:
        for img in b["img"]:
            grey = (img == 114).all(0)
            out.append(not (grey[:8].all() and grey[56:].all() and not grey[8:56].any()))
    return out


@pytest.mark.parametrize("workers", [1, 2])
def test_seeded_runs_repeat_exactly_and_after_a_resume(images, workers):
    """Two runs with the same seed and workers, and a resumed one, see the same batches; 0 and 1 worker too (a batch's
    mosaic partner pool is made of the batches its worker made, so the worker count is part of the draw)."""
    straight = train_loader(images, workers=workers, seed=5)
    other = train_loader(images, workers=workers, seed=5)
    resumed = train_loader(images, workers=workers, seed=5)
    try:
        reference = epochs(straight, 0, 2)
        assert_same(epochs(other, 0, 2), reference)
        if workers == 1:
            assert_same(epochs(train_loader(images, workers=0, seed=5), 0, 2), reference)
        resumed.set_epoch(1)
        resumed.skip_next(1)  # a resume after the first batch of epoch 2
        tail = list(resumed)
        assert_same([tail], [reference[1][1:]])
        assert_same(epochs(resumed, 2, 2), [reference[2]])
        assert [b["im_files"] for b in reference[0]] != [b["im_files"] for b in reference[1]]  # epochs are shuffled apart
        different = epochs(train_loader(images, workers=0, seed=6), 0, 0)
        assert not torch.equal(different[0][0]["img"], reference[0][0]["img"])  # the seed matters
    finally:
        close_loaders(straight, other, resumed)


def test_each_ddp_rank_gets_its_shard_every_epoch(images):
    ds = YOLODataset(str(images), 64, ["a", "b"], True, settings(), batch_size=2)
    loaders = [YOLODataLoader(ds, 2, 0, sampler=torch.utils.data.DistributedSampler(ds, num_replicas=2, rank=r, shuffle=True, seed=0),
                              base_seed=r, span_epochs=True) for r in (0, 1)]
    orders = []
    for epoch in range(3):
        shards = []
        for loader in loaders:
            loader.set_epoch(epoch)
            assert loader.sampler.epoch == epoch
            shards.append([f for b in loader for f in b["im_files"]])
        assert sorted(shards[0] + shards[1]) == sorted(ds.im_files) and not set(shards[0]) & set(shards[1])
        orders.append(shards[0])
    assert len({tuple(o) for o in orders}) > 1


def test_an_epoch_left_early_does_not_leak_into_the_next(images):
    loader = train_loader(images, workers=2, seed=1)
    reference = train_loader(images, workers=2, seed=1)
    try:
        loader.set_epoch(0)
        next(iter(loader))  # a run stopped after one batch, or a benchmark's first batch
        assert_same(epochs(loader, 1, 1), epochs(reference, 1, 1))
    finally:
        close_loaders(loader, reference)


class ThreadsDataset(YOLODataset):
    """Records OpenCV's thread count while each sample is made."""

    seen: list[int] = []

    def loader_item(self, i, partners, closed):
        self.seen.append(cv2.getNumThreads())
        return super().loader_item(i, partners, closed)


def test_opencv_runs_single_threaded_while_the_main_process_loads(images):
    previous = cv2.getNumThreads()
    cv2.setNumThreads(2)
    try:
        loader = train_loader(images, workers=0, dataset_type=ThreadsDataset)
        list(loader)
        assert ThreadsDataset.seen and set(ThreadsDataset.seen) == {1}  # setNumThreads(0): OpenCV reports 1 (no pool)
        assert cv2.getNumThreads() == 2  # put back after the epoch
    finally:
        cv2.setNumThreads(previous)


class CountingDataset(YOLODataset):
    """Counts the images read from their files (in this process)."""

    reads = 0

    def _read(self, i):
        CountingDataset.reads += 1
        return super()._read(i)


def test_a_no_cache_sample_costs_about_one_decode_and_the_buffer_stays_bounded(images):
    loader = train_loader(images, workers=0, dataset_type=CountingDataset)
    CountingDataset.reads = 0
    samples = sum(len(b["im_files"]) for b in epochs(loader, 0, 3)[-1]) * 4
    assert CountingDataset.reads <= samples + len(loader.dataset)  # 4 mosaic tiles a sample; without the pool ~4 reads each
    recent = loader.dataset.recent
    assert recent is not None and 0 < len(recent) <= recent.count == (POOL_BATCHES + 1) * 4


def test_the_recent_images_keep_to_their_count_and_bytes():
    recent = RecentImages(count=3, max_bytes=8_000)
    for i in range(5):
        recent.put(i, np.zeros((10, 10, 3), np.uint8))  # 300 bytes each
    assert list(recent.images) == [2, 3, 4] and recent.nbytes == 900
    recent.put(9, np.zeros((50, 50, 3), np.uint8))  # 7500 bytes: the oldest go until it fits
    assert list(recent.images) == [4, 9] and recent.nbytes == 7800 and recent.get(2) is None


def test_the_cache_changes_speed_never_the_samples(images):
    plain, cached = train_loader(images, workers=0, seed=2), train_loader(images, workers=0, seed=2, cache="ram")
    assert plain.dataset.recent is not None and cached.dataset.cache_mode == "ram" and cached.dataset.recent is None
    assert_same(epochs(plain, 0, 1), epochs(cached, 0, 1))


def test_a_worker_keeps_its_freed_memory_under_glibc():
    """keep_freed_memory sets malloc under glibc and says so; elsewhere it does nothing (in a fresh process: it is
    process-wide)."""
    import platform
    import subprocess
    import sys

    code = "from yolo_cb.data.loading.worker_memory import keep_freed_memory; print(keep_freed_memory())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == str(platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")
