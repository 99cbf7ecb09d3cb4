"""The YOLOX stage switch (no_aug_epochs=N, next_stage_start_epoch=E, close_mosaic=N): the last epochs train without
mosaic/mixup/affine, with the L1 box loss on, and validate every epoch.

Switch epoch S (0-based, like trainer.epoch): next_stage_start_epoch when set, else max(epochs - N, 0) with
N = no_aug_epochs, or close_mosaic when no_aug_epochs is 0. At on_train_epoch_start of every epoch with
trainer.epoch >= S — before the epoch's loader iterator exists — the switch is applied once per process:

    train_loader.close_mosaic()        # dataset transforms closed; persistent workers restarted so they see it
    criterion.use_l1 = True            # (and the EMA model's criterion, for the val/l1_loss figure)
    trainer.validate_every_epoch = True

The `>=` test (not `==`) re-applies the switch in a training resumed after it; state_dict() {switched, epoch} is
stored in checkpoints for the log line and idempotence. See docs/integrations.md for YOLOX / SuperGradients.
"""

from __future__ import annotations

from yolo_cb.callbacks.registry import integration
from yolo_cb.utils.log import LOGGER


def switch_epoch(args, epochs: int) -> int | None:
    """The 0-based epoch at which the no-augmentation stage starts, or None when it never does."""
    if getattr(args, "next_stage_start_epoch", None) is not None:
        return int(args.next_stage_start_epoch)
    n = int(getattr(args, "no_aug_epochs", 0) or 0) or int(getattr(args, "close_mosaic", 0) or 0)
    return max(int(epochs) - n, 0) if n > 0 else None


# it changes the training recipe: a failure must stop the run, not let it silently train another recipe
@integration("stage_switch", enabled=lambda args: switch_epoch(args, args.epochs) is not None, on_error="raise")
class StageSwitch:
    """Applies the YOLOX no-augmentation stage; see the module docstring. Runs on every rank (each has its loader)."""

    def __init__(self):
        self.switched = False  # the stage has started (in this run or in the run this one resumes)
        self.epoch: int | None = None  # the 0-based epoch at which it started
        self.applied = False  # applied to this process's loader / loss

    def state_dict(self) -> dict:
        return {"switched": self.switched, "epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        self.switched = bool(state.get("switched", False))
        self.epoch = None if state.get("epoch") is None else int(state["epoch"])

    def on_train_epoch_start(self, trainer):
        if self.applied:
            return
        start = switch_epoch(trainer.args, trainer.epochs)
        due = start is not None and trainer.epoch >= start
        if not (due or self.switched):
            return
        resumed = self.switched
        self.apply(trainer)
        if not resumed:
            self.switched, self.epoch = True, trainer.epoch
        if trainer.is_main:
            l1 = "L1 loss on, " if hasattr(trainer.criterion, "use_l1") else ""
            what = f"mosaic and mixup off, {l1}validating every epoch"
            if resumed:
                LOGGER.info(f"YOLOX stage switch (from epoch {(self.epoch or 0) + 1}) re-applied on resume at epoch {trainer.epoch + 1}/{trainer.epochs}: {what}")
            else:
                LOGGER.info(f"YOLOX stage switch at epoch {trainer.epoch + 1}/{trainer.epochs}: {what}")

    def apply(self, trainer) -> None:
        trainer.train_loader.close_mosaic()
        if hasattr(trainer.criterion, "use_l1"):  # the L1 term exists in YOLOX losses only; mosaic-off applies to any model
            trainer.criterion.use_l1 = True
        ema = getattr(trainer, "ema", None)
        if ema is not None and hasattr(getattr(getattr(ema, "ema", None), "criterion", None), "use_l1"):
            ema.ema.criterion.use_l1 = True
        trainer.validate_every_epoch = True
        self.applied = True
