"""Signals that a library call or a C++ loop would otherwise lose.

1. Keep the thread's alternate signal stack across a library call that replaces it and may later free it.

OpenVINO's CPU plugin installs a signal stack of its own on the thread that compiles a model, remembers the one it
replaced, and puts that one back when its plugin goes away. With two OpenVINO cores in one process (two models loaded
one after the other, e.g. validating an export and then predicting with it) the second plugin remembers the first's
stack, which is unmapped when the first core is freed: the thread is left with a signal stack that no longer exists.
The next signal delivered there with a Python handler (SIGCHLD once a DataLoader with workers ran) cannot be delivered;
the kernel kills the process with SIGSEGV and not even faulthandler can say why (measured: a test process died in a
later `subprocess.run`, tests/test_signal_stack.py reproduces it).

`kept_signal_stack()` around such a call puts the thread's own stack (Python's faulthandler's, or none) back at once,
so every plugin remembers a stack that lives as long as the process.

2. After Ctrl-C or SIGTERM the process ends within seconds, even where Python cannot act on the signal.

CPython runs a signal's Python handler only between two bytecodes of the main thread. A main thread inside one long
C++ call (an ONNX `Loop` of 10^12 iterations in ONNX Runtime) never gets there, and a callback that hangs never returns
to the code that would stop: SIGTERM was ignored (issue 59). The C part of CPython's handler always runs, and writes
the signal's number to the "wakeup fd" (`signal.set_wakeup_fd`); a watchdog thread reading it starts a deadline when
the signal's handler is one that ends the process (`ends_process`: yolo-cb's own, Python's Ctrl-C). The handlers get
that long to save and leave (predict finalises its videos; training stops at the end of the batch and writes last.pt):
BASE_GRACE_S plus twice the longest time between two `beat()`s (a batch), so a slow batch is not cut short. Past it,
the watchdog names where the main thread is and ends the process with the signal's status (130 / 143 / 138).

    with signal_deadline():      # around work that runs files or callbacks we did not write
        for batch in ...:
            ...
            beat()                # one unit of work done

A runtime that holds Python's lock while it runs leaves no thread to act: around its calls `signals_to_the_os()`
gives those signals back to the OS, which ends the process at once. Nested blocks share the outermost one's watchdog.
The outermost block, when it ends, stops watching (a caller that caught the KeyboardInterrupt goes on), unless
`past_block=True` (the CLI: the deadline then also covers the way out, e.g. a thread that interpreter shutdown would
wait for). A handler the user installed is left to do what it does.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SS_DISABLE = 2  # <signal.h>: the thread has no alternate signal stack


class _StackT(ctypes.Structure):
    """struct stack_t of <signal.h> (Linux): the stack's address, its flags, its size."""

    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


def _sigaltstack():
    """libc's sigaltstack, or None where there is none to call (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    function = ctypes.CDLL(None, use_errno=True).sigaltstack
    function.argtypes = [ctypes.POINTER(_StackT), ctypes.POINTER(_StackT)]
    return function


def _read(sigaltstack) -> _StackT:
    """The calling thread's alternate signal stack as the kernel reports it."""
    stack = _StackT()
    sigaltstack(None, ctypes.byref(stack))
    return stack


def current_signal_stack() -> tuple[int, int] | None:
    """(address, size) of the calling thread's alternate signal stack; (0, 0) when it has none; None: not Linux."""
    sigaltstack = _sigaltstack()
    if sigaltstack is None:
        return None
    stack = _read(sigaltstack)
    return (0, 0) if stack.ss_flags & SS_DISABLE else (stack.ss_sp or 0, stack.ss_size)


@contextlib.contextmanager
def kept_signal_stack() -> Iterator[None]:
    """The calling thread's alternate signal stack is the same after the block as before it."""
    sigaltstack = _sigaltstack()
    if sigaltstack is None:
        yield
        return
    before = _read(sigaltstack)
    try:
        yield
    finally:
        before.ss_flags &= SS_DISABLE  # SS_ONSTACK is a state the kernel reports, not one to set
        sigaltstack(ctypes.byref(before), None)


BASE_GRACE_S = 5.0  # seconds a signal's handlers get to save and leave, on top of twice the longest step seen
WATCHED = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGUSR1") if hasattr(signal, name))
_STDLIB = sysconfig.get_paths()["stdlib"]


def ends_process(handler: Callable[[int, Any], Any]) -> Callable[[int, Any], Any]:
    """Mark a signal handler of ours that ends the process (or the run): after it, the deadline applies."""
    handler.ends_process = True
    return handler


