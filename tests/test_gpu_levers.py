"""What the CUDA training path relies on, checked on the CPU (issue 34): the EMA stays fp32 under bf16 autocast and
averages exactly, the GradScaler steps once per accumulated optimizer step, DDP ranks that share a GPU get gloo,
compile= wraps the training forward and nothing else, and a batch makes one device-to-host copy."""

from __future__ import annotations

import copy

import pytest
import torch

from yolo_cb import YOLO
from yolo_cb.errors import ConfigError
from yolo_cb.nn import build_model
from yolo_cb.recipe.ema import ModelEMA
from yolo_cb.settings.config import get_config
from yolo_cb.training import build
from yolo_cb.training.launch import gpu_list
from yolo_cb.training.place import ddp_backend, rank_gpu

TARGETS = torch.tensor([[0, 1, 32.0, 32.0, 20.0, 16.0], [1, 2, 20.0, 40.0, 12.0, 12.0]])


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model("yolocb-n.yaml", nc=4, verbose=False, imgsz=64).train()


def test_ema_stays_fp32_and_averages_exactly_after_a_bf16_autocast_step(model):
    ema = ModelEMA(model, updates=100)
    before = copy.deepcopy(ema.ema.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(torch.rand(2, 3, 64, 64), TARGETS)["total"]
    loss.backward()
    optimizer.step()
    ema.update(model)
    d = ema.current_decay()
    live = model.state_dict()
    for name, value in ema.ema.state_dict().items():
        assert value.dtype == live[name].dtype, name  # fp32 weights and statistics stay fp32; counters stay integers
        if value.dtype.is_floating_point:
            torch.testing.assert_close(value, before[name] * d + live[name] * (1 - d), rtol=1e-6, atol=1e-7, msg=name)
        else:
            assert torch.equal(value, live[name]), name
    assert all(p.dtype == torch.float32 for p in model.parameters())  # autocast never changes the weights' dtype


def test_grad_scaler_updates_once_per_accumulated_optimizer_step(tiny):
    """nbs = 4 x batch: 4 batches per optimizer step. An enabled GradScaler (CPU's, as CUDA's fp16 path has) must be
    stepped and updated once per optimizer step, not per batch; its growth tracker counts the updates."""
    seen = {}

    def enable_scaler(trainer):
        trainer._step.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=10_000, enabled=True)

    def record(trainer):
        seen.update(steps=trainer.optimizer_steps, batches=trainer.batches_done, updates=int(trainer.scaler._growth_tracker.item()),
                    scale=float(trainer.scaler.get_scale()))

    model = YOLO("yolocb-n.yaml")
    model.add_callback("on_pretrain_routine_end", enable_scaler)
    model.add_callback("on_train_epoch_end", record)
    model.train(**{**tiny, "model": None, "batch": 4, "nbs": 16, "imgsz": 32, "val": False})
    assert seen["batches"] == 8 and seen["steps"] == 2, seen  # 32 images, batch 4: 8 batches, 2 optimizer steps
    assert seen["updates"] == seen["steps"], seen  # one scaler.update per optimizer step
    assert seen["scale"] == 2.0**10, seen  # no inf/NaN gradient was found: the scale never backed off


def test_ranks_sharing_a_gpu_use_gloo_and_a_named_gpu_is_kept():
    assert ddp_backend(True, 2, 2) == "nccl"
    assert ddp_backend(True, 2, 1) == "gloo"  # NCCL refuses two ranks on one GPU
    assert ddp_backend(False, 2, 0) == "gloo"
    assert [rank_gpu(r, 1) for r in range(2)] == [0, 0] and [rank_gpu(r, 2) for r in range(2)] == [0, 1]
    assert gpu_list("0") == ["0"] and gpu_list(1) == ["1"] and gpu_list("cuda:1") == ["1"] and gpu_list("0, 1") == ["0", "1"]
    assert gpu_list("cpu") == [] and gpu_list(None) == [] and gpu_list("") == [] and gpu_list("mps") == []


@pytest.mark.parametrize("setting", [True, "max-autotune", "aot_eager"])
def test_compile_wraps_the_training_forward_and_leaves_the_model_eager(model, setting):
    keys = list(model.state_dict())
    compiled = build.compile_forward(model, get_config({"compile": setting}).compile)
    assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule) and compiled._orig_mod is model
    assert list(model.state_dict()) == keys  # EMA, checkpoints and exports see the eager module
    assert not isinstance(copy.deepcopy(model), torch._dynamo.eval_frame.OptimizedModule)


def test_compile_off_and_a_bad_value():
    assert build.compile_forward(torch.nn.Linear(2, 2), False) is None
    with pytest.raises(ConfigError, match="compile"):
        get_config({"compile": "fastest"})


def test_one_host_copy_per_batch_gives_the_items_and_the_finite_check():
    from types import SimpleNamespace

    from yolo_cb.training.run_state import Clock, RunState
    from yolo_cb.training.step import BatchStep, StepBinding

    class Criterion:
        loss_names = ("box", "cls")

    state = RunState()
    step = BatchStep(64)
    step.bind(StepBinding(None, SimpleNamespace(criterion=Criterion()), state, Clock(), print, torch.device("cpu"), None))
    step.loss = torch.tensor(3.0, requires_grad=True) * 1
    assert step.read_losses({"box": torch.tensor(1.0), "cls": torch.tensor(2.0)}) is True
    items = state.losses.loss_items
    assert items.tolist() == [1.0, 2.0] and items.device.type == "cpu"
    step.loss = torch.tensor(float("nan"))
    assert step.read_losses({"box": torch.tensor(1.0), "cls": torch.tensor(2.0)}) is False
