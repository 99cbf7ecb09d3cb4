"""A checkpoint written before the redesign (commit a1e3525, tests/fixtures/README.md) still loads and resumes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_resume_safety import cli, write_data

from yolo_cb.engine.checkpoint import load_checkpoint, model_from_checkpoint

pytestmark = pytest.mark.slow
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "a1e3525_tiny_last.pt"


def test_a_checkpoint_of_a1e3525_loads_without_a_checksum():
    ckpt = load_checkpoint(FIXTURE)
    assert "tensors_crc32" not in ckpt and ckpt["epoch"] == 0 and ckpt["finished"] is False
    model = model_from_checkpoint(ckpt)
    assert model(torch.zeros(1, 3, 64, 64)).shape[-1] == 5 + len(ckpt["names"])


def test_a_checkpoint_of_a1e3525_resumes_to_the_end(tmp_path, shapes_dir):
    data = write_data(tmp_path / "data", shapes_dir)  # the same 8 / 4 shapes images it was trained on
    ckpt = torch.load(FIXTURE, weights_only=True)
    ckpt["train_args"]["data"] = str(data)  # its recorded YAML lies on the machine that wrote it
    old = tmp_path / "old" / "last.pt"
    old.parent.mkdir()
    torch.save(ckpt, old)  # as a1e3525 wrote it: no checksum
    done = cli(tmp_path, f"resume={old}", f"project={tmp_path / 'runs'}", "name=resumed")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    last = load_checkpoint(tmp_path / "runs" / "resumed" / "weights" / "last.pt")
    assert last["epoch"] == 1 and last["finished"] is True and isinstance(last["tensors_crc32"], int)
    assert last["model_cfg"]["width"] == 0.0625
