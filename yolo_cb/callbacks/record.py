"""callbacks.json: what every callback did in a run, on every rank, and `strict_callbacks`.

Rank 0 writes <run folder>/callbacks.json at on_train_end (every rank's record, gathered there) and again at teardown
(rank 0's numbers brought up to date; after an error, only rank 0's). Per callback and event: calls (in all and per
rank), total / mean / max seconds, errors, and whether it was switched off and why. A callback that is lost on a rank
(a DDP worker, a tune trial) shows up with calls 0 there.

strict_callbacks=True: at the end of training, a user callback (Python or callbacks=) registered for a training or
validation event that never ran on any rank is an error naming it and its event; one registered for an event training
never fires (predict, export) is a warning when the trainer's callbacks are built.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from yolo_cb.callbacks.dispatch import rank_zero_only
from yolo_cb.callbacks.events import TRAINER_EVENTS, VALIDATOR_EVENTS
from yolo_cb.callbacks.registry import register_callback
from yolo_cb.errors import UserError
from yolo_cb.utils import dist as distributed
from yolo_cb.utils.files import atomic_write_text
from yolo_cb.utils.log import LOGGER

RECORD_FILE = "callbacks.json"
# events a successful training may legitimately never fire (or fires after the strict check): not held against a callback
CONDITIONAL = ("on_exception", "teardown")
TRAINING_EVENTS = (*TRAINER_EVENTS, *VALIDATOR_EVENTS)
USER_ORIGINS = ("user", "yaml")


class StrictCallbacksError(UserError):
    """strict_callbacks=True and a user callback never ran."""


def merge(records: list[list[dict] | None]) -> list[dict]:
    """Every rank's record (index = rank; None where a rank's is missing) as one row per callback and event."""
    merged: dict[tuple[str, str], dict] = {}
    for rank, rows in enumerate(records):
        for row in rows or []:
            key = (row["event"], row["name"])
            into = merged.setdefault(key, {**{k: row[k] for k in ("event", "name", "origin", "where", "rank")}, "calls": 0,
                                           "calls_by_rank": {}, "total_s": 0.0, "max_s": 0.0, "errors": 0, "first_errors": [],
                                           "enabled": True, "disabled_why": {}})
            into["calls"] += row["calls"]
            into["calls_by_rank"][str(rank)] = row["calls"]
            into["total_s"] += row["total_s"]
            into["max_s"] = max(into["max_s"], row["max_s"])
            into["errors"] += row["errors"]
            into["first_errors"] = (into["first_errors"] + [f"rank {rank}: {e}" for e in row["first_errors"]])[:3]
            if not row["enabled"]:
                into["enabled"] = False
                into["disabled_why"][str(rank)] = row["disabled_why"]
    for row in merged.values():
        row["mean_s"] = row["total_s"] / row["calls"] if row["calls"] else 0.0
    return list(merged.values())


def never_ran(rows: list[dict]) -> list[dict]:
    """User callbacks of training / validation events with no call on any rank."""
    return [r for r in rows if r["origin"] in USER_ORIGINS and r["event"] in TRAINING_EVENTS and r["event"] not in CONDITIONAL
            and r["calls"] == 0]


def foreign_events(callbacks: Any) -> list[tuple[str, str]]:
    """(event, name) of user callbacks registered for events training never fires."""
    return [(e, x.name) for e in callbacks.keys() if e not in TRAINING_EVENTS for x in callbacks.entries(e) if x.origin in USER_ORIGINS]


def warn_foreign_events(callbacks: Any) -> None:
    for event, name in foreign_events(callbacks):
        LOGGER.warning(f"WARNING strict_callbacks: callback '{name}' is registered for '{event}', which training never fires; "
                       f"it will not run in this run")


@register_callback("callback_record")
class CallbackRecord:
    """Writes callbacks.json (rank 0, every rank's record merged) and applies strict_callbacks. Runs after every other
    callback of its events."""

    after = ("*",)

    def __init__(self):
        self.others: list[list[dict] | None] = []  # every rank's record as gathered at on_train_end (rank 0)

    def on_train_end(self, trainer):
        gathered = distributed.gather_object(trainer.callbacks.record())
        self.others = gathered or []
        missing = never_ran(merge(self.others)) if trainer.is_main else []
        self.write(trainer, self.others)
        missing = distributed.broadcast_object(missing)  # every rank fails together, or none
        if trainer.args.strict_callbacks and missing:
            names = "; ".join(f"'{r['name']}' ({r['where']}) on '{r['event']}'" for r in missing)
            raise StrictCallbacksError(f"strict_callbacks: {len(missing)} callback(s) never ran on any rank: {names}. "
                                       f"See {Path(trainer.save_dir) / RECORD_FILE}")

    @rank_zero_only  # on_train_end gathers every rank's record: it runs on all ranks
    def teardown(self, trainer):
        records = list(self.others) or [None] * distributed.world_size()
        records[0] = trainer.callbacks.record()
        self.write(trainer, records)

    @staticmethod
    def write(trainer, records: list[list[dict] | None]) -> None:
        if not trainer.is_main or not trainer.args.save or not trainer.save_dir or not Path(trainer.save_dir).is_dir():
            return
        document = {"world_size": max(len(records), 1), "ranks_missing": [r for r, rows in enumerate(records) if rows is None],
                    "callbacks": merge(records)}
        atomic_write_text(Path(trainer.save_dir) / RECORD_FILE, json.dumps(document, indent=1) + "\n")
