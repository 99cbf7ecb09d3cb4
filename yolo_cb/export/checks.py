"""The conversion checks a training runs on its own model, as the integrations `onnx_check` and `export_check` call them
(yolo_cb/integrations/): the work is here, beside the exporter it uses, so that registering those callbacks loads no
torch (they import this module once a run uses them).

    onnx_roundtrip(model or best.pt, image)   -> {max_abs, max_rel, max_err}: ONNX in memory against PyTorch
    VariantChecks("onnx,openvino_int8")       -> the variants parsed (a bad name fails before the first epoch);
        .run(best.pt, settings, run folder)   -> one row per variant: exported, validated next to PyTorch
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from yolo_cb.checkpoints.checkpoint import model_from_checkpoint
from yolo_cb.export.convert import parse_spec
from yolo_cb.export.exporter import Exporter, compare, onnx_bytes
from yolo_cb.export.formats import ExportError
from yolo_cb.export.verify import MAP_KEY, val_map


def onnx_roundtrip(model: nn.Module | Path, image: torch.Tensor, opset: int = 17, simplify: bool = True) -> dict[str, float]:
    """Export a fused eval copy of `model` to ONNX in memory, check it, run it in onnxruntime on `image` (B, 3, H, W)
    float in [0, 1] and compare every output with PyTorch: {max_abs, max_rel, max_err} over all outputs. Export errors
    propagate. A checkpoint's path is loaded, and that model (nobody else's) fused and exported itself."""
    import onnx
    import onnxruntime as ort

    module = model_from_checkpoint(model) if isinstance(model, (str, Path)) else copy.deepcopy(model)
    module = module.cpu().float().eval()
    for p in module.parameters():
        p.requires_grad_(False)
    if hasattr(module, "fuse"):
        module = module.fuse() or module
    image = image.detach().cpu().float()
    with drop_torch_ir_dump():  # in memory: no file, so nothing is left behind if the process is killed
        data = onnx_bytes(module, tuple(image.shape[-2:]), opset=opset, dynamic=False, simplify=simplify, batch=image.shape[0])
    onnx.checker.check_model(onnx.load_from_string(data))
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    outputs = session.run(None, {session.get_inputs()[0].name: image.numpy().astype(np.float32)})
    del session
    with torch.no_grad():
        reference = _flatten(module(image))
    if len(outputs) != len(reference):
        raise ExportError(f"the ONNX model has {len(outputs)} outputs, PyTorch {len(reference)}")
    result = {"max_abs": 0.0, "max_rel": 0.0, "max_err": 0.0}
    for out, ref in zip(outputs, reference, strict=True):
        diff = compare(out, ref)
        result = {k: max(result[k], diff[k]) for k in result}
    return result


@contextlib.contextmanager
def drop_torch_ir_dump():
    """Keep torch's "Torch IR graph at exception: ..." dump (hundreds of lines, written by C++ to fd 1 when a TorchScript
    ONNX export fails: torch 2.9's exporter leaves its ONNX log switched on) out of the training log. Anything else
    written to stdout meanwhile is passed on afterwards."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):  # no real fd 1 (some notebooks): nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        try:
            yield
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
            sink.seek(0)
            kept = sink.read().decode(errors="replace").split("Torch IR graph at exception:")[0]
            if kept:
                sys.stdout.write(kept)
                sys.stdout.flush()


def _flatten(output) -> list:
    if isinstance(output, (list, tuple)):
        return [t for item in output for t in _flatten(item)]
    if isinstance(output, dict):
        return [t for item in output.values() for t in _flatten(item)]
    return [output]


class VariantChecks:
    """export_check=: each variant exported from best.pt and validated on the val split next to PyTorch (the same
    letterboxed images); see yolo_cb/integrations/export_check.py."""

    def __init__(self, variants: str):
        self.variants = [token.strip() for token in str(variants).split(",") if token.strip()]
        for token in self.variants:
            parse_spec(token)  # a bad variant name fails before the first epoch

    def run(self, best: Path, args: Any, save_dir: Path) -> list[dict]:
        """One row per variant (export_check.csv's columns, integrations/export_check.py); an export or validation that fails is a row with its error, not an exception."""
        rows, reference = [], None
        for token in self.variants:
            row = {"variant": token, "file": "", "mAP50-95": "", "pytorch": "", "drop": "", "ok": False, "error": ""}
            try:
                path = Exporter({"imgsz": args.imgsz, "data": args.data, "datasets_dir": args.datasets_dir, "fraction": args.fraction,
                                 "iou": args.iou, "max_det": args.max_det, "opset": args.opset, **parse_spec(token)}, validate=False)(str(best))
                ours, validator = val_map(path, args.data, args.imgsz, 1, args.datasets_dir, save_dir)
                if reference is None:
                    reference = val_map(str(best), args.data, args.imgsz, 1, args.datasets_dir, save_dir, like=validator)[0]
                drop = reference[MAP_KEY] - ours[MAP_KEY]
                row.update(file=Path(path).name, **{"mAP50-95": round(ours[MAP_KEY], 5)}, pytorch=round(reference[MAP_KEY], 5),
                           drop=round(drop, 5), ok=drop <= float(args.export_check_tol))
            except Exception as error:  # recorded; the callback warns about it or raises
                row["error"] = f"{type(error).__name__}: {str(error).strip()[:300]}"
            rows.append(row)
        return rows
