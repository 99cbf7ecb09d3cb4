"""What the experiment trackers (Comet, ClearML, DVC Live) share: when they log, what a failure does, and the few facts
they all read from a training.

A tracker subclasses `Tracker` and writes only what is its tool's own: `start` (open the session, log the settings),
`log_batch`, `log_epoch`, `log_end` (confusion matrix, best.pt) and `close`. The events are wired here once:

- on_pretrain_routine_end (main process only): `start`;
- on_train_batch_end, every `log_every` batches: `log_batch(trainer, step, losses)` (step = the global batch index);
- on_fit_epoch_end: `log_epoch(trainer, record, images)`: `trainer.epoch_record` (the row results.csv writes) and the
  visualisation images of the epoch (`trainer.new_images`, each as (file, tag, 0-based epoch));
- on_train_end: `log_end(trainer)`, then `close(failed=False)`; on_exception: `close(failed=True)`; teardown: `close`.

Any exception from the tool warns once (`WARNING Comet: ...; Comet logging is off for the rest of this run (training
goes on)`), closes its session as well as it can and switches the tracker off; training is never stopped by it. The
callback engine's "disable" policy (every integration's) is the second net.

`Worker` runs a tracker's slow calls (imports, store setup, uploads) on one background thread, in the order they were
given, so that the training does not wait for them: MLflow and TensorBoard use it.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from yolo_cb.integrations.visualize import image_tag
from yolo_cb.utils.log import LOGGER

LOG_EVERY = 10  # training batches between two logged batch losses (as the W&B integration)


def short_error(error: BaseException) -> str:
    text = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {text[:300]}"


def project_name(trainer, env_var: str) -> str:
    """The tracker's project: `env_var` when set, else the basename of project=, else "yolo-cb" (as W&B and MLflow)."""
    return os.environ.get(env_var) or (Path(str(trainer.args.project)).name if trainer.args.project else "") or "yolo-cb"


def best_weights(trainer) -> Path | None:
    best = Path(trainer.wdir) / "best.pt" if trainer.wdir else None
    return best if best is not None and best.is_file() else None


def final_confusion(trainer) -> tuple[np.ndarray, list[str]] | None:
    """(counts, labels) of the last validation (best.pt's at on_train_end): rows predicted, columns true, the last
    row/column "background"; None when nothing was validated."""
    matrix = getattr(getattr(trainer, "validator", None), "confusion_matrix", None)
    if matrix is None:
        return None
    names = trainer.data.get("names") if isinstance(trainer.data, dict) else None
    names = names if isinstance(names, dict) else dict(enumerate(names or []))
    labels = [str(names.get(i, i)) for i in range(matrix.nc)] + ["background"]
    return np.asarray(matrix.matrix), labels


def refuse_unread(env_names: Iterable[str], title: str) -> None:
    """One warning line per set environment variable of this tool that yolo-cb does not read (Ultralytics' callbacks
    read them), naming what does that job here."""
    for name, instead in env_names:
        if os.environ.get(name):
            LOGGER.warning(f"WARNING {title}: {name} is not read by yolo-cb ({instead}); it has no effect on this run")


class Worker:
    """One background thread running the jobs given to `submit`, in order. The first job that raises calls
    `on_error(error)` (from the worker thread) and the jobs after it are skipped, but for those given with `always`. `finish(timeout)` waits, at most
    `timeout` seconds, for every job given so far; the thread is a daemon, so a job that never returns cannot keep the
    process alive after the training."""

    def __init__(self, name: str, on_error: Callable[[BaseException], None]):
        self.name, self.on_error = name, on_error
        self.jobs: queue.Queue = queue.Queue()
        self.thread: threading.Thread | None = None
        self.failed = False

    def submit(self, fn: Callable, *args, always: bool = False) -> threading.Event:
        """Queue `fn(*args)`; the returned event is set once it has run (or was skipped after a failure; an `always` job
        runs even then: the one that closes the session)."""
        done = threading.Event()
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self.thread.start()
        self.jobs.put((fn, args, always, done))
        return done

    def finish(self, timeout: float) -> bool:
        """Wait for every job given so far, at most `timeout` seconds; True when all of them have run."""
        if self.thread is None:
            return True
        return self.submit(lambda: None).wait(timeout)

    def _loop(self) -> None:
        while True:
            fn, args, always, done = self.jobs.get()
            try:
                if always or not self.failed:
                    fn(*args)
            except BaseException as error:  # noqa: BLE001  (reported through on_error, never raised into a thread's void)
                self.failed = True
                try:
                    self.on_error(error)
                except Exception as report_error:  # the report itself must not end the thread
                    LOGGER.warning(f"WARNING {self.name}: {short_error(error)} ({short_error(report_error)} while reporting it)")
            finally:
                done.set()


class Tracker:
    """The event wiring and failure policy of an experiment tracker; see the module docstring."""

    title = "tracker"  # the tool's name in log lines
    rank_zero_only = True

    def __init__(self, log_every: int = LOG_EVERY):
        self.log_every = int(log_every)
        self.session: Any = None  # the tool's run / task / Live object while it is open
        self.off = False  # switched off after a failure (one warning)

    # --- the tool's part ----------------------------------------------------------------------
    def start(self, trainer) -> Any:
        raise NotImplementedError

    def log_batch(self, trainer, step: int, losses: dict[str, float]) -> None:
        raise NotImplementedError

    def log_epoch(self, trainer, record, images: list[tuple[Path, str, int]]) -> None:
        raise NotImplementedError

    def log_end(self, trainer) -> None:
        raise NotImplementedError

    def close(self, failed: bool) -> None:
        raise NotImplementedError

    # --- failure policy -----------------------------------------------------------------------
    def guarded(self, fn, *args) -> Any:
        """Run one step of the tool; on failure warn once, close the session, switch off; never raise."""
        if self.off:
            return None
        try:
            return fn(*args)
        except Exception as error:
            self.off = True
            LOGGER.warning(f"WARNING {self.title}: {short_error(error)}; {self.title} logging is off for the rest of this run "
                           f"(training goes on)")
            self._close(failed=True)
            return None

    def _close(self, failed: bool) -> None:
        if self.session is None:
            return
        try:
            self.close(failed)
        except Exception as error:  # closing a broken session may fail too: say so, never raise
            LOGGER.warning(f"WARNING {self.title}: closing the session failed ({short_error(error)})")
        finally:
            self.session = None

    # --- events -------------------------------------------------------------------------------
    def on_pretrain_routine_end(self, trainer):
        if self.session is None:
            self.session = self.guarded(self.start, trainer)

    def on_train_batch_end(self, trainer):
        if self.session is None or trainer.loss_items is None or trainer.batch_i % self.log_every:
            return
        step = trainer.epoch * trainer.num_batches + trainer.batch_i
        self.guarded(self.log_batch, trainer, step, trainer.label_loss_items(trainer.loss_items, prefix="batch"))

    def on_fit_epoch_end(self, trainer):
        if self.session is None or trainer.epoch_record is None:
            return
        images = [(path, *image_tag(path, trainer.epoch)) for path in trainer.new_images if Path(path).is_file()]
        self.guarded(self.log_epoch, trainer, trainer.epoch_record, images)

    def on_train_end(self, trainer):
        if self.session is None:
            return
        self.guarded(self.log_end, trainer)
        if self.session is not None:
            self.guarded(self.close, False)
            self.session = None

    def on_exception(self, trainer):
        self._close(failed=True)

    def teardown(self, trainer):
        self._close(failed=trainer.exception is not None)
