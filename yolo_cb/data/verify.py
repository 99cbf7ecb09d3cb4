"""Image and label checks, run once per split in threads, with a JSON label cache.

What is checked (a bad image or label never stops a run; it is skipped or fixed, and named):

- images: unreadable, empty, zero-size, truncated (a JPEG must end with the FF D9 marker),
  unsupported suffix; each image is decoded with :func:`imread`, the function the loader uses, so an
  image that passes is one the loader can read, and its size is the decoded one (after EXIF rotation);
- label files (``class cx cy w h`` per line, normalised; a polygon row ``class x1 y1 ... xn yn`` is its bounding
  box): read by :func:`yolo_cb.data.label_file.verify_label`, whose docstring says what skips an image and what is
  fixed; the polygon rows boxed are summed up in one line per split.

A missing or empty label file means a background image. Results are cached in
``<labels folder>.yolo_cb.cache`` beside the labels folder (JSON), keyed by a hash of the
image/label paths, sizes and mtimes; a stale, corrupt or foreign cache is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from yolo_cb.data.label_file import polygons_boxed, verify_label
from yolo_cb.data.npy_cache import cache_home, cache_place
from yolo_cb.errors import DataError, os_reason
from yolo_cb.utils.files import LABEL_CACHE, LIST_FILE, article, atomic_write_text, read_bounded_text, require_regular

LOGGER = logging.getLogger("yolo_cb")

IMG_SUFFIXES = frozenset({".bmp", ".jpeg", ".jpg", ".mpo", ".png", ".tif", ".tiff", ".webp"})
# image types a folder may hold that OpenCV cannot read: listed so the user hears about them
UNSUPPORTED_IMG_SUFFIXES = {".gif", ".heic", ".heif", ".avif", ".jp2", ".ico", ".svg", ".dng", ".pfm"}
CACHE_VERSION = 3  # 2: images verified by decoding them with imread (the loader's decoder), labels read with utf-8-sig;
# 3: polygon rows boxed and counted (label_file.py)
CACHE_SUFFIX = ".yolo_cb.cache"
MAX_LISTED = 10  # problems named in full in the warning; the rest are counted

_unwritable_warned: set[str] = set()


def img2label_path(im_file: str) -> str:
    """The label file of an image: the last ``images`` folder becomes ``labels``, suffix ``.txt``."""
    p = Path(im_file)
    parts = list(p.parent.parts)
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] == "images":
            parts[i] = "labels"
            break
    return str(Path(*parts, p.stem + ".txt")) if parts else p.stem + ".txt"


def list_image_files(img_path, prefix: str = "") -> list[str]:
    """Image files from a folder, a .txt list (one path a line, relative to the list), or a list of those."""
    files: list[str] = []
    for entry in [img_path] if isinstance(img_path, (str, Path)) else img_path:
        p = Path(entry).expanduser()
        if p.is_dir():
            suffixes = IMG_SUFFIXES | UNSUPPORTED_IMG_SUFFIXES
            found = [f for f in p.rglob("*") if f.suffix.lower() in suffixes and not f.is_dir()]
            files += sorted(str(f) for f in without_special_files(found, prefix))
        elif p.suffix.lower() == ".txt" and p.exists():  # a FIFO or a device too: refused by name, never waited on
            for line in read_list(p, prefix=prefix).splitlines():
                line = line.strip()
                if line:
                    f = Path(line).expanduser()
                    files.append(str(f if f.is_absolute() else (p.parent / f).resolve()))
        elif p.is_file():
            files.append(str(p))
        elif p.exists():
            require_regular(p, "split")  # a FIFO, a device: refused by name, never waited on
        else:
            raise FileNotFoundError(f"{prefix}image path '{p}' does not exist (expected a folder, a .txt list or an image)")
    return without_undecodable_names(files, prefix)


def read_list(path: Path, what: str = "image list", each_line: str = "one image path", prefix: str = "", after: str = "") -> str:
    """A list file's text (`what`: its name in messages; `each_line`: what a line holds): a regular file of at most
    LIST_FILE's bytes, in UTF-8 (DataError, one line, otherwise; `after` ends the line, e.g. what was not done)."""
    try:
        return read_bounded_text(path, LIST_FILE, what)
    except UnicodeDecodeError as error:
        raise DataError(f"{prefix}{shown_name(str(path))}: not UTF-8 text (byte {error.object[error.start]:#04x} at position "
                        f"{error.start}); {article(what)} {what} is {each_line} a line, in UTF-8{after}") from None
    except OSError as error:
        raise DataError(f"{prefix}{shown_name(str(path))}: cannot read the {what} ({os_reason(error)}){after}") from None


