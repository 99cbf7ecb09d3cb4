"""What a checkpoint holds (`checkpoint_dict`), last.pt after an error or a signal, and best.pt validated at the end.

The saver (saver.py) decides which files and when; this module says what is written.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from yolo_cb.checkpoints.checkpoint import (
    Checkpoint,
    model_from_checkpoint,
    rng_states,
    save_checkpoint,
    serialize_checkpoint,
    strip_optimizer,
)
from yolo_cb.nn.yolox.loss import YOLOXLoss
from yolo_cb.recipe.ema import unwrap
from yolo_cb.training import resume, resume_state
from yolo_cb.utils import dist as distributed
from yolo_cb.utils.log import LOGGER
from yolo_cb.version import __version__


class Checkpointer:
    """Builds checkpoints from a trainer; keeps the dataset's fingerprint and, under DDP, every rank's RNG states."""

    def __init__(self):
        self.rank_rng: list | None = None  # under DDP: every rank's RNG states, gathered on rank 0 just before a checkpoint
        self.fingerprint: dict | None = None

    def data_fingerprint(self, data: dict) -> dict | None:
        if self.fingerprint is None and data:
            self.fingerprint = resume.dataset_fingerprint(data)
        return self.fingerprint

    def gather_rank_rng(self, world_size: int) -> None:
        """Under DDP: every rank's RNG states to rank 0, for the checkpoint about to be written (a collective: all ranks call it)."""
        if world_size > 1:
            self.rank_rng = distributed.gather_object(rng_states())

    def checkpoint_dict(self, trainer, epoch: int | None = None, batches_done: int | None = None) -> dict:
        """Trainer.checkpoint_dict: the plain-data checkpoint (see DESIGN.md), the dict of `checkpoint`."""
        return self.checkpoint(trainer, epoch, batches_done).to_dict()

    def checkpoint(self, trainer, epoch: int | None = None, batches_done: int | None = None) -> Checkpoint:
        """The trainer's state as a Checkpoint."""

        p, step, ema = trainer.state.progress, trainer.step, trainer.ema
        epoch = p.completed_epoch if epoch is None else epoch
        batches_done = (p.batches_done if p.completed_epoch < p.epoch else 0) if batches_done is None else batches_done
        return Checkpoint(
            model={k: v.detach().clone() for k, v in unwrap(trainer.model).state_dict().items()},
            ema={k: v.detach().clone() for k, v in ema.ema.state_dict().items()} if ema else None,
            ema_updates=ema.updates if ema else 0,
            last_opt_step=step.last_opt_step,
            optimizer=trainer.optimizer.state_dict(),
            scaler=step.scaler.state_dict() if step.scaler.is_enabled() else None,
            epoch=epoch,
            epochs=p.epochs,
            best_fitness=trainer.best_fitness,
            best_epoch=trainer.best_epoch,
            # these weights are best.pt's (written just before it): on resume they restore a best.pt a kill left behind
            last_is_best=trainer.best_epoch is not None and trainer.best_epoch == epoch and not p.stepped,
            finished=False,  # set when the run ends (strip_optimizer): a finished run is not resumed
            save_dir=str(Path(trainer.save_dir).resolve()) if trainer.save_dir else None,  # resume verifies it
            data_fingerprint=trainer.data_fingerprint(),
            fitness=trainer.fitness,
            train_args=trainer.args.as_dict(),
            model_cfg=dict(trainer.model_cfg),
            names={int(k): str(v) for k, v in trainer.data["names"].items()},
            callbacks=trainer.callbacks.state_dict(),
            recipe=trainer.recipe.state_dict(),
            rng=rng_states(),
            rank_rng=self.rank_rng if trainer.world_size > 1 else None,
            epoch_batches=batches_done,
            world_size=trainer.world_size,
            optimizer_steps=p.optimizer_steps,
            tloss=trainer.tloss.tolist() if batches_done and trainer.tloss is not None else None,
            grads=resume_state.partial_grads(trainer.model) if batches_done else None,
            use_l1=isinstance(trainer.criterion, YOLOXLoss) and trainer.criterion.use_l1,
            metrics={k: float(v) for k, v in trainer.metrics.items()},
            metrics_epoch=trainer.metrics_epoch,
            monitor_value=trainer.monitor_value,
            version=__version__,
            date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )

    def save_on_error(self, trainer) -> None:
        """On an exception or signal: save last.pt with the current weights (epoch = last completed one).

        After a signal every rank agreed on, the loop stopped after a whole batch: the save records that batch, and a resume
        continues exactly there. Under DDP nothing else is saved: after a failure (a rank killed, a collective broken) the
        ranks are no longer in step, so last.pt keeps the last checkpoint they all reached."""
        p, agreed = trainer.state.progress, trainer.signals.agreed
        if not (trainer.setup_done and trainer.is_main and trainer.args.save) or p.loop_done:
            return  # after the last epoch, last.pt is already the final checkpoint
        if trainer.world_size > 1 and not agreed:
            LOGGER.warning(f"WARNING not saving last.pt after {type(trainer.exception).__name__}: the ranks are no longer in step; "
                           f"it keeps the last checkpoint every rank reached")
            return
        batches = p.batches_done if agreed and p.completed_epoch < p.epoch else 0
        last = trainer.wdir / "last.pt"
        try:
            save_checkpoint(serialize_checkpoint(trainer.checkpoint_dict(epoch=p.completed_epoch, batches_done=batches)), last)
            LOGGER.info(f"saved {last} (resume with: yolo-cb train resume={last})")
        except Exception as error:  # the original error matters more than this one
            LOGGER.error(f"ERROR could not save last.pt after the failure: {error}")

    @staticmethod
    def strip_finished(last: Path, best: Path) -> Checkpoint | None:
        """Strip the optimizer from last.pt and best.pt (those that exist), marked finished; best.pt's stripped checkpoint.
        When they hold the same bytes (the last epoch was the best) one load and one serialization write both."""
        same = last.is_file() and best.is_file() and last.read_bytes() == best.read_bytes()
        stripped_last = strip_optimizer(last, finished=True, copies=(best,) if same else ()) if last.is_file() else None
        if same:
            return stripped_last
        return strip_optimizer(best, finished=True) if best.is_file() else None

    @staticmethod
    def validate_best(trainer) -> None:
        """Strip the optimizer from finished checkpoints; validate best.pt (firing on_val_*) into trainer.metrics."""
        best, last = trainer.wdir / "best.pt", trainer.wdir / "last.pt"
        cause, stripped_best = trainer.stop_cause, None
        if trainer.completed_epoch + 1 >= trainer.epochs or (cause is not None and cause.finishes_run):
            stripped_best = Checkpointer.strip_finished(last, best)
        if best.is_file() and trainer.args.val:
            LOGGER.info(f"validating {best}")
            trainer.validator.plot = True
            model = model_from_checkpoint(stripped_best or best).to(trainer.device)
            trainer.state.metrics.values, trainer.state.metrics.epoch = dict(trainer.validator(model=model)), trainer.best_epoch  # best.pt's epoch
            trainer.validator.plot = False
