"""Checkpoint averaging (`average_best=k`, with `save_topk >= k`): at the end of the run the k best checkpoints
(best_epoch{N}.pt, by the monitored metric) are averaged into best_avg.pt, which is kept only if it validates better.

    yolo-cb train data=... epochs=100 save_topk=5 average_best=5

Averaged: every floating-point tensor of the weights and of the EMA weights, BatchNorm running means and variances
included (an arithmetic mean of the k statistics: cheap, and close to recomputing them when the k epochs are near one
another); integer tensors (num_batches_tracked) are taken from the best checkpoint. The averaged file is validated on
the first validation set and compared with best.pt's final validation on the monitored metric (`monitor`, when the
validation gives it; else fitness). One line says which file was kept and by how much; a worse average is not kept.
trainer.metrics stay best.pt's either way. The loop calls it before on_train_end, so loggers see best_avg.pt.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from yolo_cb.checkpoints.checkpoint import Checkpoint, load_checkpoint, model_from_checkpoint, save_checkpoint
from yolo_cb.recipe.monitor import Monitor
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


class BestAverager:
    """average_best=k: at the end of the run, the k best best_epoch*.pt averaged into best_avg.pt, kept only if it
    validates better than best.pt; see the module docstring. The loop calls `average` on the main process."""

    def __init__(self, k: int):
        self.k = int(k)  # how many of the best checkpoints to average (checked with save_topk in yolo_cb/settings/config.py)

    @classmethod
    def from_args(cls, args: Any) -> BestAverager | None:
        return cls(args.average_best) if args.average_best else None

    def average(self, wdir: Path, monitor: Monitor, best_metrics: dict, validate: Callable[[torch.nn.Module], dict]) -> Path | None:
        """best_avg.pt from the k best files of `wdir`, when `validate(model)` rates it better than `best_metrics`
        (best.pt's final validation); returns the file kept, or None."""
        files = sorted(wdir.glob("best_epoch*.pt"), key=lambda p: monitor.best_first(float(load_checkpoint(p).monitor_value)))[: self.k]
        if len(files) < 2:
            LOGGER.info(f"average_best: {len(files)} best_epoch*.pt file(s) kept, nothing to average; best.pt is the model")
            return None
        averaged = average_checkpoints(files)
        target = wdir / "best_avg.pt"
        metrics = dict(validate(model_from_checkpoint(averaged)))
        key = monitor.key if monitor.key in metrics and monitor.key in best_metrics else "fitness"
        mine, best = float(metrics[key]), float(best_metrics.get(key, float("nan")))
        epochs = ", ".join(str(e) for e in averaged.extras["averaged_epochs"])
        if monitor.improved(mine, best):
            save_checkpoint(replace(averaged, metrics=metrics), target)
            LOGGER.info(f"average_best: kept {target} (epochs {epochs} averaged): {key} {mine:.5g} vs best.pt's {best:.5g} ({mine - best:+.5g})")
            return target
        target.unlink(missing_ok=True)
        LOGGER.info(f"average_best: kept best.pt; the average of epochs {epochs} validates {key} {mine:.5g} vs {best:.5g} "
                    f"({mine - best:+.5g}), not better")
        return None
