"""YOLO-format detection dataset: images + ``labels/*.txt``, verified, cached, augmented."""

from __future__ import annotations

import logging
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np
import torch

from yolo_cb.data.npy_cache import load_npy, npy_path, npy_valid, save_npy
from yolo_cb.data.recent import RecentImages
from yolo_cb.data.transforms import MixUp, Mosaic, build_transforms
from yolo_cb.data.verify import folder_is_writable, imread, list_image_files, load_labels
from yolo_cb.errors import os_reason
from yolo_cb.utils.memory import available_memory

LOGGER = logging.getLogger("yolo_cb")
_CACHE_LOCK = threading.Lock()  # the caching threads' one warning about a failed .npy write


def normalise_cache_mode(cache) -> str | None:
    """``False``/``None``/'false' -> None; ``True``/'ram' -> 'ram'; 'disk' -> 'disk'."""
    if cache is None or cache is False or str(cache).lower() in ("false", "none", "", "0"):
        return None
    if cache is True or str(cache).lower() in ("true", "ram", "1"):
        return "ram"
    if str(cache).lower() == "disk":
        return "disk"
    raise ValueError(f"cache={cache!r} is not one of false, ram, disk")


def keep_classes(labels: list[dict], classes) -> None:
    """Drop, in place, every box whose class is not in `classes` (an image left with none trains as background)."""
    wanted = np.asarray([classes] if isinstance(classes, int) else list(classes), dtype=np.int64)
    for label in labels:
        keep = np.isin(label["cls"].reshape(-1).astype(np.int64), wanted)
        label["cls"], label["bboxes"] = label["cls"][keep], label["bboxes"][keep]


