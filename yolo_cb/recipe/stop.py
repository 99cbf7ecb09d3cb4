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


# Other frameworks' stop flags, set on their trainer (or its control object, or the context a validation callback gets):
# a write of one on our trainer or validator is refused, naming trainer.stop, since it would otherwise be a new
# attribute nothing reads and every epoch would still train.
FOREIGN_STOP_FLAGS: dict[str, str] = {"stop_training": "Keras / SuperGradients", "should_stop": "Lightning",
                                      "should_training_stop": "Hugging Face"}


def refuse_foreign_stop_flag(name: str, owner: str = "trainer") -> None:
    """AttributeError (one line) for a write of another framework's stop flag on the trainer or the validator (owner)."""
    if name in FOREIGN_STOP_FLAGS:
        reach = "" if owner == "trainer" else " (from a validation callback: validator.trainer.stop = True)"
        raise AttributeError(f"{owner}.{name} is the stop flag of {FOREIGN_STOP_FLAGS[name]}, which yolo-cb does not read: set "
                             f"trainer.stop = True{reach} (optionally trainer.stop_reason = '...') to end the run after this "
                             f"batch or epoch")
