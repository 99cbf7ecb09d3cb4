"""The lock that makes "is a trial still needed? then start it" one step for all the workers sharing a study.

Each worker checks the study's finished and running trials against `iterations`, then creates its next trial. Without a
lock, two workers finishing at the same moment both see room for one more trial and both start one, so the study trains
more trials than asked. A `TrialClaim` is held from that check until the new trial is RUNNING in the storage (the
objective's first line releases it), never while a trial trains:
- SQLite (workers on one machine): an exclusive flock on the database's folder. Not on the database file itself: SQLite
  keeps POSIX locks on it, which any other descriptor of that file closed by this process would drop.
- PostgreSQL (workers on several machines): a transaction-level advisory lock keyed by the study's name, on a connection
  of its own; ending the transaction releases it, and so does a worker's death.
- Other databases: no lock; two workers finishing together may then train one trial more than `iterations`.
A worker that dies while holding the lock releases it with its process (flock) or its connection (PostgreSQL).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

from yolo_cb.utils.log import LOGGER


class TrialClaim:
    """A cross-process lock for one study in one storage; `acquire()` blocks, `release()` may be called any number of times."""

    def __init__(self, url: str, study_name: str, engine=None):
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
        self.backend = parsed.get_backend_name()
        self.study_name = study_name
        self.engine = engine  # the storage's SQLAlchemy engine, for the PostgreSQL lock's connection
        self.folder = Path(parsed.database).expanduser().resolve().parent if self.backend == "sqlite" else None
        self._held = None  # the open folder descriptor or the PostgreSQL connection while the lock is held
        if self.backend not in ("sqlite", "postgresql"):
            LOGGER.info(f"tune: no cross-worker lock for {self.backend}; workers that finish together may train one trial "
                        f"more than iterations= (SQLite and PostgreSQL are locked)")

    def acquire(self) -> None:
        if self._held is not None:
            return
        if self.backend == "sqlite":
            fd = os.open(self.folder, os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._held = fd
        elif self.backend == "postgresql" and self.engine is not None:
            from sqlalchemy import text

            connection = self.engine.connect()
            connection.execute(text("SELECT pg_advisory_xact_lock(hashtext(:name))"), {"name": f"yolo-cb tune {self.study_name}"})
            self._held = connection

    def hold_if(self, needed: Callable[[], bool]) -> bool:
        """Acquire, then ask `needed()`: on True the lock stays held (a trial is to start), on False it is released."""
        self.acquire()
        if needed():
            return True
        self.release()
        return False

    def release(self) -> None:
        held, self._held = self._held, None
        if held is None:
            return
        if isinstance(held, int):
            os.close(held)  # closing the descriptor drops its flock
        else:
            held.rollback()  # ends the transaction, and with it the advisory lock
            held.close()
