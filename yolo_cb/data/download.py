"""Download a dataset archive over http(s) with a progress bar, and extract it safely."""

from __future__ import annotations

import logging
import os
import tarfile
import tempfile
import zipfile
from pathlib import Path
from urllib.parse import unquote, urlparse

LOGGER = logging.getLogger("yolo_cb")

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")


def is_url(text) -> bool:
    return isinstance(text, str) and urlparse(text).scheme in ("http", "https")


def download_file(url: str, dest: Path, timeout: float = 60.0, chunk: int = 1 << 16) -> Path:
    """Fetch ``url`` into ``dest`` (atomically: a temp file renamed at the end), with a tqdm bar."""
    import urllib.request

    from tqdm import tqdm

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    try:
        request = urllib.request.Request(url, headers={"User-Agent": "yolo-cb"})
        with urllib.request.urlopen(request, timeout=timeout) as response, os.fdopen(fd, "wb") as f:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=f"downloading {dest.name}") as bar:
                while block := response.read(chunk):
                    f.write(block)
                    bar.update(len(block))
        if total is not None and os.path.getsize(tmp) != total:
            raise OSError(f"download of {url} incomplete: {os.path.getsize(tmp)} of {total} bytes")
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest


def _inside(root: Path, name: str) -> bool:
    target = (root / name).resolve()
    return target == root or root in target.parents


def safe_extract(archive: Path, dest: Path) -> None:
    """Extract a zip or tar archive into ``dest``, refusing members that would land outside it
    (absolute paths, ``..``), and links or device files in tars."""
    archive, dest = Path(archive), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                if not _inside(root, info.filename):
                    raise ValueError(f"unsafe path '{info.filename}' in {archive}: it would extract outside {dest}")
            zf.extractall(root)
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tf:
            members = tf.getmembers()
            for m in members:
                if not _inside(root, m.name) or not (m.isfile() or m.isdir()):
                    raise ValueError(f"unsafe member '{m.name}' in {archive}: outside {dest}, or a link/device")
            if hasattr(tarfile, "data_filter"):
                tf.extractall(root, members=members, filter="data")
            else:  # pragma: no cover - Python without extraction filters
                tf.extractall(root, members=members)
    else:
        raise ValueError(f"{archive} is not a zip or tar archive")


def download_dataset(url: str, datasets_dir: Path, keep_archive: bool = False) -> Path:
    """Download the archive at ``url`` into ``datasets_dir`` and extract it there."""
    datasets_dir = Path(datasets_dir)
    name = Path(unquote(urlparse(url).path)).name or "dataset.zip"
    if not name.lower().endswith(ARCHIVE_SUFFIXES):
        raise ValueError(f"download URL {url} is not a zip/tar archive ({', '.join(ARCHIVE_SUFFIXES)})")
    LOGGER.info(f"dataset not found locally: downloading {url} into {datasets_dir}")
    archive = download_file(url, datasets_dir / name)
    try:
        safe_extract(archive, datasets_dir)
    finally:
        if not keep_archive:
            archive.unlink(missing_ok=True)
    return datasets_dir
