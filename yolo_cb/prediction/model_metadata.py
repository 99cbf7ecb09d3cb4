"""The metadata of a model file we did not write (ONNX metadata_props, a TorchScript's extra file, an OpenVINO folder's
metadata.json), parsed and checked before any value is used, and the check that a model file is a detector at all.

A crafted value (`names` that is no mapping, `stride: abc`, `imgsz: [-5, 1e9]`, a metadata file that is no JSON) was a
traceback from deep inside predict; a valid ONNX that is no detector (one convolution) "detected" its pixels. Each is now
one line (CheckpointError, exit status 2 on the CLI) naming the file, the key, the value and what would be right.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from yolo_cb.errors import CheckpointError, short_repr
from yolo_cb.settings.schema import MAX_IMGSZ

MAX_METADATA_CHARS = 4_000_000  # one metadata value, or an OpenVINO metadata.json: 100000 class names fit in far less
MAX_STRIDE = 256  # our families stride 8/16/32; a larger one only makes the letterbox round absurdly
MAX_BATCH = 1024  # a fixed export batch; the warmup allocates batch x 3 x imgsz
MAX_DET = 100_000  # an nms=True export's boxes per image
FLAG_KEYS = ("dynamic", "half", "int8")


def bad_model_file(path: Path, kind: str, reason: str) -> CheckpointError:
    """The one-line error for a model file that cannot be loaded: the file, why, and what to do."""
    return CheckpointError(f"model={path}: not a usable {kind} model: {reason}; export it again from the .pt checkpoint "
                           f"(yolo-cb export model=path/to/best.pt format={kind.lower()})")


def unusable_onnx(path: Path) -> str | None:
    """Why `path` cannot be an ONNX model (empty, truncated, another kind of file, an invalid graph), or None."""
    import onnx

    if path.stat().st_size == 0:
        return "the file is empty"
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception:  # protobuf's DecodeError, or onnx's own parse errors
        return "it does not parse as ONNX (truncated, or another kind of file)"
    if not proto.ir_version or not proto.graph.node:
        return "it holds no ONNX graph (another kind of file)"
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as error:
        return f"its graph is invalid ({str(error).strip().splitlines()[0][:200]})"
    return None


def literal(text: str) -> Any:
    """A metadata string as the value it writes: JSON, or a Python literal (Ultralytics writes names as a dict's repr).
    ValueError when it is neither, or too long to be metadata."""
    if len(text) > MAX_METADATA_CHARS:
        raise ValueError(f"is {len(text)} characters long (at most {MAX_METADATA_CHARS})")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ValueError(f"is {short_repr(text)}, neither JSON nor a Python literal") from None


def parse_names(value: Any) -> dict[int, str]:
    """Class names from a dict, a list, or their JSON / Python-literal string form -> {int: str}; ValueError saying
    what is wrong otherwise (ids must be the integers 0..n-1, names text)."""
    if isinstance(value, str):
        value = literal(value)
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        value = dict(enumerate(value))
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"is {type(value).__name__} {short_repr(value)}; it must map class ids 0..n-1 to names")
    names = {}
    for key, name in value.items():
        try:
            names[int(key)] = name
        except (TypeError, ValueError):
            raise ValueError(f"has the class id {short_repr(key)}; ids must be the integers 0..n-1") from None
        if not isinstance(name, (str, int, float)) or isinstance(name, bool):
            raise ValueError(f"gives class {key} the name {short_repr(name)}; a name is text")
    if sorted(names) != list(range(len(names))):
        raise ValueError(f"has the class ids {short_repr(sorted(names))}; ids must be the integers 0..n-1")
    return {k: str(names[k]) for k in sorted(names)}


def _int_in(value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"is {short_repr(value)}; it must be an integer from {low} to {high}")
    return value


def _imgsz(value: Any) -> list[int]:
    sizes = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(sizes, (list, tuple)) or len(sizes) not in (1, 2):
        raise ValueError(f"is {short_repr(value)}; it must be a size or [height, width] of integers from 1 to {MAX_IMGSZ}")
    sizes = [_int_in(v, 1, MAX_IMGSZ) for v in sizes]
    return sizes * (3 - len(sizes))


def _nms(value: Any) -> dict:
    if value in (None, {}, False):
        return {}
    if not isinstance(value, Mapping) or set(value) != {"iou", "max_det"}:
        raise ValueError(f"is {short_repr(value)}; it must be {{}} or {{\"iou\": 0..1, \"max_det\": 1..{MAX_DET}}}")
    iou = value["iou"]
    if isinstance(iou, bool) or not isinstance(iou, (int, float)) or not 0 <= iou <= 1:
        raise ValueError(f"has iou {short_repr(iou)}; it must be a number from 0 to 1")
    return {"iou": float(iou), "max_det": _int_in(value["max_det"], 1, MAX_DET)}


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"is {short_repr(value)}; it must be true or false")
    return value


CHECKS = {"names": parse_names, "imgsz": _imgsz, "stride": lambda v: _int_in(v, 1, MAX_STRIDE),
          "batch": lambda v: None if v is None else _int_in(v, 1, MAX_BATCH), "nms": _nms,
          **{key: _flag for key in FLAG_KEYS}}


def checked_metadata(raw: Any, path: Path, kind: str) -> dict[str, Any]:
    """A model file's metadata (a mapping of strings, or of values) -> typed values (names {int: str}, imgsz [h, w],
    stride, batch, nms, flags); CheckpointError naming the file, the key and the value when one cannot be right."""
    if not isinstance(raw, Mapping):
        raise bad_model_file(path, kind, f"its metadata is {type(raw).__name__} {short_repr(raw)}, not a mapping of keys to values")
    meta: dict[str, Any] = {str(k): v for k, v in raw.items()}
    for key, check in CHECKS.items():
        if key not in meta:
            continue
        value = meta[key]
        try:
            if isinstance(value, str) and key != "names":
                value = literal(value)
            meta[key] = check(value)
        except ValueError as error:
            raise bad_model_file(path, kind, f"its metadata '{key}' {error}") from None
    return meta


def read_metadata_json(file: Path, kind: str) -> dict[str, Any]:
    """An OpenVINO folder's metadata.json (or a TorchScript's extra file, as text) -> checked_metadata; a missing file
    is no metadata, anything but a regular file of JSON is one line."""
    if not file.exists() and not file.is_symlink():
        return {}
    if not file.is_file() or file.stat().st_size > MAX_METADATA_CHARS:
        raise bad_model_file(file, kind, f"its metadata file is not a regular file of at most {MAX_METADATA_CHARS} bytes")
    return metadata_from_text(file.read_text(encoding="utf-8", errors="replace"), file, kind)


def metadata_from_text(text: str | bytes, path: Path, kind: str) -> dict[str, Any]:
    """Metadata written as one JSON object -> checked_metadata; no JSON is one line."""
    if isinstance(text, bytes):  # a TorchScript extra file
        text = text.decode("utf-8", errors="replace")
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise bad_model_file(path, kind, f"its metadata is not JSON ({short_repr(text[:200])})") from None
    return checked_metadata(raw, path, kind)


def detector_output_error(shape: Sequence[Any], nc: int, nms: bool) -> str | None:
    """Why an output of `shape` (ints, or None / names for dynamic dims) is not a yolo-cb detector's, or None.

    A detector returns (batch, anchors, 5 + classes) (nms=True exports: (batch, max_det, 6))."""
    wanted = 6 if nms else (5 + nc if nc else None)
    layout = "(batch, max_det, 6)" if nms else f"(batch, anchors, 5 + classes){f' = (batch, anchors, {wanted})' if wanted else ''}"
    shown = tuple(d if isinstance(d, int) else "?" for d in shape)
    last = shape[-1] if len(shape) else None
    if len(shape) != 3 or (isinstance(last, int) and (last < 6 or (wanted is not None and last != wanted))):
        names = f" for its {nc} class names" if nc and not nms else ""
        return f"it outputs shape {shown}, not a detector's {layout}{names}"
    return None


def refuse_non_detector(path: Path, kind: str, input_shape: Sequence[Any] | None, output_shape: Sequence[Any] | None,
                        nc: int, nms: bool) -> None:
    """CheckpointError naming the file when it takes no image batch or returns no detector's output (None: not known)."""
    reason = (detector_input_error(input_shape) if input_shape is not None else None) or (
        detector_output_error(output_shape, nc, nms) if output_shape is not None else None)
    if reason:
        raise bad_model_file(path, kind, reason)


def detector_input_error(shape: Sequence[Any]) -> str | None:
    """Why an input of `shape` is not an image batch (batch, 3, height, width), or None."""
    channels = shape[1] if len(shape) > 1 else None
    if len(shape) != 4 or (isinstance(channels, int) and channels != 3):
        return f"it takes input shape {tuple(d if isinstance(d, int) else '?' for d in shape)}, not images (batch, 3, height, width)"
    return None
