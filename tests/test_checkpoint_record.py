"""The typed checkpoint (yolo_cb.checkpoints.checkpoint.Checkpoint), what load_checkpoint returns: the same plain dict on
disk, defaults for older files, a newer layout refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from yolo_cb.checkpoints.checkpoint import (
    CHECKSUM_KEY,
    FORMAT_VERSION,
    Checkpoint,
    load_checkpoint,
    save_checkpoint,
    serialize_checkpoint,
)
from yolo_cb.errors import CheckpointError
from yolo_cb.nn.yolocb.loss import YOLOCBLoss
from yolo_cb.nn.yolox.loss import YOLOXLoss

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "a1e3525_tiny_last.pt"


def same(a, b) -> bool:
    """Deep equality of plain checkpoint data, tensors compared by dtype, shape and values; dict key order included."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and bool(torch.isclose(a, b, rtol=0, atol=0, equal_nan=True).all())
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and (a == b or a != a and b != b)  # NaN (a metric of an epoch without boxes) equals NaN


def fresh_dict() -> dict:
    """A checkpoint as today's trainer writes it: every key (the a1e3525 file has all of them but the version key,
    `recipe`, the loop's recipe states, which today's trainer writes after `callbacks`, and `loss`, the loss's own state,
    where it wrote YOLOX's `use_l1`)."""
    ckpt, fresh = torch.load(FIXTURE, weights_only=True), {}
    for key, value in ckpt.items():
        if key == "use_l1":
            fresh["loss"] = {"use_l1": bool(value)}
            continue
        fresh[key] = value
        if key == "callbacks":
            fresh["recipe"] = {"saver": {"topk": []}, "results": {"rows": []}}
    return {**fresh, "format_version": FORMAT_VERSION}


def test_a_fresh_checkpoint_round_trips_to_the_identical_dict(tmp_path):
    d = fresh_dict()
    record = Checkpoint.from_dict(d)
    assert record.extras == {} and record.format_version == FORMAT_VERSION
    assert list(record.to_dict()) == list(Checkpoint.KEYS)  # today's keys, in today's order, then the version key
    assert same(Checkpoint.from_dict({k: d[k] for k in Checkpoint.KEYS}).to_dict(), {k: d[k] for k in Checkpoint.KEYS})
    save_checkpoint(record, tmp_path / "last.pt")  # and through a file: the same dict, plus the checksum
    written = torch.load(tmp_path / "last.pt", weights_only=True)
    assert isinstance(written[CHECKSUM_KEY], int)
    assert same({k: v for k, v in written.items() if k != CHECKSUM_KEY}, record.to_dict())
    typed = load_checkpoint(tmp_path / "last.pt")
    assert isinstance(typed, Checkpoint) and same(typed.to_dict(), record.to_dict()) and typed.epoch == 0 and typed.finished is False


def test_keys_this_version_does_not_know_are_kept():
    d = {**fresh_dict(), "source": {"sha256": "ab", "url": "https://example.invalid/x.pth"}}
    record = Checkpoint.from_dict(d)
    assert record.extras == {"source": d["source"]} and same(record.to_dict(), d)


def test_an_older_checkpoint_gets_todays_defaults():
    ckpt = torch.load(FIXTURE, weights_only=True)
    assert "format_version" not in ckpt
    old = {k: ckpt[k] for k in ("model", "ema", "optimizer", "epoch", "best_fitness", "train_args", "model_cfg", "names",
                                "callbacks", "rng", "metrics", "version", "date")}  # the keys DESIGN.md first named
    record = Checkpoint.from_dict(old)
    assert record.format_version == FORMAT_VERSION  # read with defaults: a record of today's layout
    assert record.ema_updates == 0 and record.last_opt_step is None and record.epochs is None
    assert record.best_epoch is None and record.last_is_best is False and record.save_dir is None
    assert record.data_fingerprint is None and record.rank_rng is None and record.epoch_batches == 0
    assert record.world_size == 1 and record.optimizer_steps == 0 and record.tloss is None and record.grads is None
    assert record.loss is None and record.metrics_epoch is None and record.monitor_value is None
    assert record.finished is False  # it has its optimizer: not finished
    assert Checkpoint.from_dict({**old, "optimizer": None}).finished is True  # older files: stripped = finished
    assert set(record.to_dict()) == set(Checkpoint.KEYS)


def test_the_a1e3525_file_reads_typed():
    record = load_checkpoint(FIXTURE)
    assert record.epoch == 0 and record.finished is False and record.model_cfg["width"] == 0.0625
    assert CHECKSUM_KEY not in record.to_dict()


@pytest.mark.parametrize("version", [FORMAT_VERSION + 1, "2"])
def test_a_newer_format_version_is_refused_in_one_line(tmp_path, version):
    path = tmp_path / "future.pt"
    save_checkpoint(serialize_checkpoint({**fresh_dict(), "format_version": version}), path)  # as a newer yolo-cb writes it
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(path)
    message = str(error.value)
    assert "\n" not in message and str(path) in message and repr(version) in message
    with pytest.raises(CheckpointError, match="format_version"):
        Checkpoint.from_dict({**fresh_dict(), "format_version": version}, path)


def test_the_loss_state_has_its_own_slot_and_older_files_l1_switch_lands_in_it():
    """Files up to 7d42114 kept YOLOX's L1 switch as `use_l1`; today the loss's training_state() is under `loss`, and the
    trainer hands it back to whatever loss the model has (it knows no family)."""
    old = {k: v for k, v in fresh_dict().items() if k != "loss"}
    record = Checkpoint.from_dict({**old, "use_l1": True})
    assert record.loss == {"use_l1": True} and "use_l1" not in record.extras and "use_l1" not in record.to_dict()
    assert Checkpoint.from_dict(old).loss is None  # no switch recorded: the loss starts as a run does
    yolox = YOLOXLoss(4)
    yolox.load_training_state(record.loss)
    assert yolox.use_l1 is True and yolox.training_state() == {"use_l1": True}
    yolox.load_training_state({})
    assert yolox.use_l1 is False
    assert YOLOCBLoss(4, 16).training_state() == {}

