"""Export a model to ONNX, OpenVINO, TorchScript or a mobile format (ncnn, MNN, LiteRT, ExecuTorch, CoreML: export/mobile.py),
then verify the written file against PyTorch on a real image (CoreML: structurally; it runs on Apple platforms only).

    Exporter({"format": "onnx", "imgsz": 320})("runs/detect/train/weights/best.pt")   # -> ".../best.onnx"

The exported graph takes `images` (B, 3, H, W) float RGB in [0, 1] and returns `output0` (B, A, 5 + nc):
cx, cy, w, h in input pixels, then sigmoided objectness and class scores (see docs/export.md).
"""

from __future__ import annotations

import copy
import datetime
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from yolo_cb.callbacks import Callbacks
from yolo_cb.checkpoints.checkpoint import load_checkpoint, model_from_checkpoint
from yolo_cb.data.verify import imread
from yolo_cb.errors import WriteError
from yolo_cb.export.calibration_images import dataset_image, sample_image  # noqa: F401 - public here too
from yolo_cb.export.convert import (
    FORMATS,
    StagedDir,
    calibration_images,
    check_format_combo,
    file_size,
    half_onnx,
    int8_onnx,
    openvino_model,
    save_openvino,
    set_onnx_metadata,
)
from yolo_cb.export.formats import (  # noqa: F401 - public here too
    ExportError,
    ExportSettingError,
    ExportWrapper,
    StagedFile,
    check_nms_opset,
    check_opset,
    example_input,
    export_graph,
    export_onnx,
    export_torchscript,
    onnx_bytes,
    torchscript_bytes,
)
from yolo_cb.export.mobile import MOBILE_FORMATS, check_coreml, focus_as_conv, write_mobile
from yolo_cb.export.verify import match_detections, run_backend, side_by_side
from yolo_cb.prediction.backend import TORCHSCRIPT_META, TorchScriptBackend, max_stride
from yolo_cb.prediction.model_trust import record_export
from yolo_cb.prediction.predictor import preprocess
from yolo_cb.settings.config import Config, get_config
from yolo_cb.utils.device import select_device
from yolo_cb.utils.log import LOGGER
from yolo_cb.version import __version__

EXPORT_DEFAULTS = {"mode": "export", "batch": 1}  # an export is for batch 1 unless batch= is given explicitly


def _version() -> str:
    return str(__version__)


# The output-by-output gate of a half export: fp16 rounding moved a trained model's outputs by up to 0.07 (see _verify);
# a broken conversion moves them by O(1). Its mAP against PyTorch's (side_by_side) judges the precision itself.
HALF_TOL = 0.15


def compare(output: Any, reference: Any) -> dict[str, float]:
    """Differences of two arrays/tensors of the same shape: max_abs, max_rel (|a - b| / max(|b|, 1e-3)) and max_err.

    max_err = |a - b| / max(|b|, 1) is the figure tolerances apply to: absolute for values up to 1 (scores,
    probabilities), relative above (box coordinates in pixels), so float noise on a 300 px box (a few 1e-4 px)
    never fails a check while a wrong score does.
    """
    a = np.asarray(output.detach().cpu().float() if isinstance(output, torch.Tensor) else output, dtype=np.float64)
    b = np.asarray(reference.detach().cpu().float() if isinstance(reference, torch.Tensor) else reference, dtype=np.float64)
    if a.shape != b.shape:
        raise ExportError(f"exported output shape {a.shape} differs from PyTorch's {b.shape}")
    diff = np.abs(a - b)
    return {"max_abs": float(diff.max(initial=0.0)), "max_rel": float((diff / np.maximum(np.abs(b), 1e-3)).max(initial=0.0)),
            "max_err": float((diff / np.maximum(np.abs(b), 1.0)).max(initial=0.0))}


@torch.no_grad()
def torch_reference(model: nn.Module, image: torch.Tensor) -> torch.Tensor:
    """The PyTorch output for `image` (eval mode; a module in train mode is evaluated on an eval copy)."""
    if model.training:
        model = copy.deepcopy(model).eval()
    param = next(model.parameters())
    y = model(image.to(param.device, param.dtype))
    return (y[0] if isinstance(y, (list, tuple)) else y).float().cpu()


