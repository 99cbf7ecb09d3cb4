"""The ``cache=disk`` image cache: one ``.npy`` beside each image (for data outside datasets_dir, in yolo-cb's own cache
folder instead: cache_place), written atomically and checked before use.

A cache file is trusted only when it is newer than its image and its header and size say it holds the whole
decoded image (uint8, (h, w, 3) as verification measured it); anything else (empty, truncated, another shape,
left by a full disk or a killed run) is ignored and rebuilt from the image.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from yolo_cb.utils.files import create_temp


def cache_home() -> Path:
    """yolo-cb's own cache folder for data caches: $XDG_CACHE_HOME/yolo_cb/data, else ~/.cache/yolo_cb/data."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "yolo_cb" / "data"


def cache_place(path: Path, datasets_dir: Path | None) -> Path:
    """Where a cache file meant for `path` (beside the data) goes: there when the data's real folder (links followed) lies
    inside `datasets_dir`; otherwise the same name in a folder of cache_home() named by a hash of that real folder, so a
    data YAML (a `path:` linked to `/`, a folder outside datasets_dir) never decides where yolo-cb writes. None: beside."""
    if datasets_dir is None:
        return path
    folder, root = path.parent.resolve(), Path(datasets_dir).resolve()
    if folder == root or root in folder.parents:
        return path
    key = hashlib.sha256(os.fsencode(folder)).hexdigest()[:16]
    return cache_home() / f"{folder.name[:40]}-{key}" / path.name


def npy_path(im_file: str, datasets_dir: Path | None = None) -> Path:
    """The cache file of an image: the same name with the suffix ``.npy`` (where, see cache_place)."""
    return cache_place(Path(im_file).with_suffix(".npy"), datasets_dir)


def _header(f) -> tuple[tuple, bool, np.dtype]:
    """(shape, fortran_order, dtype) of an open .npy file, read from its header only."""
    major, _ = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    return read(f)


def npy_valid(npy: Path, im_file: str, shape: tuple[int, int]) -> bool:
    """Whether ``npy`` is a complete cache of ``im_file`` (decoded size ``shape`` = (h, w)) and not older than it."""
    try:
        st = npy.stat()
        if st.st_mtime_ns < Path(im_file).stat().st_mtime_ns:
            return False
        with open(npy, "rb") as f:
            arr_shape, fortran, dtype = _header(f)
            offset = f.tell()
    except (OSError, ValueError, EOFError):
        return False
    expected = (int(shape[0]), int(shape[1]), 3)
    return (tuple(arr_shape) == expected and dtype == np.uint8 and not fortran
            and st.st_size == offset + int(np.prod(expected)))


def load_npy(npy: Path, shape: tuple[int, int]) -> np.ndarray | None:
    """The cached image, or None when the file is missing, torn or of another shape."""
    try:
        img = np.load(npy, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    return img if img.dtype == np.uint8 and img.shape == (int(shape[0]), int(shape[1]), 3) else None


def save_npy(npy: Path, img: np.ndarray) -> None:
    """Write ``img`` to a temp file beside ``npy`` and rename it into place: a reader never sees half a file.

    Any failure (a full disk, a kill) leaves no file named ``npy``; the temp file is removed on errors."""
    npy.parent.mkdir(parents=True, exist_ok=True)  # a folder of cache_home() the first time
    fd, tmp = create_temp(npy.parent, f".{npy.name}.", ".tmp")
    try:
        img = np.ascontiguousarray(img)
        with os.fdopen(fd, "wb") as f:  # the .npy format by hand: np.save's tofile() loses the errno of a full disk
            np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(img))
            f.write(img.data)
        os.replace(tmp, npy)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
