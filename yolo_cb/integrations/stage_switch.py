"""The YOLOX stage switch (close_mosaic=N, alias no_aug_epochs=N; next_stage_start_epoch=E): the last epochs train without
mosaic/mixup/affine, with the L1 box loss on, and validate every epoch.

close_mosaic is Ultralytics' name and meaning (0 = never close); no_aug_epochs is YOLOX's name for the same setting (the
config resolves both to one value and refuses two different ones). Switch epoch S (0-based, like trainer.epoch):
next_stage_start_epoch when set, else max(epochs - N, 0) with N = close_mosaic, none when N is 0. Declared with parameters
(`- stage_switch: {next_stage_start_epoch: 5}` or `{close_mosaic: 3}`), those replace the settings' values.
At on_train_epoch_start of every epoch with
trainer.epoch >= S — before the epoch's loader iterator exists — the switch is applied once per process:

    train_loader.close_mosaic()        # dataset transforms closed; the workers see it in the next tasks they get (no restart)
    criterion.start_final_stage()      # YOLOX's: the L1 term on (and the EMA model's, for the val/l1_loss figure)
    trainer.validate_every_epoch = True

The `>=` test (not `==`) re-applies the switch in a training resumed after it; state_dict() {switched, epoch} is
stored in checkpoints for the log line and idempotence. See docs/integrations.md for YOLOX / SuperGradients.
"""

from __future__ import annotations

from yolo_cb.callbacks.registry import callback_alias, integration
from yolo_cb.recipe.early_stop import Stage
from yolo_cb.utils.log import LOGGER


def switch_epoch(args, epochs: int) -> int | None:
    """The 0-based epoch at which the no-augmentation stage starts, or None when it never does (early stopping's Stage
    computes it: one definition for the switch and for stop_close_mosaic)."""
    start = getattr(args, "next_stage_start_epoch", None)
    return Stage(int(getattr(args, "close_mosaic", 0) or 0), None if start is None else int(start)).start(int(epochs))


def start_final_stage(criterion) -> str:
    """Tell a loss that the last stage begins (the Detector contract's `start_final_stage`): what it turned on, for the
    log line; "" for a loss with no stage-dependent term, or one that predates the contract (a user's own loss)."""
    start = getattr(criterion, "start_final_stage", None)
    return start() if start is not None else ""


# it changes the training recipe: a failure must stop the run, not let it silently train another recipe
@callback_alias("YoloXTrainingStageSwitchCallback", {"next_stage_start_epoch": "next_stage_start_epoch"})
@callback_alias("YoloXTrainStageSwitchCallback", {"next_stage_start_epoch": "next_stage_start_epoch"})  # SuperGradients' names
@integration("stage_switch", enabled=lambda args: switch_epoch(args, args.epochs) is not None, on_error="raise")
class StageSwitch:
    """Applies the YOLOX no-augmentation stage; see the module docstring. Runs on every rank (each has its loader)."""

    def __init__(self, next_stage_start_epoch: int | None = None, close_mosaic: int | None = None):
        for key, value in (("next_stage_start_epoch", next_stage_start_epoch), ("close_mosaic", close_mosaic)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"stage_switch: {key}={value!r}, expected an integer >= 0")
        self.next_stage_start_epoch, self.close_mosaic = next_stage_start_epoch, close_mosaic
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
        start = switch_epoch(self._settings(trainer.args), trainer.epochs)
        due = start is not None and trainer.epoch >= start
        if not (due or self.switched):
            return
        resumed = self.switched
        turned_on = self.apply(trainer)
        if not resumed:
            self.switched, self.epoch = True, trainer.epoch
        if trainer.is_main:
            what = f"mosaic and mixup off, {turned_on + ', ' if turned_on else ''}validating every epoch"
            if resumed:
                LOGGER.info(f"YOLOX stage switch (from epoch {(self.epoch or 0) + 1}) re-applied on resume at epoch {trainer.epoch + 1}/{trainer.epochs}: {what}")
            else:
                LOGGER.info(f"YOLOX stage switch at epoch {trainer.epoch + 1}/{trainer.epochs}: {what}")

    def _settings(self, args):
        """The trainer's settings, with this callback's own parameters (when declared with them) in their place."""
        from types import SimpleNamespace

        if self.next_stage_start_epoch is None and self.close_mosaic is None:
            return args
        close = self.close_mosaic if self.close_mosaic is not None else args.close_mosaic
        return SimpleNamespace(next_stage_start_epoch=self.next_stage_start_epoch, close_mosaic=close)

    def apply(self, trainer) -> str:
        """Close mosaic in the loader, start the final stage in the training loss and the EMA model's (its val/l1_loss),
        validate every epoch; what the training loss turned on ("" when nothing)."""
        trainer.train_loader.close_mosaic()
        ema_model = getattr(getattr(trainer, "ema", None), "ema", None)
        if ema_model is not None:
            start_final_stage(getattr(ema_model, "criterion", None))
        turned_on = start_final_stage(trainer.criterion)
        trainer.validate_each_epoch()
        self.applied = True
        return turned_on
