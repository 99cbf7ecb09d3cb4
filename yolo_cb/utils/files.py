"""Files: atomic writes and auto-incremented run directories.

Written files get the permissions any other new file would: 0o666 less the process umask (the kernel applies
it, and a folder's default ACL, when the temp file is created), or the permissions of the file they replace.
Failures the user can fix (read-only or full filesystem, a file where a folder should be) raise WriteError,
an OSError that names the path.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from yolo_cb.errors import ConfigError, WriteError, os_reason

# OSErrors caused by where the user asked us to write, not by a bug: reported as WriteError
USER_FIXABLE = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EEXIST, errno.EFBIG}


def create_temp(folder: Path, prefix: str, suffix: str) -> tuple[int, Path]:
    """Create a new empty file ``folder/<prefix><random><suffix>`` exclusively; returns (fd, path).

    Like tempfile.mkstemp, but with mode 0o666 so the umask (not a fixed 0o600) decides who may read it."""
    # O_EXCL (with O_NOFOLLOW, for good measure) never opens a file or link already there, planted or not
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        path = Path(folder) / f"{prefix}{secrets.token_hex(4)}{suffix}"
        try:
            return os.open(path, flags, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary file name", str(folder))


def write_error(error: OSError, path: Path, what: str = "") -> OSError:
    """A WriteError naming ``path`` for an OSError the user can fix; any other OSError unchanged."""
    if isinstance(error, WriteError) or error.errno not in USER_FIXABLE:
        return error
    hint = {errno.ENOSPC: "free some space or write elsewhere", errno.EDQUOT: "free some space or write elsewhere",
            errno.EFBIG: "write elsewhere"}.get(error.errno, "choose a folder this process may write to")
    where = f"{what} ({path})" if what else str(path)
    return WriteError(f"cannot write {where}: {os_reason(error)}; {hint}", error.errno, str(path))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temp file in the same folder, fsync, then os.replace: readers never see half a file.

    A new file's mode follows the umask; a replaced file keeps its mode."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = create_temp(path.parent, f".{path.name}.", ".tmp")
        with os.fdopen(fd, "wb") as f:
            old_mode = replaced_mode(path)
            if old_mode is not None:
                os.fchmod(f.fileno(), old_mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        converted = write_error(error, path) if isinstance(error, OSError) else error
        if converted is error:
            raise
        raise converted from error


def atomic_link(source: Path, path: Path, data: bytes) -> None:
    """`path` as a hard link of `source`, a file just written with `data` (one write and fsync for two names), replacing
    `path` atomically; where the filesystem has no hard links, `data` is written (atomic_write_bytes). Safe because
    yolo-cb never writes a file in place: `source`'s name gets a new file at its next write, and `path` keeps these bytes."""
    path = Path(path)
    fd, tmp = create_temp(path.parent, f".{path.name}.", ".tmp")
    os.close(fd)
    os.unlink(tmp)  # a fresh random name for the link
    try:
        os.link(source, tmp, follow_symlinks=False)  # a link planted at `source` is linked as a link, never followed
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        atomic_write_bytes(path, data)


def replaced_mode(path: Path) -> int | None:
    """The mode of the regular file `path` replaces, or None: a link at `path` is replaced, never followed, not even to read a mode."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def own_folder(root: Path, *parts: str) -> Path:
    """root/parts..., each part created as a real folder: a symbolic link planted at one (in an output folder reused with
    exist_ok=True) is removed, never followed, so nothing is written through it into the place it names."""
    folder = Path(root)
    for part in parts:
        folder = folder / part
        if folder.is_symlink():
            folder.unlink()
        try:
            folder.mkdir()
        except FileExistsError:
            if not folder.is_dir() or folder.is_symlink():
                raise WriteError(f"cannot write into {folder}: it is not a folder; remove it or choose another name=",
                                 errno.ENOTDIR, str(folder)) from None
        except OSError as error:
            raise write_error(error, folder) from error
    return folder


def append_bytes(path: Path, data: bytes) -> None:
    """`data` appended to the regular file `path` (created when missing) as a new file renamed over it: a link planted
    at `path` (symbolic, or hard to a file elsewhere) is replaced by our own file, and the file it names keeps its bytes."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        if error.errno not in (errno.ENOENT, errno.ELOOP):
            raise write_error(error, path) from error
        old = b""  # missing, or a symbolic link: nothing of ours to keep
    else:
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            ours = stat.S_ISREG(st.st_mode) and st.st_nlink == 1  # a hard link's bytes belong to another name too
            old = f.read() if ours else b""
    atomic_write_bytes(path, old + data)