class _Watch:
    """The wakeup pipe, the thread reading it, and the longest step seen (set from the main thread by beat())."""

    def __init__(self, previous_fd: int, read_fd: int, write_fd: int):
        self.previous_fd, self.read_fd, self.write_fd = previous_fd, read_fd, write_fd
        self.closed = threading.Event()
        self.fired = False
        self.longest = 0.0
        self.last_beat: float | None = None
        self.thread = threading.Thread(target=self._read, name="yolo-cb-signal-deadline", daemon=True)

    def beat(self) -> None:
        now = time.monotonic()
        if self.last_beat is not None:
            self.longest = max(self.longest, now - self.last_beat)
        self.last_beat = now

    def _read(self) -> None:
        try:
            while not self.closed.is_set():
                data = os.read(self.read_fd, 64)
                if not data:  # the write end was closed: the block ended
                    return
                signum = next((s for s in data if s in WATCHED and _ends_process(s)), None)
                if signum is not None:
                    self.fired = True
                    self._expire(signum)
                    return
        finally:
            os.close(self.read_fd)

    def _expire(self, signum: int) -> None:
        grace = BASE_GRACE_S + 2 * self.longest
        if self.closed.wait(grace):
            return  # the block ended in time
        name = signal.Signals(signum).name
        os.write(2, f"yolo-cb: {name} received {grace:.0f} s ago and the process has not stopped (the main thread is in "
                    f"{_main_thread_place()}): exiting now with status {128 + signum}\n".encode(errors="replace"))
        os._exit(128 + signum)

    def close(self) -> bool:
        """Stop watching; False (still watching) off the main thread, where the wakeup fd cannot be put back."""
        if threading.current_thread() is not threading.main_thread():
            return False
        self.closed.set()
        current = signal.set_wakeup_fd(self.previous_fd)
        if current != self.write_fd:  # another library replaced ours meanwhile: theirs stays
            signal.set_wakeup_fd(current)
        os.close(self.write_fd)
        return True


_watch: _Watch | None = None
_fork_hook = False


def _ends_process(signum: int) -> bool:
    handler = signal.getsignal(signum)
    return handler is signal.default_int_handler or bool(getattr(handler, "ends_process", False))


def _main_thread_place() -> str:
    """'function (file:line)' of the innermost frame of the main thread outside Python's standard library."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    first = frame
    while frame is not None and frame.f_code.co_filename.startswith(_STDLIB):
        frame = frame.f_back
    frame = frame or first
    if frame is None:
        return "no Python code"
    return f"{frame.f_code.co_name} ({Path(frame.f_code.co_filename).name}:{frame.f_lineno})"


def _start() -> _Watch | None:
    """A watchdog on a new wakeup pipe; None where it cannot be (not the main thread, another wakeup fd in use)."""
    global _fork_hook
    if threading.current_thread() is not threading.main_thread():
        return None
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    if previous != -1:  # asyncio's (or the user's): leave it in charge
        signal.set_wakeup_fd(previous)
        os.close(read_fd)
        os.close(write_fd)
        return None
    if not _fork_hook and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_forget_in_child)
        _fork_hook = True
    watch = _Watch(previous, read_fd, write_fd)
    watch.thread.start()
    return watch


def _forget_in_child() -> None:
    """A forked child (a DataLoader worker) neither writes its own signals into the parent's pipe nor keeps it open."""
    global _watch
    if _watch is not None:
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)
        for fd in (_watch.read_fd, _watch.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        _watch = None


@contextlib.contextmanager
def signal_deadline(past_block: bool = False) -> Iterator[None]:
    """See the module docstring: within the block, a signal that ends the process ends it within its grace."""
    global _watch
    if _watch is not None:  # an outer block watches
        yield
        return
    watch = _start()
    _watch = watch
    try:
        yield
    finally:
        if watch is not None and _watch is watch and not (past_block and watch.fired) and watch.close():
            _watch = None


@contextlib.contextmanager
def signals_to_the_os() -> Iterator[None]:
    """Around a call into a runtime that holds Python's lock (the GIL) while it runs (MNN, measured): no Python code runs
    until it returns, the watchdog's neither, so SIGINT / SIGTERM / SIGUSR1 whose handler ends the process are left at
    their defaults meanwhile: the OS ends the process at once (nothing of ours can be saved inside that call anyway)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in WATCHED if _ends_process(signum)}
    for signum in previous:
        signal.signal(signum, signal.SIG_DFL)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def beat() -> None:
    """One unit of work (a batch) finished: after a signal, the deadline allows twice the longest time between two beats."""
    if _watch is not None:
        _watch.beat()
