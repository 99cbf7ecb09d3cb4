"""Predict sources -> frames: what `predict(source=...)` accepts, as Ultralytics' predictor loads it.

An image path, a folder, a glob, a video file, a .txt list of paths, a numpy image (HWC BGR), a PIL image (converted to
RGB, as Ultralytics' LoadPilAndNumpy), a torch tensor (BCHW, or CHW for one image: float RGB in 0..1, height and width
multiples of 32, fed to the model as it is, as Ultralytics' LoadTensor), or a list of these. `iter_frames` yields one
Frame per image or video frame; the frames of one tensor share a `group` and are predicted as one batch.
"""

from __future__ import annotations

import glob
import itertools
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import cv2
import numpy as np
import torch
from PIL import Image

from yolo_cb.data.verify import IMG_SUFFIXES, imread
from yolo_cb.errors import ConfigError
from yolo_cb.utils.log import LOGGER

VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".m4v", ".mpeg", ".mpg", ".wmv", ".webm", ".gif")
MEDIA_SUFFIXES = IMG_SUFFIXES | set(VIDEO_SUFFIXES)  # what a folder or glob source yields
TENSOR_STRIDE = 32  # a tensor source's height and width must be multiples of this (it is not letterboxed)


class TensorImages(NamedTuple):
    """The images of one tensor source: (B, 3, H, W) float RGB in 0..1 on the CPU."""

    images: torch.Tensor


class Frame(NamedTuple):
    """One image to predict on: `image` is HWC BGR uint8, or a (3, H, W) float RGB tensor (already model-sized) for a
    tensor source; `frame` the video frame index (None for images); `group` the tensor source it came from (None else);
    for a video frame, `frames` the frames of its video that are read (vid_stride counted)."""

    path: str
    image: np.ndarray | torch.Tensor
    frame: int | None
    group: int | None
    frames: int = 0


class Dataset:
    """What a predictor's callbacks read as `predictor.dataset`, as Ultralytics': `mode` ("image" or "video": of the frame
    being predicted), `frame` (1-based count of the frames read so far from the current video; 0 for images), `frames`
    (the frames of the current video that are read, vid_stride counted; 0 for images), `bs` (images per model call),
    `vid_stride`, and `source` (what predict was given)."""

    def __init__(self, source: Any, bs: int, vid_stride: int = 1):
        self.source, self.bs, self.vid_stride = source, bs, vid_stride
        self.mode, self.frame, self.frames = "image", 0, 0

    def at(self, item: Frame) -> None:
        """Point at `item`, the frame being predicted."""
        video = item.frame is not None
        self.mode = "video" if video else "image"
        self.frame = item.frame // self.vid_stride + 1 if video else 0
        self.frames = item.frames if video else 0

    def __repr__(self) -> str:
        return f"Dataset(mode={self.mode!r}, frame={self.frame}, frames={self.frames}, bs={self.bs})"


def check_tensor(tensor: torch.Tensor) -> TensorImages:
    """A tensor source as Ultralytics checks it: BCHW (CHW gets a batch axis), sides multiples of 32, values 0..1
    (larger values are read as 0..255 and divided, with a warning)."""
    shape = tuple(tensor.shape)
    expected = (f"a torch.Tensor source must be BCHW float RGB in 0..1, e.g. shape (1, 3, 640, 640), with height and width "
                f"divisible by {TENSOR_STRIDE}; got shape {shape}")
    if tensor.ndim == 3:
        tensor = tensor[None]
    if tensor.ndim != 4 or tensor.shape[1] != 3 or tensor.shape[2] % TENSOR_STRIDE or tensor.shape[3] % TENSOR_STRIDE:
        raise ConfigError(expected)
    tensor = tensor.detach().float().cpu()
    if tensor.numel() and float(tensor.max()) > 1.0 + torch.finfo(torch.float32).eps:
        LOGGER.warning(f"a torch.Tensor source should hold values in 0..1, its maximum is {float(tensor.max()):.3g}: divided by 255")
        tensor = tensor / 255.0
    return TensorImages(tensor)


