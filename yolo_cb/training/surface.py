"""What callbacks see of a trainer and how they steer it: `TrainerSurface`, the base of the Trainer.

The names callbacks read (Ultralytics' where it has one; tests/test_trainer_contract.py lists them) are properties over
the typed run state `trainer.state` (run_state.py) or a collaborator (`parts`: build.py, `step`, `place`, `clock`,
`output`: epoch_record.py). A callback steers the run through the controls only (docs/callbacks.md, "Controls").
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

from yolo_cb.recipe.stop import StopCause, refuse_foreign_stop_flag
from yolo_cb.training.run_state import delegate, state_field
from yolo_cb.utils.plotting import images_in


class TrainerSurface:
    """The trainer's names for callbacks and its controls; the Trainer (trainer.py) adds the loop."""

    # --- the run state's fields under the names callbacks know (Ultralytics' where it has one) --------------------
    epochs, start_epoch, epoch = (state_field("progress", n) for n in ("epochs", "start_epoch", "epoch"))
    completed_epoch, batch_i, batches_done = (state_field("progress", n) for n in ("completed_epoch", "batch_i", "batches_done"))
    optimizer_steps, stepped, save_step_due = (state_field("progress", n) for n in ("optimizer_steps", "stepped", "save_step_due"))
    loop_done, mid_epoch, setup_done = (state_field("progress", n) for n in ("loop_done", "mid_epoch", "setup_done"))
    validate_every_epoch = state_field("progress", "validate_every_epoch", "A control: True validates after every epoch (validate_each_epoch()).", control=True)
    loss_items, tloss = state_field("losses", "loss_items"), state_field("losses", "tloss")
    metrics, metrics_epoch = state_field("metrics", "values"), state_field("metrics", "epoch")
    fitness, monitor_value, lr = (state_field("metrics", n) for n in ("fitness", "monitor_value", "lr"))
    best_fitness, best_epoch, improved = (state_field("best", n) for n in ("fitness", "epoch", "improved"))
    stop = state_field("stop", "flag", "A control: True ends the run at the next batch or epoch boundary on every rank.", control=True)
    stop_cause = state_field("stop", "cause")
    stop_reason = state_field("stop", "reason", "A control: why the run stops (with trainer.stop = True).", control=True)
    restore_best = state_field("stop", "restore_best", "A control: after early stopping, end on best.pt's weights (True) or the last epoch's.", control=True)
    patience = delegate("recipe.early_stop", "patience", "A control: epochs without improvement before early stopping ends the run (0: never).", control=True)
    # --- and the collaborators' -------------------------------------------------------------------------------------
    model, ema, optimizer, criterion = (delegate("parts", n) for n in ("model", "ema", "optimizer", "criterion"))
    train_loader, test_loader, validator = (delegate("parts", n) for n in ("train_loader", "test_loader", "validator"))
    data, model_cfg, loss_names = (delegate("parts", n) for n in ("data", "model_cfg", "loss_names"))
    frozen, num_batches = delegate("parts", "frozen"), delegate("parts", "num_batches")
    monitor = property(lambda t: t.recipe.monitor, doc="The monitored metric (recipe/monitor.py): what best.pt, top-k and early stopping follow.")
    lr_schedule = property(lambda t: t.recipe.schedule, doc="The LR schedule (recipe/schedule.py); None with lr_scheduler=none or module:Class.")
    batch, batch_instances, batch_size_px = (delegate("step", n) for n in ("batch", "batch_instances", "batch_size_px"))
    loss = delegate("step", "loss", "A control in on_train_batch_loss_end: the loss this batch backpropagates.", control=True)
    scaler, amp_dtype, use_amp, accumulate = (delegate("step", n) for n in ("scaler", "amp_dtype", "use_amp", "accumulate"))
    last_opt_step, global_batch, optimizer_name = (delegate("step", n) for n in ("last_opt_step", "global_batch", "optimizer_name"))
    warmup_iters, warmup_bias_lr, momentum = (delegate("step.warmup", n) for n in ("iters", "bias_lr", "momentum"))
    device, rank, world_size = (delegate("place", n) for n in ("device", "rank", "world_size"))
    save_dir, wdir = delegate("place", "save_dir"), delegate("place", "wdir")
    epoch_time, epoch_time_start = delegate("clock", "epoch_time"), delegate("clock", "epoch_time_start")
    epoch_record = property(lambda t: t.output.record, doc="The last epoch's EpochRecord (training/epoch_record.py), from on_model_save on.")
    new_images = property(lambda t: t.output.images, doc="Image files written this epoch: a writer appends, loggers read.")

    def __setattr__(self, name: str, value: Any) -> None:
        refuse_foreign_stop_flag(name)  # trainer.stop_training / should_stop / should_training_stop would do nothing
        super().__setattr__(name, value)

    # --- small helpers ------------------------------------------------------------------
    @property
    def is_main(self) -> bool:
        return self.rank in (-1, 0)

    @property
    def validated_this_epoch(self) -> bool:
        """Whether trainer.metrics come from this epoch's validation (val_period and val=False skip some epochs)."""
        return self.metrics_epoch is not None and self.metrics_epoch == self.epoch

    @property
    def elapsed(self) -> float:
        return self.clock.elapsed

    @property
    def flag_device(self):
        """Where the flags every rank all-reduces live (the GPU under NCCL, else the CPU)."""
        return self.place.flag_device

    def run_callbacks(self, event: str) -> None:
        clock = self.clock
        clock.on_event(event)
        start = perf_counter()
        self.callbacks.run(event, self)
        clock.spent("callbacks", start)

    # --- the controls: how a callback steers the run (docs/callbacks.md, "Controls"); settings are fixed -------------
    def request_stop(self, cause: StopCause, reason: str) -> None:
        """End the run at the next batch or epoch boundary on every rank; the first cause given is kept."""
        if not self.stop or self.stop_cause is None:
            self.stop, self.state.stop.cause, self.stop_reason = True, StopCause(cause), reason

    def withdraw_stop(self, cause: StopCause) -> bool:
        """Withdraw a pending stop of `cause` (one of another cause stands: a signal, the time limit); True if withdrawn."""
        if not (self.stop and self.stop_cause == StopCause(cause)):
            return False
        self.stop, self.state.stop.cause, self.stop_reason = False, None, ""
        return True

    def end_after(self, epochs: int) -> None:
        """Shorten the run: it ends after `epochs` epochs (at least those already completed, at most the planned ones);
        the LR schedule keeps the curve of the planned length."""
        done, planned = self.completed_epoch + 1, int(self.args.epochs)
        if isinstance(epochs, bool) or not isinstance(epochs, int) or not max(done, 1) <= epochs <= planned:
            raise ValueError(f"trainer.end_after({epochs!r}): expected an integer from {max(done, 1)} (epochs completed) "
                             f"to {planned} (the planned epochs)")
        self.state.progress.epochs = epochs

    def set_lr(self, lr: float, group: int | None = None) -> None:
        """Set the LR of one parameter group (every group when None); the LR schedule continues from it."""
        if self.recipe.schedule is not None:
            self.recipe.schedule.set_lr(lr, group)
        else:
            for i, g in enumerate(self.optimizer.param_groups):
                g["lr"] = lr if group in (None, i) else g["lr"]

    def validate_each_epoch(self) -> None:
        """Validate after every epoch from now on, whatever val_period says (the YOLOX no-augmentation stage does)."""
        self.validate_every_epoch = True

    # --- what Ultralytics' trainer exposes to callbacks and integrations -------------------
    def add_callback(self, event: str, fn, on_error: str = "raise", **placement) -> None:
        """Register `fn(trainer)` on `event` (Ultralytics' trainer.add_callback; name= / after= / before= place it); it
        runs from the event's next firing."""
        self.callbacks.add_callback(event, fn, on_error=on_error, **placement)

    last = property(lambda t: t.wdir / "last.pt" if t.wdir else None, doc="<run folder>/weights/last.pt (once the folder exists).")
    best = property(lambda t: t.wdir / "best.pt" if t.wdir else None, doc="<run folder>/weights/best.pt (once the folder exists).")
    batch_size = property(lambda t: t.args.batch, doc="Images per batch in this process (the batch= setting).")
    plots = property(lambda t: images_in(t.save_dir), doc="Plot images in the run folder so far: path -> {data: None, timestamp}.")

    def label_loss_items(self, items=None, prefix: str = "train") -> dict[str, float]:
        if items is None:
            return {f"{prefix}/{name}": 0.0 for name in self.loss_names}
        return {f"{prefix}/{name}": round(float(v), 5) for name, v in zip(self.loss_names, items, strict=True)}
