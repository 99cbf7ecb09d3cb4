"""What a checkpoint holds (`checkpoint`, from the run's parts), last.pt after an error or a signal, and best.pt validated at the end.

The saver (saver.py) decides which files and when; this module says what is written.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from yolo_cb.checkpoints.checkpoint import (
    Checkpoint,
    model_from_checkpoint,
    rng_states,
    save_checkpoint,
    serialize_checkpoint,
    strip_optimizer,
)
from yolo_cb.recipe.ema import unwrap
from yolo_cb.training import resume, resume_state
from yolo_cb.training.run_state import RunContents
from yolo_cb.utils import dist as distributed
from yolo_cb.utils.log import LOGGER
from yolo_cb.version import __version__


class Checkpointer:
    """Builds checkpoints from a trainer; keeps the dataset's fingerprint and, under DDP, every rank's RNG states."""

    def __init__(self):
        self.rank_rng: list | None = None  # under DDP: every rank's RNG states, gathered on rank 0 just before a checkpoint
        self.fingerprint: dict | None = None

    def data_fingerprint(self, data: dict) -> dict | None:
        """The dataset's identity the checkpoints record: counted once, at the first save, unless a resume carried it."""
        if self.fingerprint is None and data:
            self.fingerprint = resume.dataset_fingerprint(data)
        return self.fingerprint

    def resumed(self, ckpt: Checkpoint, data: dict) -> None:
        """A resume of `ckpt` on `data`: its recorded fingerprint is this run's (the plan compared it with the dataset)."""
        self.fingerprint = resume.carried_fingerprint(ckpt.data_fingerprint, data)

    def gather_rank_rng(self, world_size: int) -> None:
        """Under DDP: every rank's RNG states to rank 0, for the checkpoint about to be written (a collective: all ranks call it)."""
        if world_size > 1:
            self.rank_rng = distributed.gather_object(rng_states())

    def checkpoint(self, run: RunContents, epoch: int | None = None, batches_done: int | None = None) -> Checkpoint:
        """The run's state as a Checkpoint: `epoch` is the last completed one (default: the progress's), mid-epoch
        `batches_done` the batches of the next one already trained."""
        state, parts, step, ema = run.state, run.parts, run.step, run.parts.ema
        p, best, metrics = state.progress, state.best, state.metrics
        epoch = p.completed_epoch if epoch is None else epoch
        batches_done = (p.batches_done if p.completed_epoch < p.epoch else 0) if batches_done is None else batches_done
        return Checkpoint(
            model={k: v.detach().clone() for k, v in unwrap(parts.model).state_dict().items()},
            ema={k: v.detach().clone() for k, v in ema.ema.state_dict().items()} if ema else None,
            ema_updates=ema.updates if ema else 0,
            last_opt_step=step.last_opt_step,
            optimizer=parts.optimizer.state_dict(),
            scaler=step.scaler.state_dict() if step.scaler.is_enabled() else None,
            epoch=epoch,
            epochs=p.epochs,
            best_fitness=best.fitness,
            best_epoch=best.epoch,
            # these weights are best.pt's (written just before it): on resume they restore a best.pt a kill left behind
            last_is_best=best.epoch is not None and best.epoch == epoch and not p.stepped,
            finished=False,  # set when the run ends (strip_optimizer): a finished run is not resumed
            save_dir=str(Path(run.save_dir).resolve()) if run.save_dir else None,  # resume verifies it
            data_fingerprint=self.data_fingerprint(parts.data),
            fitness=metrics.fitness,
            train_args=run.args.as_dict(),
            model_cfg=dict(parts.model_cfg),
            names={int(k): str(v) for k, v in parts.data["names"].items()},
            callbacks=run.callbacks.state_dict(),
            recipe=run.recipe.state_dict(),
            rng=rng_states(),
            rank_rng=self.rank_rng if run.world_size > 1 else None,
            epoch_batches=batches_done,
            world_size=run.world_size,
            optimizer_steps=p.optimizer_steps,
            tloss=state.losses.tloss.tolist() if batches_done and state.losses.tloss is not None else None,
            grads=resume_state.partial_grads(parts.model) if batches_done else None,
            loss=parts.criterion.training_state(),
            metrics={k: float(v) for k, v in metrics.values.items()},
            metrics_epoch=metrics.epoch,
            monitor_value=metrics.monitor_value,
            version=__version__,
            date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )

    def save_on_error(self, p: Any, world_size: int, error: BaseException, agreed: bool, wdir: Path,
                      checkpoint_dict: Callable[[int, int], dict]) -> None:
        """On an exception or signal (the caller checked the run was set up, is rank 0 and saves): save last.pt with the
        current weights (epoch = last completed one, from the run's progress `p`), from `checkpoint_dict(epoch, batches_done)`.

        After a signal every rank agreed on (`agreed`), the loop stopped after a whole batch: the save records that batch,
        and a resume continues exactly there. Under DDP nothing else is saved: after a failure (a rank killed, a collective
        broken) the ranks are no longer in step, so last.pt keeps the last checkpoint they all reached."""
        if p.loop_done:
            return  # after the last epoch, last.pt is already the final checkpoint
        if world_size > 1 and not agreed:
            LOGGER.warning(f"WARNING not saving last.pt after {type(error).__name__}: the ranks are no longer in step; "
                           f"it keeps the last checkpoint every rank reached")
            return
        batches = p.batches_done if agreed and p.completed_epoch < p.epoch else 0
        last = Path(wdir) / "last.pt"
        try:
            save_checkpoint(serialize_checkpoint(checkpoint_dict(p.completed_epoch, batches)), last)
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
    def validate_best(wdir: Path, finished: bool, validate: bool, validator: Any, device: Any) -> dict | None:
        """Strip the optimizer from the checkpoints of a `finished` run; with `validate`, best.pt's metrics from `validator`
        (firing on_val_*, with plots), else None."""
        best, last = Path(wdir) / "best.pt", Path(wdir) / "last.pt"
        stripped_best = Checkpointer.strip_finished(last, best) if finished else None
        if not (best.is_file() and validate):
            return None
        LOGGER.info(f"validating {best}")
        validator.plot = True
        try:
            return dict(validator(model=model_from_checkpoint(stripped_best or best).to(device)))
        finally:
            validator.plot = False
