"""Downloads: a URL fetched into a folder through a temp file (removed on failure), with a progress bar and a pace check
that ends a stalled transfer. Datasets (yolo_cb/data/download.py) and the official weights (yolo_cb/checkpoints/weights.py)
use it."""

from __future__ import annotations

import os
import time
from pathlib import Path

from yolo_cb.errors import DataError
from yolo_cb.utils.files import create_temp


def download_file(url: str, dest: Path, timeout: float = 60.0, chunk: int = 1 << 16) -> Path:
    """Fetch ``url`` into ``dest`` (atomically: a temp file renamed at the end), with a tqdm bar."""
    dest = Path(dest)
    tmp = fetch(url, dest.parent, dest.name, timeout, chunk)
    os.replace(tmp, dest)
    return dest


def fetch(url: str, folder: Path, name: str, timeout: float = 60.0, chunk: int = 1 << 16) -> Path:
    """Fetch ``url`` into a new temp file ``folder/.<name>.<random>.part`` (removed on failure); returns its path."""
    import urllib.request

    from tqdm import tqdm

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = create_temp(folder, f".{name}.", ".part")
    try:
        request = urllib.request.Request(url, headers={"User-Agent": "yolo-cb"})
        with urllib.request.urlopen(request, timeout=timeout) as response, os.fdopen(fd, "wb") as f:
            total = int(response.headers.get("Content-Length") or 0) or None
            pace = Pace(url, window=timeout)
            with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=f"downloading {name}") as bar:
                while block := response.read1(chunk):  # what has arrived (read() waits for a whole chunk, however slow)
                    f.write(block)
                    bar.update(len(block))
                    pace.check(len(block))
        if total is not None and os.path.getsize(tmp) != total:
            raise OSError(f"download of {url} incomplete: {os.path.getsize(tmp)} of {total} bytes")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


MIN_RATE = 1024  # bytes per second a download must average over each window: a server trickling a byte a minute is stalled


class Pace:
    """Ends a download that delivers less than MIN_RATE bytes per second over a window of `window` seconds (each socket
    read has its own timeout, which a byte every 50 s never reached)."""

    def __init__(self, url: str, window: float):
        self.url, self.window = url, float(window)
        self.start, self.bytes = time.monotonic(), 0

    def check(self, received: int) -> None:
        self.bytes += received
        elapsed = time.monotonic() - self.start
        if elapsed < self.window:
            return
        if self.bytes < MIN_RATE * elapsed:
            raise DataError(f"download of {self.url} stalled: {self.bytes} bytes in the last {elapsed:.0f} s (less than "
                            f"{MIN_RATE} bytes/s); check the server, or download the file yourself")
        self.start, self.bytes = time.monotonic(), 0