class YOLODataset(torch.utils.data.Dataset):
    """Detection dataset over ``img_path`` (folder, .txt list, or a list of those).

    Labels live beside the images with the last ``/images/`` replaced by ``/labels/`` and a
    ``.txt`` suffix; each line is ``class cx cy w h`` normalised to the image.
    ``hyp`` is any object with the augmentation settings as attributes (mosaic, mixup, degrees,
    translate, scale, shear, fliplr, flipud, hsv_h, hsv_s, hsv_v).
    A sample (``dataset[i]``) is a dict: ``img`` uint8 tensor (3, H, W) RGB, ``cls`` (n,) int64,
    ``bboxes`` (n, 4) float32 ``cx cy w h`` in pixels of ``img``, ``im_file``, ``ori_shape``
    (h0, w0) and ``ratio_pad`` (ratio, (pad_w, pad_h)); :func:`yolo_cb.data.loading.loader.collate_fn`
    batches them.
    """

    def __init__(self, img_path, imgsz, names, augment, hyp, rect=False, batch_size=16, stride=32,
                 cache=False, fraction=1.0, prefix="train: ", write_caches=True, datasets_dir=None, defer_colour=False):
        """datasets_dir: caches of data outside it go to yolo-cb's own cache folder (npy_cache.cache_place); None: beside.
        defer_colour: a sample carries its HSV gains (``hsv_gains``) for the training device instead of its colour."""
        super().__init__()
        self.imgsz, self.augment, self.hyp, self.rect = int(imgsz), bool(augment), hyp, bool(rect)
        self.names = dict(enumerate(names)) if isinstance(names, (list, tuple)) else dict(names)
        self.batch_size, self.stride, self.prefix = int(batch_size), int(stride), prefix
        self.mosaic_closed = False  # the final no-augmentation stage is on (close_mosaic)
        self.partners: np.ndarray | None = None  # while a loader task is made: the indices its mosaic partners come from
        self.recent: RecentImages | None = None  # images decoded a moment ago (keep_decoded; a training loader's pool)
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction={fraction} must be in (0, 1]")
        im_files = list_image_files(img_path, prefix)
        if fraction < 1:
            im_files = im_files[: max(1, round(len(im_files) * fraction))]
        if not im_files:
            raise FileNotFoundError(f"{prefix}no images found in {img_path}")
        self.write_caches = bool(write_caches)  # False on DDP ranks > 0: they read the caches rank 0 wrote
        self.datasets_dir = datasets_dir
        self.labels, self.report = load_labels(im_files, len(self.names), prefix, save_cache=self.write_caches, datasets_dir=datasets_dir)
        if not self.labels:
            raise FileNotFoundError(f"{prefix}no usable image in {img_path} ({len(im_files)} found, all skipped: see the warning above)")
        if getattr(hyp, "classes", None) is not None:  # classes=[...]: only those classes' boxes, as Ultralytics (images stay)
            keep_classes(self.labels, hyp.classes)
        if getattr(hyp, "single_cls", False):  # every class is class 0, 'item' (checked above against the YAML's names)
            for label in self.labels:
                label["cls"] = np.zeros_like(label["cls"])
            self.names = {0: "item"}
        if self.rect:
            self._sort_by_aspect_ratio()
        self.cache_mode = normalise_cache_mode(cache)
        self.ims: list = [None] * len(self.labels)
        self._disk_cache_failed = False  # set by the first failed .npy write (a full disk): no more writes
        if self.cache_mode:
            self.cache_images()
        self.transforms = build_transforms(self, self.imgsz, hyp, self.augment, rect=self.rect, defer_colour=defer_colour)

    @property
    def im_files(self) -> list[str]:
        return [lb["im_file"] for lb in self.labels]

    def __len__(self) -> int:
        return len(self.labels)

    # --- rectangular batches -------------------------------------------------------------------
    def _sort_by_aspect_ratio(self):
        """Sort by h/w and give each batch one shape: long side imgsz, short side the smallest stride multiple."""
        aspect = np.array([lb["shape"][0] / lb["shape"][1] for lb in self.labels])
        order = np.argsort(aspect, kind="stable")
        self.labels = [self.labels[i] for i in order]
        aspect = aspect[order]
        n_batches = math.ceil(len(aspect) / self.batch_size)
        self.batch_shapes = []
        for b in range(n_batches):
            ar = aspect[b * self.batch_size : (b + 1) * self.batch_size]
            lo, hi = ar.min(), ar.max()
            h_gain, w_gain = (hi, 1.0) if hi < 1 else (1.0, 1 / lo) if lo > 1 else (1.0, 1.0)
            shape = [math.ceil(self.imgsz * g / self.stride - 1e-6) * self.stride for g in (h_gain, w_gain)]
            self.batch_shapes.append(tuple(shape))
        self.batch_index = np.arange(len(aspect)) // self.batch_size

    # --- images --------------------------------------------------------------------------------
    def _read(self, i: int) -> np.ndarray:
        f = self.labels[i]["im_file"]
        if self.cache_mode == "disk":
            img = load_npy(npy_path(f, self.datasets_dir), self.labels[i]["shape"])  # a torn or stale cache file: read the image instead
            if img is not None:
                return img
        return self._read_file(f)

    def _read_file(self, f: str) -> np.ndarray:
        img = imread(f)  # the decoder verification used
        if img is None:
            raise FileNotFoundError(f"{self.prefix}image {f} could not be read (it passed verification: was it changed?)")
        return img

    def _resize(self, img: np.ndarray) -> np.ndarray:
        """Resize so the long side is imgsz."""
        h0, w0 = img.shape[:2]
        r = self.imgsz / max(h0, w0)
        if r != 1:
            size = (min(max(1, round(w0 * r)), self.imgsz), min(max(1, round(h0 * r)), self.imgsz))
            interp = cv2.INTER_LINEAR if (self.augment or r > 1) else cv2.INTER_AREA
            img = cv2.resize(img, size, interpolation=interp)
        return img

    def load_image(self, i: int) -> tuple[np.ndarray, tuple[int, int]]:
        """The image (BGR, long side imgsz) and its original (h0, w0): cached, decoded a moment ago, or decoded now."""
        shape = self.labels[i]["shape"]
        if self.ims[i] is not None:
            return self.ims[i], shape
        img = self.recent.get(i) if self.recent is not None else None
        if img is None:
            img = self._resize(self._read(i))
            if self.recent is not None:
                self.recent.put(i, img)
        return img, shape

    def keep_decoded(self, count: int) -> None:
        """Keep the last `count` images decoded (within recent.MAX_BYTES) for mosaic partners; not with cache=ram."""
        self.recent = RecentImages(count) if count > 0 and self.cache_mode != "ram" else None

    @property
    def draws_partners(self) -> bool:
        """Whether samples draw mosaic / mixup partners (then the loader gives each batch a pool of them)."""
        return any(isinstance(t, (Mosaic, MixUp)) and t.p > 0 for t in self.transforms)

    def cache_images(self):
        """Decode (and resize) every image once: into RAM, or as .npy beside each image for 'disk'."""
        from tqdm import tqdm

        if self.cache_mode == "disk":
            folders = {Path(lb["im_file"]).parent for lb in self.labels}
            read_only = sorted(str(f) for f in folders if not folder_is_writable(f))
            if read_only:
                LOGGER.warning(f"{self.prefix}cache=disk needs writable image folders; {read_only[0]} is read-only: not caching")
                self.cache_mode = None
                return
        elif not self._ram_fits():
            self.cache_mode = None
            return

        def work(i):
            if self.cache_mode == "ram":
                self.ims[i] = self._resize(self._read(i))
                return self.ims[i].nbytes
            return self._cache_to_disk(i)

        with ThreadPoolExecutor(max_workers=4) as pool:
            total = sum(tqdm(pool.map(work, range(len(self))), total=len(self), desc=f"{self.prefix}caching images ({self.cache_mode})", leave=False))
        LOGGER.info(f"{self.prefix}cached {len(self)} images ({total / 2**30:.2f} GB, {self.cache_mode})")

    def _cache_to_disk(self, i: int) -> int:
        """Make image i's .npy unless a complete, fresh one is there (a torn one is rebuilt); returns its size.

        A write that fails (a full disk) leaves no .npy, warns once, and the image is read from its file."""
        im_file, shape = self.labels[i]["im_file"], self.labels[i]["shape"]
        npy = npy_path(im_file, self.datasets_dir)
        if npy_valid(npy, im_file, shape):
            return npy.stat().st_size
        if not self.write_caches or self._disk_cache_failed:  # another rank writes the .npy files, or the disk is full
            return 0
        try:
            save_npy(npy, self._read_file(im_file))
        except OSError as error:
            with _CACHE_LOCK:
                if not self._disk_cache_failed:
                    self._disk_cache_failed = True
                    LOGGER.warning(f"{self.prefix}cache=disk: cannot write {npy} ({os_reason(error)}); the images without a "
                                   f"cache file are read from their files")
            return 0
        return npy.stat().st_size

    def _ram_fits(self, headroom: float = 0.5) -> bool:
        """Whether the resized images fit in ``headroom`` of the memory this process may take (free memory, the cgroup's
        limit, ulimit -v: utils/memory.py), estimated from a sample."""
        available = available_memory()
        if available is None:  # nothing to read (not Linux / POSIX): assume it fits
            return True
        step = max(1, len(self) // 30)
        per_image = np.mean([(self.imgsz / max(lb["shape"])) ** 2 * lb["shape"][0] * lb["shape"][1] * 3 for lb in self.labels[::step]])
        needed = per_image * len(self)
        if needed > headroom * available:
            LOGGER.warning(f"{self.prefix}cache=ram needs ~{needed / 2**30:.1f} GB but {available / 2**30:.1f} GB are free: not caching")
            return False
        return True

    # --- samples -------------------------------------------------------------------------------
    def get_image_and_label(self, i: int) -> dict:
        """Image i resized (long side imgsz) with its boxes as pixel xyxy: the input of the transforms."""
        img, (h0, w0) = self.load_image(i)
        h, w = img.shape[:2]
        label = self.labels[i]
        xywh = label["bboxes"]
        boxes = np.empty((len(xywh), 4), dtype=np.float32)
        boxes[:, 0] = (xywh[:, 0] - xywh[:, 2] / 2) * w
        boxes[:, 1] = (xywh[:, 1] - xywh[:, 3] / 2) * h
        boxes[:, 2] = (xywh[:, 0] + xywh[:, 2] / 2) * w
        boxes[:, 3] = (xywh[:, 1] + xywh[:, 3] / 2) * h
        sample = {
            "img": img, "cls": label["cls"].copy(), "bboxes": boxes,
            "areas": (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]),
            "im_file": label["im_file"], "ori_shape": (h0, w0),
            "ratio_pad": (self.imgsz / max(h0, w0), (0.0, 0.0)), "mosaic": False,
        }
        if self.rect:
            sample["rect_shape"] = self.batch_shapes[self.batch_index[i]]
        return sample

    def __getitem__(self, i: int) -> dict:
        """Sample i, augmented with numpy's global RNG as it stands; ``img`` a contiguous (3, H, W) tensor."""
        sample = self._make(i)
        sample["img"] = sample["img"].contiguous()
        return sample

    def loader_item(self, i: int, partners: np.ndarray | None, closed: bool) -> dict:
        """Sample i as a loader task asks for it (numpy's RNG already seeded for it): mosaic / mixup partners drawn from
        `partners` (None: any image), the final stage on when `closed`. ``img`` is a (3, H, W) view of an (H, W, 3)
        array: the channels_last layout, which collate copies as it is."""
        if closed and not self.mosaic_closed:
            self.close_mosaic()  # a worker's copy of the dataset: the stage switch comes with the task
        self.partners = partners
        try:
            return self._make(i)
        finally:
            self.partners = None

    def draw_partners(self, n: int) -> np.ndarray:
        """`n` dataset indices for mosaic / mixup: from the current task's pool, else from every image."""
        if self.partners is None:
            return np.random.randint(0, len(self), n)
        return self.partners[np.random.randint(0, len(self.partners), n)]

    def _make(self, i: int) -> dict:
        sample = self.get_image_and_label(i)
        for t in self.transforms:
            sample = t(sample)
        return self.format(sample)

    @staticmethod
    def format(sample: dict) -> dict:
        """To the batchable form: RGB uint8 tensor (3, H, W) over an (H, W, 3) array; boxes as pixel cx cy w h; the HSV
        gains left for the device (``hsv_gains``) when the sample has them."""
        img = cv2.cvtColor(sample["img"], cv2.COLOR_BGR2RGB)
        b = sample["bboxes"].reshape(-1, 4)
        xywh = np.stack([(b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2, b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]], 1)
        gains = {"hsv_gains": torch.from_numpy(sample["hsv_gains"])} if "hsv_gains" in sample else {}
        return {**gains,
            "img": torch.from_numpy(img).permute(2, 0, 1), "cls": torch.from_numpy(sample["cls"].astype(np.int64)),
            "bboxes": torch.from_numpy(xywh.astype(np.float32)), "im_file": sample["im_file"],
            "ori_shape": tuple(sample["ori_shape"]), "ratio_pad": sample["ratio_pad"], "mosaic": bool(sample["mosaic"]),
        }

    def close_mosaic(self) -> None:
        """Final no-augmentation stage (YOLOX): no mosaic, mixup or affine; letterbox + flip + HSV stay."""
        for t in self.transforms:
            if hasattr(t, "close"):
                t.close()
        self.mosaic_closed = True
