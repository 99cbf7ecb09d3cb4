"""Predict: source -> letterbox -> model (any backend) -> NMS -> Results, saved as annotated images / YOLO txt.

    results = Predictor({"conf": 0.3})("images/", model="best.onnx")        # list of Results
    for r in Predictor()("video.mp4", model="best.pt", stream=True): ...   # generator, frame by frame

Sources (yolo_cb/prediction/sources.py): an image path, a folder, a glob, a video file, a .txt list of paths, a numpy image
(HWC BGR), a PIL image, a BCHW float RGB tensor in 0..1 (sides multiples of 32, not letterboxed), or a list of these.
Images are predicted in batches of `batch` (1 unless given, as in Ultralytics; a fixed-batch export: its batch).
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from yolo_cb.callbacks import Callbacks
from yolo_cb.data.transforms import letterbox
from yolo_cb.data.verify import IMG_SUFFIXES
from yolo_cb.errors import ConfigError
from yolo_cb.nn.postprocess import augmented_predictions, postprocess, scale_boxes
from yolo_cb.prediction.backend import Backend, load_backend
from yolo_cb.prediction.embed import embeddings, layer_names
from yolo_cb.prediction.results import Results, encode_image
from yolo_cb.prediction.sources import Dataset, Frame, batches, expand, iter_frames, tensor_to_bgr
from yolo_cb.prediction.tracking import Tracks, tracks_for
from yolo_cb.settings.config import Config, get_config
from yolo_cb.utils.files import atomic_write_bytes, create_temp, own_folder, run_dir
from yolo_cb.utils.log import LOGGER
from yolo_cb.utils.signal_stack import beat, ends_process, signal_deadline

PREDICT_CONF = 0.25  # confidence threshold when conf is empty
PREDICT_BATCH = 1  # images per model call when batch= is not given (Ultralytics' predict default), not training's batch


def preprocess(img: np.ndarray, imgsz: int | tuple[int, int], auto: bool = False, stride: int = 32) -> tuple[torch.Tensor, tuple]:
    """HWC BGR uint8 -> letterboxed CHW RGB float tensor in [0, 1], and ratio_pad = (ratio, (pad_w, pad_h))."""
    shape = (imgsz, imgsz) if isinstance(imgsz, int) else tuple(imgsz)
    if img.ndim == 2:
        img = cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
    elif img.shape[2] == 4:
        img = cv2.cvtColor(img, cv2.COLOR_BGRA2BGR)
    boxed, ratio, pad = letterbox(img, new_shape=shape, auto=auto, stride=stride)
    tensor = torch.from_numpy(np.ascontiguousarray(boxed[..., ::-1].transpose(2, 0, 1))).float().div_(255.0)
    return tensor, (ratio, tuple(pad))


def level_strides(backend: Backend) -> tuple[int, ...]:
    """The output levels' strides of a PyTorch backend's model, for augment=True; other backends are refused (an export
    runs one fixed graph, where Ultralytics ignores augment= silently)."""
    strides = getattr(getattr(backend, "model", None), "strides", None)
    if getattr(backend, "kind", None) != "pytorch" or not strides:
        raise ConfigError(f"augment=True (test-time augmentation) needs a PyTorch model (.pt, a model YAML loaded with weights); "
                          f"{backend.path or type(backend).__name__} is a {getattr(backend, 'kind', 'other')} model: drop augment=")
    return tuple(int(s) for s in strides)


def tta_predictions(backend: Backend, x: torch.Tensor) -> torch.Tensor:
    """backend's decoded predictions of x over the test-time augmentation passes (yolo_cb.nn.postprocess), joined."""
    return augmented_predictions(backend, x, level_strides(backend))


