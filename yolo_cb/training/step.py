"""One training batch: forward under AMP, the non-finite guard, backward, accumulation, clipping, the optimizer step, EMA.

`BatchStep` holds what the step needs between batches (the scaler, the accumulation, the warmup length) and the current
batch's values callbacks read (`trainer.batch`, `trainer.loss`, ...: properties of the Trainer over these attributes).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from time import perf_counter
from typing import Any, NamedTuple

import torch

from yolo_cb.data import batch as batch_keys
from yolo_cb.data.batch import batch_shape
from yolo_cb.data.loading.device_colour import model_input
from yolo_cb.recipe.optim import resolve_optimizer, sync_late_groups
from yolo_cb.recipe.schedule import Warmup
from yolo_cb.training.run_state import Clock, RunState
from yolo_cb.utils import dist as distributed
from yolo_cb.utils.log import LOGGER

MAX_NONFINITE_IN_A_ROW = 5  # consecutive non-finite losses tolerated (each skips its step) before the run fails


def clip_norm(grad_clip: float, nbs: int) -> float:
    """The largest gradient norm let through, in the units of the gradient the step holds: grad_clip= is a norm of the
    gradient of the loss summed over the nominal batch's images (Ultralytics' units, which clip at 10); the step holds
    that of the mean over those images (the backward scales each batch by batch/nbs), 1/nbs of it."""
    return float(grad_clip) / max(int(nbs), 1)


CPU_BF16_ENV = "YOLO_CB_CPU_BF16"  # "0" / "1": overrides the detection below (run as a CPU without / with native bf16)


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN runs bf16 natively on this CPU (AVX512-BF16 or AMX): there, bf16 autocast roughly halves a train
    step (BENCHMARKS.md); elsewhere bf16 is emulated and slower than fp32. $YOLO_CB_CPU_BF16=0 or 1 decides instead
    (with ONEDNN_MAX_CPU_ISA, how `make test-isa` runs the numerically sensitive tests as another CPU kind would)."""
    override = os.environ.get(CPU_BF16_ENV, "").strip()
    if override in ("0", "1"):
        return override == "1"
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def amp_plan(amp: bool, device: torch.device) -> tuple[bool, torch.dtype]:
    """(autocast on, its dtype) for amp= on this device: CUDA bf16 where supported, else fp16 (with a GradScaler); a CPU
    with native bf16: bf16; any other CPU: off (fp32)."""
    if amp and device.type == "cuda":
        return True, torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if amp and device.type == "cpu" and cpu_has_native_bf16():
        return True, torch.bfloat16
    return False, torch.float16


class NonFiniteLossError(RuntimeError):
    """The loss was NaN/inf for too many batches in a row."""


class StepBinding(NamedTuple):
    """What the step works with during a run, bound once at setup (`BatchStep.bind`): the settings, the run's parts
    (model, compiled forward, criterion, optimizer, EMA: build.Parts), its state (losses, progress), the clock, `fire`
    (an event to the callbacks, with the trainer as their argument), the device and where the rank flags live."""

    args: Any
    parts: Any
    state: RunState
    clock: Clock
    fire: Callable[[str], None]
    device: torch.device
    flag_device: Any


class StepResult(NamedTuple):
    """What one batch's step did: its loss items (on the CPU; None when the loss was not finite), whether the loss was
    finite (a non-finite batch is skipped), and whether an optimizer step was taken."""

    losses: torch.Tensor | None
    finite: bool
    stepped: bool