def without_special_files(found: list[Path], prefix: str = "") -> list[Path]:
    """The regular files of `found` (links to them included); FIFOs, devices, sockets and broken links are left out with one
    warning naming the first and counting them: reading a FIFO would wait for a writer forever."""
    special = [f for f in found if not f.is_file()]
    if special:
        LOGGER.warning(f"{prefix}{len(special)} file(s) skipped: not a regular file (a FIFO, device, socket or broken link), e.g. "
                       f"{shown_name(str(special[0]))}")
    return [f for f in found if f.is_file()]


def shown_name(path: str) -> str:
    """A file name for a message: bytes that are not UTF-8 (kept by Python as surrogates) written as \\xNN escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def without_undecodable_names(files: list[str], prefix: str = "") -> list[str]:
    """``files`` less those whose name is not valid UTF-8 (they cannot be logged, hashed or written to a cache as
    text), with one warning naming the first and counting them."""
    def decodable(f: str) -> bool:
        try:
            f.encode("utf-8")
            return True
        except UnicodeEncodeError:
            return False

    kept = [f for f in files if decodable(f)]
    if len(kept) < len(files):
        bad = next(f for f in files if not decodable(f))
        LOGGER.warning(f"{prefix}{len(files) - len(kept)} image file(s) skipped: the name is not valid UTF-8 (e.g. "
                       f"{shown_name(bad)}); rename them to use them")
    return kept


def imread(im_file: str) -> np.ndarray | None:
    """Decode an image the way training, validation and verification read it: BGR uint8 (h, w, 3) with the EXIF
    orientation applied, or None when it cannot be decoded.

    OpenCV (``cv2.IMREAD_COLOR``, which applies the EXIF orientation) reads it, except a TIFF whose EXIF orientation
    turns it by 90 degrees (OpenCV 5 fails on those): Pillow reads that one and applies the same orientation.
    Pillow is also the fallback for any other image OpenCV cannot decode.
    """
    import cv2

    path = str(im_file)
    if Path(path).suffix.lower() in (".tif", ".tiff") and _exif_orientation(path) in (5, 6, 7, 8):
        return _pil_decode(path)
    img = cv2.imread(path, cv2.IMREAD_COLOR)
    if img is None or img.size == 0:
        img = _pil_decode(path)
    return img


def _exif_orientation(path: str) -> int:
    try:
        from PIL import Image

        with Image.open(path) as im:
            return int(im.getexif().get(0x0112, 1))
    except Exception:  # no Pillow, or a file Pillow cannot parse: let OpenCV try
        return 1


def _pil_decode(path: str) -> np.ndarray | None:
    """Pillow decode with the EXIF orientation applied, as BGR uint8; None when Pillow cannot decode it."""
    from PIL import Image, ImageOps

    try:
        with Image.open(path) as im:
            rgb = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    except Exception:  # PIL raises many types for bad files
        return None
    return np.ascontiguousarray(rgb[..., ::-1]) if rgb.ndim == 3 and rgb.size else None


def verify_image(im_file: str) -> tuple[tuple[int, int] | None, str | None]:
    """``((h, w), None)`` for a usable image (its size as :func:`imread` decodes it), else ``(None, reason)``."""
    path = Path(im_file)
    if path.suffix.lower() not in IMG_SUFFIXES:
        return None, f"unsupported image suffix '{path.suffix}' (supported: {' '.join(sorted(IMG_SUFFIXES))})"
    try:
        st = path.stat()
    except OSError as e:
        return None, f"unreadable image ({e.strerror or e})"
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block the decoder forever, waiting for a writer
        return None, "not a regular file (a FIFO, device or socket)"
    size = st.st_size
    if size == 0:
        return None, "empty image file (0 bytes)"
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.verify()  # structure and checksums, which a decoder may skip over
            fmt = (im.format or "").lower()
    except Exception as e:  # PIL raises many types for bad files
        return None, f"unreadable or corrupt image ({type(e).__name__}: {e})"
    if fmt in ("jpeg", "mpo"):
        with open(path, "rb") as f:
            f.seek(-2, os.SEEK_END)
            if f.read(2) != b"\xff\xd9":
                return None, "truncated JPEG (no end-of-image marker FF D9)"
    img = imread(str(path))  # exactly what the loader will do
    if img is None:
        return None, "unreadable or corrupt image (neither OpenCV nor Pillow could decode it)"
    h, w = img.shape[:2]
    if w < 1 or h < 1:
        return None, f"zero-size image ({w}x{h})"
    return (h, w), None


def verify_pair(im_file: str, lb_file: str, nc: int) -> dict:
    """One cache entry: the image's shape and boxes, or why it is skipped."""
    shape, reason = verify_image(im_file)
    entry = {"im_file": im_file, "shape": list(shape) if shape else None, "labels": [], "missing": False, "notes": [], "corrupt": reason,
             "polygons": 0}
    if reason is None:
        lab = verify_label(lb_file, nc)
        corrupt = f"label {lb_file} {lab['corrupt']}" if lab["corrupt"] else None
        entry.update(labels=lab["labels"].tolist(), missing=lab["missing"], notes=lab["notes"], corrupt=corrupt,
                     polygons=0 if corrupt else lab["polygons"])
    return entry


