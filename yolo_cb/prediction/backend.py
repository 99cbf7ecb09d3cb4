"""One inference interface over a PyTorch model, a `.pt` checkpoint, an ONNX file, a TorchScript file or an OpenVINO folder.

    backend = load_backend("best.onnx")          # or "best.pt", "best.torchscript", "best_openvino_model/", an nn.Module
    preds = backend(x)                           # x: float (B, 3, H, W) RGB in [0, 1] -> (B, A, 5 + nc)

Every backend returns the same raw layout as an eval-mode YOLOX: per anchor cx, cy, w, h in input pixels,
then the sigmoided objectness and class scores. NMS is left to `yolo_cb.nn.postprocess.postprocess`; an export with
NMS in its graph (`nms=True`) returns (B, max_det, 6) instead and says so in `backend.end2end` ({"iou", "max_det"}).
"""

from __future__ import annotations

import io
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from yolo_cb.checkpoints.checkpoint import model_from_checkpoint
from yolo_cb.errors import ConfigError
from yolo_cb.prediction import model_trust, probe, torchscript_check
from yolo_cb.prediction.backend_base import DEFAULT_STRIDE, Backend, max_stride  # noqa: F401 - public here too
from yolo_cb.prediction.mobile_backends import mobile_backend, mobile_format, runtime
from yolo_cb.prediction.model_metadata import (  # noqa: F401 - public here too
    bad_model_file,
    checked_metadata,
    metadata_from_text,
    parse_names,
    read_metadata_json,
    refuse_non_detector,
    unusable_onnx,
)
from yolo_cb.prediction.onnx_session import onnx_session
from yolo_cb.utils.device import select_device
from yolo_cb.utils.log import LOGGER
from yolo_cb.utils.signal_stack import kept_signal_stack

TORCHSCRIPT_META = "config.txt"  # name of the extra file holding the metadata JSON inside a .torchscript archive
OPENVINO_META = "metadata.json"  # the metadata file inside an OpenVINO model folder
class PyTorchBackend(Backend):
    kind = "pytorch"

    def __init__(self, model: nn.Module, *, owned: bool, device: torch.device, fp16: bool, path: str | None = None):
        """`owned`: the backend built this model (it may fuse, move and cast it); a caller's module is left as it is."""
        names = parse_names(getattr(model, "names", None) or {i: str(i) for i in range(int(getattr(model, "nc", 0)))})
        stride = max_stride(model)
        if owned:
            model = model.to(device).eval()
            if hasattr(model, "fuse"):
                model = model.fuse() or model
            if fp16:
                model = model.half()
        else:
            param = next(model.parameters(), None)
            device = param.device if param is not None else device
        super().__init__(names=names, stride=stride, device=device, fp16=fp16, path=path)
        self.model = model
        self.owned = owned
        self.dtype = next(model.parameters()).dtype if next(model.parameters(), None) is not None else torch.float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.device)
        if self.owned or not self.fp16 or self.device.type != "cuda":
            y = self.model(x.to(self.dtype))
        else:  # a caller's fp32 module in fp16: autocast instead of casting their weights
            with torch.autocast("cuda", dtype=torch.float16):
                y = self.model(x)
        if isinstance(y, (list, tuple)):
            y = y[0]
        return y.float()


class ONNXBackend(Backend):
    kind = "onnx"
    label = "ONNX"

    def __init__(self, path: str, *, device: torch.device, fp16: bool, threads: int | None = None):
        import onnxruntime as ort
        providers = ["CPUExecutionProvider"]
        if device.type == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
            providers = [("CUDAExecutionProvider", {"device_id": device.index or 0}), "CPUExecutionProvider"]
        elif device.type == "cuda":
            LOGGER.warning(f"onnxruntime has no CUDAExecutionProvider; running {path} on CPU")
            device = torch.device("cpu")
        self.session = onnx_session(path, providers, threads)
        meta = checked_metadata(self.session.get_modelmeta().custom_metadata_map, Path(path), self.label)
        inp = self.session.get_inputs()[0]
        self.input_name = inp.name
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.input_dtype = "float16" if "float16" in inp.type else "float32"
        shape = list(inp.shape)
        static = len(shape) == 4 and all(isinstance(v, int) and v > 0 for v in shape[2:])
        imgsz = tuple(shape[2:]) if static else None
        batch = shape[0] if shape and isinstance(shape[0], int) and shape[0] > 0 else None
        output_shape = list(self.session.get_outputs()[0].shape)
        refuse_non_detector(Path(path), self.label, shape, output_shape, len(meta.get("names") or {}), bool(meta.get("nms")))
        names = meta.get("names")
        if not names:
            nc = output_shape[-1] if output_shape else None
            nc = nc - 5 if isinstance(nc, int) and nc > 5 and not meta.get("nms") else 0
            names = {i: str(i) for i in range(nc)}
        super().__init__(names=names, stride=int(meta.get("stride", DEFAULT_STRIDE)), imgsz=imgsz, batch=batch,
                         device=device, fp16=self.input_dtype == "float16", metadata=meta, path=str(path))
        if not meta.get("names"):
            LOGGER.warning(f"{path} has no 'names' metadata; using class ids as names")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        array = x.detach().cpu().numpy().astype(self.input_dtype, copy=False)
        y = self.session.run(self.output_names[:1], {self.input_name: array})[0]
        return torch.from_numpy(y).float().to(self.device)


