"""Early stopping: the run ends when the monitored metric has not improved for `patience` epochs (0: never), and what
that means for the close_mosaic stage (the YOLOX no-augmentation epochs at the end of the run).

It reads the run's one best epoch (the epoch best.pt holds, `trainer.best_epoch`), so nothing keeps a second "best".
The loop asks `EarlyStop.decide` once after each epoch's validation, before the checkpoint (training/trainer.py), and
gets one answer: go on, stop now, or end after epoch N.

When the patience rule fires before the close_mosaic stage began, `stop_close_mosaic=` decides:

    yolo-cb train data=... epochs=300 close_mosaic=15 patience=20 stop_close_mosaic=finish

- `skip` (default): stop now; the stage is skipped, and the log says so.
- `finish`: the run ends after epoch e + close_mosaic (e: the epoch, 1-based, at which the rule fired), so the stage
  switch (which starts at epochs - close_mosaic, yolo_cb/integrations/stage_switch.py) begins at the next epoch; the
  patience rule is not asked again, and the run stops (as early stopping) after the stage's last epoch. The LR schedule
  keeps the curve of the original length. The shortened length is this part's checkpoint state (`{"end": N}`; files
  written up to main 6a64969 hold it as the stop_stage callback's state), so a resume during the stage keeps it. With
  next_stage_start_epoch= the stage has a fixed start, and `finish` is refused.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from yolo_cb.errors import ConfigError
from yolo_cb.utils.log import LOGGER

LEGACY_STATE = "early_stopping"  # the callback that kept a best of its own before 0.1: its state in older checkpoints


class Stage(NamedTuple):
    """The close_mosaic stage as early stopping sees it: its length, a fixed start (next_stage_start_epoch) or none,
    and stop_close_mosaic (skip | finish)."""

    epochs: int = 0
    fixed_start: int | None = None
    policy: str = "skip"

    def start(self, run_epochs: int) -> int | None:
        """The 0-based epoch at which the stage starts in a run of `run_epochs`, or None when there is none (the stage
        switch, yolo_cb/integrations/stage_switch.py, starts it there)."""
        if self.fixed_start is not None:
            return self.fixed_start
        return max(run_epochs - self.epochs, 0) if self.epochs > 0 else None


class Decision(NamedTuple):
    """The answer after an epoch: `stop` (why the run stops now; None: it goes on) and `end_after` (the run's new length
    in epochs, when the stage is finished first; None: unchanged)."""

    stop: str | None = None
    end_after: int | None = None


class EarlyStop:
    """The patience rule and the close_mosaic stage's policy; `patience` may be set by a control (trainer.patience)."""

    def __init__(self, patience: int, stage: Stage | None = None):
        self.patience = patience
        self.stage = stage or Stage()
        self.end: int | None = None  # the run's length once `finish` moved the stop past the stage

    @classmethod
    def from_args(cls, args: Any) -> EarlyStop:
        """From the settings; ConfigError for stop_close_mosaic=finish with a fixed stage start."""
        stage = Stage(int(args.close_mosaic or 0), args.next_stage_start_epoch, args.stop_close_mosaic)
        if stage.policy == "finish" and stage.fixed_start is not None and stage.epochs > 0 and args.patience:
            raise ConfigError(f"invalid value for 'stop_close_mosaic': finish with next_stage_start_epoch="
                              f"{stage.fixed_start} (a fixed stage start cannot be moved forward); use skip")
        return cls(args.patience, stage)

    @property
    def patience(self) -> int:
        return self._patience

    @patience.setter
    def patience(self, epochs: int) -> None:
        self._patience = check_patience(epochs)

    def reason(self, epoch: int, best_epoch: int | None, key: str, best: float | None) -> str | None:
        """Why the run stops after `epoch` (0-based), or None: no improvement of `key` since `best_epoch` for patience epochs."""
        if not self.patience or best_epoch is None or epoch - best_epoch < self.patience:
            return None
        shown = "none" if best is None else f"{best:.4f}"
        return f"early stopping: no improvement of {key} in {self.patience} epochs (best {shown} at epoch {best_epoch + 1})"

    def decide(self, epoch: int, epochs: int, reason: str | None, is_main: bool) -> Decision:
        """After `epoch` (0-based) of a run of `epochs`, the patience rule having said `reason` (None: no stop): stop
        now, end after epoch N (the close_mosaic stage first), or go on."""
        if self.end is not None:  # finishing the stage: only its last epoch ends the run
            return Decision(f"early stopping, after the close_mosaic stage (epoch {self.end})" if epoch + 1 >= self.end else None)
        start = self.stage.start(epochs)
        if reason is None or start is None or epoch + 1 >= start:
            return Decision(reason)  # no stop, or the stage has begun (or there is none): the stop stands
        n = self.stage.epochs
        if self.stage.policy == "skip":
            if is_main:
                LOGGER.info(f"early stopping at epoch {epoch + 1}: the close_mosaic stage ({n} epochs without mosaic, from epoch "
                            f"{start + 1}) is skipped; stop_close_mosaic=finish trains it before the run ends")
            return Decision(reason)
        self.end = epoch + 1 + n
        if is_main:
            LOGGER.info(f"{reason}; stop_close_mosaic=finish: the close_mosaic stage trains first, epochs "
                        f"{epoch + 2}-{self.end}, then the run ends (it was {epochs} epochs)")
        return Decision(None, self.end)

    def state_dict(self) -> dict:
        return {"end": self.end}

    def load_state_dict(self, state: dict) -> None:
        self.end = None if state.get("end") is None else int(state["end"])


def check_patience(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"patience={value!r}: expected an integer >= 0 (epochs without improvement; 0 = never stop early)")
    return value


def legacy_best_epoch(callback_states: dict) -> int | None:
    """The best epoch an older checkpoint kept in its early_stopping callback's state (None: none recorded)."""
    state = (callback_states or {}).get(LEGACY_STATE) or {}
    return None if state.get("best_epoch") is None else int(state["best_epoch"])
