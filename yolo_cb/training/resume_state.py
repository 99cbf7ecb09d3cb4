"""Resume, once the run is built: the trainer's state restored from the checkpoint that yolo_cb.training.resume chose.

Weights, optimizer, EMA, scaler, counters, metrics, callback states and RNG states; under DDP, every rank on rank 0's
checkpoint; best.pt made to hold the epoch the checkpoint says; and a mid-epoch checkpoint's position (the batches already
trained, that epoch's mean losses and accumulated gradients) carried into the first resumed epoch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import torch

from yolo_cb.checkpoints.checkpoint import Checkpoint, checkpoint_epoch, load_weights_strictly, save_checkpoint, set_rng_states
from yolo_cb.recipe.early_stop import LEGACY_STATE, legacy_best_epoch
from yolo_cb.recipe.ema import unwrap
from yolo_cb.recipe.optim import fit_saved_layout
from yolo_cb.training.run_state import RunContents, RunState
from yolo_cb.utils import dist as distributed
from yolo_cb.utils.log import LOGGER


class MidEpoch(NamedTuple):
    """Where a mid-epoch checkpoint stopped: batches of its epoch already trained, their mean losses, the gradients
    accumulated towards the next optimizer step."""

    batches: int
    tloss: torch.Tensor | None
    grads: dict | None


def resume_position(ckpt: Checkpoint | None) -> str | None:
    """Where a checkpoint resumes ("epoch 3, batch 40, step 1234"), to compare ranks' checkpoints; None for a fresh run."""
    if ckpt is None:
        return None
    return f"epoch {int(ckpt.epoch) + 2}, batch {int(ckpt.epoch_batches or 0)}, step {int(ckpt.optimizer_steps)}, {ckpt.date}"


def agree_on_checkpoint(ckpt: Checkpoint | None, rank: int, world_size: int, flag_device: Any) -> Checkpoint | None:
    """The checkpoint this rank continues from. Under DDP every rank must continue from the same checkpoint: rank 0's (the
    one that writes them). A rank whose own copy differs or is missing (a per-node disk, a stale copy) receives rank 0's
    over the process group."""
    if world_size <= 1:
        return ckpt
    mine = resume_position(ckpt)
    rank0 = distributed.broadcast_object(mine)
    if not distributed.any_rank(mine != rank0, flag_device):
        return ckpt
    received = distributed.broadcast_object(ckpt if rank == 0 else None)
    if mine == rank0:
        return ckpt
    LOGGER.warning(f"WARNING rank {rank}: its own checkpoint ({mine or 'none'}) is not rank 0's ({rank0 or 'none: a fresh run'}); "
                   f"using rank 0's, received over the process group")
    return received


def restore_best(ckpt: Checkpoint, resumed: str | Path, best: Path) -> None:
    """Make best.pt hold the epoch the checkpoint (at `resumed`) says: a kill between the last.pt and best.pt writes leaves
    it missing or one improvement behind, and best.pt would otherwise only come back after a strictly better epoch."""
    want = ckpt.best_epoch
    if want is None:
        return  # an older checkpoint: it does not say which epoch best.pt holds
    have = checkpoint_epoch(best)
    if have == want:
        return
    resumed = Path(str(resumed)).expanduser()
    source = resumed if ckpt.last_is_best else None
    if source is None:  # a moved or copied run: the right best.pt may lie next to the checkpoint or in the recorded run folder
        places = [resumed.parent / "best.pt"] + ([Path(ckpt.save_dir) / "weights" / "best.pt"] if ckpt.save_dir else [])
        source = next((p for p in places if p.resolve() != best.resolve() and checkpoint_epoch(p) == want), None)
    state = "missing" if have is None else f"of epoch {have + 1}"
    if source is not None:
        save_checkpoint(source.read_bytes(), best)
        LOGGER.info(f"restored {best} (epoch {want + 1}) from {source}: it was {state}")
    else:
        LOGGER.warning(f"WARNING {best} should hold epoch {want + 1} but is {state}, and no copy of that epoch is left; "
                       f"it is written again when fitness improves")


