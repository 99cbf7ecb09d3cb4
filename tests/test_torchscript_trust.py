"""A TorchScript file is code (security round 4): a crafted `.torchscript` calling `aten::from_file(path, shared=True)`
overwrote bytes of a file outside its folder during `yolo-cb predict` and `val`, exit 0. A file yolo-cb did not write is
now refused unless trust=True (tests/test_torchscript_round5.py); given trust=True, the content checks still refuse such a
file in one line before any of it runs (also code torch.jit.load would run while loading: __setstate__), and the file it
aimed at is unchanged; our own exports still load and predict."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

META = json.dumps({"names": {"0": "a"}, "stride": 32, "imgsz": [64, 64], "batch": 1})


class Overwriter(torch.nn.Module):
    def __init__(self, victim: str):
        super().__init__()
        self.victim = victim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mapped = torch.from_file(self.victim, shared=True, size=9, dtype=torch.uint8)
        mapped.fill_(65)  # shared=True: written through to the file
        return torch.zeros(x.shape[0], 6, 84) + mapped[0].float() * 0  # used, so the compiler keeps it


class OverwriterOnLoad(torch.nn.Module):
    def __init__(self, victim: str):
        super().__init__()
        self.victim = victim
        self.mark = torch.zeros(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(x.shape[0], 6, 84) + self.mark * 0

    @torch.jit.export
    def __getstate__(self) -> tuple[str, bool]:
        return self.victim, self.training

    @torch.jit.export
    def __setstate__(self, state: tuple[str, bool]) -> None:
        self.mark = torch.from_file(state[0], shared=True, size=9, dtype=torch.uint8).fill_(66)[:1].float()
        self.victim, self.training = state[0], state[1]


@pytest.mark.parametrize("crafted, said", [(Overwriter, "calls aten::from_file"), (OverwriterOnLoad, "defines __setstate__")])
def test_a_crafted_torchscript_is_refused_before_it_touches_a_file(tmp_path, shapes_small_yaml, crafted, said):
    victim = tmp_path / "elsewhere" / "victim.bin"
    victim.parent.mkdir()
    victim.write_bytes(b"original content")
    model = tmp_path / "model" / "crafted.torchscript"
    model.parent.mkdir()
    torch.jit.save(torch.jit.script(crafted(str(victim))), str(model), _extra_files={"config.txt": META})
    image = tmp_path / "model" / "a.jpg"
    import cv2
    import numpy as np
    cv2.imwrite(str(image), np.full((64, 64, 3), 100, np.uint8))
    for mode, extra in (("predict", f"source={image}"), ("val", f"data={shapes_small_yaml}")):
        done = subprocess.run([sys.executable, "-m", "yolo_cb", mode, f"model={model}", extra, "imgsz=64", "trust=True"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 2 and len(lines) == 1 and said in lines[0] and "refused to run" in lines[0], done.stderr[-3000:]
        assert victim.read_bytes() == b"original content"


def test_our_own_torchscript_exports_pass_the_check(tmp_path):
    from test_predict_hostile import tiny_checkpoint

    from yolo_cb import YOLO
    from yolo_cb.checkpoints.checkpoint import Checkpoint, save_checkpoint
    from yolo_cb.nn import build_model

    yolox = tiny_checkpoint(tmp_path / "x.pt")
    cb = build_model("yolocb-n", nc=2, verbose=False)
    state = {k: v.clone() for k, v in cb.state_dict().items()}
    yolocb = save_checkpoint(Checkpoint(model=state, ema=state, model_cfg=dict(cb.cfg), names={0: "a", 1: "b"},
                                        train_args={"imgsz": 64}, epoch=0), tmp_path / "cb.pt")
    for weights in (yolox, yolocb):
        exported = YOLO(str(weights)).export(format="torchscript", imgsz=64)
        results = YOLO(str(exported)).predict(torch.zeros(1, 3, 64, 64), imgsz=64)
        assert len(results) == 1
