"""Early stopping before the close_mosaic stage: `stop_close_mosaic=skip` (stop now; the stage is skipped, and the log
says so) or `finish` (train the close_mosaic epochs first, without mosaic / mixup and with YOLOX's L1 loss, then end).

    yolo-cb train data=... epochs=300 close_mosaic=15 patience=20 stop_close_mosaic=finish

With `finish`, when early stopping fires at epoch e (1-based) before the stage began, the stop is withdrawn and the run
is shortened to e + close_mosaic epochs: the stage switch (which starts at epochs - close_mosaic) begins at the next
epoch, and early stopping does not end the run again before its last epoch. The LR schedule keeps the curve of the
original length (it is not stretched or squeezed). The shortened length is this callback's checkpoint state, so a resume
during the stage keeps it. With next_stage_start_epoch= the stage has a fixed start, and `finish` is refused.
"""

from __future__ import annotations

from yolo_cb.callbacks.registry import integration
from yolo_cb.errors import ConfigError
from yolo_cb.integrations.stage_switch import switch_epoch
from yolo_cb.recipe.stop import StopCause
from yolo_cb.utils.log import LOGGER


def _uses_stage(args) -> bool:
    return int(args.close_mosaic or 0) > 0 and int(args.patience or 0) > 0


# it changes how long the run trains: a failure must stop the run
@integration("stop_stage", enabled=_uses_stage, on_error="raise")
class StopStage:
    """Skips (saying so) or finishes the close_mosaic stage when early stopping fires before it; see the module docstring."""

    def __init__(self):
        self.end: int | None = None  # the shortened length (epochs) once `finish` withdrew a stop

    def state_dict(self) -> dict:
        return {"end": self.end}

    def load_state_dict(self, state: dict) -> None:
        self.end = None if state.get("end") is None else int(state["end"])

    def on_pretrain_routine_end(self, trainer):
        if trainer.args.stop_close_mosaic == "finish" and trainer.args.next_stage_start_epoch is not None:
            raise ConfigError(f"invalid value for 'stop_close_mosaic': finish with next_stage_start_epoch="
                              f"{trainer.args.next_stage_start_epoch} (a fixed stage start cannot be moved forward); use skip")
        if self.end is not None:
            trainer.end_after(self.end)  # resumed during a stage that early stopping moved forward

    def on_fit_epoch_end(self, trainer):
        if self.end is not None:  # finishing the stage: early stopping does not end it early; its last epoch does
            trainer.withdraw_stop(StopCause.EARLY_STOPPING)
            if trainer.epoch + 1 >= self.end:
                trainer.request_stop(StopCause.EARLY_STOPPING, f"early stopping, after the close_mosaic stage (epoch {self.end})")
            return
        if not trainer.stop or trainer.stop_cause != StopCause.EARLY_STOPPING:
            return
        start = switch_epoch(trainer.args, trainer.epochs)
        if start is None or trainer.epoch + 1 >= start:
            return  # the stage has begun (or there is none): the stop stands
        n = int(trainer.args.close_mosaic)
        if trainer.args.stop_close_mosaic == "skip":
            if trainer.is_main:
                LOGGER.info(f"early stopping at epoch {trainer.epoch + 1}: the close_mosaic stage ({n} epochs without mosaic, from epoch "
                            f"{start + 1}) is skipped; stop_close_mosaic=finish trains it before the run ends")
            return
        self.end = trainer.epoch + 1 + n
        if trainer.is_main:
            LOGGER.info(f"{trainer.stop_reason}; stop_close_mosaic=finish: the close_mosaic stage trains first, epochs "
                        f"{trainer.epoch + 2}-{self.end}, then the run ends (it was {trainer.epochs} epochs)")
        trainer.withdraw_stop(StopCause.EARLY_STOPPING)
        trainer.end_after(self.end)