class TorchScriptBackend(Backend):
    kind = "torchscript"
    label = "TorchScript"

    def __init__(self, path: str, *, device: torch.device, fp16: bool, trust: bool = False):
        """trust: load the file although yolo-cb did not write it for this user (model_trust.py); it is a program."""
        extra = {TORCHSCRIPT_META: ""}
        reason = not_torchscript(Path(path))  # a renamed checkpoint, an empty file: said as such, nothing loaded
        if reason:
            raise bad_model_file(Path(path), self.label, reason)
        data = model_trust.loadable_bytes(Path(path), self.label, trust)  # ours, or trusted: else refused before torch sees it
        torchscript_check.check_archive(data, Path(path))  # and then, as defence in depth, nothing of it runs while loading
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit.load's deprecation notice
            try:
                self.model = torch.jit.load(io.BytesIO(data), map_location=device, _extra_files=extra).eval()
            except RuntimeError as error:
                raise bad_model_file(Path(path), self.label, f"torch.jit.load cannot read it ({first_line(error)})") from None
        torchscript_check.check_graph(self.model, Path(path))  # and it runs only when all of it is tensor maths
        meta = metadata_from_text(extra[TORCHSCRIPT_META], Path(path), self.label) if extra[TORCHSCRIPT_META] else {}
        dynamic = bool(meta.get("dynamic", False))
        imgsz = meta.get("imgsz") if not dynamic else None
        batch = meta.get("batch") if not dynamic else None
        param = next(self.model.parameters(), None)
        self.dtype = param.dtype if param is not None else torch.float32
        names = meta.get("names") or {}
        super().__init__(names=names, stride=int(meta.get("stride", DEFAULT_STRIDE)), imgsz=imgsz, batch=batch,
                         device=device, fp16=self.dtype == torch.float16, metadata=meta, path=str(path))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.model(x.to(self.device, self.dtype))
        if isinstance(y, (list, tuple)) and y:
            y = y[0]
        return y.float() if isinstance(y, torch.Tensor) else y