def pil_to_bgr(image: Image.Image) -> np.ndarray:
    """A PIL image as the HWC BGR uint8 array the predictor reads (RGB first, as Ultralytics converts it)."""
    return np.ascontiguousarray(np.asarray(image.convert("RGB"))[:, :, ::-1])


def tensor_to_bgr(image: torch.Tensor) -> np.ndarray:
    """A (3, H, W) float RGB 0..1 tensor as an HWC BGR uint8 array (the Results' original image)."""
    return np.ascontiguousarray((image.permute(1, 2, 0) * 255).clamp(0, 255).round().byte().numpy()[:, :, ::-1])


def expand(source: Any) -> list[Any] | Iterator[Any]:
    """Flatten a source into image/video paths, numpy images and TensorImages (folders, globs, .txt lists expanded; PIL
    images converted): a list, or an iterator where a recursive glob (`**`) is streamed."""
    if isinstance(source, (np.ndarray, TensorImages)):
        return [source]
    if isinstance(source, Image.Image):
        return [pil_to_bgr(source)]
    if isinstance(source, torch.Tensor):
        return [check_tensor(source)]
    if isinstance(source, (list, tuple)):
        parts = [expand(s) for s in source]
        return [item for part in parts for item in part] if all(isinstance(p, list) for p in parts) else itertools.chain(*parts)
    return _expand_path(str(source))


def _expand_path(text: str, reading: tuple[Path, ...] = ()) -> list[str] | Iterator[str]:
    """A path source's items; `reading` are the .txt lists being read, outermost first (one that lists itself, directly
    or through another list, is refused in one line: it recursed until Python's stack ran out)."""
    path = Path(text).expanduser()
    if any(ch in text for ch in "*?[") and not path.exists():
        if "**" in text:  # a tree walked as it is read: its first match predicts at once (`/**/*.jpg` globbed for minutes)
            return _streamed_glob(text)
        matches = sorted(glob.glob(text))
        if not matches:
            raise FileNotFoundError(f"source glob '{text}' matched no files")
        return _media_or_refuse([Path(m) for m in matches], text)
    if path.is_dir():
        return _media_or_refuse(sorted(path.iterdir()), text)
    if path.is_file() and path.suffix.lower() == ".txt":
        return _expand_list(path, reading)
    if path.is_file():
        return [str(path)]
    raise FileNotFoundError(f"source '{text}' does not exist (expected an image, video, folder, glob, .txt list, numpy or PIL "
                            f"image, or a BCHW torch.Tensor)")


def _media_or_refuse(paths: list[Path], text: str) -> list[str]:
    """The image and video files among `paths` of a folder or glob source; none is an error, as in Ultralytics."""
    media = [str(p) for p in paths if p.is_file() and p.suffix.lower() in MEDIA_SUFFIXES]
    if not media:
        raise FileNotFoundError(f"No images or videos found in {text}: source= needs image or video files "
                                f"({', '.join(sorted(MEDIA_SUFFIXES))})")
    return media


def _expand_list(path: Path, reading: tuple[Path, ...]) -> list[str]:
    """The items of a .txt list source: one path (or folder, glob, list) per line, relative to the list's folder."""
    here = path.resolve()
    if here in reading:
        raise FileNotFoundError(f"source list '{path}' lists itself (through {' -> '.join(map(str, (*reading, here)))}): a list "
                                f"names images, folders, globs or other lists, never one it is part of")
    items = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            entry = Path(line).expanduser()
            items.extend(_expand_path(str(entry if entry.is_absolute() or entry.exists() else path.parent / entry), (*reading, here)))
    return items


def _streamed_glob(pattern: str) -> Iterator[str]:
    """The media files a recursive glob matches, in the order the file system lists them; FileNotFoundError when none."""
    found = False
    for match in glob.iglob(pattern, recursive=True):
        if Path(match).suffix.lower() in MEDIA_SUFFIXES and Path(match).is_file():
            found = True
            yield match
    if not found:
        raise FileNotFoundError(f"source glob '{pattern}' matched no files")