def term_as_exit() -> Any:
    """Make SIGTERM raise SystemExit(143) (as Ctrl-C raises KeyboardInterrupt) so that open videos are finalised;
    returns the handler to restore, or None when nothing was changed (not the main thread, or a handler of the user's)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None

    @ends_process
    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, handler)


class Predictor:
    """Runs a model over a source; see the module docstring. Events: on_predict_start, on_predict_batch_start,
    on_predict_postprocess_end (predictor.results), on_predict_batch_end, on_predict_end."""

    def __init__(self, args: Config | dict | None = None, callbacks: Callbacks | None = None):
        self.args = args if isinstance(args, Config) else get_config({"mode": "predict", **(args or {})}, base={"batch": PREDICT_BATCH})
        self.callbacks = callbacks if callbacks is not None else Callbacks()
        self.backend: Backend | None = None
        self.model: Backend | None = None  # the loaded model (as Ultralytics' predictor.model): names, stride, device, __call__
        self._model_source = None  # what `model` was loaded from (a path or an nn.Module)
        self.source = None
        self.dataset: Dataset | None = None  # what is being predicted: mode ("image" / "video"), frame, frames, bs (Ultralytics')
        self.trackers: Tracks | None = None  # track mode: the trackers, kept across calls with persist=True
        self.save_dir: Path | None = None
        self.batch: tuple[list[str], list[np.ndarray], list[str]] | None = None  # (paths, BGR images, "image 1/3 path: " strings)
        self.results: list[Results] = []
        self.seen = 0
        self._described = 0  # source items described so far in this call (predictor.batch's third element)
        self.imgsz: tuple[int, int] | None = None
        self._writers: dict[str, tuple[cv2.VideoWriter, Path, Path]] = {}  # source -> (writer, its temp file, the video)
        self._claimed: dict[tuple[str, str], str] = {}  # (kind, output file name) -> the source it was given to

    def run_callbacks(self, event: str) -> None:
        self.callbacks.run(event, self)

    def add_callback(self, event: str, fn, on_error: str = "raise") -> None:
        """Register `fn(predictor)` on `event` (Ultralytics' predictor.add_callback)."""
        self.callbacks.add_callback(event, fn, on_error=on_error)

    @property
    def conf(self) -> float:
        return PREDICT_CONF if self.args.conf is None else float(self.args.conf)

    def setup_model(self, model: Any) -> Backend:
        if model is None and self.backend is not None:
            model = self._model_source  # reuse the model of the previous call
        model = model if model is not None else self.args.model
        if model is None:
            raise ValueError("predict needs a model: a .pt checkpoint, an .onnx / .torchscript file or an nn.Module")
        if self.backend is None or model is not self._model_source:
            self.backend = self.model = load_backend(model, device=self.args.device, fp16=bool(self.args.half), trust=bool(self.args.trust),
                                                     imgsz=self.args.imgsz)
            self._model_source = model
            from torchvision.ops import batched_nms  # noqa: F401 - NMS's kernel: its import (seconds) is set-up, not a frame's postprocess
        size = self.args.imgsz
        self.imgsz = self.backend.imgsz or ((size, size) if isinstance(size, int) else tuple(size))
        return self.backend

    def __call__(self, source: Any = None, model: Any = None, stream: bool = False):
        gen = self.stream_inference(source, model)
        return gen if stream else list(gen)

    def batch_size(self, backend: Backend) -> int:
        """Images per model call: batch= (1 unless given, as Ultralytics' predict); a fixed-batch export runs its own
        batch, and another batch= given for it is refused (it would be ignored)."""
        wanted = int(self.args.batch or PREDICT_BATCH)
        if backend.batch and wanted not in (1, backend.batch):
            raise ConfigError(f"invalid value for 'batch': {wanted}; the model {backend.path or ''} was exported for a fixed batch of "
                              f"{backend.batch}: predict with batch={backend.batch} (or 1), or re-export with dynamic=True or batch={wanted}")
        return backend.batch or wanted

    @torch.no_grad()
    def stream_inference(self, source: Any = None, model: Any = None) -> Iterator[Results]:
        source = source if source is not None else self.args.source
        if source is None:
            raise ConfigError(f"{self.args.mode} needs a source: an image, folder, glob, video, .txt list, numpy or PIL image, or a BCHW tensor")
        backend = self.setup_model(model)
        if self.args.augment:
            level_strides(backend)  # a model that cannot take other input sizes: refused before any work
        if self.args.embed:
            layer_names(backend, self.args.embed)  # a model without readable layers, or a layer it lacks: refused at once
        self.source = source
        items = expand(source)
        if isinstance(items, list):
            count = sum(len(item.images) if hasattr(item, "images") else 1 for item in items)
        else:  # a streamed glob: its first match (or none: FileNotFoundError) is read here, before a run dir is made
            first = next(items, None)
            items, count = itertools.chain([first] if first is not None else [], items), None
        size = self.batch_size(backend)
        if self.args.save or self.args.save_txt or self.args.save_crop:
            self.save_dir = self._make_save_dir()
        self.seen, self._described, self._claimed = 0, 0, {}
        self.dataset = Dataset(source, size, self.args.vid_stride)
        if self.args.mode == "track":
            self.trackers = tracks_for(self.trackers, self.args.tracker, bool(self.args.persist))
        self.run_callbacks("on_predict_start")
        previous_term = term_as_exit()
        try:
            with signal_deadline():  # a model call stuck in C++ after a signal: the process still ends (utils/signal_stack.py)
                for batch in batches(iter_frames(items, self.args.vid_stride), size):
                    self.dataset.at(batch[-1])
                    yield from self._embed_batch(batch, backend) if self.args.embed else self._predict_batch(batch, backend, count)
                    beat()
        finally:  # reached on Ctrl-C and, through term_as_exit, on SIGTERM: the videos are finalised and stay readable
            self._finish_videos()
            if previous_term is not None and threading.current_thread() is threading.main_thread():  # (a generator may be closed elsewhere)
                signal.signal(signal.SIGTERM, previous_term)
        if self.save_dir is not None:
            LOGGER.info(f"predict: {self.seen} image(s) -> {self.save_dir}")
        self.run_callbacks("on_predict_end")

    def _predict_batch(self, batch: list[Frame], backend: Backend, count: int) -> list[Results]:
        """One batch through the events: preprocess, model, postprocess, save; returns its Results."""
        paths, frame_ids = [f.path for f in batch], [f.frame for f in batch]
        images = [tensor_to_bgr(f.image) if isinstance(f.image, torch.Tensor) else f.image for f in batch]
        self.batch = (paths, images, [self._describe(p, f, count) for p, f in zip(paths, frame_ids, strict=True)])
        self.run_callbacks("on_predict_batch_start")
        t0 = time.perf_counter()
        tensors, ratio_pads = zip(*(self.prepare(f.image, backend) for f in batch), strict=True)
        x = torch.stack(tensors).to(backend.device)
        t1 = time.perf_counter()
        preds = tta_predictions(backend, x) if self.args.augment else backend(x)
        t2 = time.perf_counter()
        self.results = self.postprocess(preds, images, paths, frame_ids, ratio_pads)
        if self.args.mode == "track":  # each Results keeps its tracked boxes, with their ids
            self.results = self.trackers.update(self.results, bool(self.args.persist))
        t3 = time.perf_counter()
        n = len(images)
        speed = {"preprocess": (t1 - t0) * 1e3 / n, "inference": (t2 - t1) * 1e3 / n, "postprocess": (t3 - t2) * 1e3 / n}
        for r in self.results:
            r.speed = dict(speed)
        self.run_callbacks("on_predict_postprocess_end")
        for r in self.results:
            self.save_result(r)
            if self.args.show:
                r.show(line_width=self.args.line_width, labels=bool(self.args.show_labels), conf=bool(self.args.show_conf))
        self.seen += n
        if self.args.verbose:
            for r, text in zip(self.results, self.batch[2], strict=True):
                LOGGER.info(f"{text}{r.verbose() or '(no detections), '}{speed['inference']:.1f}ms")
        self.run_callbacks("on_predict_batch_end")
        return self.results

    def _embed_batch(self, batch: list[Frame], backend: Backend) -> list[torch.Tensor]:
        """embed=: one feature vector per image of the batch (yolo_cb/prediction/embed.py) instead of Results; the
        batch's events but on_predict_postprocess_end fire (there is no postprocess), as in Ultralytics."""
        paths = [f.path for f in batch]
        images = [tensor_to_bgr(f.image) if isinstance(f.image, torch.Tensor) else f.image for f in batch]
        self.batch = (paths, images, [self._describe(p, f.frame, None) for p, f in zip(paths, batch, strict=True)])
        self.run_callbacks("on_predict_batch_start")
        x = torch.stack([self.prepare(f.image, backend)[0] for f in batch]).to(backend.device)
        vectors = embeddings(backend, x, self.args.embed)
        self.seen += len(batch)
        self.run_callbacks("on_predict_batch_end")
        return vectors

    def prepare(self, image: np.ndarray | torch.Tensor, backend: Backend) -> tuple[torch.Tensor, tuple]:
        """The model input of one image and its ratio_pad: a tensor source's image as it is (model-sized already, as
        Ultralytics feeds it), any other letterboxed to imgsz."""
        if isinstance(image, torch.Tensor):
            return image, (1.0, (0.0, 0.0))
        return preprocess(image, self.imgsz, auto=False, stride=backend.stride)

    def _describe(self, path: str, frame: int | None, count: int | None) -> str:
        """The per-image line Ultralytics puts third in predictor.batch: 'image 3/10 path: ' or 'video 1/1 (frame 5) path: '."""
        self._described += frame in (None, 0)  # a new source item starts
        kind = "image" if frame is None else "video"
        return f"{kind} {self._described}/{count or '?'}{'' if frame is None else f' (frame {frame + 1})'} {path}: "

    def postprocess(self, preds: torch.Tensor, images: list[np.ndarray], paths: list[str], frame_ids: list, ratio_pads) -> list[Results]:
        args = self.args
        dets = postprocess(preds, conf=self.conf, iou=args.iou, max_det=args.max_det, agnostic=bool(args.agnostic_nms), classes=args.classes,
                           end2end=getattr(self.backend, "end2end", None))
        results = []
        for det, img, path, frame, ratio_pad in zip(dets, images, paths, frame_ids, ratio_pads, strict=True):
            det = scale_boxes(det.cpu(), ratio_pad, img.shape[:2]) if len(det) else det.cpu().reshape(0, 6)
            results.append(Results(img, path, self.backend.names, boxes=det, frame=frame,
                                   save_dir=str(self.save_dir) if self.save_dir is not None else None))
        return results

    # --- saving -----------------------------------------------------------------------------
    def _make_save_dir(self) -> Path:
        return run_dir(self.args, "predict")

    def _claim(self, kind: str, name: str, source: str) -> str:
        """The output file name for `source` in save_dir: `name`, or, when another source already has it (a.jpg and
        a.png both give labels/a.txt; x/a.jpg and y/a.jpg both give a.jpg), `name` tagged with the source's suffix
        (a_png.txt), then numbered; the rename is named in one warning."""
        if self._claimed.setdefault((kind, name), source) == source:
            return name
        base, ext = os.path.splitext(name)
        tag, n = Path(source).suffix[1:].lower() or "file", 1
        candidate = f"{base}_{tag}{ext}"
        while self._claimed.setdefault((kind, candidate), source) != source:
            n += 1
            candidate = f"{base}_{tag}{n}{ext}"
        LOGGER.warning(f"{name} is already the {kind} output of {self._claimed[(kind, name)]}: the one of {source} is {candidate}")
        return candidate

    def save_result(self, r: Results) -> None:
        if self.save_dir is None:
            return
        stem = Path(r.path).stem
        txt_stem = stem if r.frame is None else f"{stem}_{r.frame}"
        # save_dir may be an earlier run's folder (exist_ok=True): every file and folder in it is written without following
        # a link planted there (utils/files.py: own_folder, atomic writes, exclusive creates), so nothing lands elsewhere
        if self.args.save_txt:  # no boxes: an empty file, as Ultralytics
            txt = own_folder(self.save_dir, "labels") / self._claim("labels", f"{txt_stem}.txt", r.path)
            r.save_txt(txt, save_conf=bool(self.args.save_conf))
        if self.args.save_crop:
            r.save_crop(own_folder(self.save_dir, "crops"), file_name=txt_stem)
        if not self.args.save:
            return
        plotted = r.plot(line_width=self.args.line_width, labels=bool(self.args.show_labels), conf=bool(self.args.show_conf))
        if r.frame is None:
            suffix = Path(r.path).suffix.lower()
            target = self.save_dir / self._claim("image", Path(r.path).name if suffix in IMG_SUFFIXES else f"{stem}.jpg", r.path)
            data = encode_image(target, plotted)
            if data is None:
                LOGGER.warning(f"could not write {target}")
            else:
                atomic_write_bytes(target, data)
            return
        if r.path not in self._writers:
            self._writers[r.path] = self._video_writer(r.path, stem, plotted.shape[:2])
        self._writers[r.path][0].write(plotted)

    def _video_writer(self, source: str, stem: str, size: tuple[int, int]) -> tuple[cv2.VideoWriter, Path, Path]:
        """A writer into a new temp file beside the video (created exclusively: never through a link), renamed onto the
        video when predict ends (_finish_videos)."""
        capture = cv2.VideoCapture(source)
        fps = capture.get(cv2.CAP_PROP_FPS) or 30.0
        capture.release()
        target = self.save_dir / self._claim("video", f"{stem}.mp4", source)
        fd, temp = create_temp(self.save_dir, f".{target.stem}.", ".tmp.mp4")
        os.close(fd)
        h, w = size
        return cv2.VideoWriter(str(temp), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h)), temp, target

    def _finish_videos(self) -> None:
        for writer, temp, target in self._writers.values():
            writer.release()
            os.replace(temp, target)
        self._writers.clear()
