"""Files: atomic writes, auto-incremented run directories, and bounded reads of files we did not write.

Written files get the permissions any other new file would: 0o666 less the process umask (the kernel applies
it, and a folder's default ACL, when the temp file is created), or the permissions of the file they replace.
Failures the user can fix (read-only or full filesystem, a file where a folder should be) raise WriteError,
an OSError that names the path.

Reading (:func:`read_bounded`, at the end) is the one way yolo-cb reads a file a dataset or a user names: a data YAML
of 48 MB was still being parsed after 240 s (2.2 GB), and a VOC image-set list that was a FIFO made a run wait for a
writer forever. Every such file (a data, settings or model YAML, an image list, a VOC image-set list, a COCO / LabelMe /
Label Studio JSON, a VOC XML, a YOLO label file, the label cache) is looked at with ``os.stat`` first, and anything but
a regular file (a FIFO, a folder, a device, a socket) is refused unopened; it is then opened with ``O_NONBLOCK`` (a FIFO
swapped in after the ``stat`` opens at once instead of waiting for a writer) and checked again on the descriptor; and
it may hold at most its kind's ``limit`` bytes (FileKind, below): at most ``limit + 1`` bytes are ever read, so a file
that grows, or a special file that reports size 0, is refused all the same. A refusal is a FileRefused (a DataError:
one line, exit status 2 on the CLI) naming the file, what it is or how large, and what would be right.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from yolo_cb.errors import ConfigError, DataError, WriteError, os_reason
from yolo_cb.utils.log import printable

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


# --- reading a file we did not write --------------------------------------------------------------------------------
MiB = 2**20


@dataclass(frozen=True)
class FileKind:
    """A kind of file read from a dataset or a user, and the most bytes one may hold."""

    what: str  # named in the error line: "YAML file", "image list", ...
    limit: int  # bytes


# The bounds, each with why (docs/security.md, "Files read from a dataset"):
YAML_FILE = FileKind("YAML file", 1 * MiB)  # data, cfg=, model, space= YAMLs: one with 1000 class names is tens of KB
LIST_FILE = FileKind("list file", 512 * MiB)  # an image list or a VOC image-set list: 5 million image paths of 100 characters
ANNOTATION_JSON = FileKind("annotation JSON", 2048 * MiB)  # COCO's instances_train2017.json is 448 MB: room for 4 of it
ANNOTATION_XML = FileKind("VOC annotation", 16 * MiB)  # one image's objects: a few KB
LABEL_FILE = FileKind("label file", 16 * MiB)  # one image's boxes, ~40 bytes each: 16 MiB is 400,000 boxes
LABEL_CACHE = FileKind("label cache", 2048 * MiB)  # every label of a split, as JSON: as large as an annotation JSON

FILE_TYPES = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
              (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class FileRefused(DataError):
    """A file refused unread: not a regular file, or larger than its kind may be. `reason` is the line without the path."""

    def __init__(self, path: str | os.PathLike, reason: str):
        super().__init__(f"{printable(path)}: {reason}")
        self.reason = reason


def size_text(n: int) -> str:
    """Bytes as people say them: 512 B, 1.0 MiB, 2.1 GiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", MiB), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _refuse_mode(path: str | os.PathLike, mode: int, what: str) -> None:
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in FILE_TYPES if test(mode)), "a special file")
    raise FileRefused(path, f"is not a regular file but {kind}; {article(what)} {what} is read only from a regular file, never "
                            f"waited on: name the file itself")


def article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def _refuse_size(path: str | os.PathLike, size: int, limit: int, what: str) -> None:
    if size > limit:
        raise FileRefused(path, f"holds {size_text(size) if size > limit + 1 else 'more than ' + size_text(limit)}, and {article(what)} {what} "
                                f"may hold at most {size_text(limit)}; yolo-cb does not read it: check that it is the right file")


def require_regular(path: str | os.PathLike, what: str) -> os.stat_result:
    """`path`'s stat (links followed) when it is a regular file; FileRefused naming what it is otherwise (a FIFO, a
    folder, a device, a socket). A missing file raises FileNotFoundError as it is."""
    found = os.stat(path)
    _refuse_mode(path, found.st_mode, what)
    return found


def read_bounded(path: str | os.PathLike, kind: FileKind, what: str | None = None) -> bytes:
    """The bytes of the regular file `path`, at most ``kind.limit`` of them; FileRefused otherwise (see the module
    docstring). `what` names the file in the error line (default: the kind's name). A missing or unreadable file raises
    the OSError as it is."""
    what = what or kind.what
    _refuse_size(path, require_regular(path, what).st_size, kind.limit, what)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        opened = os.fstat(fd)
        _refuse_mode(path, opened.st_mode, what)  # swapped for a FIFO or a device after the stat: still refused
        data = _read_at_most(f, opened.st_size, kind.limit + 1)
    _refuse_size(path, len(data), kind.limit, what)
    return data


def _read_at_most(f, size: int, most: int) -> bytes:
    """Up to `most` bytes of `f`, whose size said `size`: read(n) allocates n bytes first, so the first read asks for the
    size (and a byte more, to see a file that grew) and any more comes in chunks of at most 1 MiB."""
    parts = [f.read(min(size + 1, most))]
    total = len(parts[0])
    while total < most and (chunk := f.read(min(MiB, most - total))):
        parts.append(chunk)
        total += len(chunk)
    return b"".join(parts)


def read_bounded_text(path: str | os.PathLike, kind: FileKind, what: str | None = None) -> str:
    """:func:`read_bounded` as UTF-8 text (a byte order mark, from Windows editors, is not data); UnicodeDecodeError as it is."""
    return read_bounded(path, kind, what).decode("utf-8-sig")


def existing(path: Path) -> Path:
    """`path`, or the nearest folder above it that exists (where a file system can be asked for its free space)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
