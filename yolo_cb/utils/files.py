"""Files: atomic writes and auto-incremented run directories."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temp file in the same folder, fsync, then os.replace: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def increment_path(path: Path, exist_ok: bool = False, mkdir: bool = True) -> Path:
    """runs/train/exp -> runs/train/exp2, exp3, ... unless exist_ok; creates the folder."""
    path = Path(path)
    if path.exists() and not exist_ok:
        stem = re.sub(r"\d+$", "", path.name) or path.name
        n = 2
        while (path.parent / f"{stem}{n}").exists():
            n += 1
        path = path.parent / f"{stem}{n}"
    if mkdir:
        path.mkdir(parents=True, exist_ok=True)
    return path


def run_dir(args, mode: str) -> Path:
    """The run directory for `mode` from project=/name=/exist_ok= (runs/<mode>/<name>)."""
    project = Path(args.project) if args.project else Path("runs") / mode
    return increment_path(project / (args.name or "exp"), exist_ok=bool(args.exist_ok))
