"""collate_fn, build_dataloader (seeding, DDP sampler, workers) and close_mosaic reaching the workers."""

from __future__ import annotations

import types

import cv2
import numpy as np
import pytest
import torch
import yaml

from yolo_cb.data.dataset import YOLODataset
from yolo_cb.data.loading.loader import build_dataloader, build_yolo_dataset, close_loaders, collate_fn
from yolo_cb.utils.paths import DEFAULT_CFG

COLOURS = [(0, 0, 255), (0, 255, 0), (255, 0, 0), (0, 255, 255)]  # BGR, far from the grey padding


def settings(**overrides):
    cfg = yaml.safe_load(DEFAULT_CFG.read_text())
    cfg.update(imgsz=128, batch=4, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, translate=0.0, scale=0.0)
    cfg.update(overrides)
    return types.SimpleNamespace(**cfg)


@pytest.fixture(scope="module")
def solid(tmp_path_factory):
    """4 images, each one solid colour, with one box covering the middle."""
    root = tmp_path_factory.mktemp("solid")
    (root / "images").mkdir()
    (root / "labels").mkdir()
    for i, colour in enumerate(COLOURS):
        cv2.imwrite(str(root / "images" / f"{i}.png"), np.full((96 + 16 * i, 128, 3), colour, np.uint8))
        (root / "labels" / f"{i}.txt").write_text(f"{i} 0.5 0.5 0.5 0.5\n")
    return root / "images"


def n_colours(img_chw: torch.Tensor) -> int:
    """How many of the 4 solid colours appear in a (3, H, W) RGB image (ignoring the grey padding)."""
    img = img_chw.permute(1, 2, 0).numpy()[..., ::-1]  # back to BGR
    return sum(int((np.abs(img.astype(np.int16) - c).max(2) < 8).sum() > 20) for c in COLOURS)


def test_collate_fn_layout(solid):
    ds = YOLODataset(str(solid), 128, ["a", "b", "c", "d"], False, settings(), rect=False)
    batch = collate_fn([ds[0], ds[3]])
    assert batch["img"].dtype == torch.uint8 and batch["img"].shape == (2, 3, 128, 128) and batch["img"].is_contiguous()
    t = batch["targets"]
    assert t.dtype == torch.float32 and t.shape == (2, 6)
    assert t[:, 0].tolist() == [0, 1] and t[:, 1].tolist() == [0, 3]
    h0, w0 = batch["ori_shapes"][0]
    r, (pw, ph) = batch["ratio_pad"][0]
    assert (h0, w0) == (96, 128) and r == 1.0 and (pw, ph) == (0.0, 16.0)
    assert torch.allclose(t[0, 2:], torch.tensor([64.0, 16 + 48.0, 64.0, 48.0]))  # pixels of the input image
    assert batch["im_files"][1].endswith("3.png")
    img0 = batch["img"][0].permute(1, 2, 0).numpy()
    assert tuple(img0[64, 64]) == COLOURS[0][::-1]  # RGB


def test_close_mosaic_reaches_persistent_workers(solid):
    ds = YOLODataset(str(solid), 128, ["a", "b", "c", "d"], True, settings(mosaic=1.0), batch_size=4)
    loader = build_dataloader(ds, batch_size=4, workers=2, shuffle=True, seed=0)
    assert loader.num_workers == min(2, __import__("os").cpu_count()) and loader.persistent_workers == (loader.num_workers > 0)
    loader.set_epoch(0)
    mosaics = [n_colours(im) for batch in loader for im in batch["img"]]
    assert max(mosaics) >= 2  # mosaics mix the solid images
    loader.close_mosaic()
    for epoch in (1, 2):
        loader.set_epoch(epoch)
        singles = [n_colours(im) for batch in loader for im in batch["img"]]
        assert singles == [1, 1, 1, 1], f"epoch {epoch}: a mosaic after close_mosaic: {singles}"
    workers = list(loader._iterator._workers) if loader.num_workers else []
    close_loaders(loader)  # what the trainer does at the end of train()
    assert loader._iterator is None and not any(w.is_alive() for w in workers)


def test_seeded_workers_repeat_the_same_augmentation(solid):
    def first_batch():
        ds = YOLODataset(str(solid), 128, ["a", "b", "c", "d"], True, settings(mosaic=1.0, scale=0.5), batch_size=4)
        loader = build_dataloader(ds, batch_size=4, workers=1, shuffle=True, seed=3)
        try:
            return next(iter(loader))
        finally:
            close_loaders(loader)

    a, b = first_batch(), first_batch()
    assert torch.equal(a["img"], b["img"]) and torch.equal(a["targets"], b["targets"])


def test_distributed_sampler_and_set_epoch(solid, tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        ds = YOLODataset(str(solid), 128, ["a", "b", "c", "d"], False, settings(), batch_size=2)
        loader = build_dataloader(ds, batch_size=2, workers=0, shuffle=True, rank=0, seed=0)
        assert isinstance(loader.sampler, torch.utils.data.DistributedSampler)
        orders = []
        for epoch in range(4):
            loader.set_epoch(epoch)
            assert loader.sampler.epoch == epoch
            orders.append(tuple(f for batch in loader for f in batch["im_files"]))
        assert len(set(orders)) > 1  # shuffled differently per epoch
    finally:
        dist.destroy_process_group()


def test_build_yolo_dataset_from_settings(solid):
    args = settings(cache="ram", rect=False, fraction=0.5)
    train = build_yolo_dataset(args, str(solid), "train", {0: "a", 1: "b", 2: "c", 3: "d"})
    assert train.augment and len(train) == 2 and train.cache_mode == "ram" and train.batch_size == 4
    val = build_yolo_dataset(args, str(solid), "val", {0: "a", 1: "b", 2: "c", 3: "d"}, batch=2)
    assert not val.augment and val.rect and len(val) == 4 and val.batch_size == 2
    batches = list(build_dataloader(val, 2, 0, shuffle=True))  # rect: shuffle is refused
    assert [b["img"].shape[2:] for b in batches] == [val.batch_shapes[0], val.batch_shapes[1]]
