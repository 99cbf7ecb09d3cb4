"""Backends of the mobile and edge exports, each on its own runtime (CPU, fp32 arithmetic where the runtime lets us say so):

    best_ncnn_model/     ncnn (`ncnn`)             best.ncnn.param + best.ncnn.bin + metadata.json; runs one image at a time
    best.mnn             MNN (`MNN`)               metadata in the model's bizCode (JSON)
    best.tflite          LiteRT (`ai-edge-litert`) metadata in the flatbuffer's metadata table, entry "yolo_cb"
    best.pte             ExecuTorch (`executorch`) metadata from the program's constant method "yolo_cb_metadata"
    best.mlpackage       CoreML: runs on Apple platforms only; loading it here stops with one line saying so

Every one returns the raw layout of backend.Backend: (B, A, 5 + nc). A runtime that is not installed stops with one
line naming the extra to install.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from yolo_cb.errors import ConfigError
from yolo_cb.prediction.backend_base import DEFAULT_STRIDE, Backend
from yolo_cb.prediction.model_metadata import bad_model_file, metadata_from_text, read_metadata_json

# format -> (the module its runtime imports as, the pip line that brings it)
RUNTIMES = {
    "ncnn": ("ncnn", "pip install 'yolo-cb[ncnn]'"),
    "mnn": ("MNN", "pip install 'yolo-cb[mnn]'"),
    "tflite": ("ai_edge_litert", "pip install 'yolo-cb[litert]'"),
    "executorch": ("executorch", "pip install 'yolo-cb[executorch]'"),
    "coreml": ("coremltools", "pip install 'yolo-cb[coreml]'"),
}
NCNN_META = "metadata.json"  # the metadata file inside an ncnn model folder
TFLITE_META = "yolo_cb"  # the name of the metadata entry inside a .tflite file
PTE_META = "yolo_cb_metadata"  # the constant method of a .pte program returning the metadata JSON as uint8
MOBILE_SUFFIXES = {".mnn": "mnn", ".tflite": "tflite", ".pte": "executorch", ".mlpackage": "coreml"}


def runtime(fmt: str, path: Any) -> Any:
    """The runtime module of format `fmt`, imported; ConfigError naming the extra when it is not installed."""
    module, install = RUNTIMES[fmt]
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ConfigError(f"model={path} is a {fmt} model and its runtime is not installed ({error}): {install}") from None


def _static(meta: dict[str, Any]) -> tuple[tuple[int, int] | None, int | None]:
    imgsz = meta.get("imgsz")
    return (tuple(int(v) for v in imgsz) if imgsz else None), (int(meta["batch"]) if meta.get("batch") else None)


def _base(backend: Backend, meta: dict[str, Any], path: Path, batch: int | None = None) -> None:
    """Backend.__init__ from the export's metadata (names, stride, the static image size and batch)."""
    imgsz, fixed_batch = _static(meta)
    Backend.__init__(backend, names=meta.get("names") or {}, stride=int(meta.get("stride", DEFAULT_STRIDE)), imgsz=imgsz,
                     batch=fixed_batch if batch is None else batch or None, device=torch.device("cpu"), metadata=meta, path=str(path))


class NCNNBackend(Backend):
    kind = "ncnn"
    label = "ncnn"

    def __init__(self, path: str, *, threads: int | None = None):
        """`path`: an export folder (`*_ncnn_model/`) or its .param; fp32 storage and arithmetic (no fp16 / bf16 packing)."""
        ncnn = runtime("ncnn", path)
        folder = Path(path) if Path(path).is_dir() else Path(path).parent
        param = next(iter(sorted(folder.glob("*.ncnn.param"))), None)
        if param is None or not param.with_suffix(".bin").is_file():
            raise bad_model_file(folder, "ncnn", "the folder holds no .ncnn.param / .ncnn.bin pair")
        meta_file = folder / NCNN_META
        meta = read_metadata_json(meta_file, "ncnn")
        self.net = ncnn.Net()
        for flag in ("use_vulkan_compute", "use_fp16_storage", "use_fp16_arithmetic", "use_fp16_packed", "use_bf16_storage"):
            setattr(self.net.opt, flag, False)
        if threads:
            self.net.opt.num_threads = int(threads)
        if self.net.load_param(str(param)) != 0 or self.net.load_model(str(param.with_suffix(".bin"))) != 0:
            raise bad_model_file(param, "ncnn", "ncnn cannot load it (a layer it does not know, or a truncated file)")
        self.mat = ncnn.Mat
        self.input_name, self.output_name = self.net.input_names()[0], self.net.output_names()[0]
        _base(self, meta, folder, batch=0)  # one image per extraction: any batch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outputs = []
        for image in x.detach().cpu().float().numpy():
            extractor = self.net.create_extractor()
            extractor.input(self.input_name, self.mat(np.ascontiguousarray(image)))
            status, out = extractor.extract(self.output_name)
            if status != 0:  # ncnn's layers return -100 when an allocation fails
                raise RuntimeError(f"ncnn could not run {self.path} (status {status}{': out of memory' if status == -100 else ''})")
            outputs.append(np.array(out))
        return torch.from_numpy(np.stack(outputs)).float()