def files_hash(im_files: list[str], lb_files: list[str], nc: int) -> str:
    """Hash of the image/label paths, sizes and mtimes (and nc): changes when any of them changes."""
    h = hashlib.sha256(f"v{CACHE_VERSION} nc={nc}".encode())
    for f in (*im_files, *lb_files):
        try:
            st = os.stat(f)
            h.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{f}\0missing\n".encode())
    return h.hexdigest()


def cache_path_for(lb_files: list[str]) -> Path:
    """``labels/train`` -> ``labels/train.yolo_cb.cache`` (beside the first label folder)."""
    folder = Path(lb_files[0]).parent
    return folder.parent / (folder.name + CACHE_SUFFIX)


def read_cache(path: Path, expected_hash: str, im_files: list[str]) -> list[dict] | None:
    """The cached entries, or None when the cache is missing, corrupt, foreign or stale."""
    try:
        data = json.loads(read_bounded_text(path, LABEL_CACHE))  # a FIFO planted as the cache is refused (then replaced)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION or data.get("hash") != expected_hash:
        return None
    entries = data.get("entries")
    if not isinstance(entries, list) or len(entries) != len(im_files):
        return None
    keys = {"im_file", "shape", "labels", "notes", "corrupt", "polygons"}
    if not all(isinstance(e, dict) and keys <= e.keys() and e["im_file"] == f for e, f in zip(entries, im_files, strict=True)):
        return None
    return entries


def folder_is_writable(folder: Path) -> bool:
    """Writable for this process *and* not marked read-only: a folder without any write bit counts as
    read-only even for root (who could write to it anyway), so shared read-only datasets stay untouched."""
    try:
        return os.access(folder, os.W_OK) and bool(folder.stat().st_mode & 0o222)
    except OSError:
        return False


def warn_unwritable(folder: Path, what: str, reason: str = "read-only") -> None:
    """Warn once per folder that ``what`` is not saved there."""
    if str(folder) not in _unwritable_warned:
        _unwritable_warned.add(str(folder))
        LOGGER.warning(f"{what} not saved: {folder} is not writable ({reason})")


def write_cache(path: Path, file_hash: str, entries: list[dict]) -> None:
    """Write the cache atomically; an unwritable or read-only folder is warned about once and skipped."""
    if path.parent.parent == cache_home():
        path.parent.mkdir(parents=True, exist_ok=True)  # our own cache folder, the first time
    if not folder_is_writable(path.parent):
        return warn_unwritable(path.parent, "label cache")
    try:
        atomic_write_text(path, json.dumps({"version": CACHE_VERSION, "hash": file_hash, "entries": entries}))
    except OSError as e:
        warn_unwritable(path.parent, "label cache", e.strerror or str(e))