class OpenVINOBackend(Backend):
    kind = "openvino"
    label = "OpenVINO"

    def __init__(self, path: str, *, device: torch.device, fp16: bool, threads: int | None = None):
        """`path`: an export folder (`*_openvino_model/`) or its .xml; runs on the CPU in fp32 arithmetic (an fp16 export
        holds fp16 weights; OpenVINO's default bf16 on CPUs that have it is switched off, so results match PyTorch's)."""
        try:
            import openvino as ov
        except ImportError as error:
            raise ConfigError(f"model={path} is an OpenVINO model: pip install 'yolo-cb[openvino]' (openvino)") from error
        folder = Path(path) if Path(path).is_dir() else Path(path).parent
        xml = Path(path) if Path(path).is_file() else next(iter(sorted(folder.glob("*.xml"))), None)
        if xml is None:
            raise bad_model_file(folder, "OpenVINO", "the folder holds no .xml model")
        meta = read_metadata_json(folder / OPENVINO_META, self.label)
        config = {"INFERENCE_PRECISION_HINT": "f32", **({"INFERENCE_NUM_THREADS": int(threads)} if threads else {})}
        try:
            with kept_signal_stack():  # the CPU plugin swaps this thread's signal stack (utils/signal_stack.py)
                core = ov.Core()
                self.compiled = core.compile_model(core.read_model(str(xml)), "CPU", config)
        except RuntimeError as error:
            raise bad_model_file(xml, "OpenVINO", f"OpenVINO cannot read it ({str(error).strip().splitlines()[0][:200]})") from None
        if device.type != "cpu":
            LOGGER.warning(f"OpenVINO models run on the CPU here; running {path} on CPU")
            device = torch.device("cpu")
        shape = self.compiled.input(0).get_partial_shape()
        static = shape.is_static
        dims = [d.get_length() for d in shape] if static else []
        super().__init__(names=meta.get("names") or {}, stride=int(meta.get("stride", DEFAULT_STRIDE)),
                         imgsz=tuple(dims[2:]) if static else None, batch=dims[0] if static else None,
                         device=device, fp16=False, metadata=meta, path=str(folder))
        self.check_detector(*(partial_dims(port.get_partial_shape()) for port in (self.compiled.input(0), self.compiled.output(0))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.compiled(x.detach().cpu().float().numpy())[self.compiled.output(0)]
        return torch.from_numpy(y).float().to(self.device)


def partial_dims(shape: Any) -> list[int | None]:
    """An OpenVINO PartialShape as a list: a length, or None for a dynamic dimension."""
    return [d.get_length() if d.is_static else None for d in shape]


def not_torchscript(path: Path) -> str | None:
    """Why `path` cannot be a TorchScript archive (empty, truncated, a renamed checkpoint, ...), from its zip directory
    alone (nothing of it is deserialised), or None."""
    if path.stat().st_size == 0:
        return "the file is empty"
    if not zipfile.is_zipfile(path):
        return "it is not a TorchScript archive (truncated, or another kind of file)"
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except zipfile.BadZipFile:
        return "it is not a TorchScript archive (truncated, or another kind of file)"
    if any(n.endswith("/data.pkl") for n in names) and not any("/code/" in n for n in names):
        return "it is a PyTorch checkpoint (torch.save), not a TorchScript archive: give it as a .pt file"
    return None


TORCHSCRIPT_SUFFIXES = (".torchscript", ".ts", ".jit")  # model files that are programs (prediction/model_trust.py)


def first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__


def load_backend(weights: Any, device: Any = "cpu", fp16: bool = False, threads: int | None = None, trust: bool = False,
                 imgsz: Any = None) -> Backend:
    """A Backend for an nn.Module, a `.pt` checkpoint, an `.onnx` file, a `.torchscript` file or an OpenVINO folder / .xml.

    fp16 applies on CUDA only (ignored with a warning on CPU); ONNX/TorchScript files run in the precision they were exported in.
    threads: intra-op threads of ONNX Runtime / OpenVINO (None: the runtime's default; PyTorch: torch.set_num_threads).
    trust: load a TorchScript file yolo-cb did not write for this user (the `trust` setting; see model_trust.py).
    imgsz: the input size it will run at (predict's / val's), for the probe of a model file: every file but our `.pt` is
    loaded and run once in a bounded child process before it is loaded here (prediction/probe.py).
    """
    dev = select_device(device)
    if fp16 and dev.type != "cuda":
        LOGGER.warning("fp16 inference needs CUDA; running in fp32 on %s", dev)
        fp16 = False
    if isinstance(weights, Backend):
        return weights
    if isinstance(weights, nn.Module):
        return PyTorchBackend(weights, owned=False, device=dev, fp16=fp16)
    path = Path(str(weights))
    fmt = mobile_format(path) if path.exists() else None  # CoreML: refused here
    if fmt is not None:
        runtime(fmt, path)  # installed here (or one line naming the extra), before the probe
    if path.suffix.lower() in TORCHSCRIPT_SUFFIXES and path.is_file():  # refused here, before the probe's child loads it
        reason = not_torchscript(path)  # a renamed checkpoint, an empty file: said as such first
        if reason:
            raise bad_model_file(path, TorchScriptBackend.label, reason)
        model_trust.loadable_bytes(path, TorchScriptBackend.label, trust)
    if probe.probed(path):
        probe.check_model_file(path, imgsz, threads, trust)
    return open_model_file(path, dev, fp16, threads, trust)


def open_model_file(path: Path, dev: torch.device, fp16: bool, threads: int | None, trust: bool = False) -> Backend:
    """The Backend of the model file at `path`, by its kind (no probe: load_backend and the probe's child call this)."""
    mobile = mobile_backend(path, threads) if path.exists() else None  # ncnn, MNN, LiteRT, ExecuTorch (CoreML: refused)
    if mobile is not None:
        return mobile
    if path.is_dir() or path.suffix.lower() == ".xml":
        if path.exists():
            return OpenVINOBackend(str(path), device=dev, fp16=fp16, threads=threads)
    if not path.is_file():
        raise FileNotFoundError(f"model weights '{path}' not found")
    suffix = path.suffix.lower()
    if suffix == ".onnx":
        return ONNXBackend(str(path), device=dev, fp16=fp16, threads=threads)
    if suffix in TORCHSCRIPT_SUFFIXES:
        return TorchScriptBackend(str(path), device=dev, fp16=fp16, trust=trust)
    if suffix in (".pt", ".pth"):
        return PyTorchBackend(model_from_checkpoint(path), owned=True, device=dev, fp16=fp16, path=str(path))
    raise ValueError(f"unsupported model file '{path}': expected .pt, .onnx, .torchscript, .mnn, .tflite, .pte, an OpenVINO "
                     f"or an ncnn folder")