class MNNBackend(Backend):
    kind = "mnn"
    label = "MNN"
    holds_gil = True  # measured: its forward keeps Python's lock

    def __init__(self, path: str, *, threads: int | None = None):
        mnn = runtime("mnn", path)
        if Path(path).stat().st_size == 0:
            raise bad_model_file(Path(path), "MNN", "the file is empty")
        manager = mnn.nn.create_runtime_manager(({"backend": "CPU", "precision": "high", "numThread": int(threads or 1)},))
        try:
            self.module = mnn.nn.load_module_from_file(str(path), ["images"], ["output0"], runtime_manager=manager)
            info = self.module.get_info()
        except Exception:  # MNN raises plain exceptions (or returns None) for a file that is no MNN model
            self.module, info = None, {}
        if self.module is None:
            raise bad_model_file(Path(path), "MNN", "MNN cannot load it (truncated, or another kind of file)")
        meta = metadata_from_text(info.get("bizCode") or "{}", Path(path), "MNN")
        self.expr = mnn.expr
        _base(self, meta, Path(path))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        array = np.ascontiguousarray(x.detach().cpu().float().numpy())
        y = self.module.forward(self.expr.const(array, list(array.shape), self.expr.NCHW, self.expr.float))
        return torch.from_numpy(np.array(self.expr.convert(y, self.expr.NCHW).read())).float()


def tflite_metadata(data: bytes, path: Path) -> dict[str, Any]:
    """The yolo-cb metadata stored in a .tflite flatbuffer (entry TFLITE_META of its metadata table), or {}."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.Model.GetRootAs(data, 0)
    for i in range(model.MetadataLength()):
        entry = model.Metadata(i)
        if entry.Name() == TFLITE_META.encode():
            return metadata_from_text(model.Buffers(entry.Buffer()).DataAsNumpy().tobytes(), Path(path), "TFLite")
    return {}


class LiteRTBackend(Backend):
    kind = "tflite"
    label = "TFLite"
    holds_gil = True  # not measured: taken to keep it

    def __init__(self, path: str, *, threads: int | None = None):
        litert = runtime("tflite", path)
        importlib.import_module(f"{litert.__name__}.interpreter")
        try:
            self.interpreter = litert.interpreter.Interpreter(model_path=str(path), num_threads=int(threads or 1))
            self.interpreter.allocate_tensors()
            meta = tflite_metadata(Path(path).read_bytes(), Path(path))
        except (ValueError, RuntimeError):
            raise bad_model_file(Path(path), "TFLite", "LiteRT cannot load it (truncated, or another kind of file)") from None
        self.input, self.output = self.interpreter.get_input_details()[0], self.interpreter.get_output_details()[0]
        _base(self, meta, Path(path))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.interpreter.set_tensor(self.input["index"], np.ascontiguousarray(x.detach().cpu().numpy(), dtype=self.input["dtype"]))
        self.interpreter.invoke()
        return torch.from_numpy(self.interpreter.get_tensor(self.output["index"]).copy()).float()


class ExecuTorchBackend(Backend):
    kind = "executorch"
    label = "ExecuTorch"
    holds_gil = True  # not measured: taken to keep it

    def __init__(self, path: str, *, threads: int | None = None):
        runtime("executorch", path)
        from executorch.runtime import Runtime

        try:
            program = Runtime.get().load_program(str(path))
            self.method = program.load_method("forward")
        except Exception:  # ExecuTorch's RuntimeError / ValueError for a file that is no program
            raise bad_model_file(Path(path), "ExecuTorch", "ExecuTorch cannot load it (truncated, or another kind of file)") from None
        meta = {}
        if PTE_META in program.method_names:
            raw = program.load_method(PTE_META).execute([])[0]
            meta = metadata_from_text(bytes(raw.numpy().astype(np.uint8).tolist()), Path(path), "ExecuTorch")
        _base(self, meta, Path(path))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.execute([x.detach().cpu().float().contiguous()])[0].float()


def coreml_refusal(path: Path) -> ConfigError:
    """The one line for running a CoreML model here."""
    return ConfigError(f"model={path} is a CoreML model: Core ML runs it on Apple platforms only (macOS, iOS); on this machine "
                       f"validate or predict with another export of the same checkpoint (e.g. format=onnx)")


def is_ncnn_folder(path: Path) -> bool:
    return (path.is_dir() and any(path.glob("*.ncnn.param"))) or path.name.endswith(".ncnn.param")


def is_coreml(path: Path) -> bool:
    return path.suffix.lower() == ".mlpackage" or path.parent.suffix.lower() == ".mlpackage"


def mobile_format(path: Path) -> str | None:
    """The format ('ncnn', 'mnn', 'tflite', 'executorch') of a mobile export at `path`, or None when it is none of them;
    a CoreML package is refused (it runs on Apple platforms only)."""
    if is_coreml(path):
        raise coreml_refusal(path)
    if is_ncnn_folder(path):
        return "ncnn"
    fmt = MOBILE_SUFFIXES.get(path.suffix.lower())
    return fmt if fmt is not None and path.is_file() else None


def mobile_backend(path: Path, threads: int | None = None) -> Backend | None:
    """The backend of a mobile export at `path` (see the module docstring), or None when `path` is none of them."""
    fmt = mobile_format(path)
    if fmt is None:
        return None
    kinds = {"ncnn": NCNNBackend, "mnn": MNNBackend, "tflite": LiteRTBackend, "executorch": ExecuTorchBackend}
    return kinds[fmt](str(path), threads=threads)
