"""The exported graph and its bytes: ONNX and TorchScript serialised in memory, then written by `StagedFile`.

Nothing is written to the system temp folder and nothing is written onto the target: an export goes to a temp
file beside it (``.<name>.<pid>.<random>.tmp``), is checked there and only then renamed over the target, so a
kill at any moment leaves the previous export intact. Temp files of processes that died are removed by the next
export to the same target.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from yolo_cb.errors import ConfigError, WriteError
from yolo_cb.export.nms import NMS_OPSET_MIN, NMSWrapper
from yolo_cb.prediction.backend import TORCHSCRIPT_META
from yolo_cb.utils.files import create_temp, replaced_mode, write_error
from yolo_cb.utils.log import LOGGER

OPSET_MIN_STATIC = 10  # the stem's strided slices need Slice with steps (opset 10)
OPSET_MIN_DYNAMIC = 11  # the in-graph cell grids need CumSum (opset 11)


class ExportError(RuntimeError):
    """Export failed, or the exported file disagrees with PyTorch beyond export_tol."""


class ExportSettingError(ExportError, ConfigError):
    """An export setting that this machine or the installed exporter cannot honour (a user error: exit 2 on the CLI)."""


def max_opset() -> int:
    """The newest opset the installed torch.onnx TorchScript exporter (dynamo=False, the one used here) supports."""
    try:
        from torch.onnx import _constants
    except ImportError:  # pragma: no cover - a torch without the private constants module
        return 17
    return int(getattr(_constants, "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET", getattr(_constants, "ONNX_MAX_OPSET", 17)))


def check_opset(opset: Any, dynamic: bool) -> int:
    """`opset` as an int when the installed exporter can write this graph with it; else ExportSettingError naming the range."""
    low, high = (OPSET_MIN_DYNAMIC if dynamic else OPSET_MIN_STATIC), max_opset()
    try:
        value = int(opset)
    except (TypeError, ValueError):
        value = None
    if value is None or not low <= value <= high:
        why = " (dynamic=True needs CumSum)" if dynamic else ""
        raise ExportSettingError(f"opset={opset} cannot be exported here: torch {torch.__version__} writes this model with opset "
                                 f"{low} to {high}{why}; pass an opset in that range (the default is 17)")
    return value


def check_nms_opset(opset: Any) -> None:
    """ExportSettingError unless `opset` has NonMaxSuppression (nms=True)."""
    if int(opset) < NMS_OPSET_MIN:
        raise ExportSettingError(f"opset={opset} cannot hold nms=True: NonMaxSuppression needs opset {NMS_OPSET_MIN} or newer; "
                                 f"pass opset={NMS_OPSET_MIN} or more (the default is 17)")


class ExportWrapper(nn.Module):
    """The eval graph that is exported: raw head outputs decoded in-graph.

    Static shapes: the model's own decode (cell grids become constants). Dynamic shapes: grids are built in-graph from
    each feature map's size with cumsum over ones (no Range / python ints), so one file serves any batch and size.
    """

    def __init__(self, model: nn.Module, dynamic: bool = False):
        super().__init__()
        self.model = model
        self.dynamic = dynamic
        self.strides = tuple(int(s) for s in model.stride.tolist()) if isinstance(model.stride, torch.Tensor) else tuple(model.stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.dynamic:
            return self.model(x)
        raw = self.model.raw_outputs(x)
        outs = []
        for o, stride in zip(raw, self.strides, strict=True):
            ones = torch.ones_like(o[0, 0])  # (H, W)
            gx = ones.cumsum(1) - 1  # column index per cell
            gy = ones.cumsum(0) - 1  # row index per cell
            grid = torch.stack((gx, gy), dim=-1).reshape(1, -1, 2)  # (1, H*W, 2), row-major
            p = o.flatten(2).transpose(1, 2)  # (B, H*W, 5 + nc)
            xy = (p[..., :2] + grid) * stride
            wh = torch.exp(p[..., 2:4]) * stride
            outs.append(torch.cat((xy, wh, torch.sigmoid(p[..., 4:])), dim=-1))
        return torch.cat(outs, dim=1)


def example_input(model: nn.Module, batch: int, imgsz: tuple[int, int]) -> torch.Tensor:
    param = next(model.parameters())
    return torch.zeros(batch, 3, *imgsz, device=param.device, dtype=param.dtype)


def export_graph(model: nn.Module, dynamic: bool = False, nms: dict | None = None) -> nn.Module:
    """The module that is traced: the decoded graph, followed by in-graph NMS when `nms` ({"iou", "max_det"}) is given."""
    graph = ExportWrapper(model, dynamic=dynamic).eval()
    return NMSWrapper(graph, nms["iou"], nms["max_det"]).eval() if nms else graph


def onnx_bytes(model: nn.Module, imgsz: tuple[int, int], opset: int = 17, dynamic: bool = False, simplify: bool = True,
               batch: int = 1, metadata: dict[str, Any] | None = None, nms: dict | None = None) -> bytes:
    """The serialised ONNX model of an eval-mode (fused) YOLOX: torch.onnx (TorchScript-based), checked, simplified, metadata
    added; `nms` ({"iou", "max_det"}): NMS in the graph, output (B, max_det, 6)."""
    import onnx

    opset = check_opset(opset, dynamic)
    if nms:
        check_nms_opset(opset)
    wrapper = export_graph(model, dynamic, nms)
    out_axes = {0: "batch"} if nms else {0: "batch", 1: "anchors"}
    dynamic_axes = {"images": {0: "batch", 2: "height", 3: "width"}, "output0": out_axes} if dynamic else None
    buffer = io.BytesIO()  # in memory: no raw.onnx in the system temp folder (a model of yolo-cb's size is far below 2 GB)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarnings about constant grids are expected for static exports
        torch.onnx.export(wrapper, example_input(model, batch, imgsz), buffer, opset_version=opset, input_names=["images"],
                          output_names=["output0"], dynamic_axes=dynamic_axes, do_constant_folding=True, dynamo=False)
    proto = onnx.load_from_string(buffer.getvalue())
    onnx.checker.check_model(proto)
    if simplify:
        try:
            import onnxslim

            proto = onnxslim.slim(proto)
        except Exception as error:  # a failed simplification keeps the plain (valid) graph
            LOGGER.warning(f"onnxslim simplification failed, keeping the unsimplified graph: {error}")
    del proto.metadata_props[:]
    for key, value in (metadata or {}).items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = str(key), value if isinstance(value, str) else json.dumps(value)
    return proto.SerializeToString()


def torchscript_bytes(model: nn.Module, imgsz: tuple[int, int], dynamic: bool = False, batch: int = 1,
                      metadata: dict[str, Any] | None = None, meta_key: str = "config.txt") -> bytes:
    """The saved torch.jit.trace archive of the eval graph; metadata JSON goes into its extra file `meta_key`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(ExportWrapper(model, dynamic=dynamic).eval(), example_input(model, batch, imgsz), strict=False,
                                 check_trace=False)
        buffer = io.BytesIO()
        torch.jit.save(traced, buffer, _extra_files={meta_key: json.dumps(metadata or {})})
    return buffer.getvalue()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def clean_stale_temps(target: Path) -> list[Path]:
    """Remove temp files beside `target` left by our writes whose process has died (a kill during export); the removed paths."""
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.(\d+)\.[0-9a-f]+\.tmp$")
    removed = []
    try:
        entries = list(target.parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = pattern.match(entry.name)
        if match and int(match.group(1)) != os.getpid() and not _pid_alive(int(match.group(1))):
            entry.unlink(missing_ok=True)
            removed.append(entry)
    if removed:
        LOGGER.info(f"removed {len(removed)} temp file(s) of an interrupted export beside {target}")
    return removed


def export_write_error(error: OSError, target: Path, hint: str = "") -> OSError:
    """The one-line WriteError for an export that cannot be written beside `target` (read-only, full), ending in `hint`
    (what to do) when given; an OSError nobody can fix that way is returned unchanged."""
    converted = write_error(error, target, "the export")
    if hint and isinstance(converted, WriteError):
        full = error.errno in (errno.ENOSPC, errno.EDQUOT)
        return WriteError(f"{converted.message.rsplit('; ', 1)[0]}; {'free some space, or: ' if full else ''}{hint}",
                          error.errno, str(target))
    return converted


class StagedFile:
    """A temp file beside `target` that becomes `target` only on commit() (os.replace), and is removed otherwise.

        with StagedFile(file) as staged:   # WriteError here when the folder cannot be written (read-only, full)
            staged.write(data); check(staged.path); staged.commit()
    """

    def __init__(self, target: str | Path, hint: str = ""):
        self.target = Path(target)
        self.hint = hint  # what to do when the folder cannot be written (replaces write_error's generic advice)
        self.path: Path | None = None
        self.committed = False

    def __enter__(self) -> StagedFile:
        clean_stale_temps(self.target)
        try:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            fd, self.path = create_temp(self.target.parent, f".{self.target.name}.{os.getpid()}.", ".tmp")
            os.close(fd)
        except OSError as error:
            raise self._error(error) from error
        return self

    def _error(self, error: OSError) -> OSError:
        return export_write_error(error, self.target, self.hint)

    def write(self, data: bytes) -> None:
        """Write `data` to the temp file and fsync it; a replaced target's permissions are kept."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)  # our temp file: a link swapped in is not followed
            with os.fdopen(fd, "wb") as f:
                mode = replaced_mode(self.target)
                if mode is not None:
                    os.fchmod(f.fileno(), mode)
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except OSError as error:
            raise self._error(error) from error

    def commit(self) -> Path:
        """Rename the temp file over the target (atomic on one filesystem); returns the target."""
        os.replace(self.path, self.target)
        self.committed = True
        return self.target

    def __exit__(self, *exc: object) -> None:
        if not self.committed and self.path is not None:
            self.path.unlink(missing_ok=True)


def write_export(file: str | Path, data: bytes) -> Path:
    """`data` written to `file` through a StagedFile (no check before the rename)."""
    with StagedFile(file) as staged:
        staged.write(data)
        return staged.commit()


def export_onnx(model: nn.Module, file: str | Path, imgsz: tuple[int, int], opset: int = 17, dynamic: bool = False,
                simplify: bool = True, batch: int = 1, metadata: dict[str, Any] | None = None) -> Path:
    """Export an eval-mode (fused) YOLOX to `file` (see onnx_bytes), written beside it and renamed."""
    return write_export(file, onnx_bytes(model, imgsz, opset, dynamic, simplify, batch, metadata))


def export_torchscript(model: nn.Module, file: str | Path, imgsz: tuple[int, int], dynamic: bool = False, batch: int = 1,
                       metadata: dict[str, Any] | None = None) -> Path:
    """torch.jit.trace the eval graph to `file` (see torchscript_bytes), written beside it and renamed."""
    return write_export(file, torchscript_bytes(model, imgsz, dynamic, batch, metadata, TORCHSCRIPT_META))
