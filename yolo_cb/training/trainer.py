"""The training loop: setup, epochs, batches, optimizer steps, validation, early stopping, the LR schedule, saving —
every step called by name, every step firing its event.

The recipe's parts are objects the loop calls: the LR schedule (recipe/schedule.py), early stopping
(recipe/early_stop.py), results.csv and the checkpoint files (saver.py), unfreezing (recipe/unfreeze.py) and checkpoint
averaging (recipe/average.py). Progress, integrations and the user's callbacks are callbacks; they read the trainer's
names (surface.py) and steer the run only through the controls (listed once: run_state.CONTROLS; Trainer's docstring
lists them from it). The loop reads and writes one path per fact: the private typed state `_state` (run_state.py) and
the private parts beside it: build.py (model, loaders, validator), step.py (one batch), checkpointer.py (what a
checkpoint holds, last.pt after an error), signals.py, place.py (device, ranks, run folder).
"""

from __future__ import annotations

from pathlib import Path
from time import perf_counter
from typing import Any

import torch

from yolo_cb.callbacks.dispatch import Callbacks
from yolo_cb.checkpoints.checkpoint import Checkpoint, restore_best_weights, serialize_checkpoint
from yolo_cb.data.loading.loader import close_loaders
from yolo_cb.evaluation import val_sets
from yolo_cb.evaluation.val_metrics import DetectionMetrics
from yolo_cb.evaluation.validator import Validator
from yolo_cb.recipe.ema import ModelEMA, unwrap
from yolo_cb.recipe.freeze import freeze_layers
from yolo_cb.recipe.optim import adopt_optimizer, build_optimizer, resolve_optimizer
from yolo_cb.recipe.parts import RecipeParts
from yolo_cb.recipe.results_plot import plot_results
from yolo_cb.recipe.saver import EpochOutcome
from yolo_cb.recipe.stop import StopCause
from yolo_cb.settings.config import Config
from yolo_cb.settings.controls import controls_doc
from yolo_cb.training import build, resume_state
from yolo_cb.training.checkpointer import Checkpointer
from yolo_cb.training.epoch_record import EpochOutput, EpochRecord
from yolo_cb.training.place import Place, make_save_dir
from yolo_cb.training.run_state import Clock, Progress, RunContents, RunState
from yolo_cb.training.signals import SignalWatch
from yolo_cb.training.step import MAX_NONFINITE_IN_A_ROW, BatchStep, NonFiniteLossError, StepBinding, StepResult  # noqa: F401  (public names)
from yolo_cb.training.surface import TrainerSurface
from yolo_cb.utils import dist as distributed
from yolo_cb.utils.device import select_device
from yolo_cb.utils.log import LOGGER
from yolo_cb.utils.paths import DEFAULT_MODEL
from yolo_cb.utils.process_state import restore_process_state, save_process_state


