"""Download a dataset archive over http(s) with a progress bar, and extract it safely."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from pathlib import Path
from urllib.parse import unquote, urlparse

from yolo_cb.errors import DataError
from yolo_cb.utils.download import fetch

LOGGER = logging.getLogger("yolo_cb")

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")


def is_url(text) -> bool:
    return isinstance(text, str) and urlparse(text).scheme in ("http", "https")


def _inside(root: Path, name: str) -> bool:
    """Whether archive member ``name`` stays inside ``root``: relative, no '..' climbing out (checked on the text and resolved)."""
    if not name or name.startswith(("/", "\\")) or (len(name) > 1 and name[0].isalpha() and name[1] == ":") or "\0" in name:
        return False
    target = (root / name).resolve()
    return target == root or root in target.parents


MAX_RATIO = 100  # an archive may expand to this many times its own size ...
MIN_LIMIT = 64 * 2**20  # ... or to this many bytes, whichever is more (small archives of text labels compress well)
FREE_MARGIN = 256 * 2**20  # room left on the disk after an extraction


def _in_folder(name: str, only: str | None) -> bool:
    """Whether archive member ``name`` lies in the top folder ``only`` (any member does when ``only`` is None)."""
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    return only is None or (bool(parts) and parts[0] == only)


def _checked_members(archive: Path, root: Path, dest: Path, label: str, only: str | None = None) -> tuple[str, list, int]:
    """("zip" or "tar", the members, their total size), after refusing any member that is unsafe (outside ``dest``, or
    outside its folder ``only`` there: a sibling dataset's; a link or device); nothing is written here."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            members = zf.infolist()
        for info in members:
            if not _in_folder(info.filename, only):
                raise DataError(_outside_its_folder(info.filename, label, dest, only))
            if not _inside(root, info.filename):
                raise DataError(f"unsafe member '{info.filename}' in {label}: it would extract outside {dest}; archive refused, nothing extracted")
            if stat.S_ISLNK(info.external_attr >> 16):
                raise DataError(f"unsafe member '{info.filename}' in {label}: a symbolic link; archive refused, nothing extracted")
        return "zip", members, sum(i.file_size for i in members)  # zipfile never writes more than a member's file_size
    if tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tf:
            members = tf.getmembers()
        for m in members:
            if not _in_folder(m.name, only):
                raise DataError(_outside_its_folder(m.name, label, dest, only))
            if not _inside(root, m.name) or not (m.isfile() or m.isdir()):
                kind = "outside " + str(dest) if not _inside(root, m.name) else "a link or device file"
                raise DataError(f"unsafe member '{m.name}' in {label}: {kind}; archive refused, nothing extracted")
        return "tar", members, sum(m.size for m in members if m.isfile())
    raise DataError(f"{label} is not a zip or tar archive")


def _outside_its_folder(name: str, label: str, dest: Path, only: str) -> str:
    return (f"unsafe member '{name}' in {label}: the dataset's files go in {Path(dest) / only}, and this one would land beside "
            f"it (another dataset's folder in {dest}); archive refused, nothing extracted")


def _check_expansion(archive: Path, root: Path, total: int, label: str) -> None:
    """Refuse an archive that would expand past MAX_RATIO times its size (a zip bomb) or past the free space."""
    size = archive.stat().st_size
    limit = max(MAX_RATIO * size, MIN_LIMIT)
    if total > limit:
        raise DataError(f"{label} would expand to {total / 2**20:,.0f} MiB, {total / max(size, 1):,.0f} times its size of "
                        f"{size / 2**20:,.1f} MiB (at most {MAX_RATIO}x or {MIN_LIMIT // 2**20} MiB are extracted): a zip bomb or "
                        f"not a dataset; archive refused, nothing extracted")
    free = shutil.disk_usage(root).free
    if total > free - FREE_MARGIN:
        raise DataError(f"{label} needs {total / 2**30:.2f} GiB but {root} has {free / 2**30:.2f} GiB free (and "
                        f"{FREE_MARGIN // 2**20} MiB are kept free); free some space or pass datasets_dir= another disk; "
                        f"nothing extracted")


def _merge(src: Path, dest: Path) -> None:
    """Move the tree under ``src`` into ``dest`` by renames (same filesystem), creating folders as needed."""
    for folder, _dirs, files in os.walk(src):
        target = dest / Path(folder).relative_to(src)
        target.mkdir(exist_ok=True)
        for name in files:
            os.replace(Path(folder) / name, target / name)


def safe_extract(archive: Path, dest: Path, label: str | None = None, only: str | None = None) -> None:
    """Extract a zip or tar archive into ``dest``, refusing the whole archive before writing anything when a member
    would land outside it (absolute path, ``..``), is a link or device (tar), or the archive would expand past
    MAX_RATIO times its size or past the free space. ``label`` names the archive in messages (default: its path);
    ``only``: the top folder every member must be in (a dataset's archive extracts into its own folder, never a sibling's).

    The members are extracted into a temp folder in ``dest`` and moved into place only when all of them are out: a
    corrupt member, a full disk or an interrupt removes everything this call wrote."""
    archive, dest = Path(archive), Path(dest)
    label = label or str(archive)
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    kind, members, total = _checked_members(archive, root, dest, label, only)
    _check_expansion(archive, root, total, label)
    staging = Path(tempfile.mkdtemp(prefix=".extract-", dir=root))
    try:
        try:
            if kind == "zip":
                with zipfile.ZipFile(archive) as zf:
                    zf.extractall(staging, members=members)
            else:
                with tarfile.open(archive) as tf:
                    tf.extractall(staging, members=members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error) as error:
            raise DataError(f"{label} is corrupt ({type(error).__name__}: {error}); nothing extracted") from None
        _merge(staging, root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def download_dataset(url: str, datasets_dir: Path, keep_archive: bool = False, only: str | None = None) -> Path:
    """Download the archive at ``url`` into a temp file in ``datasets_dir`` and extract it there (every member in the top
    folder ``only`` when given: the dataset's own).

    The temp file never replaces a file of the user's; with ``keep_archive`` it is kept as ``datasets_dir/<name>``
    unless that name is taken."""
    datasets_dir = Path(datasets_dir)
    name = Path(unquote(urlparse(url).path)).name or "dataset.zip"
    if not name.lower().endswith(ARCHIVE_SUFFIXES):
        raise DataError(f"download URL {url} is not a zip/tar archive ({', '.join(ARCHIVE_SUFFIXES)})")
    LOGGER.info(f"dataset not found locally: downloading {url} into {datasets_dir}")
    archive = fetch(url, datasets_dir, name)
    try:
        safe_extract(archive, datasets_dir, label=name, only=only)
        if keep_archive and not (datasets_dir / name).exists():
            os.replace(archive, datasets_dir / name)
    finally:
        archive.unlink(missing_ok=True)
    return datasets_dir
