"""One run, one folder: a training run holds an exclusive OS lock on `<run folder>/.lock` until it ends.

The lock is `fcntl.flock` on that file, so the kernel releases it when the process ends in any way (kill -9
included): a lock left by a dead run is never in the way, with no PID guessing. The file records the holder's PID
and host, which the refusal names.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

from yolo_cb.errors import UserError, WriteError
from yolo_cb.utils.files import write_error

LOCK_NAME = ".lock"  # in the run folder; kept after the run (removing it would race with a run taking it)


class RunFolderInUse(UserError, RuntimeError):
    """Another live process trains in this run folder; nothing was written."""


class RunLock:
    """The exclusive lock of one run folder; `release()` (or the process ending) frees it."""

    def __init__(self, folder: Path, fd: int):
        self.folder, self._fd = Path(folder), fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __del__(self):
        self.release()


def _holder(path: Path) -> str:
    try:
        pid, _, host = path.read_text().partition(" ")
        return f"PID {int(pid)} on {host.strip() or 'this host'}"
    except (OSError, ValueError):
        return "another process"


def _refuse(folder: Path, path: Path) -> RunFolderInUse:
    return RunFolderInUse(f"run folder {folder} is in use by another training run ({_holder(path)}); two runs in one folder "
                          f"would overwrite each other's weights. Wait for it to end, or choose another name= (or drop exist_ok)")


def _link_refused(path: Path) -> WriteError:
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return WriteError(f"the run folder's lock file {path} is a symbolic link{target}; yolo-cb makes that file itself and "
                      f"never writes through a link it did not make: remove the link, or choose another name=", errno.ELOOP, str(path))


def lock_run_folder(folder: Path) -> RunLock:
    """Take the run folder's lock or raise RunFolderInUse naming the holder; records this process as the holder."""
    folder = Path(folder)
    path = folder / LOCK_NAME
    import fcntl  # POSIX; yolo-cb's signals and DDP launch are POSIX too

    try:  # O_NOFOLLOW: a .lock planted as a link would make the truncate below empty the file it names
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _link_refused(path) from None
        raise write_error(error, path, "the run folder's lock file") from error
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _refuse(folder, path) from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())  # the holder, for a refused run's message
    except OSError as error:
        os.close(fd)
        raise write_error(error, path, "the run folder's lock file") from error
    return RunLock(folder, fd)
