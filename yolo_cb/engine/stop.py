"""Why a training stopped early: `trainer.stop_cause` (a StopCause) beside the human-readable `trainer.stop_reason`.

A callback that stops a run calls `trainer.request_stop(StopCause.X, "message")` (or sets `trainer.stop = True`,
which counts as StopCause.CALLBACK). Code that needs to know why reads the cause, never the message's text.
"""

from __future__ import annotations

from enum import Enum


class StopCause(str, Enum):
    CALLBACK = "callback"  # trainer.stop = True from a callback that gave no cause
    EARLY_STOPPING = "early_stopping"  # no improvement of the monitored metric for `patience` epochs: the run is finished
    TIME_LIMIT = "time_limit"  # the `time=` budget is spent
    SIGNAL = "signal"  # SIGINT / SIGTERM (here or on another rank)
    PRUNED = "pruned"  # a tuning trial stopped by the pruner
    TARGET = "target"  # a target metric was reached

    @property
    def finishes_run(self) -> bool:
        """A run stopped for this cause is complete (its checkpoints are final, a resume has nothing to do)."""
        return self in (StopCause.EARLY_STOPPING, StopCause.PRUNED, StopCause.TARGET)
