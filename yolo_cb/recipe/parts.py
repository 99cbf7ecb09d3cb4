"""The parts of the training recipe the loop calls by name, together, and their states in checkpoints.

`RecipeParts` holds them: the monitored metric (recipe/monitor.py), early stopping (recipe/early_stop.py), the LR
schedule (recipe/schedule.py; None with lr_scheduler=none or module:Class, where a callback sets the LR), the saver
(saver.py), results.csv's rows (saver.py's ResultsLog), the unfreeze stages (recipe/unfreeze.py) and checkpoint
averaging (recipe/average.py). A checkpoint stores the stateful ones under `recipe`; files written
while they were callbacks hold their states under the callbacks' names, read by `load_states`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from yolo_cb.recipe.average import BestAverager
from yolo_cb.recipe.early_stop import EarlyStop
from yolo_cb.recipe.monitor import Monitor
from yolo_cb.recipe.saver import ResultsLog, Saver
from yolo_cb.recipe.schedule import LRSchedule
from yolo_cb.recipe.unfreeze import UnfreezeStages

# each stateful part -> the name of the callback that held its state in checkpoints written before it was a part
LEGACY_NAMES = {"lr_schedule": "lr_schedule", "saver": "checkpoint", "results": "results_csv", "early_stop": "stop_stage"}
LATER = ("early_stop",)  # parts whose state was still a callback's once `recipe` existed (files up to 6a64969 hold both)


@dataclass
class RecipeParts:
    monitor: Monitor  # monitor / monitor_mode / min_delta: what best.pt, top-k and early stopping follow
    early_stop: EarlyStop  # patience and the close_mosaic stage's policy: asked after every epoch, before the checkpoint
    schedule: LRSchedule | None  # the LR of every group (None: lr_scheduler=none or module:Class, a callback's job)
    saver: Saver  # which checkpoint files, and when
    results: ResultsLog  # results.csv's rows
    unfreeze: UnfreezeStages | None  # when freeze= layers join training (None: they never do)
    averager: BestAverager | None  # average_best=k: best_avg.pt at the end (None: off)

    @classmethod
    def from_args(cls, args: Any) -> RecipeParts:
        return cls(Monitor.from_args(args), EarlyStop.from_args(args), LRSchedule() if LRSchedule.wanted(args) else None,
                   Saver(args), ResultsLog(), UnfreezeStages.from_args(args), BestAverager.from_args(args))

    def stateful(self) -> dict[str, Any]:
        parts = (("lr_schedule", self.schedule), ("saver", self.saver), ("results", self.results), ("early_stop", self.early_stop))
        return {name: part for name, part in parts if part is not None}

    def state_dict(self) -> dict[str, Any]:
        return {name: part.state_dict() for name, part in self.stateful().items()}

    def load_states(self, recipe: dict | None, callback_states: dict) -> None:
        """The checkpoint's `recipe` states; for an older file, its callbacks' (taken out of `callback_states`, so that
        no callback is warned of them). A module:Class lr_scheduler= keeps its callback's state."""
        for name, part in self.stateful().items():
            state = recipe.get(name) if recipe else None
            if not recipe or name in LATER:
                older = callback_states.pop(LEGACY_NAMES[name], None)
                state = older if state is None else state
            if state is not None:
                part.load_state_dict(state)
