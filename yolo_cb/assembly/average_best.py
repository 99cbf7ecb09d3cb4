"""Checkpoint averaging (`average_best=k`, with `save_topk >= k`): at the end of the run the k best checkpoints
(best_epoch{N}.pt, by the monitored metric) are averaged into best_avg.pt, which is kept only if it validates better.

    yolo-cb train data=... epochs=100 save_topk=5 average_best=5

Averaged: every floating-point tensor of the weights and of the EMA weights, BatchNorm running means and variances
included (an arithmetic mean of the k statistics: cheap, and close to recomputing them when the k epochs are near one
another); integer tensors (num_batches_tracked) are taken from the best checkpoint. The averaged file is validated on
the first validation set and compared with best.pt's final validation on the monitored metric (`monitor`, when the
validation gives it; else fitness). One line says which file was kept and by how much; a worse average is not kept.
trainer.metrics stay best.pt's either way.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from yolo_cb.callbacks.registry import integration
from yolo_cb.checkpoints.checkpoint import Checkpoint, load_checkpoint, model_from_checkpoint, save_checkpoint
from yolo_cb.errors import ConfigError
from yolo_cb.utils.log import LOGGER


def average_state(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The mean of each floating-point tensor over `states` (computed in float64, stored in the first state's dtype);
    other tensors from the first state."""
    out = {}
    for key, first in states[0].items():
        if first.is_floating_point():
            mean = torch.stack([s[key].double() for s in states]).mean(0)
            out[key] = mean.to(first.dtype)
        else:
            out[key] = first.clone()
    return out


def average_checkpoints(paths: list[Path]) -> Checkpoint:
    """The first (best) checkpoint with its model and EMA weights replaced by the means over all of `paths`, without
    an optimizer; the averaged epochs (1-based) are recorded under the file's key `averaged_epochs`."""
    ckpts = [load_checkpoint(p) for p in paths]
    weights = {key: average_state([getattr(c, key) for c in ckpts]) for key in ("model", "ema") if all(getattr(c, key) for c in ckpts)}
    epochs = [int(c.epoch) + 1 for c in ckpts]
    return replace(ckpts[0], **weights, optimizer=None, extras={**ckpts[0].extras, "averaged_epochs": epochs})


# it writes a model file a user may deploy: a failure must be seen
@integration("average_best", enabled=lambda args: bool(args.average_best), on_error="raise")
class AverageBest:
    """Averages the k best checkpoints at the end of training; see the module docstring. Main process only."""

    rank_zero_only = True

    def __init__(self, k: int | None = None):
        self.k = k  # None: the average_best setting

    def on_pretrain_routine_start(self, trainer):
        k = self._k(trainer)  # the setting is checked with save_topk in yolo_cb/config.py; a k given here is checked here
        if k < 2 or trainer.args.save_topk < k:
            raise ConfigError(f"average_best: k={k}; give an integer >= 2 and save_topk >= {k} (save_topk is {trainer.args.save_topk})")

    def _k(self, trainer) -> int:
        return int(self.k if self.k is not None else trainer.args.average_best)

    def on_train_end(self, trainer):
        if not trainer.is_main or not trainer.args.save:
            return
        files = sorted(trainer.wdir.glob("best_epoch*.pt"), key=lambda p: trainer.monitor.best_first(float(load_checkpoint(p).monitor_value)))
        files = files[: self._k(trainer)]
        if len(files) < 2:
            LOGGER.info(f"average_best: {len(files)} best_epoch*.pt file(s) kept, nothing to average; best.pt is the model")
            return
        averaged = average_checkpoints(files)
        target = trainer.wdir / "best_avg.pt"
        metrics = dict(trainer.validator(model=model_from_checkpoint(averaged).to(trainer.device)))
        key = trainer.monitor.key if trainer.monitor.key in metrics and trainer.monitor.key in trainer.metrics else "fitness"
        mine, best = float(metrics[key]), float(trainer.metrics.get(key, float("nan")))
        epochs = ", ".join(str(e) for e in averaged.extras["averaged_epochs"])
        if trainer.monitor.improved(mine, best):
            save_checkpoint(replace(averaged, metrics=metrics), target)
            LOGGER.info(f"average_best: kept {target} (epochs {epochs} averaged): {key} {mine:.5g} vs best.pt's {best:.5g} ({mine - best:+.5g})")
        else:
            target.unlink(missing_ok=True)
            LOGGER.info(f"average_best: kept best.pt; the average of epochs {epochs} validates {key} {mine:.5g} vs {best:.5g} "
                        f"({mine - best:+.5g}), not better")
