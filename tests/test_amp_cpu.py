"""amp= on a CPU: bf16 autocast where the CPU runs bf16 natively (AVX512-BF16, AMX), fp32 elsewhere and with amp=False;
read from the dtype the model's first convolution really produced during training, not from the trainer's flags."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY

from yolo_cb import YOLO
from yolo_cb.training.step import amp_plan, cpu_has_native_bf16


def conv_dtypes_in_training(data: str, project: str, amp: bool) -> set[torch.dtype]:
    seen: set[torch.dtype] = set()

    def hook_first_conv(trainer):
        conv = next(m for m in trainer.model.modules() if isinstance(m, torch.nn.Conv2d))
        conv.register_forward_hook(lambda module, inputs, output: module.training and seen.add(output.dtype))

    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_train_start", hook_first_conv)
    model.train(**{**TINY, "data": data, "project": project, "name": f"amp{amp}", "amp": amp, "val": False})
    return seen


@pytest.mark.parametrize("amp", [True, False])
def test_amp_on_the_cpu_trains_in_bf16_only_where_native(amp, tmp_path, shapes_small_yaml):
    native = cpu_has_native_bf16()
    assert amp_plan(amp, torch.device("cpu")) == ((True, torch.bfloat16) if amp and native else (False, torch.float16))
    expected = torch.bfloat16 if amp and native else torch.float32
    assert conv_dtypes_in_training(str(shapes_small_yaml), str(tmp_path / "runs"), amp) == {expected}


@pytest.mark.parametrize("value, native", [("0", False), ("1", True)])
def test_the_bf16_detection_can_be_overridden(value, native, monkeypatch):
    """$YOLO_CB_CPU_BF16 decides as a CPU without / with native bf16 would (`make test-isa` runs the sensitive tests so)."""
    monkeypatch.setenv("YOLO_CB_CPU_BF16", value)
    assert cpu_has_native_bf16() is native
    assert amp_plan(True, torch.device("cpu")) == ((True, torch.bfloat16) if native else (False, torch.float16))