def load_state(ckpt: Checkpoint, run: RunContents) -> None:
    """Restore a built run from `ckpt`: weights, optimizer, EMA, scaler, counters, metrics, the recipe's and callbacks'
    states, RNG. The dataset is the checkpoint's: the plan refused any other (training/resume.py check_resume_data)."""
    load_weights_strictly(unwrap(run.parts.model), ckpt.model, f"checkpoint '{run.args.resume}'")
    if ckpt.optimizer:
        run.parts.optimizer.load_state_dict(fit_saved_layout(ckpt.optimizer, run.parts.optimizer, unwrap(run.parts.model)))
    else:
        LOGGER.warning("WARNING the checkpoint has no optimizer state (a finished run); the optimizer starts fresh")
    if run.parts.ema is not None and ckpt.ema:
        run.parts.ema.ema.load_state_dict(ckpt.ema)
        run.parts.ema.updates = int(ckpt.ema_updates)
    if ckpt.scaler and run.step.scaler.is_enabled():
        run.step.scaler.load_state_dict(ckpt.scaler)
    run.state.progress.start_epoch = int(ckpt.epoch) + 1
    run.state.progress.completed_epoch = run.state.progress.start_epoch - 1
    callback_states = dict(ckpt.callbacks or {})
    legacy_best = legacy_best_epoch(callback_states)  # older files: early stopping's own best, now the run's one best
    callback_states.pop(LEGACY_STATE, None)
    best_epoch = ckpt.best_epoch if ckpt.best_epoch is not None else legacy_best
    run.state.best.fitness, run.state.best.epoch, run.state.metrics.fitness = ckpt.best_fitness, best_epoch, ckpt.fitness
    run.state.metrics.values = dict(ckpt.metrics or {})
    run.state.metrics.epoch, run.state.metrics.monitor_value = ckpt.metrics_epoch, ckpt.monitor_value
    run.parts.criterion.load_training_state(ckpt.loss or {})
    recorded_step = ckpt.last_opt_step  # None in older files: the last step of the last completed epoch
    run.step.last_opt_step = int(run.state.progress.start_epoch * run.parts.num_batches - 1 if recorded_step is None else recorded_step)
    run.recipe.load_states(ckpt.recipe, callback_states)
    run.callbacks.load_state_dict(callback_states)
    restore_rng(ckpt, run.world_size, run.rank)
    run.state.progress.optimizer_steps = int(ckpt.optimizer_steps)
    skip = resume_batches(ckpt, run.parts.num_batches, run.world_size, run.args.batch)
    run.state.progress.epoch, run.state.progress.batches_done = min(run.state.progress.start_epoch, run.state.progress.epochs - 1), skip  # where a save before the loop resumes
    if skip:
        run.state.progress.stepped = True
        run.state.progress.mid_epoch = MidEpoch(skip, torch.tensor(ckpt.tloss) if ckpt.tloss is not None else None, ckpt.grads)
    if run.state.progress.start_epoch >= run.state.progress.epochs:  # killed after the last epoch was saved, before the run ended
        LOGGER.info(f"all {run.state.progress.epochs} epochs are trained; finishing the run (final validation of best.pt)")
    elif skip:
        LOGGER.info(f"resuming from epoch {run.state.progress.start_epoch + 1} of {run.state.progress.epochs}, after batch {skip} of {run.parts.num_batches}")
    else:
        LOGGER.info(f"resuming from epoch {run.state.progress.start_epoch + 1} of {run.state.progress.epochs}")


def resume_batches(ckpt: Checkpoint, num_batches: int, world_size: int, batch: int) -> int:
    """Batches of the resumed epoch already trained. Saved with another number of ranks or batch size, the epoch
    continues after about as many images (the shards differ, so not exactly the same images)."""
    done = int(ckpt.epoch_batches or 0)
    old_world, old_batch = int(ckpt.world_size or 1), int((ckpt.train_args or {}).get("batch") or batch)
    if not done or (old_world, old_batch) == (world_size, batch):
        return done
    images = done * old_batch * old_world
    batches = min(num_batches, images // (batch * world_size))
    LOGGER.warning(f"WARNING the checkpoint is from {old_world} rank(s) with batch={old_batch}, {done} batches into its epoch ({images} "
                   f"images); now {world_size} rank(s) with batch={batch}: that epoch continues after batch {batches}")
    return batches


def restore_rng(ckpt: Checkpoint, world_size: int, rank: int) -> None:
    """Single process: the checkpoint's RNG states. DDP: each rank its own (rank 0 gathered them); with another number of
    ranks than saved, the ranks keep their fresh seeds (seed + rank): the run continues, not bit-exactly."""
    per_rank = ckpt.rank_rng
    if world_size == 1 and ckpt.rng:
        set_rng_states(ckpt.rng)
    elif per_rank and len(per_rank) == world_size:
        set_rng_states(per_rank[rank])
    elif world_size > 1:
        saved = f"saved with {len(per_rank)} ranks" if per_rank else "saved without per-rank RNG states"
        LOGGER.warning(f"WARNING the checkpoint was {saved}; now {world_size}: each rank re-seeds (seed + rank), "
                       f"so the resumed run continues but does not repeat the uninterrupted one exactly")


def partial_grads(model: torch.nn.Module) -> dict | None:
    """Gradients accumulated towards the next optimizer step (None when there are none, as right after a step)."""
    grads = {name: p.grad.detach().clone() for name, p in unwrap(model).named_parameters() if p.grad is not None}
    return grads or None


def continue_epoch(run: RunState, train_loader: Any, model: torch.nn.Module) -> int:
    """At the start of the first resumed epoch of a mid-epoch checkpoint: skip the batches already trained (their indices
    drawn, nothing loaded), take back that epoch's mean losses and accumulated gradients; the batches skipped (0: none)."""
    state: MidEpoch | None = run.progress.mid_epoch
    run.progress.mid_epoch = None
    if state is None:
        return 0
    train_loader.skip_next(state.batches)
    run.losses.tloss = state.tloss
    grads: dict[str, Any] | None = state.grads
    for name, p in unwrap(model).named_parameters():
        if grads and name in grads:
            p.grad = grads[name].to(p.device)
    return state.batches
