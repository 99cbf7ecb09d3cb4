"""What callbacks see of a trainer and how they steer it: `TrainerSurface`, the base of the Trainer.

The names callbacks read (Ultralytics' where it has one; tests/test_trainer_contract.py lists them) are typed descriptors
(run_state.TrainerName), one per line, over the trainer's private holders: the run state `_state` (run_state.py) and the
collaborators `_parts` (build.py), `_step`, `_place`, `_clock`, `_output` (epoch_record.py), `_recipe`. The loop reads
and writes those holders (one path per fact); these names are for callbacks, which steer the run through the controls
only (run_state.CONTROLS; docs/callbacks.md, "Controls").
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

import torch

from yolo_cb.recipe.stop import StopCause, refuse_foreign_stop_flag
from yolo_cb.training.run_state import ReadOnlyView, TrainerName, delegate, state_field
from yolo_cb.utils.plotting import images_in


class TrainerSurface:
    """The trainer's names for callbacks and its controls; the Trainer (trainer.py) adds the loop."""

    # --- the run state's fields under the names callbacks know (Ultralytics' where it has one) --------------------
    epochs: TrainerName[int] = state_field("progress", "epochs", "Epochs to train in all (trainer.end_after() shortens the run).")
    start_epoch: TrainerName[int] = state_field("progress", "start_epoch", "The first epoch this process trains (0-based).")
    epoch: TrainerName[int] = state_field("progress", "epoch", "The current epoch (0-based).")
    completed_epoch: TrainerName[int] = state_field("progress", "completed_epoch", "The last epoch whose batches all ran (-1: none).")
    batch_i: TrainerName[int] = state_field("progress", "batch_i", "Index of the current batch in its epoch.")
    batches_done: TrainerName[int] = state_field("progress", "batches_done", "Batches of the current epoch trained so far.")
    optimizer_steps: TrainerName[int] = state_field("progress", "optimizer_steps", "Optimizer steps since the run began.")
    stepped: TrainerName[bool] = state_field("progress", "stepped", "An optimizer step since the last completed epoch.")
    save_step_due: TrainerName[bool] = state_field("progress", "save_step_due", "The batch just ended on a save_steps multiple.")
    loop_done: TrainerName[bool] = state_field("progress", "loop_done", "Every epoch ran: last.pt is final.")
    mid_epoch: TrainerName[Any] = state_field("progress", "mid_epoch", "On a mid-epoch resume: where the first epoch continues.")
    setup_done: TrainerName[bool] = state_field("progress", "setup_done", "Model, loaders and optimizer are built.")
    validate_every_epoch: TrainerName[bool] = state_field("progress", "validate_every_epoch", "A control: True validates after every epoch (validate_each_epoch()).", control=True)
    loss_items: TrainerName[torch.Tensor | None] = state_field("losses", "loss_items", "The last batch's loss items (detached, CPU).")
    tloss: TrainerName[torch.Tensor | None] = state_field("losses", "tloss", "The epoch's running mean of the loss items.")
    metrics: TrainerName[dict[str, float]] = state_field("metrics", "values", "The latest validated metrics.")
    metrics_epoch: TrainerName[int | None] = state_field("metrics", "epoch", "The 0-based epoch trainer.metrics belong to (None: none yet).")
    fitness: TrainerName[float | None] = state_field("metrics", "fitness", "The latest validation's fitness.")
    monitor_value: TrainerName[float | None] = state_field("metrics", "monitor_value", "The monitored metric's latest validated value.")
    lr: TrainerName[dict[str, float]] = state_field("metrics", "lr", "lr/pg<i> at the end of the last epoch.")
    best_fitness: TrainerName[float | None] = state_field("best", "fitness", "The best monitored value so far.")
    best_epoch: TrainerName[int | None] = state_field("best", "epoch", "The epoch whose weights best.pt holds.")
    improved: TrainerName[bool] = state_field("best", "improved", "The epoch just validated improved on the best (best.pt is written).")
    stop: TrainerName[bool] = state_field("stop", "flag", "A control: True ends the run at the next batch or epoch boundary on every rank.", control=True)
    stop_cause: TrainerName[StopCause | None] = state_field("stop", "cause", "Why the run stops (StopCause), once requested.")
    stop_reason: TrainerName[str] = state_field("stop", "reason", "A control: why the run stops (with trainer.stop = True).", control=True)
    restore_best: TrainerName[bool] = state_field("stop", "restore_best", "A control: after early stopping, end on best.pt's weights (True) or the last epoch's.", control=True)
    patience: TrainerName[int] = delegate("recipe.early_stop", "patience", "A control: epochs without improvement before early stopping ends the run (0: never).", control=True)
    # --- and the collaborators' -------------------------------------------------------------------------------------
    model: TrainerName[Any] = delegate("parts", "model", "The model being trained (DDP-wrapped on several ranks).")
    ema: TrainerName[Any] = delegate("parts", "ema", "The EMA of the weights (recipe/ema.py ModelEMA; None off rank 0).")
    optimizer: TrainerName[Any] = delegate("parts", "optimizer", "The optimizer.")
    criterion: TrainerName[Any] = delegate("parts", "criterion", "The loss.")
    train_loader: TrainerName[Any] = delegate("parts", "train_loader", "The training loader.")
    test_loader: TrainerName[Any] = delegate("parts", "test_loader", "The validation loader.")
    validator: TrainerName[Any] = delegate("parts", "validator", "The validator (evaluation/validator.py).")
    data: TrainerName[Any] = delegate("parts", "data", "The checked data YAML (a dict).")
    model_cfg: TrainerName[Any] = delegate("parts", "model_cfg", "The model's configuration (a dict).")
    loss_names: TrainerName[Any] = delegate("parts", "loss_names", "The names of the loss items.")
    frozen: TrainerName[Any] = delegate("parts", "frozen", "The modules freeze= froze.")
    num_batches: TrainerName[int] = delegate("parts", "num_batches", "Batches per epoch.")
    monitor = property(lambda t: t._recipe.monitor, doc="The monitored metric (recipe/monitor.py): what best.pt, top-k and early stopping follow.")
    lr_schedule = property(lambda t: t._recipe.schedule, doc="The LR schedule (recipe/schedule.py); None with lr_scheduler=none or module:Class.")
    batch: TrainerName[Any] = delegate("step", "batch", "The current batch.")
    batch_instances: TrainerName[Any] = delegate("step", "batch_instances", "Instances in the current batch.")
    batch_size_px: TrainerName[Any] = delegate("step", "batch_size_px", "The current batch's image size in pixels.")
    loss: TrainerName[Any] = delegate("step", "loss", "A control in on_train_batch_loss_end: the loss this batch backpropagates.", control=True)
    scaler: TrainerName[Any] = delegate("step", "scaler", "The AMP gradient scaler.")
    amp_dtype: TrainerName[Any] = delegate("step", "amp_dtype", "The AMP dtype.")
    use_amp: TrainerName[bool] = delegate("step", "use_amp", "Whether AMP is on.")
    accumulate: TrainerName[int] = delegate("step", "accumulate", "Batches accumulated per optimizer step.")
    last_opt_step: TrainerName[int] = delegate("step", "last_opt_step", "The batch index of the last optimizer step.")
    global_batch: TrainerName[int] = delegate("step", "global_batch", "Images per batch over every rank.")
    optimizer_name: TrainerName[str] = delegate("step", "optimizer_name", "The optimizer's resolved name.")
    warmup_iters: TrainerName[int] = delegate("step.warmup", "iters", "Warmup batches.")
    warmup_bias_lr: TrainerName[float] = delegate("step.warmup", "bias_lr", "The bias group's LR at warmup's start.")
    momentum: TrainerName[float] = delegate("step.warmup", "momentum", "The momentum warmup ends on.")
    device: TrainerName[Any] = delegate("place", "device", "The torch.device of this rank.")
    rank: TrainerName[int] = delegate("place", "rank", "This process's rank (-1: no DDP).")
    world_size: TrainerName[int] = delegate("place", "world_size", "The number of ranks.")
    save_dir: TrainerName[Any] = delegate("place", "save_dir", "The run folder.")
    wdir: TrainerName[Any] = delegate("place", "wdir", "<run folder>/weights.")
    epoch_time: TrainerName[float | None] = delegate("clock", "epoch_time", "Seconds the last epoch took.")
    epoch_time_start: TrainerName[float | None] = delegate("clock", "epoch_time_start", "When the current epoch began (time.time()).")
    epoch_record = property(lambda t: t._output.record, doc="The last epoch's EpochRecord (training/epoch_record.py), from on_model_save on.")
    new_images = property(lambda t: t._output.images, doc="Image files written this epoch: a writer appends, loggers read.")
    state = property(lambda t: ReadOnlyView(t._state, "state"), doc="A read-only view of the run state (run_state.py); "
                     "the names above read it, the controls steer it.")

    def __setattr__(self, name: str, value: Any) -> None:
        refuse_foreign_stop_flag(name)  # trainer.stop_training / should_stop / should_training_stop would do nothing
        super().__setattr__(name, value)

    # --- small helpers ------------------------------------------------------------------
    @property
    def is_main(self) -> bool:
        return self._place.rank in (-1, 0)

    @property
    def validated_this_epoch(self) -> bool:
        """Whether trainer.metrics come from this epoch's validation (val_period and val=False skip some epochs)."""
        return self._state.metrics.epoch is not None and self._state.metrics.epoch == self._state.progress.epoch

    @property
    def elapsed(self) -> float:
        return self._clock.elapsed

    @property
    def flag_device(self):
        """Where the flags every rank all-reduces live (the GPU under NCCL, else the CPU)."""
        return self._place.flag_device

    def run_callbacks(self, event: str) -> None:
        clock = self._clock
        clock.on_event(event)
        start = perf_counter()
        self.callbacks.run(event, self)
        clock.spent("callbacks", start)

    # --- the controls: how a callback steers the run (docs/callbacks.md, "Controls"); settings are fixed -------------
    def request_stop(self, cause: StopCause, reason: str) -> None:
        """End the run at the next batch or epoch boundary on every rank; the first cause given is kept."""
        stop = self._state.stop
        if not stop.flag or stop.cause is None:
            stop.flag, stop.cause, stop.reason = True, StopCause(cause), reason

    def withdraw_stop(self, cause: StopCause) -> bool:
        """Withdraw a pending stop of `cause` (one of another cause stands: a signal, the time limit); True if withdrawn."""
        stop = self._state.stop
        if not (stop.flag and stop.cause == StopCause(cause)):
            return False
        stop.flag, stop.cause, stop.reason = False, None, ""
        return True

    def end_after(self, epochs: int) -> None:
        """Shorten the run: it ends after `epochs` epochs (at least those already completed, at most the planned ones);
        the LR schedule keeps the curve of the planned length."""
        done, planned = self._state.progress.completed_epoch + 1, int(self.args.epochs)
        if isinstance(epochs, bool) or not isinstance(epochs, int) or not max(done, 1) <= epochs <= planned:
            raise ValueError(f"trainer.end_after({epochs!r}): expected an integer from {max(done, 1)} (epochs completed) "
                             f"to {planned} (the planned epochs)")
        self._state.progress.epochs = epochs

    def set_lr(self, lr: float, group: int | None = None) -> None:
        """Set the LR of one parameter group (every group when None); the LR schedule continues from it."""
        if self._recipe.schedule is not None:
            self._recipe.schedule.set_lr(lr, group)
        else:
            for i, g in enumerate(self._parts.optimizer.param_groups):
                g["lr"] = lr if group in (None, i) else g["lr"]

    def validate_each_epoch(self) -> None:
        """Validate after every epoch from now on, whatever val_period says (the YOLOX no-augmentation stage does)."""
        self._state.progress.validate_every_epoch = True

    # --- what Ultralytics' trainer exposes to callbacks and integrations -------------------
    def add_callback(self, event: str, fn, on_error: str = "raise", **placement) -> None:
        """Register `fn(trainer)` on `event` (Ultralytics' trainer.add_callback; name= / after= / before= place it); it
        runs from the event's next firing."""
        self.callbacks.add_callback(event, fn, on_error=on_error, **placement)

    last = property(lambda t: t._place.wdir / "last.pt" if t._place.wdir else None, doc="<run folder>/weights/last.pt (once the folder exists).")
    best = property(lambda t: t._place.wdir / "best.pt" if t._place.wdir else None, doc="<run folder>/weights/best.pt (once the folder exists).")
    batch_size = property(lambda t: t.args.batch, doc="Images per batch in this process (the batch= setting).")
    plots = property(lambda t: images_in(t._place.save_dir), doc="Plot images in the run folder so far: path -> {data: None, timestamp}.")

    def label_loss_items(self, items=None, prefix: str = "train") -> dict[str, float]:
        if items is None:
            return {f"{prefix}/{name}": 0.0 for name in self._parts.loss_names}
        return {f"{prefix}/{name}": round(float(v), 5) for name, v in zip(self._parts.loss_names, items, strict=True)}