def too_many_pixels(path: str) -> str | None:
    """Why `path` is refused before decoding: more pixels than training accepts, read from the header (no decode).

    Training refuses such an image when Pillow opens it to verify it (a DecompressionBombError above
    2 x PIL.Image.MAX_IMAGE_PIXELS, 178,956,970 pixels by default); predict applies the same limit, the same way."""
    import re

    try:
        with Image.open(path):  # lazy: reads the header only, and raises for a decompression bomb
            return None
    except Image.DecompressionBombError as error:
        found = re.search(r"\((\d+) pixels\)", str(error))
        pixels = f"{int(found.group(1)):,} pixels" if found else str(error)
        return (f"{pixels}, more than training accepts ({2 * int(Image.MAX_IMAGE_PIXELS or 0):,}: Pillow's decompression-bomb "
                f"limit, 2 x PIL.Image.MAX_IMAGE_PIXELS); resize it to predict on it")
    except Exception:  # not an image Pillow reads: OpenCV decides, as in training's imread
        return None


def undecodable_name(path: str) -> str | None:
    """`path` written with \\xNN escapes when its name is not valid UTF-8 (OpenCV crashes on such a path), else None."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return os.fsencode(path).decode("utf-8", "backslashreplace")
    return None


def iter_frames(items: Iterable[Any], vid_stride: int = 1) -> Iterator[Frame]:
    """A Frame for every image, tensor image and video frame (every `vid_stride`-th: 0, N, 2N, ...) of expanded `items`
    (expand's); unreadable files are skipped with a warning."""
    for n, item in enumerate(items):
        if isinstance(item, np.ndarray):
            yield Frame(f"image{n}.jpg", item, None, None)
        elif isinstance(item, TensorImages):
            yield from (Frame(f"image{i}.jpg", image, None, n) for i, image in enumerate(item.images))
        elif (shown := undecodable_name(item)) is not None:  # as training does with such names: skipped, named once
            LOGGER.warning(f"skipping {shown}: the file name is not valid UTF-8 (OpenCV cannot open it); rename it to predict on it")
        elif Path(item).suffix.lower() in VIDEO_SUFFIXES:
            yield from _video_frames(item, vid_stride)
        else:
            img = _read_image(item)
            if img is not None:
                yield Frame(item, img, None, None)


def _read_image(path: str) -> np.ndarray | None:
    refused = too_many_pixels(path)
    if refused is not None:
        LOGGER.warning(f"skipping {path}: {refused}")
        return None
    img = imread(path)  # as training reads it: EXIF orientation applied
    if img is None:
        LOGGER.warning(f"skipping unreadable image {path}")
    return img


def _video_frames(path: str, stride: int = 1) -> Iterator[Frame]:
    """Frames 0, stride, 2 * stride, ... of the video (the others are grabbed, not decoded into images)."""
    capture = cv2.VideoCapture(path)
    if not capture.isOpened():
        LOGGER.warning(f"skipping unreadable video {path}")
        return
    try:
        frame_index = 0
        read = -(-int(capture.get(cv2.CAP_PROP_FRAME_COUNT) or 0) // stride)  # frames read: ceil(total / stride)
        while True:
            ok, frame = capture.read() if frame_index % stride == 0 else (capture.grab(), None)
            if not ok:
                break
            if frame is not None:
                yield Frame(path, frame, frame_index, None, read)
            frame_index += 1
        if frame_index == 0:
            LOGGER.warning(f"skipping unreadable video {path} (no frames decoded)")
    finally:
        capture.release()


def batches(frames: Iterator[Frame], size: int) -> Iterator[list[Frame]]:
    """Frames in batches of `size`; the images of one tensor source form one batch of their own (as Ultralytics runs a
    tensor: its batch axis is the batch)."""
    batch: list[Frame] = []
    for item in frames:
        if batch and (item.group != batch[-1].group or (item.group is None and len(batch) == size)):
            yield batch
            batch = []
        batch.append(item)
    if batch:
        yield batch
