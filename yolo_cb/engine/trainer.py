"""The training loop: setup, epochs, batches, optimizer steps, validation, saving — every step fires its event.

Everything around the loop (progress, results.csv, checkpoints, early stopping, integrations, the
user's callbacks) is a callback; the loop only computes and keeps the state callbacks read. The state is typed
(`trainer.state`, run_state.py); the parts live beside it: build.py (model, loaders, validator), step.py (one batch),
checkpointer.py (what a checkpoint holds, last.pt after an error), signals.py, place.py (device, ranks, run folder).
"""

from __future__ import annotations

from pathlib import Path
from time import perf_counter
from typing import Any

from yolo_cb.callbacks.engine import Callbacks
from yolo_cb.config import Config
from yolo_cb.data.loader import close_loaders
from yolo_cb.engine import build, resume_state, val_sets
from yolo_cb.engine.backend import select_device
from yolo_cb.engine.build import refuse_unread_loss_settings  # noqa: F401  (imported from here by callers and tests)
from yolo_cb.engine.checkpointer import Checkpointer
from yolo_cb.engine.ema import ModelEMA
from yolo_cb.engine.epoch_record import EpochOutput, EpochRecord
from yolo_cb.engine.monitor import Monitor
from yolo_cb.engine.place import Place, make_save_dir
from yolo_cb.engine.run_state import Clock, Progress, RunState, delegate, state_field
from yolo_cb.engine.signals import SIGNAL_EXIT, SignalWatch  # noqa: F401  (SIGNAL_EXIT: yolo_cb/launch.py reads it here)
from yolo_cb.engine.step import MAX_NONFINITE_IN_A_ROW, BatchStep, NonFiniteLossError  # noqa: F401  (public names)
from yolo_cb.engine.stop import StopCause, refuse_foreign_stop_flag
from yolo_cb.paths import DEFAULT_MODEL
from yolo_cb.utils import dist as distributed
from yolo_cb.utils.log import LOGGER
from yolo_cb.utils.process_state import restore_process_state, save_process_state


