"""One run, one folder: a training run holds an exclusive OS lock on `<run folder>/.lock` until it ends.

The lock is `fcntl.flock` on that file, so the kernel releases it when the process ends in any way (kill -9
included): a lock left by a dead run is never in the way, with no PID guessing. The file records the holder's PID
and host, which the refusal names.

The run folder may be one we did not make (exist_ok=True, a received folder), so `.lock` may already be anything. It is
opened without truncating, without following a link (O_NOFOLLOW) and without waiting on a FIFO (O_NONBLOCK), and is
used only if it is a regular file with no other name: a hard link's bytes belong to a file elsewhere too. Only then
is it rewritten. Any other `.lock`, and any OSError on the way, is a WriteError: one line, exit 2 on the command line.

A flock belongs to the open file, which a fork shares: a helper process forked by a callback (or a DataLoader worker)
would keep the folder locked after the run ended, under the run's PID. A forked child therefore closes its copy at
once (os.register_at_fork), and exec closes it (O_CLOEXEC): the lock is the run process's alone. A process that was
handed the descriptor anyway (pass_fds) holds the lock after the run; the refusal then names it (Linux: from /proc),
not the ended run that the file records.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import weakref
from pathlib import Path

from yolo_cb.errors import UserError, WriteError, os_reason
from yolo_cb.utils.files import write_error

LOCK_NAME = ".lock"  # in the run folder; kept after the run (removing it would race with a run taking it)
# no O_TRUNC: an existing file keeps its bytes until it is known to be ours
OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
WHAT = "the run folder's lock file"
KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"),
         (stat.S_ISDIR, "a folder"))

_held: weakref.WeakSet = weakref.WeakSet()  # this process's RunLocks: a forked child closes their descriptors
_fork_hook = False  # whether _release_in_child is registered (at the first lock, not at import)


class RunFolderInUse(UserError, RuntimeError):
    """Another live process trains in this run folder; nothing was written."""


class RunLock:
    """The exclusive lock of one run folder; `release()` (or the process ending) frees it."""

    def __init__(self, folder: Path, fd: int):
        self.folder, self._fd = Path(folder), fd
        _held.add(self)

    def release(self) -> None:
        """Close the descriptor: the flock is dropped once no process has it open (in a forked child: only its copy)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        _held.discard(self)

    def __del__(self):
        self.release()


def _release_in_child() -> None:
    for lock in list(_held):
        lock.release()


def _keep_locks_from_forked_children() -> None:
    global _fork_hook
    if not _fork_hook and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_release_in_child)
        _fork_hook = True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: nothing is sent, the PID is only looked up
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: alive
    return True


def _same_file(path: str, st: os.stat_result) -> bool:
    try:
        other = os.stat(path)
    except OSError:
        return False
    return (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino)


def _processes_with(fd: int) -> list[int]:
    """The other processes that have the file of `fd` open (Linux's /proc; elsewhere none are found)."""
    st, found = os.fstat(fd), []
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != os.getpid()]
    except OSError:
        return []
    for pid in sorted(pids):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # ended meanwhile, or another user's
        if any(_same_file(f"/proc/{pid}/fd/{n}", st) for n in fds):
            found.append(pid)
    return found


def _holder(fd: int) -> str:
    """Who holds the lock: the PID and host the file records, or, when that process has ended, the one that holds it."""
    try:
        pid, _, host = os.pread(fd, 256, 0).decode().partition(" ")
        pid, host = int(pid), host.strip()
    except (OSError, ValueError):
        return "another process"
    if pid <= 0 or (host and host != socket.gethostname()) or _alive(pid):
        return f"PID {pid} on {host or 'this host'}"
    heirs = _processes_with(fd)
    if heirs:
        return f"PID {', '.join(map(str, heirs))} on {host}, given the lock by PID {pid}, which has ended"
    return f"a process given the lock by PID {pid} on {host}, which has ended"


def _refuse(folder: Path, fd: int) -> RunFolderInUse:
    return RunFolderInUse(f"run folder {folder} is in use by another training run ({_holder(fd)}); two runs in one folder "
                          f"would overwrite each other's weights. Wait for it to end, or choose another name= (or drop exist_ok)")


def _link_refused(path: Path) -> WriteError:
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return WriteError(f"{WHAT} {path} is a symbolic link{target}; yolo-cb makes that file itself and never writes through a "
                      f"link it did not make: remove the link, or choose another name=", errno.ELOOP, str(path))


def _not_ours(path: Path, what: str, code: int) -> WriteError:
    return WriteError(f"{WHAT} {path} is {what}; yolo-cb makes that file itself (a regular file with one name) and never "
                      f"rewrites one it did not make: remove it, or choose another name=", code, str(path))


def _os_error(error: OSError, path: Path) -> WriteError:
    """Any OSError on the lock file as one line naming it."""
    if error.errno == errno.ELOOP:
        return _link_refused(path)
    if error.errno == errno.EISDIR:
        return _not_ours(path, "a folder", error.errno)
    if error.errno == errno.ENXIO:
        return _not_ours(path, "a socket or a device", error.errno)
    mapped = write_error(error, path, WHAT)
    if isinstance(mapped, WriteError):
        return mapped
    return WriteError(f"cannot use {WHAT} {path}: {os_reason(error)}; remove it, or choose another name=", error.errno, str(path))


def _check_ours(fd: int, path: Path) -> None:
    """WriteError unless the opened file is a regular file with no other name (so rewriting it changes nothing else)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in KINDS if test(st.st_mode)), "a special file")
        raise _not_ours(path, f"{kind}, not a regular file", errno.EINVAL)
    if st.st_nlink > 1:
        raise _not_ours(path, f"a hard link (one of {st.st_nlink} names of one file): rewriting it would change the file of its "
                              f"other names", errno.EMLINK)


def _open(path: Path) -> int:
    """The lock file opened read-write, created if missing, checked to be ours; every failure a WriteError."""
    try:
        fd = os.open(path, OPEN_FLAGS, 0o666)
    except OSError as error:
        raise _os_error(error, path) from None
    try:
        _check_ours(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _take(fd: int, folder: Path, path: Path) -> None:
    """flock the descriptor and record this process as the holder; closes it on any failure."""
    import fcntl  # POSIX; yolo-cb's signals and DDP launch are POSIX too

    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _refuse(folder, fd) from None
        os.ftruncate(fd, 0)  # a regular file with this one name (checked): only our own record is lost
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())  # the holder, for a refused run's message
    except OSError as error:
        os.close(fd)
        raise _os_error(error, path) from None
    except BaseException:
        os.close(fd)
        raise


def lock_run_folder(folder: Path) -> RunLock:
    """Take the run folder's lock or raise RunFolderInUse naming the holder; records this process as the holder.

    A `.lock` that is not a regular file of its own (a link, a hard link, a FIFO, a folder) is refused with a WriteError."""
    folder = Path(folder)
    path = folder / LOCK_NAME
    fd = _open(path)
    _take(fd, folder, path)
    _keep_locks_from_forked_children()
    return RunLock(folder, fd)
