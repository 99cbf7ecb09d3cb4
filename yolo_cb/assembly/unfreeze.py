"""Unfreeze schedule: `freeze=` layers join training at a later epoch (`unfreeze_epoch=N`, or stages from a callback).

    yolo-cb train model=yolox-s.pt freeze=5 unfreeze_epoch=10     # backbone fixed for epochs 0-9, trained from epoch 10 on

`unfreeze_epoch` is 0-based, like `trainer.epoch` and next_stage_start_epoch. Several stages, declared as a callback:

    callbacks:
      - unfreeze: {stages: {5: [backbone.backbone.dark5], 10: all}}     # "all": every module freeze= froze

At on_train_epoch_start of each epoch >= a stage's epoch, that stage's modules get requires_grad=True. Every parameter
is in the optimizer from the start (a frozen one has no gradient, so the optimizer skips it), so from that epoch on
they train with fresh optimizer state (momentum / Adam moments from zero), and their BatchNorm statistics update from
that epoch on. Their LR is the current schedule's with a warmup of their own: with `unfreeze_warmup=E` (epochs, default
1.0; 0 = off) the frozen tensors sit in late parameter groups per frozen module (yolo_cb/recipe/optim.py) whose LR
ramps linearly from ~0 to their group's scheduled LR over round(E x batches per epoch) batches, counted from the first
optimizer step after the unfreeze; the other groups are untouched. The test is `>=`, so a resume after the boundary
unfreezes again before its first batch, and the ramp's start is in the optimizer's state: a resumed run is the
uninterrupted one, bit for bit, across the boundary and during the ramp. A stage that names part of a frozen module
whose other part was unfrozen earlier joins that module's ramp where it is.
"""

from __future__ import annotations

from typing import Any

from yolo_cb.callbacks.registry import integration
from yolo_cb.errors import ConfigError
from yolo_cb.recipe.ema import unwrap
from yolo_cb.recipe.freeze import unfreeze_modules
from yolo_cb.utils.log import LOGGER

ALL = "all"  # a stage that unfreezes every module freeze= froze


def parse_stages(stages: Any) -> dict[int, Any]:
    """{epoch: "all" | [module names]} checked: epochs are integers >= 0."""
    if not isinstance(stages, dict) or not stages:
        raise ConfigError(f"unfreeze: stages={stages!r}; expected a mapping {{epoch: all | [module names]}}, e.g. {{5: all}}")
    parsed: dict[int, Any] = {}
    for epoch, names in stages.items():
        try:
            key = int(epoch)
        except (TypeError, ValueError):
            key = -1
        if key < 0 or isinstance(epoch, bool):
            raise ConfigError(f"unfreeze: stage epoch {epoch!r} is not an integer >= 0 (0-based, like trainer.epoch)")
        if names != ALL and not (isinstance(names, (list, tuple)) and names and all(isinstance(n, str) for n in names)):
            raise ConfigError(f"unfreeze: stage {key} unfreezes {names!r}; expected 'all' or a list of module names")
        parsed[key] = names if names == ALL else [str(n) for n in names]
    return dict(sorted(parsed.items()))


# it changes what is trained: a failure must stop the run
@integration("unfreeze", enabled=lambda args: args.unfreeze_epoch is not None, on_error="raise")
class Unfreeze:
    """Unfreezes frozen modules at the epochs of its stages; see the module docstring. Runs on every rank."""

    def __init__(self, stages: dict | None = None):
        self.stages = parse_stages(stages) if stages is not None else None  # None: {unfreeze_epoch: all} from the settings
        self.done: set[int] = set()  # stages applied in this process

    def _stages(self, trainer) -> dict[int, Any]:
        return self.stages if self.stages is not None else {int(trainer.args.unfreeze_epoch): ALL}

    def on_pretrain_routine_end(self, trainer):
        if not trainer.frozen:
            raise ConfigError(f"unfreeze: stages {self.stages}; nothing is frozen: set freeze= (a layer count or module names) as well")
        late = [e for e in self._stages(trainer) if e >= trainer.epochs]
        if late and trainer.is_main:
            LOGGER.warning(f"WARNING unfreeze: stage epoch(s) {late} (0-based) are not reached in {trainer.epochs} epochs: those layers stay frozen")

    def on_train_epoch_start(self, trainer):
        for epoch, names in self._stages(trainer).items():
            if trainer.epoch < epoch or epoch in self.done:
                continue
            modules = list(trainer.frozen) if names == ALL else names
            count = unfreeze_modules(unwrap(trainer.model), modules)
            self.done.add(epoch)
            if trainer.is_main:
                again = " (re-applied on resume)" if trainer.epoch > epoch else ""
                warmup = float(trainer.args.unfreeze_warmup)
                ramp = f", warming up over {warmup:g} epochs (unfreeze_warmup)" if warmup > 0 else " (unfreeze_warmup=0: no warmup)"
                LOGGER.info(f"unfreeze at epoch {trainer.epoch + 1}/{trainer.epochs}{again}: {count} tensors of {', '.join(modules)} "
                            f"train from now on at their group's current LR{ramp}, with fresh optimizer state")
