"""Unfreeze schedule: `freeze=` layers join training at a later epoch (`unfreeze_epoch=N`, or declared stages).

    yolo-cb train model=yolox-s.pt freeze=5 unfreeze_epoch=10     # backbone fixed for epochs 0-9, trained from epoch 10 on

`unfreeze_epoch` is 0-based, like `trainer.epoch` and next_stage_start_epoch. Several stages, declared in callbacks:
(read with the settings, which keep them: yolo_cb/settings/declared.py; they replace unfreeze_epoch):

    callbacks:
      - unfreeze: {stages: {5: [backbone.backbone.dark5], 10: all}}     # "all": every module freeze= froze

The loop calls `UnfreezeStages.apply` at the start of each epoch, before on_train_epoch_start: every stage whose epoch
is reached gets requires_grad=True on its modules. Every parameter is in the optimizer from the start (a frozen one has
no gradient, so the optimizer skips it), so from that epoch on they train with fresh optimizer state (momentum / Adam
moments from zero), and their BatchNorm statistics update from that epoch on. Their LR is the current schedule's with a
warmup of their own: with `unfreeze_warmup=E` (epochs, default 1.0; 0 = off) the frozen tensors sit in late parameter
groups per frozen module (yolo_cb/recipe/optim.py) whose LR ramps linearly from ~0 to their group's scheduled LR over
round(E x batches per epoch) batches, counted from the first optimizer step after the unfreeze; the other groups are
untouched. The test is `>=`, so a resume after the boundary unfreezes again before its first batch, and the ramp's start
is in the optimizer's state: a resumed run is the uninterrupted one, bit for bit, across the boundary and during the
ramp. A stage that names part of a frozen module whose other part was unfrozen earlier joins that module's ramp where
it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from yolo_cb.errors import ConfigError
from yolo_cb.recipe.freeze import unfreeze_modules
from yolo_cb.settings.declared import ALL, parse_stages
from yolo_cb.utils.log import LOGGER

if TYPE_CHECKING:  # torch loads when a model is trained, not when the declared stages are checked
    from torch import nn

class UnfreezeStages:
    """The epochs at which frozen modules join training; the loop checks them once and applies them each epoch."""

    def __init__(self, stages: Any, warmup: float):
        self.stages = parse_stages(stages)  # {0-based epoch: "all" | [module names]}
        self.warmup = float(warmup)  # unfreeze_warmup: epochs over which an unfrozen module's LR ramps up (0: none)
        self.done: set[int] = set()  # stages applied in this process (a resume applies the reached ones again)

    @classmethod
    def from_args(cls, args: Any) -> UnfreezeStages | None:
        """The declared stages (`- unfreeze: {stages: ...}`, kept by the settings), else unfreeze_epoch=N as one stage,
        {N: all}; None when neither is given."""
        declared = getattr(args, "unfreeze_stages", None)
        if declared is not None:
            return cls(declared, args.unfreeze_warmup)
        return cls({args.unfreeze_epoch: ALL}, args.unfreeze_warmup) if args.unfreeze_epoch is not None else None

    def check(self, frozen: list[str], epochs: int, is_main: bool) -> None:
        """Before the first epoch: something must be frozen; a stage past the run's end is said once."""
        if not frozen:
            raise ConfigError(f"unfreeze: stages {self.stages}; nothing is frozen: set freeze= (a layer count or module names) as well")
        late = [e for e in self.stages if e >= epochs]
        if late and is_main:
            LOGGER.warning(f"WARNING unfreeze: stage epoch(s) {late} (0-based) are not reached in {epochs} epochs: those layers stay frozen")

    def apply(self, epoch: int, epochs: int, model: nn.Module, frozen: list[str], is_main: bool) -> None:
        """requires_grad=True on the modules of every stage reached by `epoch` and not yet applied in this process."""
        for start, names in self.stages.items():
            if epoch < start or start in self.done:
                continue
            modules = list(frozen) if names == ALL else names
            count = unfreeze_modules(model, modules)
            self.done.add(start)
            if is_main:
                again = " (re-applied on resume)" if epoch > start else ""
                ramp = f", warming up over {self.warmup:g} epochs (unfreeze_warmup)" if self.warmup > 0 else " (unfreeze_warmup=0: no warmup)"
                LOGGER.info(f"unfreeze at epoch {epoch + 1}/{epochs}{again}: {count} tensors of {', '.join(modules)} "
                            f"train from now on at their group's current LR{ramp}, with fresh optimizer state")
