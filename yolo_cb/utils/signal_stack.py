"""Keep the thread's alternate signal stack across a library call that replaces it and may later free it.

OpenVINO's CPU plugin installs a signal stack of its own on the thread that compiles a model, remembers the one it
replaced, and puts that one back when its plugin goes away. With two OpenVINO cores in one process (two models loaded
one after the other, e.g. validating an export and then predicting with it) the second plugin remembers the first's
stack, which is unmapped when the first core is freed: the thread is left with a signal stack that no longer exists.
The next signal delivered there with a Python handler (SIGCHLD once a DataLoader with workers ran) cannot be delivered;
the kernel kills the process with SIGSEGV and not even faulthandler can say why (measured: a test process died in a
later `subprocess.run`, tests/test_signal_stack.py reproduces it).

`kept_signal_stack()` around such a call puts the thread's own stack (Python's faulthandler's, or none) back at once,
so every plugin remembers a stack that lives as long as the process.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import Iterator

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