def verify_all(im_files: list[str], lb_files: list[str], nc: int, prefix: str = "", workers: int | None = None) -> list[dict]:
    """Verify every image/label pair in threads, with a progress bar."""
    from tqdm import tqdm

    workers = workers or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = pool.map(verify_pair, im_files, lb_files, [nc] * len(im_files))
        return list(tqdm(results, total=len(im_files), desc=f"{prefix}checking images and labels", leave=False))


def warn_shared_labels(im_files: list[str], lb_files: list[str], prefix: str = "") -> None:
    """One warning when images differing only in suffix (a.jpg, a.png) share one label file: both get its boxes."""
    owners: dict[str, list[str]] = {}
    for im, lb in zip(im_files, lb_files, strict=True):
        owners.setdefault(lb, []).append(im)
    shared = [(lb, ims) for lb, ims in owners.items() if len(ims) > 1]
    if shared:
        lb, ims = shared[0]
        more = f" (and {len(shared) - 1} more label file(s) like it)" if len(shared) > 1 else ""
        LOGGER.warning(f"{prefix}{lb} is the label file of {len(ims)} images: {', '.join(Path(i).name for i in ims)}{more}; "
                       f"each of them gets its boxes: rename the images so that each has its own label file")


def load_labels(im_files: list[str], nc: int, prefix: str = "", cache: bool = True, save_cache: bool = True,
                datasets_dir: Path | None = None) -> tuple[list[dict], dict]:
    """Verified label records for ``im_files`` (cached), and a report.

    Records: ``im_file``, ``shape`` (h, w), ``cls`` (n,) int64, ``bboxes`` (n, 4) float32 normalised
    ``cx cy w h``. The report has the counts (``polygons``: polygon rows boxed), ``from_cache`` and ``cache_file``. Logs
    one summary line, one line counting the polygon rows boxed (when any) and one warning naming each skipped or fixed
    file. ``datasets_dir``: the cache of labels outside it goes to yolo-cb's own cache folder (npy_cache.cache_place);
    None: beside the labels.
    """
    lb_files = [img2label_path(f) for f in im_files]
    warn_shared_labels(im_files, lb_files, prefix)
    path = cache_place(cache_path_for(lb_files), datasets_dir) if lb_files else None
    file_hash = files_hash(im_files, lb_files, nc)
    entries = read_cache(path, file_hash, im_files) if (cache and path) else None
    from_cache = entries is not None
    if entries is None:
        entries = verify_all(im_files, lb_files, nc, prefix)
        if cache and path and save_cache:  # under DDP only rank 0 writes; the others read what it wrote
            write_cache(path, file_hash, entries)
    records, problems = [], []
    n_boxes = n_background = n_corrupt = 0
    for e, lb in zip(entries, lb_files, strict=True):
        if e["corrupt"]:
            n_corrupt += 1
            problems.append(f"{e['im_file']}: skipped, {e['corrupt']}")
            continue
        if e["notes"]:
            problems.append(f"{lb}: fixed, {'; '.join(e['notes'])}")
        labels = np.array(e["labels"], dtype=np.float32).reshape(-1, 5)
        n_boxes += len(labels)
        n_background += len(labels) == 0
        records.append({"im_file": e["im_file"], "shape": tuple(e["shape"]), "cls": labels[:, 0].astype(np.int64), "bboxes": labels[:, 1:]})
    polygons = sum(e["polygons"] for e in entries)
    report = {"images": len(records), "boxes": n_boxes, "backgrounds": n_background, "corrupt": n_corrupt,
              "fixed": len(problems) - n_corrupt, "polygons": polygons, "from_cache": from_cache, "cache_file": str(path) if path else None}
    source = " (from cache)" if from_cache else ""
    LOGGER.info(f"{prefix}{len(records)} images, {n_boxes} boxes, {n_background} backgrounds, {n_corrupt} corrupt{source}")
    if polygons:
        LOGGER.info(f"{prefix}{polygons_boxed(polygons)}")
    if problems:
        listed = "\n".join(f"  {p}" for p in problems[:MAX_LISTED])
        more = f"\n  ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
        LOGGER.warning(f"{prefix}{n_corrupt} image(s) skipped, {len(problems) - n_corrupt} label file(s) fixed:\n{listed}{more}")
    return records, report
