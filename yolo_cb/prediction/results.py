"""Prediction results: Results (one image) holding Boxes (its detections), with plotting and YOLO-format text output."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from yolo_cb.utils.draw import draw_detections
from yolo_cb.utils.files import append_bytes, create_new_file, own_folder
from yolo_cb.utils.log import LOGGER, printable

SUMMARY_COLUMNS = ["name", "class", "confidence", "box"]  # Results.to_df() / to_csv(): Ultralytics' columns, box a dict x1..y2

# Ultralytics' Results.plot() arguments yolo-cb does not take: each named in one error rather than silently ignored
ULTRALYTICS_PLOT_ONLY = {"font": "the font is OpenCV's", "im_gpu": "drawing is on the CPU image", "kpt_radius": "no keypoints",
                         "kpt_line": "no keypoints", "boxes": "boxes are always drawn", "masks": "no masks", "probs": "no class probabilities",
                         "show": "call r.show()", "txt_color": "the text colour follows the box colour"}


def refuse_plot_arguments(unsupported: dict) -> None:
    """One line naming every plot() argument given that yolo-cb does not take (Ultralytics' with the reason)."""
    if unsupported:
        named = ", ".join(f"{k} ({ULTRALYTICS_PLOT_ONLY[k]})" if k in ULTRALYTICS_PLOT_ONLY else f"{k} (not a plot argument)" for k in unsupported)
        raise TypeError(f"Results.plot() does not take: {named}; it takes line_width, labels, conf, img, pil, save, filename, "
                        f"font_size, color_mode")


class Boxes:
    """Detections of one image: data (n, 6) = [x1, y1, x2, y2, conf, cls] in original-image pixels; tracked boxes (track
    mode) are (n, 7) = [x1, y1, x2, y2, id, conf, cls], as Ultralytics', and `id` holds their track ids.

    `data` is a torch tensor, or a NumPy array after `.numpy()` (every property then returns NumPy, as in Ultralytics)."""

    def __init__(self, data: torch.Tensor | np.ndarray, orig_shape: tuple[int, int]):
        if not isinstance(data, np.ndarray):
            data = torch.as_tensor(data, dtype=torch.float32)
        if data.ndim == 1:
            data = data.reshape(-1, 6)
        if data.shape[-1] not in (6, 7):
            raise ValueError(f"Boxes expects (n, 6) [x1, y1, x2, y2, conf, cls] or (n, 7) [x1, y1, x2, y2, id, conf, cls], "
                             f"got {tuple(data.shape)}")
        self.data = data
        self.orig_shape = tuple(int(v) for v in orig_shape[:2])

    @property
    def is_track(self) -> bool:
        """Whether the boxes carry track ids (track mode)."""
        return self.data.shape[-1] == 7

    @property
    def id(self) -> torch.Tensor | np.ndarray | None:
        """The track id of each box (track mode), else None, as Ultralytics' boxes.id."""
        return self.data[:, -3] if self.is_track else None

    @property
    def xyxy(self) -> torch.Tensor | np.ndarray:
        return self.data[:, :4]

    @property
    def conf(self) -> torch.Tensor | np.ndarray:
        return self.data[:, -2]

    @property
    def cls(self) -> torch.Tensor | np.ndarray:
        return self.data[:, -1]

    @property
    def xywh(self) -> torch.Tensor | np.ndarray:
        """Centre x, centre y, width, height in pixels."""
        b = self.xyxy
        parts = ((b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2, b[:, 2] - b[:, 0], b[:, 3] - b[:, 1])
        return np.stack(parts, axis=1) if isinstance(b, np.ndarray) else torch.stack(parts, dim=1)

    def _scale(self) -> torch.Tensor | np.ndarray:
        h, w = self.orig_shape
        if isinstance(self.data, np.ndarray):
            return np.array([w, h, w, h], dtype=self.data.dtype)
        return torch.tensor([w, h, w, h], dtype=self.data.dtype, device=self.data.device)

    @property
    def xyxyn(self) -> torch.Tensor | np.ndarray:
        return self.xyxy / self._scale()

    @property
    def xywhn(self) -> torch.Tensor | np.ndarray:
        return self.xywh / self._scale()

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    def cpu(self) -> Boxes:
        return Boxes(self.data if isinstance(self.data, np.ndarray) else self.data.cpu(), self.orig_shape)

    def numpy(self) -> Boxes:
        """These boxes with NumPy data (Ultralytics' Boxes.numpy())."""
        return Boxes(self.data if isinstance(self.data, np.ndarray) else self.data.detach().cpu().numpy(), self.orig_shape)

    def to(self, *args, **kwargs) -> Boxes:
        return Boxes(torch.as_tensor(self.data).to(*args, **kwargs), self.orig_shape)

    def _tensor(self) -> torch.Tensor:
        """The (n, 6) detections [x1, y1, x2, y2, conf, cls] as a tensor (a tracked box's id left out)."""
        data = torch.as_tensor(self.data)
        return torch.cat([data[:, :4], data[:, -2:]], dim=1) if self.is_track else data

    def __len__(self) -> int:
        return int(self.data.shape[0])

    def __getitem__(self, index: Any) -> Boxes:
        return Boxes(self.data[index].reshape(-1, self.data.shape[-1]), self.orig_shape)

    def __repr__(self) -> str:
        return f"Boxes(n={len(self)}, orig_shape={self.orig_shape})"


class Results:
    """One image's detections: boxes, names, orig_img (BGR), orig_shape (h, w), path, speed (ms per stage), save_dir."""

    masks = keypoints = probs = obb = None  # Ultralytics' fields of its other tasks: none for detection

    def __init__(self, orig_img: np.ndarray, path: str, names: dict[int, str], boxes: torch.Tensor | np.ndarray | None = None,
                 speed: dict[str, float] | None = None, frame: int | None = None, save_dir: str | None = None):
        self.save_dir = save_dir  # where predict(save=True) writes (None: nothing saved)
        self.orig_img = orig_img
        self.orig_shape = tuple(int(v) for v in orig_img.shape[:2])
        self.path = str(path)
        self.names = names
        self.boxes = Boxes(boxes if boxes is not None else torch.zeros(0, 6), self.orig_shape)
        self.speed = speed or {"preprocess": None, "inference": None, "postprocess": None}
        self.frame = frame  # frame index for videos, else None

    def _with_boxes(self, boxes: Boxes) -> Results:
        return Results(self.orig_img, self.path, self.names, boxes=boxes.data, speed=dict(self.speed), frame=self.frame, save_dir=self.save_dir)

    def with_tracks(self, tracked: np.ndarray) -> Results:
        """The same image with `tracked` (n, 7) [x1, y1, x2, y2, id, conf, cls] boxes (track mode), as a tensor."""
        return self._with_boxes(Boxes(torch.as_tensor(tracked, dtype=torch.float32).reshape(-1, 7), self.orig_shape))

    def new(self) -> Results:
        """The same image, path, names, speed, frame and save_dir with no detections, as Ultralytics' Results.new()."""
        return Results(self.orig_img, self.path, self.names, speed=dict(self.speed), frame=self.frame, save_dir=self.save_dir)

    def __len__(self) -> int:
        return len(self.boxes)

    def __getitem__(self, index: Any) -> Results:
        """`results[0][i]`: the same image with only detection(s) `index` (an int, a slice, a mask or index list)."""
        return self._with_boxes(self.boxes[index])

    def cpu(self) -> Results:
        return self._with_boxes(self.boxes.cpu())

    def numpy(self) -> Results:
        """A copy whose boxes hold NumPy arrays (boxes.xyxy, .conf, .cls ... are np.ndarray)."""
        return self._with_boxes(self.boxes.numpy())

    def to(self, *args, **kwargs) -> Results:
        return self._with_boxes(self.boxes.to(*args, **kwargs))

    def __repr__(self) -> str:
        return f"Results(path={self.path!r}, orig_shape={self.orig_shape}, detections={len(self)})"

    def verbose(self) -> str:
        """Ultralytics' log string: '2 circles, 1 cross, ' (counts by class name, in class order); '' with no detections."""
        if not len(self):
            return ""
        counts = torch.bincount(self.boxes._tensor()[:, 5].long().cpu())
        # the names escaped (a model's metadata may hold terminal escapes): this string is printed to the console
        return "".join(f"{int(n)} {printable(self.names.get(i, str(i)))}{'s' * (n > 1)}, " for i, n in enumerate(counts.tolist()) if n)

    def summary(self, normalize: bool = False, decimals: int = 5) -> list[dict[str, Any]]:
        """One dict per detection: name, class, confidence, box {x1, y1, x2, y2} (pixels, or fractions of the image when
        `normalize`), rounded to `decimals` (Ultralytics' Results.summary())."""
        h, w = self.orig_shape if normalize else (1, 1)
        rows = []
        ids = self.boxes.id.tolist() if self.boxes.is_track else None
        for i, (x1, y1, x2, y2, conf, cls) in enumerate(self.boxes._tensor().cpu().tolist()):
            box = {"x1": x1 / w, "y1": y1 / h, "x2": x2 / w, "y2": y2 / h}
            rows.append({"name": self.names.get(int(cls), str(int(cls))), "class": int(cls), "confidence": round(conf, decimals),
                         "box": {k: round(v, decimals) for k, v in box.items()}, **({"track_id": int(ids[i])} if ids else {})})
        return rows

    def to_json(self, normalize: bool = False, decimals: int = 5) -> str:
        """summary() as a JSON string."""
        import json

        return json.dumps(self.summary(normalize=normalize, decimals=decimals), indent=2)

    def to_csv(self, normalize: bool = False, decimals: int = 5) -> str:
        """summary() as CSV text with a header, Ultralytics' columns: name, class, confidence, box (the box's dict
        {'x1': ..., 'y1': ..., 'x2': ..., 'y2': ...} written as text, as Ultralytics writes its struct column)."""
        import csv
        import io

        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(SUMMARY_COLUMNS)
        for row in self.summary(normalize=normalize, decimals=decimals):
            writer.writerow([row["name"], row["class"], row["confidence"], repr(row["box"])])
        return out.getvalue()

    def to_df(self, normalize: bool = False, decimals: int = 5):
        """summary() as a pandas DataFrame with Ultralytics' columns: name, class, confidence, box (a dict x1, y1, x2, y2
        per row); needs pandas (Ultralytics 8.4 returns a polars DataFrame of the same columns)."""
        try:
            import pandas
        except ImportError as error:
            raise ImportError("Results.to_df() needs pandas: pip install pandas (to_csv() and summary() need nothing)") from error
        return pandas.DataFrame(self.summary(normalize=normalize, decimals=decimals), columns=SUMMARY_COLUMNS)

    def show(self, **plot_kwargs) -> None:
        """Open plot() in the system's image viewer. Without a display, as Ultralytics: nothing is shown and one warning
        per process says so (save() writes a file)."""
        import os
        import sys

        from PIL import Image

        if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
            warn_no_display()
            return
        Image.fromarray(self.plot(**plot_kwargs)[..., ::-1]).show()

    def plot(self, line_width: int | None = None, labels: bool = True, conf: bool = True, img: np.ndarray | None = None,
             pil: bool = False, save: bool = False, filename: str | Path | None = None, *, font_size: float | None = None,
             color_mode: str = "class", **unsupported):
        """A copy of the original image (BGR array) with each box, its class name and score drawn in the class colour.

        pil=True returns a PIL.Image (RGB) instead; save=True also writes it to `filename` (default results_<image name>).
        font_size: the label text's size in pixels (default: scaled to the line width); color_mode: "class" (a colour per
        class) or "instance" (a colour per detection), as Ultralytics. Its other plot arguments are refused by name."""
        canvas = self._draw(line_width, labels, conf, img, font_size=font_size, color_mode=color_mode, **unsupported)
        if save:
            self._write(canvas, filename)
        if pil:
            from PIL import Image

            return Image.fromarray(np.ascontiguousarray(canvas[..., ::-1]))
        return canvas

    def _draw(self, line_width: int | None = None, labels: bool = True, conf: bool = True, img: np.ndarray | None = None, *,
              font_size: float | None = None, color_mode: str = "class", **unsupported) -> np.ndarray:
        refuse_plot_arguments(unsupported)
        canvas = np.ascontiguousarray((img if img is not None else self.orig_img).copy())
        return draw_detections(canvas, self.boxes._tensor().cpu().tolist(), self.names, line_width, labels, conf, font_size=font_size,
                               color_mode=color_mode)

    def default_filename(self) -> str:
        """results_<image name> (a video frame: results_<stem>_<frame>.jpg), Ultralytics' name for save() without one."""
        p = Path(self.path)
        return f"results_{p.name}" if self.frame is None else f"results_{p.stem}_{self.frame}.jpg"

    def _write(self, image: np.ndarray, filename: str | Path | None) -> str:
        import cv2

        filename = Path(filename or self.default_filename())
        filename.parent.mkdir(parents=True, exist_ok=True)
        if not cv2.imwrite(str(filename), image):
            raise OSError(f"could not write image {filename} (the suffix must be an image format cv2 writes, e.g. .jpg or .png)")
        return str(filename)

    def save(self, filename: str | Path | None = None, **plot_kwargs) -> str:
        """Write plot(**plot_kwargs) to `filename` (default: results_<image name> in the working directory, as Ultralytics);
        returns the path. plot_kwargs: line_width, labels, conf, img, font_size, color_mode."""
        return self._write(self._draw(**plot_kwargs), filename)

    def save_crop(self, save_dir: str | Path, file_name: str | Path = "im.jpg") -> list[str]:
        """Each detection cut from the original image into <save_dir>/<class name>/<file_name stem>.jpg (then stem2.jpg, ...
        so that no crop overwrites another); returns the paths written."""
        import cv2

        h, w = self.orig_shape
        written = []
        for x1, y1, x2, y2, _, cls in self.boxes._tensor().cpu().tolist():
            left, top = max(int(x1), 0), max(int(y1), 0)
            right, bottom = min(int(np.ceil(x2)), w), min(int(np.ceil(y2)), h)
            if right <= left or bottom <= top:
                continue
            Path(save_dir).mkdir(parents=True, exist_ok=True)
            folder = own_folder(Path(save_dir), class_folder(self.names.get(int(cls), str(int(cls))), int(cls)))
            encoded, data = cv2.imencode(".jpg", np.ascontiguousarray(self.orig_img[top:bottom, left:right]))
            if not encoded:
                raise OSError(f"could not encode the crop of {self.path} as JPEG")
            fd, target = create_new_file(folder, Path(file_name).stem, ".jpg")  # never over a file or through a link
            with os.fdopen(fd, "wb") as f:
                f.write(data.tobytes())
            written.append(str(target))
        return written

    def save_txt(self, path: str | Path, save_conf: bool = False) -> str:
        """Append one YOLO-format line per box to `path`: 'cls cx cy w h [conf] [id]', coordinates normalised to [0, 1]; a
        tracked box's id last, as Ultralytics."""
        boxes = Boxes(self.boxes._tensor(), self.orig_shape)
        ids = self.boxes.id.tolist() if self.boxes.is_track else [None] * len(boxes)
        lines = []
        for (cx, cy, w, h), score, cls, i in zip(boxes.xywhn.tolist(), boxes.conf.tolist(), boxes.cls.tolist(), ids, strict=True):
            line = f"{int(cls)} {cx:.6f} {cy:.6f} {w:.6f} {h:.6f}"
            lines.append(line + (f" {score:.6f}" if save_conf else "") + (f" {int(i)}" if i is not None else ""))
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        append_bytes(path, "".join(line + "\n" for line in lines).encode("utf-8"))  # a link at `path` is replaced, never followed
        return str(path)


def class_folder(name: str, cls: int) -> str:
    """A class name as one folder name inside crops/: a name is data, so its control characters are escaped (as printed),
    '/' and '\\' become '_', and '', '.' or '..' (the folder itself or its parent) become the class id; cut to 200 bytes."""
    plain = "".join("_" if c in "/\\\0" else c for c in printable(name)).encode("utf-8", "replace")[:200].decode("utf-8", "ignore")
    return plain if plain not in ("", ".", "..") else str(cls)


def encode_image(path: Path, image: np.ndarray) -> bytes | None:
    """The bytes of `image` in the format `path`'s suffix names (.jpg, .png, ...), or None when OpenCV cannot write it."""
    import cv2

    try:
        encoded, data = cv2.imencode(Path(path).suffix or ".jpg", image)
    except cv2.error:
        return None
    return data.tobytes() if encoded else None


@functools.cache
def warn_no_display() -> None:
    """Once per process: show() / show=True on a machine without a display shows nothing."""
    LOGGER.warning("WARNING show: this machine has no display (DISPLAY / WAYLAND_DISPLAY is not set), so nothing is shown; "
                   "save=True or r.save('file.jpg') writes the annotated images")