class Trainer:
    """Trains a YOLOX model. `trainer.train()` returns the final metrics dict.

    State callbacks read: epoch, epochs, start_epoch, batch_i, batch, loss, loss_items, tloss, metrics,
    metrics_epoch, validated_this_epoch, fitness, monitor, monitor_value, best_fitness, model, ema, optimizer,
    criterion, train_loader, test_loader, save_dir, args, stop, stop_cause (a StopCause), stop_reason (its message),
    exception, data, device, rank, world_size, frozen, lr_schedule, batches_done, optimizer_steps, save_step_due,
    epoch_record (engine/epoch_record.py), new_images (the image files written this epoch); and,
    as Ultralytics names them, best, last, plots, epoch_time, batch_size, lr, validator, add_callback. A callback ends
    the run with `trainer.request_stop(StopCause.X, message)` (or `trainer.stop = True`). The LR is the lr_schedule
    callback's (yolo_cb/assembly/lr_schedule.py): nothing here writes it.

    Each of these names is a property: over the typed run state `trainer.state` (progress, losses, metrics, best, stop:
    engine/run_state.py) or over a collaborator (`parts`: engine/build.py, `step`: engine/step.py, `place`:
    engine/place.py, `clock`, `output`: engine/epoch_record.py), so a callback's write (`trainer.stop = True`) lands where the loop reads it.
    """

    def __init__(self, args: Config, callbacks: Callbacks | None = None, model: Any = None):
        self.args = args
        self.model_source = model if model is not None else (args.model or DEFAULT_MODEL)
        if args.model is None and isinstance(model, (str, Path)):
            args.model = str(model)  # args.yaml and checkpoints record the model really used, never null
        self.callbacks = callbacks if callbacks is not None else Callbacks()
        self.state = RunState(progress=Progress(epochs=args.epochs))  # epoch, losses, metrics, best, stop: run_state.py
        self.parts = build.Parts()  # model, ema, optimizer, criterion, loaders, validator, data
        self.step = BatchStep(args.imgsz)  # one batch: AMP, backward, accumulation, optimizer step, EMA
        self.place = Place()  # device, rank, world size, run folder
        self.checkpointer = Checkpointer()
        self.signals = SignalWatch()
        self.clock = Clock()
        self.output = EpochOutput()  # the epoch's record and the image files written in it: engine/epoch_record.py
        self.monitor = Monitor.from_args(args)  # monitor / monitor_mode / min_delta: what best.pt, top-k and early stopping follow
        self.resume_ckpt: dict | None = None
        self.exception: BaseException | None = None
        self.validate_every_epoch = False  # set by the YOLOX stage switch: validate each epoch after the switch

    # --- the run state's fields under the names callbacks know (Ultralytics' where it has one) --------------------
    epochs, start_epoch, epoch = (state_field("progress", n) for n in ("epochs", "start_epoch", "epoch"))
    completed_epoch, batch_i, batches_done = (state_field("progress", n) for n in ("completed_epoch", "batch_i", "batches_done"))
    optimizer_steps, stepped, save_step_due = (state_field("progress", n) for n in ("optimizer_steps", "stepped", "save_step_due"))
    loop_done, mid_epoch, setup_done = (state_field("progress", n) for n in ("loop_done", "mid_epoch", "setup_done"))
    loss_items, tloss = state_field("losses", "loss_items"), state_field("losses", "tloss")
    metrics, metrics_epoch = state_field("metrics", "values"), state_field("metrics", "epoch")
    fitness, monitor_value, lr = (state_field("metrics", n) for n in ("fitness", "monitor_value", "lr"))
    best_fitness, best_epoch, improved = (state_field("best", n) for n in ("fitness", "epoch", "improved"))
    stop = state_field("stop", "flag", "Set True from any callback to end the run at the next batch or epoch boundary on every rank.")
    stop_cause, stop_reason = state_field("stop", "cause"), state_field("stop", "reason")
    # --- and the collaborators' -------------------------------------------------------------------------------------
    model, ema, optimizer, criterion = (delegate("parts", n) for n in ("model", "ema", "optimizer", "criterion"))
    train_loader, test_loader, validator = (delegate("parts", n) for n in ("train_loader", "test_loader", "validator"))
    data, model_cfg, loss_names = (delegate("parts", n) for n in ("data", "model_cfg", "loss_names"))
    frozen, num_batches, lr_schedule = (delegate("parts", n) for n in ("frozen", "num_batches", "lr_schedule"))
    batch, loss, batch_instances, batch_size_px = (delegate("step", n) for n in ("batch", "loss", "batch_instances", "batch_size_px"))
    scaler, amp_dtype, use_amp, accumulate = (delegate("step", n) for n in ("scaler", "amp_dtype", "use_amp", "accumulate"))
    last_opt_step, global_batch, warmup_iters = (delegate("step", n) for n in ("last_opt_step", "global_batch", "warmup_iters"))
    warmup_bias_lr, momentum, optimizer_name = (delegate("step", n) for n in ("warmup_bias_lr", "momentum", "optimizer_name"))
    device, rank, world_size = (delegate("place", n) for n in ("device", "rank", "world_size"))
    save_dir, wdir = delegate("place", "save_dir"), delegate("place", "wdir")
    epoch_time, epoch_time_start = delegate("clock", "epoch_time"), delegate("clock", "epoch_time_start")
    epoch_record = property(lambda t: t.output.record, doc="The last epoch's EpochRecord (engine/epoch_record.py), from on_model_save on.")
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

    def request_stop(self, cause: StopCause, reason: str) -> None:
        """End the run at the next batch or epoch boundary on every rank; the first cause given is kept."""
        if not self.stop or self.stop_cause is None:
            self.stop, self.stop_cause, self.stop_reason = True, StopCause(cause), reason

    # --- what Ultralytics' trainer exposes to callbacks and integrations -------------------
    def add_callback(self, event: str, fn, on_error: str = "raise", **placement) -> None:
        """Register `fn(trainer)` on `event` (Ultralytics' trainer.add_callback; name= / after= / before= place it); it
        runs from the event's next firing."""
        self.callbacks.add_callback(event, fn, on_error=on_error, **placement)

    @property
    def last(self) -> Path | None:
        """<run folder>/weights/last.pt (a Path, known once the run folder exists)."""
        return self.wdir / "last.pt" if self.wdir else None

    @property
    def best(self) -> Path | None:
        """<run folder>/weights/best.pt (a Path, known once the run folder exists)."""
        return self.wdir / "best.pt" if self.wdir else None

    @property
    def batch_size(self) -> int:
        """Images per batch in this process (the batch= setting)."""
        return self.args.batch

    @property
    def plots(self) -> dict[Path, dict]:
        """Plot images written in the run folder so far: path -> {"data": None, "timestamp": modification time}."""
        if not self.save_dir or not Path(self.save_dir).is_dir():
            return {}
        files = sorted(p for p in Path(self.save_dir).iterdir() if p.suffix in (".png", ".jpg") and p.is_file())
        return {p: {"data": None, "timestamp": p.stat().st_mtime} for p in files}

    def label_loss_items(self, items=None, prefix: str = "train") -> dict[str, float]:
        if items is None:
            return {f"{prefix}/{name}": 0.0 for name in self.loss_names}
        return {f"{prefix}/{name}": round(float(v), 5) for name, v in zip(self.loss_names, items, strict=True)}

    def checkpoint_dict(self, epoch: int | None = None, batches_done: int | None = None) -> dict:
        """The plain-data checkpoint (see DESIGN.md): loadable with torch.load(weights_only=True).

        `epoch` is the last completed epoch; mid-epoch (a save_steps or signal save) `epoch_batches` says how many batches
        of the next one are trained, with what resuming there needs: that epoch's mean losses, accumulated gradients, and
        every rank's RNG states under DDP (gathered on rank 0 just before)."""
        return self.checkpointer.checkpoint_dict(self, epoch, batches_done)

    def data_fingerprint(self) -> dict | None:
        """The dataset's identity stored in checkpoints (data YAML, image counts, names); resume refuses another one."""
        return self.checkpointer.data_fingerprint(self.data)

    # --- the run ------------------------------------------------------------------------
    def train(self) -> dict:
        """Run the whole training; teardown always fires; errors re-raise after last.pt and on_exception."""
        self.signals.install(self)
        previous_state = save_process_state(LOGGER)
        try:
            self._setup()
            self.run_callbacks("on_train_start")
            self._fit()
            self._finish()
            return self.metrics
        except BaseException as error:
            self._fail(error)
            raise
        finally:
            self.signals.restore()
            self.run_callbacks("teardown")
            close_loaders(self.train_loader, self.test_loader, *self.parts.extra_val.values())
            self.place.leave_distributed(self, clean_exit=self.exception is None)
            restore_process_state(previous_state, LOGGER)
            self.place.release()

    def _fit(self) -> None:
        """The epochs: train, validate and save, on_fit_epoch_end; stop when every rank agrees to."""
        for epoch in range(self.start_epoch, self.epochs):
            if self.signals.agree_to_stop(self):  # set before the epoch's first batch (on_pretrain_routine_*, on_train_start, ...)
                self.signals.raise_on_signal(self)
                LOGGER.info(f"stopping before epoch {epoch + 1}: {self.stop_reason or 'trainer.stop was set'}; epoch {epoch + 1} is not trained")
                break
            self.epoch = epoch
            self._train_epoch()
            self.signals.raise_on_signal(self)
            self.completed_epoch, self.stepped = epoch, False
            self._validate_and_save()
            self.run_callbacks("on_fit_epoch_end")
            if self.signals.agree_to_stop(self):
                self.signals.raise_on_signal(self)
                LOGGER.info(f"stopping after epoch {epoch + 1}: {self.stop_reason or 'trainer.stop was set'}")
                break
            if epoch + 1 < self.epochs:
                self.run_callbacks("on_params_update")  # the LR schedule callback set the next epoch's LR in on_model_save
        self.loop_done = True

    def _finish(self) -> None:
        """Validate best.pt on rank 0, share the metrics, on_train_end (a signal during either still exits 130 / 143)."""
        if self.is_main:
            self.checkpointer.validate_best(self)
        self.metrics = distributed.broadcast_object(self.metrics)
        self.signals.agree_to_stop(self)
        self.signals.raise_on_signal(self)
        self.run_callbacks("on_train_end")
        self.signals.raise_on_signal(self)
        self._log_callback_stats()

    def _fail(self, error: BaseException) -> None:
        """last.pt (when it can be saved exactly), then on_exception; the original error is what the user sees."""
        self.exception = error
        self.checkpointer.save_on_error(self)
        try:
            self.run_callbacks("on_exception")
        except Exception as callback_error:  # the original error is what the user must see, not the handler's
            LOGGER.error(f"ERROR on_exception failed ({callback_error}); re-raising the original error: {type(error).__name__}: {error}")

    # --- setup ----------------------------------------------------------------------------
    def _setup(self) -> None:
        args = self.args
        self.place.join_distributed(args.device)
        if self.world_size == 1:
            self.device = select_device(args.device)
        resume_state.agree_on_checkpoint(self)  # under DDP: every rank on rank 0's checkpoint
        make_save_dir(self)
        self.run_callbacks("on_pretrain_routine_start")
        build.seed_everything(args.seed + max(self.rank, 0), args.deterministic)
        self.data = build.check_data(self)
        self._build_model()
        build.build_loaders(self)
        self.optimizer = self.step.build_optimizer(args, self.model, self.device, self.world_size, self.num_batches,
                                                   len(self.train_loader.dataset), self.epochs, self.frozen)
        self.ema = ModelEMA(self.model) if self.is_main else None
        if self.resume_ckpt is not None:
            resume_state.load_state(self, self.resume_ckpt)
        build.wrap_distributed(self)
        build.compile_forward(self)  # after the EMA's copy and the DDP wrapper: neither sees a compiled module
        build.build_validator(self)
        if self.metrics_epoch is None and not self.metrics:
            self.metrics = build.placeholder_metrics(self.loss_names, self.data)
            self.monitor.value(self.metrics)  # monitor= names a metric of this run, or the run stops here, before any epoch
        self.setup_done = True
        if args.verbose and self.is_main:
            LOGGER.info("callbacks, per event in firing order:\n" + self.callbacks.table())
        self.run_callbacks("on_pretrain_routine_end")

    def _build_model(self) -> None:
        build.build_model(self)

    # --- epoch / batch ------------------------------------------------------------------
    def _train_epoch(self) -> None:
        self.model.train()
        self.run_callbacks("on_train_epoch_start")  # the stage switch may close mosaic here, before the iterator exists
        build.sync_trainable(self)  # after it: a callback may unfreeze here; frozen BatchNorm keeps its statistics
        self.train_loader.set_epoch(self.epoch)
        self.optimizer.zero_grad(set_to_none=True)
        self.tloss = None
        self.new_images.clear()
        skip = resume_state.continue_epoch(self)  # a mid-epoch resume: the batches already trained are skipped
        self.batches_done = skip
        self.clock.mark = perf_counter()
        for batch_i, batch in enumerate(self.train_loader, start=skip):
            self.clock.spent("data", self.clock.mark)  # the wait for this batch
            self.batch_i, self.batch = batch_i, batch
            steps = self.optimizer_steps
            self._train_batch()
            self.batches_done = batch_i + 1
            n = self.args.save_steps
            self.save_step_due = bool(n) and self.optimizer_steps > steps and self.optimizer_steps % n == 0 and self.batches_done < self.num_batches
            if self.save_step_due:
                self.checkpointer.gather_rank_rng(self)
            self.run_callbacks("on_train_batch_end")
            self.save_step_due = False
            if self.args.time and self.elapsed > self.args.time * 3600 and not self.stop:
                self.request_stop(StopCause.TIME_LIMIT, f"time limit of {self.args.time} h reached")
            if self.signals.agree_to_stop(self):
                break
            self.clock.mark = perf_counter()
        self.lr = {f"lr/pg{i}": group["lr"] for i, group in enumerate(self.optimizer.param_groups)}
        self.run_callbacks("on_train_epoch_end")

    def _train_batch(self) -> None:
        self.step.run(self)

    # --- validation and saving ------------------------------------------------------------
    def _should_validate(self) -> bool:
        final = self.epoch + 1 == self.epochs
        periodic = self.args.val and (self.epoch + 1) % self.args.val_period == 0
        return final or periodic or self.stop or (self.args.val and self.validate_every_epoch)

    def _validate_and_save(self) -> None:
        self.improved = False
        if self._should_validate():
            start = perf_counter()
            metrics = val_sets.validate_sets(self) if self.is_main else None  # every validation set (one, usually)
            metrics = distributed.broadcast_object(metrics)
            self.clock.spent("val", start)
            self.metrics, self.metrics_epoch = dict(metrics), self.epoch
            self.fitness = float(self.metrics.get("fitness", 0.0))
            self.monitor_value = self.monitor.value(self.metrics)
            if self.monitor.improved(self.monitor_value, self.best_fitness):
                self.best_fitness, self.improved = self.monitor_value, True
        elif self.best_fitness is None:
            self.improved = True  # nothing validated yet: best.pt follows last.pt
        if self.improved:
            self.best_epoch = self.epoch
        self.checkpointer.gather_rank_rng(self)
        self.output.record = EpochRecord.of(self)  # results.csv and every logger read this one record
        self.run_callbacks("on_model_save")

    def _log_callback_stats(self, top: int = 5) -> None:
        """The closing line: what yolo-cb's own callbacks (defaults and integrations) cost against the run's wall time, then
        the slowest callbacks."""
        if not self.is_main:
            return
        spent, wall = self.callbacks.seconds_by_origin(), self.elapsed
        builtin, yours = spent["default"] + spent["integration"], spent["user"] + spent["yaml"]
        share = f"{100 * builtin / wall:.1f}%" if wall > 0 else "-"
        rows = [r for r in self.callbacks.stats() if r["calls"]][:top]
        record = Path(self.save_dir) / "callbacks.json" if self.args.save and self.save_dir else None
        LOGGER.info(f"callbacks: yolo-cb's own (defaults and integrations) {builtin:.2f}s = {share} of the training's {wall:.1f}s "
                    f"wall time, yours {yours:.2f}s; slowest: "
                    + "; ".join(f"{r['callback']} ({r['event']}) {r['total_s']:.2f}s/{r['calls']} calls" for r in rows)
                    + (f"; every callback's calls, times and errors, on every rank: {record}" if record else ""))