def verify_onnx(path: str | Path, model: nn.Module, image_tensor: torch.Tensor) -> dict[str, float]:
    """Run `path` in onnxruntime (CPU) on image_tensor (B, 3, H, W) and compare with `model` (see `compare`)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inp = session.get_inputs()[0]
    dtype = np.float16 if "float16" in inp.type else np.float32
    output = session.run(None, {inp.name: image_tensor.detach().cpu().numpy().astype(dtype)})[0]
    return compare(output, torch_reference(model, image_tensor))


def verify_torchscript(path: str | Path, model: nn.Module, image_tensor: torch.Tensor) -> dict[str, float]:
    """Run `path` as predict would (refused unless recorded as ours: see record_export) and compare with `model`."""
    param = next(model.parameters())
    loaded = TorchScriptBackend(str(path), device=param.device, fp16=False)
    with torch.no_grad():
        output = loaded.model(image_tensor.to(param.device, param.dtype))
    return compare(output[0] if isinstance(output, (list, tuple)) else output, torch_reference(model, image_tensor))


def verify_backend(path: str | Path, model: nn.Module, image_tensor: torch.Tensor, fmt: str = "openvino") -> dict[str, float]:
    """Run `path` through the yolo-cb Backend of format `fmt` (an OpenVINO folder, a mobile export) and compare with `model`."""
    return compare(run_backend(path, image_tensor, fmt), torch_reference(model, image_tensor))


class Exporter:
    """Exports a checkpoint or module to args.format (FORMATS: onnx, openvino, torchscript, ncnn, mnn, tflite, executorch, coreml) and
    verifies the result; see the module docstring."""

    def __init__(self, args: Config | dict | None = None, callbacks: Callbacks | None = None, validate: bool = True,
                 folder: Path | None = None):
        """validate: with data=, validate the export and PyTorch on its val split (benchmark and export_check do it themselves);
        folder: where the export goes (None: beside its checkpoint; the benchmark writes into its own run folder)."""
        if isinstance(args, Config):
            self.args = args
        else:
            self.args = get_config({**EXPORT_DEFAULTS, **(args or {})})
        self.callbacks = callbacks if callbacks is not None else Callbacks()
        self.validate = validate
        self.folder = Path(folder) if folder is not None else None
        self.file: Path | None = None  # the source model (.pt), as Ultralytics' exporter.file; None for an nn.Module
        self.output: Path | None = None  # the exported file or folder, set at on_export_start, written by on_export_end
        self.model: nn.Module | None = None
        self.metadata: dict[str, Any] = {}
        self.verification: dict[str, float] = {}
        self.image_path: str | None = None
        self.nms: dict | None = None  # nms=True: {"iou", "max_det"} fixed in the graph
        self.val_metrics: dict[str, float] = {}  # data= given: mAP50-95 of PyTorch and of the export, and the drop

    def run_callbacks(self, event: str) -> None:
        self.callbacks.run(event, self)

    # --- steps ------------------------------------------------------------------------------
    def _load(self, model: Any) -> tuple[nn.Module, Path | None, dict]:
        """(fused eval copy on the export device, weights path or None, train_args)."""
        model = model if model is not None else self.args.model
        if model is None:
            raise ValueError("nothing to export: pass a checkpoint path or a model (model=...)")
        weights, train_args = None, {}
        if isinstance(model, nn.Module):
            module = copy.deepcopy(model)
        else:
            weights = Path(str(model))
            if weights.suffix.lower() not in (".pt", ".pth"):
                raise ValueError(f"export needs a .pt checkpoint or a model, got '{model}'")
            ckpt = load_checkpoint(weights)
            train_args = ckpt.train_args or {}
            module = model_from_checkpoint(ckpt)
        module = module.float().eval()
        for p in module.parameters():
            p.requires_grad_(False)
        if hasattr(module, "fuse"):
            module = module.fuse() or module
        return module, weights, train_args

    def _device(self) -> torch.device:
        if not self.args.half or str(self.args.format).lower() != "torchscript":
            return torch.device("cpu")  # ONNX / OpenVINO fp16 is a conversion of the fp32 graph: no GPU needed
        device = select_device(self.args.device or "")
        if device.type != "cuda":
            raise ExportSettingError("half=True for format=torchscript (fp16 weights) needs a CUDA device; CUDA is not available here "
                                     f"(device={self.args.device or 'auto'}). Export in fp32, or use format=onnx / openvino half=True.")
        return device

    def _imgsz(self) -> tuple[int, int]:
        size = self.args.imgsz
        h, w = (size, size) if isinstance(size, int) else tuple(size)
        stride = max_stride(self.model)
        if h % stride or w % stride:
            raise ExportSettingError(f"imgsz={size} is not a multiple of the model's stride {stride}; pass e.g. imgsz="
                                     f"{max(stride, round(h / stride) * stride)}")
        return int(h), int(w)

    def _verification_image(self, train_args: dict, imgsz: tuple[int, int], batch: int) -> torch.Tensor:
        import cv2

        path = dataset_image(train_args.get("data") or self.args.data, train_args.get("datasets_dir") or self.args.datasets_dir)
        img = imread(str(path)) if path else None
        if img is None:
            img, self.image_path = sample_image(), "generated test scene"
        else:
            self.image_path = str(path)
        tensor, _ = preprocess(img, imgsz, auto=False)
        images = [tensor]
        for i in range(1, batch):  # more images for a batch > 1: flipped / different crops of the same scene
            images.append(preprocess(cv2.flip(img, 1) if i % 2 else img[: img.shape[0] * 3 // 4], imgsz, auto=False)[0])
        return torch.stack(images)

    def _verify(self, fmt: str, file: Path, model: nn.Module, image: torch.Tensor, target: Path | None = None) -> dict[str, float]:
        """Run `file` against PyTorch; ExportError above export_tol (`target`: the file it would become, left unchanged)."""
        if self.nms:
            return self._verify_nms(fmt, file, model, image, target)
        if fmt == "coreml":  # Core ML predicts on Apple platforms only: its package is checked structurally
            shapes = check_coreml(file, image, tuple(torch_reference(model, image).shape))
            LOGGER.info(f"export verification (coreml): converted; input images {shapes['inputs']}, output output0 {shapes['outputs']} as "
                        "PyTorch's (its outputs are not compared here: Core ML runs on macOS / iOS only)")
            return {}
        fn = verify_torchscript if fmt == "torchscript" else verify_onnx if fmt == "onnx" else verify_backend
        result = fn(file, model, image, fmt) if fn is verify_backend else fn(file, model, image)
        tol = float(self.args.export_tol)
        if self.args.half:  # fp16 arithmetic vs fp32 on a trained YOLOX-nano at 64 px: 0.023 (Xeon), 0.0705 when trained and run
            tol = max(tol, HALF_TOL)  # with oneDNN capped at AVX (onnx and openvino alike); the mAP on data= is the real gate
        if self.args.int8:  # int8 is judged by its mAP on data= (see side_by_side), not output by output
            LOGGER.info(f"int8 {fmt} export: difference vs PyTorch {result['max_err']:.3g} (not gated; the mAP is)")
            return result
        LOGGER.info(f"export verification ({fmt}, {tuple(image.shape)} image from {self.image_path}): difference vs PyTorch "
                    f"{result['max_err']:.3g} (abs up to 1, relative above; tolerance {tol:g}), max abs {result['max_abs']:.3g}")
        if result["max_err"] > tol:
            kept = f"; not saved, {target} is unchanged" if target is not None else ""
            raise ExportError(f"exported {fmt} file {target or file} differs from PyTorch by {result['max_err']:.4g} (abs for values up "
                              f"to 1, relative above; max abs {result['max_abs']:.4g}) on {self.image_path}, above export_tol={tol:g}{kept}")
        return result

    # --- entry ------------------------------------------------------------------------------
    def _metadata(self, module: nn.Module, imgsz: tuple[int, int], batch: int) -> dict[str, Any]:
        args = self.args
        names = {int(k): str(v) for k, v in (getattr(module, "names", None) or {i: str(i) for i in range(module.nc)}).items()}
        return {
            "description": f"yolo-cb {getattr(module, 'name', 'YOLOX')} detector",
            "author": "yolo-cb",
            "task": args.task,
            "version": _version(),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "names": json.dumps({str(k): v for k, v in names.items()}),
            "imgsz": json.dumps(list(imgsz)),
            "stride": str(max_stride(module)),
            "batch": str(batch),
            "dynamic": json.dumps(bool(args.dynamic)),
            "half": json.dumps(bool(args.half)),
            "int8": json.dumps(bool(args.int8)),
            "nms": json.dumps(self.nms or {}),
            "output": ("(B, max_det, 6): x1, y1, x2, y2 (input pixels), score, class; rows of score 0 are padding" if self.nms else
                       "(B, A, 5 + nc): cx, cy, w, h (input pixels), obj, class scores (sigmoided); A = sum over strides 8/16/32 of H/s * W/s"),
        }

    def _target(self, fmt: str, weights: Path | None, module: nn.Module) -> Path:
        stem = weights.stem if weights is not None else str(getattr(module, "name", "yolox")).lower() or "yolox"
        stem += ("_int8" if self.args.int8 else "_half" if self.args.half else "") + ("_nms" if self.args.nms else "")
        name = {"onnx": f"{stem}.onnx", "torchscript": f"{stem}.torchscript", "openvino": f"{stem}_openvino_model", "ncnn": f"{stem}_ncnn_model",
                "mnn": f"{stem}.mnn", "tflite": f"{stem}.tflite", "executorch": f"{stem}.pte", "coreml": f"{stem}.mlpackage"}[fmt]
        folder = self.folder or (weights.parent if weights is not None else Path(self.args.project or "."))
        return folder / name

    def _onnx_bytes(self, module: nn.Module, imgsz: tuple[int, int], batch: int) -> bytes:
        args = self.args
        data = onnx_bytes(module, imgsz, opset=args.opset, dynamic=bool(args.dynamic), simplify=bool(args.simplify), batch=batch,
                          metadata=self.metadata, nms=self.nms)
        return half_onnx(data) if args.half and str(args.format).lower() == "onnx" else data

    def _write(self, fmt: str, staged: Path, module: nn.Module, imgsz: tuple[int, int], batch: int, calib: list | None) -> Path:
        """Serialise into the staged temp file / folder; returns the file to verify."""
        if fmt == "torchscript":  # a program: recorded as ours before anything loads it (predict and val refuse others)
            data = torchscript_bytes(module, imgsz, dynamic=bool(self.args.dynamic), batch=batch, metadata=self.metadata, meta_key=TORCHSCRIPT_META)
            record_export(data, self.output)
            staged.write_bytes(data)
            return staged
        if fmt in MOBILE_FORMATS:
            module = focus_as_conv(module)  # YOLOX's strided slices as a convolution: the same outputs, a portable graph
            onnx_data = self._onnx_bytes(module, imgsz, batch) if fmt in ("ncnn", "mnn") else None
            stem = self.output.name.removesuffix("_ncnn_model")
            write_mobile(fmt, staged, stem, module, example_input(module, batch, imgsz), onnx_data, bool(self.args.half), bool(self.args.int8),
                         calib, self.metadata)
            return staged
        data = self._onnx_bytes(module, imgsz, batch)
        if fmt == "onnx" and calib is None:
            staged.write_bytes(data)
            return staged
        source = (staged if fmt == "openvino" else staged.parent) / f".{staged.name}.fp32.onnx"
        source.write_bytes(data)
        quantized = source.with_name(source.name.replace(".fp32.", ".int8."))
        try:
            if fmt == "onnx":
                int8_onnx(source, staged, calib)
                set_onnx_metadata(staged, self.metadata)
                return staged
            ir_source = source
            if calib is not None:  # openvino int8: the same QDQ graph as onnx int8, converted
                int8_onnx(source, quantized, calib)
                ir_source = quantized
            save_openvino(openvino_model(ir_source), staged, self.output.name.removesuffix("_openvino_model"), bool(self.args.half),
                          self.metadata)
            return staged
        finally:
            source.unlink(missing_ok=True)
            quantized.unlink(missing_ok=True)

    def _serialise(self, fmt: str, staged: Path, module: nn.Module, imgsz: tuple[int, int], batch: int, calib: list | None, source: Any) -> Path:
        try:
            return self._write(fmt, staged, module, imgsz, batch, calib)
        except (ExportError, WriteError):
            raise
        except Exception as error:
            raise ExportError(f"{fmt} export of {source} failed: {type(error).__name__}: {error}") from error

    def _verify_nms(self, fmt: str, file: Path, model: nn.Module, image: torch.Tensor, target: Path | None) -> dict[str, float]:
        """An nms=True export against PyTorch's own predict (decode, per-class NMS): boxes above conf 0.25 within 1 px."""
        with torch.no_grad():
            reference = export_graph(model, False, self.nms)(image).cpu().numpy()
        result = match_detections(run_backend(file, image, fmt), reference)
        LOGGER.info(f"export verification ({fmt}, nms=True, image from {self.image_path}): boxes within {result['max_px']:.3g} px of "
                    f"PyTorch's, {int(result['missing'])} detection(s) found by one only")
        if not self.args.int8 and (result["missing"] or result["max_px"] > 1.0 + 10 * bool(self.args.half)):
            raise ExportError(f"exported {fmt} model {target or file} detects differently from PyTorch on {self.image_path} "
                              f"(boxes {result['max_px']:.3g} px apart, {int(result['missing'])} missing); not saved")
        return result

    def _checked_settings(self) -> str:
        """The format, after every refusal that needs no work (unknown format, combinations, opset, int8 without data)."""
        args = self.args
        fmt = str(args.format).lower()
        if fmt not in FORMATS:
            raise ExportSettingError(f"format={args.format!r} is not a known export format; known: {', '.join(FORMATS)}")
        check_format_combo(fmt, bool(args.half), bool(args.int8), bool(args.nms), bool(args.dynamic))
        if fmt in ("onnx", "openvino", "ncnn", "mnn"):  # the formats made from the ONNX graph
            check_opset(args.opset, bool(args.dynamic))
            if args.nms:
                check_nms_opset(args.opset)
        if self._calibrated(fmt) and not args.data:
            calibration_images(None, None, 1.0, (32, 32))  # raises the one-line error
        self.nms = {"iou": float(args.iou), "max_det": int(args.max_det)} if args.nms else None
        return fmt

    def _calibrated(self, fmt: str) -> bool:
        """int8 with calibrated activation ranges (MNN's int8 is weights only: no data needed)."""
        return bool(self.args.int8) and fmt != "mnn"

    def __call__(self, model: Any = None) -> str:
        args = self.args
        fmt = self._checked_settings()
        device = self._device()
        module, weights, train_args = self._load(model)
        module = module.to(device)
        if args.half and fmt == "torchscript":
            module = module.half()
        self.model = module
        imgsz = self._imgsz()
        batch = int(args.batch or 1)
        calib = calibration_images(args.data, args.datasets_dir, float(args.fraction), imgsz) if self._calibrated(fmt) else None
        self.metadata = self._metadata(module, imgsz, batch)
        self.file, self.output = weights, self._target(fmt, weights, module)
        file = self.output
        self.run_callbacks("on_export_start")
        LOGGER.info(f"exporting {weights or type(module).__name__} to {fmt} (imgsz {imgsz}, batch {batch}, dynamic={bool(args.dynamic)}, "
                    f"half={bool(args.half)}, int8={bool(args.int8)}, nms={bool(args.nms)}{', opset ' + str(args.opset) if fmt in ('onnx', 'openvino') else ''})")
        hint = (f"an export is written beside its checkpoint: copy {weights} to a folder this process may write to and export the copy"
                if weights is not None else "pass project= a folder this process may write to")
        with StagedDir(file, hint) if fmt in ("openvino", "ncnn", "coreml") else StagedFile(file, hint) as staged:  # a temp beside `file`, renamed when checked
            written = self._serialise(fmt, staged.path, module, imgsz, batch, calib, weights or type(module).__name__)
            image = self._verification_image(train_args, imgsz, batch).to(device)
            self.verification = self._verify(fmt, written, module.float() if fmt != "torchscript" else module, image, target=file)
            staged.commit()
        LOGGER.info(f"export done: {file} ({file_size(file) / 1e6:.1f} MB)")
        if args.data and self.validate:
            self.val_metrics = side_by_side(module.float(), file, args.data, list(imgsz), batch, args.datasets_dir)
        self.run_callbacks("on_export_end")
        return str(file)