def create_new_file(folder: Path, stem: str, suffix: str) -> tuple[int, Path]:
    """(fd, path) of a new file folder/<stem><suffix>, else <stem>2<suffix>, <stem>3<suffix>, ...: created exclusively and
    without following links, so an existing file is never overwritten and a link planted at a name is skipped."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    n = 1
    while True:
        path = Path(folder) / f"{stem}{n if n > 1 else ''}{suffix}"
        try:
            return os.open(path, flags, 0o666), path
        except FileExistsError:
            n += 1
        except OSError as error:
            raise write_error(error, path) from error


def increment_path(path: Path, exist_ok: bool = False, mkdir: bool = True) -> Path:
    """runs/detect/train -> runs/detect/train-2, train-3, ... unless exist_ok; creates the folder. As Ultralytics 8.4, the
    number is appended to the name as given (name=t10 twice: t10, then t10-2).

    Claiming a name is its mkdir (without exist_ok): of several processes starting at once, each gets its own folder."""
    path = Path(path)
    if exist_ok or not mkdir:
        if mkdir:
            path.mkdir(parents=True, exist_ok=True)
        return path if exist_ok or not path.exists() else _next_free(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    candidate = path
    while True:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            candidate = _next_free(path, after=candidate)


RUN_NUMBER_SEPARATOR = "-"  # train, train-2, train-3: Ultralytics 8.4's separator (before 8.4: none, train2)


def _next_free(path: Path, after: Path | None = None) -> Path:
    """The first name <name>-2, <name>-3, ... (after `after`, if given) that does not exist yet."""
    stem = path.name + RUN_NUMBER_SEPARATOR
    n = 2
    if after is not None and after != path:
        n = int(after.name[len(stem):]) + 1
    while (path.parent / f"{stem}{n}").exists():
        n += 1
    return path.parent / f"{stem}{n}"


def _plain_name(name: str) -> str:
    """name= as a folder inside project=: absolute names and '..' parts (which would write elsewhere) are refused."""
    parts = Path(str(name)).parts
    if Path(str(name)).is_absolute() or ".." in parts or not parts:
        raise ConfigError(f"name={name}: a run's name is a folder inside project=, not a path out of it; give a plain name "
                          f"(e.g. name=exp), and put the place in project=")
    return str(name)


RUNS_DIR = Path("runs")  # where run folders go when project= is empty: runs/<task>/<mode>, as Ultralytics


def default_project(args=None) -> Path:
    """The project folder when project= is empty: runs/detect (runs/<task>)."""
    return RUNS_DIR / (getattr(args, "task", None) or "detect")


def _is_file_in_the_way(path: Path) -> bool:
    """Whether `path` exists and is no folder; False where it cannot even be asked (a name longer than the OS allows)."""
    try:
        return path.exists() and not path.is_dir()
    except OSError:
        return False


def run_dir(args, mode: str) -> Path:
    """The run directory for `mode` from project=/name=/exist_ok= (<project or runs/detect>/<name or mode>), created:
    runs/detect/train, then train-2, train-3, ... as Ultralytics 8.4 names them.

    A project= that cannot hold it (a file, read-only, full) raises WriteError naming project= and the reason."""
    project = Path(args.project) if args.project else default_project(args)
    wanted = project / _plain_name(args.name or mode)
    try:
        return increment_path(wanted, exist_ok=bool(args.exist_ok))
    except OSError as error:
        blocker = next((p for p in (project, *project.parents) if _is_file_in_the_way(p)), None)
        reason = f"{blocker} is a file, not a folder" if blocker is not None else os_reason(error)
        setting = f"project={args.project}" if args.project else f"the default project folder {project}"
        raise WriteError(f"{setting}: cannot create the run folder {wanted}: {reason}; pass project= a folder this process "
                         f"may write to", error.errno, str(wanted)) from error