class Trainer(TrainerSurface):
    """Trains a detector; `trainer.train()` returns the final metrics dict.

    What callbacks read, and the controls they steer it with, are the surface's (training/surface.py); this class is
    the loop, which calls each part of the recipe by name.
    """

    def __init__(self, args: Config, callbacks: Callbacks | None = None, model: Any = None, resume: Checkpoint | None = None):
        self.args = args
        self.model_source = model if model is not None else (args.model or DEFAULT_MODEL)
        args.settle(model)  # the plan settled them (nothing changes then); settings given directly are settled and sealed here
        self.callbacks = callbacks if callbacks is not None else Callbacks()
        self._state = RunState(progress=Progress(epochs=args.epochs))  # epoch, losses, metrics, best, stop: run_state.py
        self._parts = build.Parts()  # model, ema, optimizer, criterion, loaders, validator, data
        self._step = BatchStep(args.imgsz)  # one batch: AMP, backward, accumulation, optimizer step, EMA
        self._place = Place()  # device, rank, world size, run folder
        self._checkpointer = Checkpointer()
        self._signals = SignalWatch()
        self._clock = Clock()
        self._output = EpochOutput()  # the epoch's record and the image files written in it: training/epoch_record.py
        self._recipe = RecipeParts.from_args(args)  # monitor, early stopping, LR schedule, saver, results.csv: called by name
        self.resume_ckpt = resume  # the checkpoint a resume continues (the plan's; its run folder is verified in place.py)
        self.exception: BaseException | None = None
        self._state.stop.restore_best = bool(args.restore_best)

    def checkpoint_dict(self, epoch: int | None = None, batches_done: int | None = None) -> dict:
        """The plain-data checkpoint (see DESIGN.md): loadable with torch.load(weights_only=True).

        `epoch` is the last completed epoch; mid-epoch (a save_steps or signal save) `epoch_batches` says how many batches
        of the next one are trained, with what resuming there needs: that epoch's mean losses, accumulated gradients, and
        every rank's RNG states under DDP (gathered on rank 0 just before)."""
        return self._checkpointer.checkpoint(self._contents(), epoch, batches_done).to_dict()

    def _contents(self) -> RunContents:
        """This run's state, parts, settings, recipe and callbacks: what a checkpoint holds and a resume restores."""
        place = self._place
        return RunContents(self._state, self._parts, self._step, self.args, self._recipe, self.callbacks, place.save_dir, place.rank,
                           place.world_size)

    def _checkpoint_bytes(self, epoch: int | None = None) -> bytes:
        return serialize_checkpoint(self.checkpoint_dict(epoch=epoch))

    def final_metrics(self) -> DetectionMetrics:
        """What train() of the facade returns: the final metrics, with the per-class detail of their validation."""
        return DetectionMetrics.of_run(self._state.metrics.values, self._parts.validator)

    def final_weights(self) -> Path | None:
        """The weights the run ends on (best.pt; last.pt with restore_best=False), absolute; None when none was written."""
        weights = self.best if self._state.stop.restore_best else self.last
        return weights.resolve() if weights is not None and weights.is_file() else None

    def data_fingerprint(self) -> dict | None:
        """The dataset's identity stored in checkpoints (data YAML, image counts, names); resume refuses another one."""
        return self._checkpointer.data_fingerprint(self._parts.data)

    # --- the run ------------------------------------------------------------------------
    def train(self) -> dict:
        """Run the whole training; teardown always fires; errors re-raise after last.pt and on_exception."""
        parts, place = self._parts, self._place
        self._signals.install(self.request_stop)
        previous_state = save_process_state(LOGGER)
        try:
            self._setup()
            if self.is_main and self._recipe.saver.active and self.args.save_initial and self._state.progress.start_epoch == 0:
                self._recipe.saver.save_initial(self._checkpoint_bytes(epoch=-1), place.wdir)  # epoch -1: no epoch trained yet
            self.run_callbacks("on_train_start")
            self._fit()
            self._finish()
            return self._state.metrics.values
        except BaseException as error:
            self._fail(error)
            raise
        finally:
            self._signals.restore()
            self.run_callbacks("teardown")
            close_loaders(parts.train_loader, parts.test_loader, *parts.extra_val.values())
            place.leave_distributed(parts, clean_exit=self.exception is None)
            restore_process_state(previous_state, LOGGER)
            place.release()

    def _fit(self) -> None:
        """The epochs: train, validate and save, on_fit_epoch_end; stop when every rank agrees to."""
        state = self._state
        for epoch in range(state.progress.start_epoch, state.progress.epochs):
            if self._agree_to_stop():  # set before the epoch's first batch (on_pretrain_routine_*, on_train_start, ...)
                self._raise_on_signal()
                LOGGER.info(f"stopping before epoch {epoch + 1}: {state.stop.reason or 'trainer.stop was set'}; epoch {epoch + 1} is not trained")
                break
            state.progress.epoch = epoch
            self._train_epoch()
            self._raise_on_signal()
            state.progress.completed_epoch, state.progress.stepped = epoch, False
            self._validate_and_save()
            self.run_callbacks("on_fit_epoch_end")
            if self._agree_to_stop():
                self._raise_on_signal()
                LOGGER.info(f"stopping after epoch {epoch + 1}: {state.stop.reason or 'trainer.stop was set'}")
                break
            if epoch + 1 >= state.progress.epochs:  # the last epoch (trainer.end_after may have shortened the run)
                break
            self.run_callbacks("on_params_update")  # the LR schedule set the next epoch's LR before the checkpoint
        state.progress.loop_done = True
        if self.is_main and self._recipe.saver.active and state.progress.completed_epoch >= state.progress.start_epoch:  # an epoch ran here
            self._recipe.saver.save_closing(self._checkpoint_bytes, self._place.wdir)  # with on_fit_epoch_end's changes

    def _finish(self) -> None:
        """Validate best.pt on rank 0, share the metrics, on_train_end (a signal during either still exits 130 / 143)."""
        state, parts, place = self._state, self._parts, self._place
        if self.is_main:
            cause = state.stop.cause
            finished = state.progress.completed_epoch + 1 >= state.progress.epochs or (cause is not None and cause.finishes_run)
            metrics = self._checkpointer.validate_best(place.wdir, finished, bool(self.args.val), parts.validator, place.device)
            if metrics is not None:  # best.pt's metrics, of best.pt's epoch
                state.metrics.values, state.metrics.epoch = metrics, state.best.epoch
        state.metrics.values = distributed.broadcast_object(state.metrics.values)
        self._agree_to_stop()
        self._raise_on_signal()
        if state.stop.restore_best and state.stop.cause == StopCause.EARLY_STOPPING:
            restore_best_weights(self.best, parts.model, parts.ema.ema if parts.ema else None)  # best.pt's weights, not the last epoch's
        if self.is_main and self.args.plots and self.args.save:
            self.plot_metrics()
        if self.is_main and self.args.save and self._recipe.averager is not None:  # best_avg.pt, before loggers' on_train_end
            validate = lambda model: parts.validator(model=model.to(place.device))  # noqa: E731
            self._recipe.averager.average(place.wdir, self._recipe.monitor, state.metrics.values, validate)
        self.run_callbacks("on_train_end")
        self._raise_on_signal()
        self._log_callback_stats()

    def _fail(self, error: BaseException) -> None:
        """last.pt (when it can be saved exactly), then on_exception; the original error is what the user sees."""
        self.exception = error
        if self._state.progress.setup_done and self.is_main and self.args.save:
            self._checkpointer.save_on_error(self._state.progress, self._place.world_size, error, self._signals.agreed, self._place.wdir,
                                            lambda epoch, batches: self.checkpoint_dict(epoch=epoch, batches_done=batches))
        try:
            self.run_callbacks("on_exception")
        except Exception as callback_error:  # the original error is what the user must see, not the handler's
            LOGGER.error(f"ERROR on_exception failed ({callback_error}); re-raising the original error: {type(error).__name__}: {error}")

    # --- setup ----------------------------------------------------------------------------
    def _setup(self) -> None:
        state, parts, place = self._state, self._parts, self._place
        args = self.args
        place.join_distributed(args.device)
        if place.world_size == 1:
            place.device = select_device(args.device)
        self.resume_ckpt = resume_state.agree_on_checkpoint(self.resume_ckpt, place.rank, place.world_size, place.flag_device)  # DDP: rank 0's
        make_save_dir(place, args, self.resume_ckpt)
        self.run_callbacks("on_pretrain_routine_start")
        build.seed_everything(args.seed + max(place.rank, 0), args.deterministic)
        parts.data = build.check_data(args, place.rank)
        self._build_model()
        loaders = build.build_loaders(args, parts.data, place.rank, self.is_main, place.device)
        parts.train_loader, parts.test_loader, parts.extra_val = loaders.train, loaders.test, loaders.extra
        parts.num_batches = len(loaders.train)
        planned = self._step.plan_optimizer(args, place.device, place.world_size, parts.num_batches, len(parts.train_loader.dataset),
                                            state.progress.epochs)
        parts.optimizer = adopt_optimizer(self.build_optimizer(parts.model, **planned))
        parts.ema = ModelEMA(parts.model) if self.is_main else None
        self._step.bind(StepBinding(args, parts, state, self._clock, self.run_callbacks, place.device, place.flag_device))
        if self.resume_ckpt is not None:
            resume_state.load_state(self.resume_ckpt, self._contents())
            self._checkpointer.resumed(self.resume_ckpt, parts.data)
        self._wrap_forward()
        parts.validator = Validator(args, save_dir=place.save_dir, callbacks=self.callbacks, dataloader=parts.test_loader)
        parts.validator.trainer = self  # validator events reach the trainer (and its epoch) during training
        self._start_recipe()
        if state.metrics.epoch is None and not state.metrics.values:
            state.metrics.values = build.placeholder_metrics(parts.loss_names, parts.data)
            self._recipe.monitor.value(state.metrics.values)  # monitor= names a metric of this run, or the run stops here, before any epoch
        state.progress.setup_done = True
        if args.verbose and self.is_main:
            LOGGER.info("callbacks, per event in firing order:\n" + self.callbacks.table())
        self.run_callbacks("on_pretrain_routine_end")

    def _start_recipe(self) -> None:
        """The schedule sets the first epoch's LR (a resume restored its state); the unfreeze stages are checked against
        what freeze= froze; a resume rewrites results.csv and keeps a length early stopping shortened (the stage finished)."""
        state = self._state
        if self._recipe.early_stop.end is not None:
            self.end_after(self._recipe.early_stop.end)
        if self._recipe.schedule is not None:
            self._recipe.schedule.start(self._parts.optimizer, self.args, state.progress.epochs, state.progress.start_epoch, self._step.warmup)
        if self._recipe.unfreeze is not None:
            self._recipe.unfreeze.check(self._parts.frozen, state.progress.epochs, self.is_main)
        if self.is_main and self.args.save and state.progress.start_epoch > 0:
            self._recipe.results.resume(self._place.save_dir, state.progress.start_epoch)

    def _build_model(self) -> None:
        """The model, the modules freeze= froze (before the optimizer: frozen tensors get no group), the loss."""
        parts, args = self._parts, self.args
        parts.model = build.initial_model(args, self.model_source, self.resume_ckpt, parts.data, self._place.device, self.is_main)
        parts.model_cfg = dict(parts.model.cfg)
        parts.frozen = freeze_layers(unwrap(parts.model), args.freeze)
        parts.criterion, parts.loss_names = build.build_criterion(args, parts.model)

    def _wrap_forward(self) -> None:
        """The DDP wrapper (several ranks) and compile='s forward over it, after the EMA's copy: neither sees a wrapper."""
        parts = self._parts
        if self._place.world_size > 1:
            parts.model, parts.ddp_trainable = build.wrap_distributed(unwrap(parts.model), self.args.sync_bn, self._place.device)
        parts.compiled = build.compile_forward(parts.model, self.args.compile)

    # --- epoch / batch ------------------------------------------------------------------
    def _train_epoch(self) -> None:
        state, parts, place = self._state, self._parts, self._place
        parts.model.train()
        if self._recipe.unfreeze is not None:  # freeze= layers whose stage is reached train from this epoch on
            self._recipe.unfreeze.apply(state.progress.epoch, state.progress.epochs, unwrap(parts.model), parts.frozen, self.is_main)
        self.run_callbacks("on_train_epoch_start")  # the stage switch may close mosaic here, before the iterator exists
        if build.stale_wrapper(parts, place.world_size):  # after it: unfrozen layers (a callback may unfreeze too)
            self._wrap_forward()
        parts.train_loader.set_epoch(state.progress.epoch)
        parts.optimizer.zero_grad(set_to_none=True)
        state.losses.tloss = None
        self._output.images.clear()
        skip = resume_state.continue_epoch(state, parts.train_loader, parts.model)  # a mid-epoch resume: the batches already trained are skipped
        state.progress.batches_done = skip
        self._clock.mark = perf_counter()
        for batch_i, batch in enumerate(parts.train_loader, start=skip):
            self._clock.spent("data", self._clock.mark)  # the wait for this batch
            state.progress.batch_i, self._step.batch = batch_i, batch
            ni = batch_i + parts.num_batches * state.progress.epoch  # the batch's index over the run: what warmup follows
            if self._recipe.schedule is not None:
                self._recipe.schedule.warmup_batch(state.progress.epoch, ni)
            result = self._train_batch(ni)
            state.progress.batches_done = batch_i + 1
            n = self.args.save_steps
            progress = state.progress
            progress.save_step_due = bool(n) and result.stepped and progress.optimizer_steps % n == 0 and progress.batches_done < parts.num_batches
            if state.progress.save_step_due:
                self._checkpointer.gather_rank_rng(place.world_size)
                if self.is_main and self._recipe.saver.active:
                    self._recipe.saver.save_step(self._checkpoint_bytes(), place.wdir)
            self.run_callbacks("on_train_batch_end")
            state.progress.save_step_due = False
            if self.args.time and self._clock.elapsed > self.args.time * 3600 and not state.stop.flag:
                self.request_stop(StopCause.TIME_LIMIT, f"time limit of {self.args.time} h reached")
            if self._agree_to_stop():
                break
            self._clock.mark = perf_counter()
        state.metrics.lr = {f"lr/pg{i}": group["lr"] for i, group in enumerate(parts.optimizer.param_groups)}
        self.run_callbacks("on_train_epoch_end")

    def _train_batch(self, ni: int) -> StepResult:
        return self._step.run(self._state.progress.epoch, self._state.progress.batch_i, ni)

    # --- Ultralytics' steps a subclass may override: the loop calls them by name --------------------------------
    def build_optimizer(self, model, name: str = "auto", lr: float = 0.001, momentum: float = 0.9, decay: float = 1e-5,
                        iterations: float = 1e5) -> torch.optim.Optimizer:
        """The optimizer (Ultralytics' signature; `decay` is already scaled to the nominal batch): groups 0-2 (biases,
        decay weights, norm weights), and with unfreeze_warmup the frozen layers' late groups (recipe/optim.py). An
        override's optimizer is used as it returns it; the LR schedule then owns each of its groups."""
        name, lr, momentum = resolve_optimizer(name, lr, momentum, int(iterations))
        ramp_iters = max(round(self.args.unfreeze_warmup * self._parts.num_batches), 1) if self.args.unfreeze_warmup > 0 else 0
        return build_optimizer(model, name, lr, momentum, decay, self._parts.frozen, ramp_iters)

    def validate(self) -> tuple[dict, float]:
        """(metrics, fitness) of this epoch (Ultralytics' return): every validation set on rank 0, shared with every
        rank. An override may add metrics or change the fitness (call super().validate() first)."""
        parts = self._parts
        metrics = None
        if self.is_main:  # every validation set (one, usually)
            validate_on = lambda loader: parts.validator(trainer=self, dataloader=loader)  # noqa: E731
            metrics = val_sets.validate_sets(validate_on, parts.validator, parts.data, parts.test_loader, parts.extra_val)
        metrics = distributed.broadcast_object(metrics)
        return metrics, float(metrics.get("fitness", 0.0))

    def save_metrics(self, metrics: dict) -> None:
        """This epoch's row of results.csv (an EpochRecord row), stored in the checkpoint; the file follows it."""
        self._recipe.results.add(metrics)

    def save_model(self) -> None:
        """This epoch's checkpoint files (recipe/saver.py): last.pt, best.pt when improved, epoch / top-k copies."""
        state = self._state
        if self.is_main and self._recipe.saver.active:
            outcome = EpochOutcome(state.progress.epoch, state.best.improved, state.metrics.monitor_value if self.validated_this_epoch else None)
            self._recipe.saver.save_epoch(self._checkpoint_bytes(), self._place.wdir, outcome, self._recipe.monitor.best_first)

    def plot_metrics(self) -> None:
        """results.png from results.csv."""
        plot_results(Path(self._place.save_dir) / "results.csv")

    # --- validation and saving ------------------------------------------------------------
    def _should_validate(self) -> bool:
        state = self._state
        final = state.progress.epoch + 1 == state.progress.epochs
        periodic = self.args.val and (state.progress.epoch + 1) % self.args.val_period == 0
        return final or periodic or state.stop.flag or (self.args.val and state.progress.validate_every_epoch)

    def _validate_and_save(self) -> None:
        state = self._state
        state.best.improved = False
        if self._should_validate():
            start = perf_counter()
            metrics, fitness = self.validate()
            self._clock.spent("val", start)
            state.metrics.fitness = float(fitness)
            state.metrics.values = {**metrics, "fitness": state.metrics.fitness}  # monitor=fitness follows validate()
            state.metrics.epoch = state.progress.epoch
            state.metrics.monitor_value = self._recipe.monitor.value(state.metrics.values)
            if self._recipe.monitor.improved(state.metrics.monitor_value, state.best.fitness):
                state.best.fitness, state.best.improved = state.metrics.monitor_value, True
        elif state.best.fitness is None:
            state.best.improved = True  # nothing validated yet: best.pt follows last.pt
        if state.best.improved:
            state.best.epoch = state.progress.epoch
        self._stop_early()
        self._checkpointer.gather_rank_rng(self._place.world_size)
        self._output.record = EpochRecord(  # results.csv and every logger read this one record
            epoch=state.progress.epoch + 1, time=round(self._clock.elapsed, 3), train=self.label_loss_items(state.losses.tloss, prefix="train"),
            metrics=dict(state.metrics.values), lr=dict(state.metrics.lr), validated=self.validated_this_epoch, times=self._clock.phase_ms())
        if self._recipe.schedule is not None:  # the next epoch's LR, before the checkpoint that holds it
            self._recipe.schedule.next_epoch(state.progress.epoch, state.metrics.values, self.validated_this_epoch)
        if self.is_main and self.args.save:
            self.save_metrics(self._output.record.row())
        self.save_model()
        if self.is_main and self.args.save:  # after the checkpoint: results.csv never shows an epoch last.pt lacks
            self._recipe.results.write(self._place.save_dir)
        self.run_callbacks("on_model_save")  # after the files are written

    def _stop_early(self) -> None:
        """Early stopping (recipe/early_stop.py), asked once per epoch before the checkpoint: stop now, or end after epoch
        N (stop_close_mosaic=finish: the close_mosaic stage first); the patience rule once something was validated."""
        state, early = self._state, self._recipe.early_stop
        if state.stop.flag:
            return
        rule = None if state.metrics.monitor_value is None else early.reason(state.progress.epoch, state.best.epoch, self._recipe.monitor.key, state.best.fitness)
        decision = early.decide(state.progress.epoch, state.progress.epochs, rule, self.is_main)
        if decision.end_after is not None:
            self.end_after(decision.end_after)
        if decision.stop:
            self.request_stop(StopCause.EARLY_STOPPING, decision.stop)

    def _agree_to_stop(self) -> bool:
        return self._signals.agree_to_stop(self._state.stop, self._place.flag_device)

    def _raise_on_signal(self) -> None:
        """Leave as an interrupt after a signal; when the ranks agreed mid-run, with the RNG states the save needs."""
        self._signals.raise_on_signal(lambda: self._state.progress.loop_done or self._checkpointer.gather_rank_rng(self._place.world_size))

    def _log_callback_stats(self) -> None:
        """The closing line: what yolo-cb's own callbacks cost against the run's wall time, then the slowest callbacks."""
        if self.is_main:
            record = Path(self._place.save_dir) / "callbacks.json" if self.args.save and self._place.save_dir else None
            LOGGER.info(self.callbacks.closing_line(self._clock.elapsed, record))


Trainer.__doc__ = f"{Trainer.__doc__}\n{controls_doc()}"  # the controls, from their one list (settings/controls.py)