class BatchStep:
    """Forward, backward and the optimizer step of one batch, with what they carry from batch to batch."""

    def __init__(self, imgsz: int):
        self.batch = None  # the current batch (the loader's dict)
        self.loss = None  # its total loss (a tensor with its graph, until backward)
        self.imgsz = imgsz  # the image size before the first batch
        self.scaler = torch.amp.GradScaler("cuda", enabled=False)
        self.amp_dtype, self.use_amp = torch.float16, False
        self.global_batch = 0  # images per optimizer step over all ranks, before accumulation
        self.accumulate = 1  # batches per optimizer step
        self.last_opt_step = -1  # the batch index (over the run) of the last optimizer step
        self.warmup = Warmup()  # the run's warmup (plan_optimizer): the schedule ramps the LR, this step the accumulation
        self.optimizer_name = ""
        self.nonfinite_in_a_row = 0
        self.run_with: StepBinding | None = None  # set once the run's parts exist (bind)

    @property
    def batch_instances(self) -> int:
        return batch_shape(self.batch, self.imgsz)[0]

    @property
    def batch_size_px(self) -> int:
        return batch_shape(self.batch, self.imgsz)[1]

    def bind(self, binding: StepBinding) -> None:
        self.run_with = binding

    def plan_optimizer(self, args, device: torch.device, world_size: int, num_batches: int, dataset_size: int,
                       epochs: int) -> dict:
        """The accumulation, warmup and AMP that follow from the settings; returns the optimizer's arguments in
        Ultralytics' build_optimizer(model, name, lr, momentum, decay, iterations) terms."""
        self.global_batch = args.batch * world_size  # `batch` is per process under DDP
        self.accumulate = max(round(args.nbs / self.global_batch), 1)
        decay = args.weight_decay * self.global_batch * self.accumulate / args.nbs
        iterations = math.ceil(dataset_size / max(args.batch, args.nbs)) * epochs
        self.optimizer_name, _, momentum = resolve_optimizer(args.optimizer, args.lr0, args.momentum, iterations)
        self.warmup = Warmup.of(args, num_batches, momentum)
        self.use_amp, self.amp_dtype = amp_plan(bool(args.amp), device)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.use_amp and self.amp_dtype == torch.float16)
        if self.use_amp and device.type == "cpu":
            LOGGER.info("amp: the forward runs under bf16 autocast on this CPU (native bf16); amp=False trains in fp32")
        self.last_opt_step = -1
        return {"name": args.optimizer, "lr": args.lr0, "momentum": args.momentum, "decay": decay, "iterations": iterations}

    def run(self, epoch: int, batch_i: int, ni: int) -> StepResult:
        """Train on self.batch, batch `batch_i` of `epoch` and `ni` of the run: on_train_batch_start ... (optimizer_step,
        on_before_zero_grad when a step is due); what it did."""
        bound = self.run_with
        before = batch_keys.snapshot(self.batch)
        bound.fire("on_train_batch_start")
        batch_keys.apply_edits(self.batch, before)  # a callback's edit of trainer.batch["cls"] / ["bboxes"] / ["batch_idx"] trains
        clock, start = bound.clock, perf_counter()
        args, device = bound.args, bound.device
        warming = self.warmup.accumulate(ni, args.nbs, self.global_batch)  # during warmup, from 1 batch up to the nominal batch
        if warming is not None:
            self.accumulate = warming
        # non_blocking: the loader pins memory on CUDA; colour here when the workers left it to the device (colour_on=)
        images = model_input(self.batch["img"].to(device, non_blocking=True), self.batch.get("hsv_gains"))
        if args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        targets = self.batch["targets"].to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=self.amp_dtype, enabled=self.use_amp):
            loss_dict = self.forward(bound.parts)(images, targets)
        read = self.loss = loss_dict["total"]
        finite = self.read_losses(loss_dict)
        clock.spent("forward", start)
        bound.fire("on_train_batch_loss_end")
        if self.loss is not read:  # a callback replaced the loss (trainer.loss = ...): the guard checks what will be backpropagated
            finite = bool(torch.isfinite(self.loss.detach()).all())
        if distributed.any_rank(not finite, bound.flag_device):
            self.skip_nonfinite(epoch, batch_i)
            return StepResult(None, False, False)
        self.nonfinite_in_a_row = 0
        losses, i = bound.state.losses, batch_i
        losses.tloss = losses.loss_items if losses.tloss is None else (losses.tloss * i + losses.loss_items) / (i + 1)
        # scaling by batch/nbs makes the accumulated gradient a mean over the nominal batch
        # DDP averages gradients over ranks; * world_size makes that a sum over the global batch
        start = perf_counter()
        self.scaler.scale(self.loss * self.global_batch / args.nbs).backward()
        clock.spent("backward", start)
        bound.fire("on_after_backward")
        stepped = ni - self.last_opt_step >= self.accumulate
        if stepped:
            self.optimizer_step(ni)
            self.last_opt_step = ni
        return StepResult(losses.loss_items, True, stepped)

    @staticmethod
    def forward(parts):
        """The module the batch runs through: compile='s torch.compile over the model, else the model."""
        compiled = parts.compiled
        return compiled if compiled is not None else parts.model  # not `or`: a module's truth value is its len()

    def read_losses(self, loss_dict: dict) -> bool:
        """trainer.loss_items (on the CPU, as callbacks read them) and whether the total is finite, in ONE device-to-host
        copy: on CUDA each copy waits for the GPU, and two per batch (the items, then the finite check) stalled it twice."""
        names = self.run_with.parts.criterion.loss_names
        values = torch.stack([self.loss.detach().float(), *(loss_dict[n].detach().float() for n in names)]).cpu()
        self.run_with.state.losses.loss_items = values[1:]
        return bool(torch.isfinite(values[0]))

    def skip_nonfinite(self, epoch: int, batch_i: int) -> None:
        self.nonfinite_in_a_row += 1
        LOGGER.warning(f"WARNING non-finite loss {self.loss.item()} at epoch {epoch + 1} batch {batch_i}: step skipped "
                       f"({self.nonfinite_in_a_row}/{MAX_NONFINITE_IN_A_ROW} in a row)")
        self.run_with.parts.optimizer.zero_grad(set_to_none=True)
        if self.nonfinite_in_a_row >= MAX_NONFINITE_IN_A_ROW:
            raise NonFiniteLossError(f"the loss was NaN/inf for {self.nonfinite_in_a_row} batches in a row (epoch {epoch + 1}, "
                                     f"batch {batch_i}); last.pt holds the weights before. Try a lower lr0, amp=False or check the labels.")

    def optimizer_step(self, ni: int) -> None:
        bound = self.run_with
        optimizer, clock, parts = bound.parts.optimizer, bound.clock, bound.parts
        start = perf_counter()
        sync_late_groups(optimizer, ni)  # unfrozen layers' own warmup: their LR follows the schedule's times a ramp
        self.scaler.unscale_(optimizer)
        clock.spent("optimizer", start)
        bound.fire("on_before_optimizer_step")  # unscaled, accumulated gradients; before clipping
        start = perf_counter()
        if bound.args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(parts.model.parameters(), max_norm=clip_norm(bound.args.grad_clip, bound.args.nbs))
        self.scaler.step(optimizer)
        self.scaler.update()
        progress = bound.state.progress
        progress.stepped = True
        progress.optimizer_steps += 1
        clock.spent("optimizer", start)
        bound.fire("optimizer_step")
        bound.fire("on_before_zero_grad")
        start = perf_counter()
        optimizer.zero_grad(set_to_none=True)
        if parts.ema is not None:
            parts.ema.update(parts.model)
        clock.spent("optimizer", start)
