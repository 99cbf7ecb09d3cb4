"""Checkpoints that are not what was written (issue 26.6 and its one-line errors): a block flipped inside a tensor
fails the checksum on every load (val, predict, export, resume); a text file named .pt and weights that do not fit
their architecture record are one line, exit 2, on the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import test_checkpoint_trust
import torch

from yolo_cb import YOLO
from yolo_cb.checkpoints.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from yolo_cb.errors import UserError

pytestmark = pytest.mark.slow
trained = test_checkpoint_trust.trained  # the finished one-epoch run and its data YAML, made once per module


def flip_inside_largest_tensor(source: Path, target: Path, size: int = 4096) -> None:
    """Copy `source` to `target` with `size` bytes inverted in the middle of its largest weight tensor's record."""
    ckpt = torch.load(source, weights_only=True)
    tensor = max(ckpt["ema"].values(), key=lambda t: t.numel() * t.element_size())
    # the bytes as the file stores them: the tensor's storage in its own memory format (channels_last when trained so)
    raw = torch.empty(0, dtype=torch.uint8).set_(tensor.untyped_storage()).numpy().tobytes()
    assert len(raw) > 2 * size
    blob = bytearray(source.read_bytes())
    start = blob.find(raw[:256])
    assert start >= 0
    middle = start + len(raw) // 2
    blob[middle:middle + size] = bytes(b ^ 0xFF for b in blob[middle:middle + size])
    target.write_bytes(bytes(blob))


def yolo_cb(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yolo_cb", *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def assert_one_line(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr and all(w in result.stderr for w in words), result.stderr[-3000:]


def test_a_flipped_block_fails_every_load_by_name(tmp_path, trained):
    last, data = trained
    bad = tmp_path / "flipped.pt"
    flip_inside_largest_tensor(last, bad)
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(bad)
    ckpt = torch.load(bad, weights_only=True)  # what today's torch accepts without a word
    assert ckpt["epoch"] == 0
    images = (Path(data).parent / "train.txt").read_text().split()[0]  # conftest's trained_copy lists them there
    assert_one_line(yolo_cb(tmp_path, "val", f"model={bad}", f"data={data}", "imgsz=64"), str(bad), "corrupt")  # the CLI: exit 2
    loads = (lambda: YOLO(str(bad)).predict(source=images), lambda: YOLO(str(bad)).export(format="onnx"),
             lambda: YOLO().train(resume=str(bad), callbacks=""))  # every other way in, in this process
    for load in loads:
        with pytest.raises(CheckpointError, match="corrupt") as caught:
            load()
        assert str(bad) in str(caught.value) and "\n" not in str(caught.value)
    assert not list(tmp_path.glob("*.onnx")) and not (tmp_path / "runs").exists()


def test_a_good_checkpoint_round_trips_its_checksum(tmp_path, trained):
    written = torch.load(trained[0], weights_only=True)  # the file's own dict: the checksum is not part of the Checkpoint
    assert isinstance(written["tensors_crc32"], int)
    save_checkpoint(load_checkpoint(trained[0]), tmp_path / "copy.pt")
    assert torch.load(tmp_path / "copy.pt", weights_only=True)["tensors_crc32"] == written["tensors_crc32"]


NO_CHECKPOINT = [b"hello world", b"not a checkpoint, just text\n", b"", b"PK\x03\x04truncated"]


def test_a_file_that_is_no_checkpoint_is_one_line(tmp_path, trained):
    """Each kind of non-checkpoint through each way in, in this process (one line naming the file, nothing trained); then
    each way in once on the CLI (exit 2, no traceback): the CLI's handling does not depend on the file's content."""
    for i, content in enumerate(NO_CHECKPOINT):
        fake = tmp_path / f"fake{i}.pt"
        fake.write_bytes(content)
        attempts = (lambda f: YOLO(str(f)).val(data=trained[1]), lambda f: YOLO().train(resume=str(f)),
                    lambda f: YOLO().train(pretrained=str(f), data=trained[1], epochs=1, project=str(tmp_path / "runs")))
        for attempt in attempts:
            with pytest.raises(UserError) as caught:
                attempt(fake)
            assert str(fake) in str(caught.value) and "\n" not in str(caught.value), (content, str(caught.value))
    fake = tmp_path / "fake0.pt"
    for command in (["val", f"model={fake}", f"data={trained[1]}"], ["train", f"resume={fake}"],
                    ["train", f"pretrained={fake}", f"data={trained[1]}", "epochs=1", f"project={tmp_path / 'runs'}"]):
        assert_one_line(yolo_cb(tmp_path, *command), str(fake))


def test_weights_that_do_not_fit_their_architecture_record_are_one_line(tmp_path, trained):
    ckpt = load_checkpoint(trained[0])
    ckpt.model_cfg = {**ckpt.model_cfg, "width": ckpt.model_cfg["width"] * 2}  # a record of a wider model
    ckpt.finished, ckpt.epochs, ckpt.train_args["epochs"] = False, 2, 2  # a run a resume continues
    mismatched = tmp_path / "mismatched.pt"
    save_checkpoint(ckpt, mismatched)
    assert_one_line(yolo_cb(tmp_path, "val", f"model={mismatched}", f"data={trained[1]}", "imgsz=64"), str(mismatched), "do not fit")
    assert_one_line(yolo_cb(tmp_path, "train", f"resume={mismatched}", "callbacks="), str(mismatched), "do not fit")
