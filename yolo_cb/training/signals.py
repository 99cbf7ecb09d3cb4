"""SIGINT / SIGTERM / SIGUSR1 during training: stop at the end of the batch, save last.pt, exit 130 / 143 / 138.

Within a deadline (utils/signal_stack.py): a callback that hangs, or a step that never returns, cannot keep the
process alive; it ends a few seconds (and twice the longest batch) after the signal, with the same exit status. The
epoch's last.pt is written before on_fit_epoch_end, so a hang there keeps the finished epoch.

And the one all-reduce that makes every rank stop together, on `trainer.stop` or on a signal any rank received.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable
from typing import Any

from yolo_cb.recipe.stop import StopCause
from yolo_cb.training.run_state import Stop
from yolo_cb.utils import dist as distributed
from yolo_cb.utils.log import LOGGER
from yolo_cb.utils.signal_stack import beat, ends_process, signal_deadline

# exit codes after a signal (last.pt saved first); 143 and 138 tell a job script to requeue (docs/distributed.md)
SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143, **({signal.SIGUSR1: 138} if hasattr(signal, "SIGUSR1") else {})}


class SignalWatch:
    """The signal received (here or, once agreed, on another rank) and the handlers it replaced."""

    def __init__(self):
        self.signum: int | None = None
        self.agreed = False  # every rank knows of the signal and stopped at the same batch: a save there is exact
        self._previous: dict = {}
        self._deadline = contextlib.ExitStack()

    def install(self, request_stop: Callable[[StopCause, str], None]) -> None:
        """Handlers that ask for a stop through `request_stop` (the trainer's control); a second signal aborts at once."""
        if threading.current_thread() is not threading.main_thread():  # handlers can only be installed from the main thread
            return

        @ends_process
        def handler(signum, frame):
            if self.signum is not None:  # a second signal: stop now
                raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(SIGNAL_EXIT[signum])
            self.signum = signum
            request_stop(StopCause.SIGNAL, f"{signal.Signals(signum).name} received")
            LOGGER.warning(f"{signal.Signals(signum).name} received: stopping at the end of this batch and saving last.pt (again to abort now)")

        for sig in SIGNAL_EXIT:
            self._previous[sig] = signal.signal(sig, handler)
        self._deadline.enter_context(signal_deadline())

    def restore(self) -> None:
        self._deadline.close()
        for sig, old in self._previous.items():
            signal.signal(sig, old)
        self._previous = {}

    def agree_to_stop(self, state: Stop, flag_device: Any) -> bool:
        """Combine the stop flag and any received signal over all ranks (one all-reduce), so every rank stops together.
        Called after every batch: a beat of the signal deadline."""
        beat()
        stop, signum = distributed.max_over_ranks([state.flag, self.signum or 0], flag_device)
        self.agreed = self.agreed or bool(signum)
        if signum and self.signum is None:
            self.signum = signum
            state.cause = state.cause or StopCause.SIGNAL
            state.reason = state.reason or f"{signal.Signals(signum).name} received on another rank"
        if stop and not state.flag:
            state.flag = True
            state.reason = state.reason or "trainer.stop was set on another rank"
        if stop and state.cause is None:
            state.cause = StopCause.CALLBACK
        return bool(stop)

    def raise_on_signal(self, before_exit: Callable[[], None]) -> None:
        """After a SIGINT/SIGTERM/SIGUSR1: leave the loop as an interrupt (exit 130 / 143 / 138 on the CLI). When every rank
        agreed at the same batch, `before_exit` runs first on each (the trainer gathers the RNG states its save needs)."""
        if self.signum is not None and self.agreed:
            before_exit()
        if self.signum is not None:
            raise KeyboardInterrupt if self.signum == signal.SIGINT else SystemExit(SIGNAL_EXIT[self.signum])
