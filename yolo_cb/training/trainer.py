"""The training loop: setup, epochs, batches, optimizer steps, validation, early stopping, the LR schedule, saving —
every step called by name, every step firing its event.

The recipe's parts are objects the loop calls: the LR schedule (recipe/schedule.py), early stopping
(recipe/early_stop.py), results.csv and the checkpoint files (saver.py), unfreezing (recipe/unfreeze.py) and checkpoint
averaging (recipe/average.py). Progress, integrations and the
user's callbacks are callbacks; they steer the run only through the controls (request_stop, withdraw_stop, end_after,
validate_each_epoch, patience, restore_best, set_lr). The state is typed (`trainer.state`, run_state.py); the parts live
beside it: build.py (model, loaders, validator), step.py (one batch), checkpointer.py (what a checkpoint holds, last.pt
after an error), signals.py, place.py (device, ranks, run folder).
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
        self.state = RunState(progress=Progress(epochs=args.epochs))  # epoch, losses, metrics, best, stop: run_state.py
        self.parts = build.Parts()  # model, ema, optimizer, criterion, loaders, validator, data
        self.step = BatchStep(args.imgsz)  # one batch: AMP, backward, accumulation, optimizer step, EMA
        self.place = Place()  # device, rank, world size, run folder
        self.checkpointer = Checkpointer()
        self.signals = SignalWatch()
        self.clock = Clock()
        self.output = EpochOutput()  # the epoch's record and the image files written in it: training/epoch_record.py
        self.recipe = RecipeParts.from_args(args)  # monitor, early stopping, LR schedule, saver, results.csv: called by name
        self.resume_ckpt = resume  # the checkpoint a resume continues (the plan's; its run folder is verified in place.py)
        self.exception: BaseException | None = None
        self.restore_best = bool(args.restore_best)

    def checkpoint_dict(self, epoch: int | None = None, batches_done: int | None = None) -> dict:
        """The plain-data checkpoint (see DESIGN.md): loadable with torch.load(weights_only=True).

        `epoch` is the last completed epoch; mid-epoch (a save_steps or signal save) `epoch_batches` says how many batches
        of the next one are trained, with what resuming there needs: that epoch's mean losses, accumulated gradients, and
        every rank's RNG states under DDP (gathered on rank 0 just before)."""
        return self.checkpointer.checkpoint(self._contents(), epoch, batches_done).to_dict()

    def _contents(self) -> RunContents:
        """This run's state, parts, settings, recipe and callbacks: what a checkpoint holds and a resume restores."""
        return RunContents(self.state, self.parts, self.step, self.args, self.recipe, self.callbacks, self.save_dir, self.rank,
                           self.world_size)

    def _checkpoint_bytes(self, epoch: int | None = None) -> bytes:
        return serialize_checkpoint(self.checkpoint_dict(epoch=epoch))

    def final_metrics(self) -> DetectionMetrics:
        """What train() of the facade returns: the final metrics, with the per-class detail of their validation."""
        return DetectionMetrics.of_run(self.metrics, self.validator)

    def final_weights(self) -> Path | None:
        """The weights the run ends on (best.pt; last.pt with restore_best=False), absolute; None when none was written."""
        weights = self.best if self.restore_best else self.last
        return weights.resolve() if weights is not None and weights.is_file() else None

    def data_fingerprint(self) -> dict | None:
        """The dataset's identity stored in checkpoints (data YAML, image counts, names); resume refuses another one."""
        return self.checkpointer.data_fingerprint(self.data)

    # --- the run ------------------------------------------------------------------------
    def train(self) -> dict:
        """Run the whole training; teardown always fires; errors re-raise after last.pt and on_exception."""
        self.signals.install(self.request_stop)
        previous_state = save_process_state(LOGGER)
        try:
            self._setup()
            if self.is_main and self.recipe.saver.active and self.args.save_initial and self.start_epoch == 0:
                self.recipe.saver.save_initial(self._checkpoint_bytes(epoch=-1), self.wdir)  # epoch -1: no epoch trained yet
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
            self.place.leave_distributed(self.parts, clean_exit=self.exception is None)
            restore_process_state(previous_state, LOGGER)
            self.place.release()

    def _fit(self) -> None:
        """The epochs: train, validate and save, on_fit_epoch_end; stop when every rank agrees to."""
        for epoch in range(self.start_epoch, self.epochs):
            if self._agree_to_stop():  # set before the epoch's first batch (on_pretrain_routine_*, on_train_start, ...)
                self._raise_on_signal()
                LOGGER.info(f"stopping before epoch {epoch + 1}: {self.stop_reason or 'trainer.stop was set'}; epoch {epoch + 1} is not trained")
                break
            self.state.progress.epoch = epoch
            self._train_epoch()
            self._raise_on_signal()
            self.state.progress.completed_epoch, self.state.progress.stepped = epoch, False
            self._validate_and_save()
            self.run_callbacks("on_fit_epoch_end")
            if self._agree_to_stop():
                self._raise_on_signal()
                LOGGER.info(f"stopping after epoch {epoch + 1}: {self.stop_reason or 'trainer.stop was set'}")
                break
            if epoch + 1 >= self.epochs:  # the last epoch (trainer.end_after may have shortened the run)
                break
            self.run_callbacks("on_params_update")  # the LR schedule set the next epoch's LR before the checkpoint
        self.state.progress.loop_done = True
        if self.is_main and self.recipe.saver.active and self.completed_epoch >= self.start_epoch:  # an epoch ran here
            self.recipe.saver.save_closing(self._checkpoint_bytes, self.wdir)  # with on_fit_epoch_end's changes

    def _finish(self) -> None:
        """Validate best.pt on rank 0, share the metrics, on_train_end (a signal during either still exits 130 / 143)."""
        if self.is_main:
            cause = self.stop_cause
            finished = self.completed_epoch + 1 >= self.epochs or (cause is not None and cause.finishes_run)
            metrics = self.checkpointer.validate_best(self.wdir, finished, bool(self.args.val), self.validator, self.device)
            if metrics is not None:  # best.pt's metrics, of best.pt's epoch
                self.state.metrics.values, self.state.metrics.epoch = metrics, self.best_epoch
        self.state.metrics.values = distributed.broadcast_object(self.metrics)
        self._agree_to_stop()
        self._raise_on_signal()
        if self.restore_best and self.stop_cause == StopCause.EARLY_STOPPING:
            restore_best_weights(self.best, self.model, self.ema.ema if self.ema else None)  # best.pt's weights, not the last epoch's
        if self.is_main and self.args.plots and self.args.save:
            self.plot_metrics()
        if self.is_main and self.args.save and self.recipe.averager is not None:  # best_avg.pt, before loggers' on_train_end
            self.recipe.averager.average(self.wdir, self.recipe.monitor, self.metrics, lambda model: self.validator(model=model.to(self.device)))
        self.run_callbacks("on_train_end")
        self._raise_on_signal()
        self._log_callback_stats()

    def _fail(self, error: BaseException) -> None:
        """last.pt (when it can be saved exactly), then on_exception; the original error is what the user sees."""
        self.exception = error
        if self.setup_done and self.is_main and self.args.save:
            self.checkpointer.save_on_error(self.state.progress, self.world_size, error, self.signals.agreed, self.wdir,
                                            lambda epoch, batches: self.checkpoint_dict(epoch=epoch, batches_done=batches))
        try:
            self.run_callbacks("on_exception")
        except Exception as callback_error:  # the original error is what the user must see, not the handler's
            LOGGER.error(f"ERROR on_exception failed ({callback_error}); re-raising the original error: {type(error).__name__}: {error}")

    # --- setup ----------------------------------------------------------------------------
    def _setup(self) -> None:
        args = self.args
        self.place.join_distributed(args.device)
        if self.world_size == 1:
            self.place.device = select_device(args.device)
        self.resume_ckpt = resume_state.agree_on_checkpoint(self.resume_ckpt, self.rank, self.world_size, self.flag_device)  # DDP: rank 0's
        make_save_dir(self.place, args, self.resume_ckpt)
        self.run_callbacks("on_pretrain_routine_start")
        build.seed_everything(args.seed + max(self.rank, 0), args.deterministic)
        self.parts.data = build.check_data(args, self.rank)
        self._build_model()
        loaders = build.build_loaders(args, self.data, self.rank, self.is_main, self.device)
        self.parts.train_loader, self.parts.test_loader, self.parts.extra_val = loaders.train, loaders.test, loaders.extra
        self.parts.num_batches = len(loaders.train)
        planned = self.step.plan_optimizer(args, self.device, self.world_size, self.num_batches, len(self.train_loader.dataset), self.epochs)
        self.parts.optimizer = adopt_optimizer(self.build_optimizer(self.model, **planned))
        self.parts.ema = ModelEMA(self.model) if self.is_main else None
        self.step.bind(StepBinding(args, self.parts, self.state, self.clock, self.run_callbacks, self.device, self.flag_device))
        if self.resume_ckpt is not None:
            resume_state.load_state(self.resume_ckpt, self._contents())
            self.checkpointer.resumed(self.resume_ckpt, self.data)
        self._wrap_forward()
        self.parts.validator = Validator(args, save_dir=self.save_dir, callbacks=self.callbacks, dataloader=self.test_loader)
        self.validator.trainer = self  # validator events reach the trainer (and its epoch) during training
        self._start_recipe()
        if self.metrics_epoch is None and not self.metrics:
            self.state.metrics.values = build.placeholder_metrics(self.loss_names, self.data)
            self.recipe.monitor.value(self.metrics)  # monitor= names a metric of this run, or the run stops here, before any epoch
        self.state.progress.setup_done = True
        if args.verbose and self.is_main:
            LOGGER.info("callbacks, per event in firing order:\n" + self.callbacks.table())
        self.run_callbacks("on_pretrain_routine_end")

    def _start_recipe(self) -> None:
        """The schedule sets the first epoch's LR (a resume restored its state); the unfreeze stages are checked against
        what freeze= froze; a resume rewrites results.csv and keeps a length early stopping shortened (the stage finished)."""
        if self.recipe.early_stop.end is not None:
            self.end_after(self.recipe.early_stop.end)
        if self.recipe.schedule is not None:
            self.recipe.schedule.start(self.optimizer, self.args, self.epochs, self.start_epoch, self.step.warmup)
        if self.recipe.unfreeze is not None:
            self.recipe.unfreeze.check(self.frozen, self.epochs, self.is_main)
        if self.is_main and self.args.save and self.start_epoch > 0:
            self.recipe.results.resume(self.save_dir, self.start_epoch)

    def _build_model(self) -> None:
        """The model, the modules freeze= froze (before the optimizer: frozen tensors get no group), the loss."""
        parts, args = self.parts, self.args
        parts.model = build.initial_model(args, self.model_source, self.resume_ckpt, self.data, self.device, self.is_main)
        parts.model_cfg = dict(parts.model.cfg)
        parts.frozen = freeze_layers(unwrap(parts.model), args.freeze)
        parts.criterion, parts.loss_names = build.build_criterion(args, parts.model)

    def _wrap_forward(self) -> None:
        """The DDP wrapper (several ranks) and compile='s forward over it, after the EMA's copy: neither sees a wrapper."""
        parts = self.parts
        if self.world_size > 1:
            parts.model, parts.ddp_trainable = build.wrap_distributed(unwrap(parts.model), self.args.sync_bn, self.device)
        parts.compiled = build.compile_forward(parts.model, self.args.compile)

    # --- epoch / batch ------------------------------------------------------------------
    def _train_epoch(self) -> None:
        self.model.train()
        if self.recipe.unfreeze is not None:  # freeze= layers whose stage is reached train from this epoch on
            self.recipe.unfreeze.apply(self.epoch, self.epochs, unwrap(self.model), self.frozen, self.is_main)
        self.run_callbacks("on_train_epoch_start")  # the stage switch may close mosaic here, before the iterator exists
        if build.stale_wrapper(self.parts, self.world_size):  # after it: unfrozen layers (a callback may unfreeze too)
            self._wrap_forward()
        self.train_loader.set_epoch(self.epoch)
        self.optimizer.zero_grad(set_to_none=True)
        self.state.losses.tloss = None
        self.new_images.clear()
        skip = resume_state.continue_epoch(self.state, self.train_loader, self.model)  # a mid-epoch resume: the batches already trained are skipped
        self.state.progress.batches_done = skip
        self.clock.mark = perf_counter()
        for batch_i, batch in enumerate(self.train_loader, start=skip):
            self.clock.spent("data", self.clock.mark)  # the wait for this batch
            self.state.progress.batch_i, self.step.batch = batch_i, batch
            ni = batch_i + self.num_batches * self.epoch  # the batch's index over the run: what warmup follows
            if self.recipe.schedule is not None:
                self.recipe.schedule.warmup_batch(self.epoch, ni)
            result = self._train_batch(ni)
            self.state.progress.batches_done = batch_i + 1
            n = self.args.save_steps
            self.state.progress.save_step_due = bool(n) and result.stepped and self.optimizer_steps % n == 0 and self.batches_done < self.num_batches
            if self.save_step_due:
                self.checkpointer.gather_rank_rng(self.world_size)
                if self.is_main and self.recipe.saver.active:
                    self.recipe.saver.save_step(self._checkpoint_bytes(), self.wdir)
            self.run_callbacks("on_train_batch_end")
            self.state.progress.save_step_due = False
            if self.args.time and self.elapsed > self.args.time * 3600 and not self.stop:
                self.request_stop(StopCause.TIME_LIMIT, f"time limit of {self.args.time} h reached")
            if self._agree_to_stop():
                break
            self.clock.mark = perf_counter()
        self.state.metrics.lr = {f"lr/pg{i}": group["lr"] for i, group in enumerate(self.optimizer.param_groups)}
        self.run_callbacks("on_train_epoch_end")

    def _train_batch(self, ni: int) -> StepResult:
        return self.step.run(self.epoch, self.batch_i, ni)

    # --- Ultralytics' steps a subclass may override: the loop calls them by name --------------------------------
    def build_optimizer(self, model, name: str = "auto", lr: float = 0.001, momentum: float = 0.9, decay: float = 1e-5,
                        iterations: float = 1e5) -> torch.optim.Optimizer:
        """The optimizer (Ultralytics' signature; `decay` is already scaled to the nominal batch): groups 0-2 (biases,
        decay weights, norm weights), and with unfreeze_warmup the frozen layers' late groups (recipe/optim.py). An
        override's optimizer is used as it returns it; the LR schedule then owns each of its groups."""
        name, lr, momentum = resolve_optimizer(name, lr, momentum, int(iterations))
        ramp_iters = max(round(self.args.unfreeze_warmup * self.num_batches), 1) if self.args.unfreeze_warmup > 0 else 0
        return build_optimizer(model, name, lr, momentum, decay, self.frozen, ramp_iters)

    def validate(self) -> tuple[dict, float]:
        """(metrics, fitness) of this epoch (Ultralytics' return): every validation set on rank 0, shared with every
        rank. An override may add metrics or change the fitness (call super().validate() first)."""
        metrics = None
        if self.is_main:  # every validation set (one, usually)
            validate_on = lambda loader: self.validator(trainer=self, dataloader=loader)  # noqa: E731
            metrics = val_sets.validate_sets(validate_on, self.validator, self.data, self.test_loader, self.parts.extra_val)
        metrics = distributed.broadcast_object(metrics)
        return metrics, float(metrics.get("fitness", 0.0))

    def save_metrics(self, metrics: dict) -> None:
        """This epoch's row of results.csv (an EpochRecord row), stored in the checkpoint; the file follows it."""
        self.recipe.results.add(metrics)

    def save_model(self) -> None:
        """This epoch's checkpoint files (recipe/saver.py): last.pt, best.pt when improved, epoch / top-k copies."""
        if self.is_main and self.recipe.saver.active:
            outcome = EpochOutcome(self.epoch, self.improved, self.monitor_value if self.validated_this_epoch else None)
            self.recipe.saver.save_epoch(self._checkpoint_bytes(), self.wdir, outcome, self.recipe.monitor.best_first)

    def plot_metrics(self) -> None:
        """results.png from results.csv."""
        plot_results(Path(self.save_dir) / "results.csv")

    # --- validation and saving ------------------------------------------------------------
    def _should_validate(self) -> bool:
        final = self.epoch + 1 == self.epochs
        periodic = self.args.val and (self.epoch + 1) % self.args.val_period == 0
        return final or periodic or self.stop or (self.args.val and self.validate_every_epoch)

    def _validate_and_save(self) -> None:
        self.state.best.improved = False
        if self._should_validate():
            start = perf_counter()
            metrics, fitness = self.validate()
            self.clock.spent("val", start)
            self.state.metrics.fitness = float(fitness)
            self.state.metrics.values, self.state.metrics.epoch = {**metrics, "fitness": self.fitness}, self.epoch  # monitor=fitness follows validate()
            self.state.metrics.monitor_value = self.recipe.monitor.value(self.metrics)
            if self.recipe.monitor.improved(self.monitor_value, self.best_fitness):
                self.state.best.fitness, self.state.best.improved = self.monitor_value, True
        elif self.best_fitness is None:
            self.state.best.improved = True  # nothing validated yet: best.pt follows last.pt
        if self.improved:
            self.state.best.epoch = self.epoch
        self._stop_early()
        self.checkpointer.gather_rank_rng(self.world_size)
        self.output.record = EpochRecord(  # results.csv and every logger read this one record
            epoch=self.epoch + 1, time=round(self.elapsed, 3), train=self.label_loss_items(self.tloss, prefix="train"),
            metrics=dict(self.metrics), lr=dict(self.lr), validated=self.validated_this_epoch, times=self.clock.phase_ms())
        if self.recipe.schedule is not None:  # the next epoch's LR, before the checkpoint that holds it
            self.recipe.schedule.next_epoch(self.epoch, self.metrics, self.validated_this_epoch)
        if self.is_main and self.args.save:
            self.save_metrics(self.epoch_record.row())
        self.save_model()
        if self.is_main and self.args.save:  # after the checkpoint: results.csv never shows an epoch last.pt lacks
            self.recipe.results.write(self.save_dir)
        self.run_callbacks("on_model_save")  # after the files are written

    def _stop_early(self) -> None:
        """Early stopping (recipe/early_stop.py), asked once per epoch before the checkpoint: stop now, or end after epoch
        N (stop_close_mosaic=finish: the close_mosaic stage first); the patience rule once something was validated."""
        if self.stop:
            return
        early = self.recipe.early_stop
        rule = None if self.monitor_value is None else early.reason(self.epoch, self.best_epoch, self.recipe.monitor.key, self.best_fitness)
        decision = early.decide(self.epoch, self.epochs, rule, self.is_main)
        if decision.end_after is not None:
            self.end_after(decision.end_after)
        if decision.stop:
            self.request_stop(StopCause.EARLY_STOPPING, decision.stop)

    def _agree_to_stop(self) -> bool:
        return self.signals.agree_to_stop(self.state.stop, self.flag_device)

    def _raise_on_signal(self) -> None:
        """Leave as an interrupt after a signal; when the ranks agreed mid-run, with the RNG states the save needs."""
        self.signals.raise_on_signal(lambda: self.loop_done or self.checkpointer.gather_rank_rng(self.world_size))

    def _log_callback_stats(self) -> None:
        """The closing line: what yolo-cb's own callbacks cost against the run's wall time, then the slowest callbacks."""
        if self.is_main:
            record = Path(self.save_dir) / "callbacks.json" if self.args.save and self.save_dir else None
            LOGGER.info(self.callbacks.closing_line(self.elapsed, record))
