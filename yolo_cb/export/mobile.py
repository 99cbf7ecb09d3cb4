"""Mobile and edge exports: ncnn and MNN (converted from the exported ONNX graph), LiteRT (.tflite) and ExecuTorch (.pte)
(from torch.export of the same eval graph), CoreML (.mlpackage, from its trace; converted and checked structurally only:
Core ML runs on Apple platforms).

Every one is static (the exported image size and batch) and has no NMS inside. YOLOX's stem (Focus: strided slices, which
ncnn has no layer for) is exported as an exact space-to-depth convolution (`focus_as_conv`). Precisions: see PRECISIONS.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from yolo_cb.export.formats import ExportError, ExportSettingError, ExportWrapper
from yolo_cb.nn.blocks import ConvBNAct, Focus
from yolo_cb.prediction.mobile_backends import NCNN_META, PTE_META, RUNTIMES, TFLITE_META

MOBILE_FORMATS = ("ncnn", "mnn", "tflite", "executorch", "coreml")
# the precisions each format is exported in: half = fp16 weights (ncnn, MNN) or fp16 compute (CoreML); int8 = MNN's int8
# weights (fp32 arithmetic, no calibration) or LiteRT's static int8 (PT2E, calibrated on data=)
PRECISIONS = {"ncnn": ("fp32", "half"), "mnn": ("fp32", "half", "int8"), "tflite": ("fp32", "int8"), "executorch": ("fp32",),
              "coreml": ("fp32", "half")}
# the modules each format's export imports (the converter and the runtime that verifies it)
CONVERTERS = {"ncnn": ("pnnx", "ncnn"), "mnn": ("MNN", "_tools"), "tflite": ("litert_torch", "ai_edge_litert"),
              "executorch": ("executorch",), "coreml": ("coremltools",)}
TOOL_TIMEOUT = 600  # seconds a converter process may take (pnnx, MNNConvert take ~2 s for a small model)


def check_mobile(fmt: str, half: bool, int8: bool, nms: bool, dynamic: bool) -> None:
    """ExportSettingError for what format `fmt` cannot hold (nms, dynamic shapes, a precision) or an absent converter."""
    precision = "int8" if int8 else "half" if half else "fp32"
    if nms:
        raise ExportSettingError(f"format={fmt} does not hold NMS in its graph (nms=True is onnx / openvino only); export without "
                                 "nms: yolo-cb runs NMS after the model")
    if dynamic:
        raise ExportSettingError(f"format={fmt} is exported for one image size and batch; drop dynamic=True (or use format=onnx)")
    if precision not in PRECISIONS[fmt]:
        raise ExportSettingError(f"format={fmt} is exported in {' / '.join(PRECISIONS[fmt])} here, not {precision}; "
                                 f"drop {'int8' if int8 else 'half'}=True")
    missing = [m for m in CONVERTERS[fmt] if importlib.util.find_spec(m) is None]
    if missing:
        raise ExportSettingError(f"format={fmt} needs {', '.join(missing)}, not installed here: {RUNTIMES[fmt][1]}")


class FocusAsConv(nn.Module):
    """A Focus stem whose space-to-depth is a fixed stride-2 2x2 convolution: each output channel copies one pixel of each
    2x2 block (weights 1 and 0, so the result is exactly the slices'), channel order as Focus's (tl, bl, tr, br)."""

    def __init__(self, focus: nn.Module, channels: int = 3):
        super().__init__()
        weight = torch.zeros(4 * channels, channels, 2, 2)
        for block, (dy, dx) in enumerate(((0, 0), (1, 0), (0, 1), (1, 1))):
            for c in range(channels):
                weight[block * channels + c, c, dy, dx] = 1.0
        self.register_buffer("space_to_depth", weight)
        self.conv = focus.conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(nn.functional.conv2d(x, self.space_to_depth.to(x.dtype), stride=2))


def focus_as_conv(model: nn.Module) -> nn.Module:
    """`model`, or a copy of it whose Focus stems are FocusAsConv (the same outputs; strided slices are not portable)."""
    if not any(isinstance(m, Focus) for m in model.modules()):
        return model
    model = copy.deepcopy(model)
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if isinstance(child, Focus):
                setattr(parent, name, FocusAsConv(child, child.conv.conv.in_channels // 4))
    return model


def _tool(command: list[str], what: str, cwd: Path) -> None:
    """Run a converter process; ExportError with the end of its output when it fails."""
    proc = subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=TOOL_TIMEOUT)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        raise ExportError(f"{what} failed (exit {proc.returncode}): {' | '.join(tail)}")


def write_ncnn(onnx_file: Path, folder: Path, stem: str, shape: tuple[int, ...], half: bool, metadata: dict[str, Any]) -> None:
    """pnnx converts `onnx_file` into folder/`stem`.ncnn.param + .bin (fp16 weights when half); metadata.json beside them.
    pnnx's by-products (its own graph, Python scripts) are written to a work folder that is removed."""
    import pnnx

    onnx_file, folder = Path(onnx_file).resolve(), Path(folder).resolve()  # the tool runs in its work folder: no relative path
    work = folder / ".pnnx"
    work.mkdir()
    try:
        shape_arg = f"inputshape=[{','.join(str(v) for v in (1, *shape[1:]))}]"  # ncnn runs one image per extraction
        out = {"ncnnparam": folder / f"{stem}.ncnn.param", "ncnnbin": folder / f"{stem}.ncnn.bin", "pnnxparam": work / "p.param",
               "pnnxbin": work / "p.bin", "pnnxpy": work / "p.py", "pnnxonnx": work / "p.onnx", "ncnnpy": work / "n.py"}
        _tool([pnnx.EXEC_PATH, str(onnx_file), shape_arg, f"fp16={int(half)}", *(f"{k}={v}" for k, v in out.items())], "pnnx", work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for leftover in onnx_file.parent.glob(f"{onnx_file.stem}.pnnx*"):  # pnnx writes its simplified copy beside the input
        leftover.unlink(missing_ok=True)
    (folder / NCNN_META).write_text(json.dumps(metadata, indent=1))


def write_mnn(onnx_file: Path, target: Path, half: bool, int8: bool, metadata: dict[str, Any]) -> None:
    """MNN's converter (its compiled module `_tools`, in a child process) writes `target` from `onnx_file`; the metadata JSON
    is the model's bizCode. Not MNN.tools.mnnconvert: importing that module runs `pip install` and a usage logger. Its
    return value is no status (1 after "Converted Success!"): a missing or empty model is the failure."""
    flags = ["--fp16"] if half else ["--weightQuantBits", "8"] if int8 else []
    onnx_file, target = Path(onnx_file).resolve(), Path(target).resolve()  # the tool runs in the target's folder
    _tool([sys.executable, "-c", "import sys, _tools; _tools.mnnconvert(sys.argv)", "-f", "ONNX", "--modelFile", str(onnx_file),
           "--MNNModel", str(target), "--bizCode", json.dumps(metadata), *flags], "MNNConvert", target.parent)
    if not target.is_file() or target.stat().st_size == 0:
        raise ExportError(f"MNNConvert wrote no model for {onnx_file.name}")


def _in_conv_block(node: Any) -> bool:
    """A node of a ConvBNAct block (the parameters' get_attr nodes carry no module stack: they follow their convolution)."""
    stack = node.meta.get("nn_module_stack")
    return stack is None or f"{ConvBNAct.__module__}.{ConvBNAct.__qualname__}" in {kind for _, kind in stack.values()}


def _quantized(graph: nn.Module, example: torch.Tensor, calib: list[np.ndarray]) -> tuple[nn.Module, Any]:
    """Static int8 of `graph` for LiteRT: torch.export, then PT2E with LiteRT's symmetric per-channel config on the
    convolutions of ConvBNAct blocks only, calibrated. The head's prediction convolutions and the decode stay in float, as
    in onnx int8: quantized too, boxes in pixels and scores in [0, 1] share one int8 range and the test model's mAP50-95
    fell from 0.28 to 0.00. (LiteRT's own set_module_type filters the weights' nodes too, which carry no module stack,
    so it quantizes nothing: the conv annotator is called here with a filter that lets them through.) Returns the module
    and the QuantConfig that tells the converter to lower its quantize / dequantize pairs to int8 kernels (without it the
    convolutions stay float between fake-quantize nodes)."""
    from litert_torch.quantize import pt2e_quantizer
    from litert_torch.quantize.pt2e_quantizer_utils import OP_TO_ANNOTATOR
    from litert_torch.quantize.quant_config import QuantConfig
    from torchao.quantization.pt2e import quantize_pt2e

    config = pt2e_quantizer.get_symmetric_quantization_config(is_per_channel=True)

    class ConvBlockQuantizer(pt2e_quantizer.PT2EQuantizer):
        def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
            OP_TO_ANNOTATOR["conv"](model, config, _in_conv_block)
            return model

    quantizer = ConvBlockQuantizer().set_global(config)  # the global config (static) only tells QuantConfig the mode
    prepared = quantize_pt2e.prepare_pt2e(torch.export.export(graph, (example,)).module(), quantizer)
    for image in calib:
        prepared(torch.from_numpy(image).expand(example.shape[0], -1, -1, -1))
    return quantize_pt2e.convert_pt2e(prepared, fold_quantize=False), QuantConfig(pt2e_quantizer=quantizer)


def tflite_with_metadata(data: bytes, metadata: dict[str, Any]) -> bytes:
    """The .tflite flatbuffer `data` with `metadata` (JSON) as its metadata entry TFLITE_META."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(bytearray(data), 0)
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(json.dumps(metadata).encode(), dtype=np.uint8)
    model.buffers.append(buffer)
    entry = schema.MetadataT()
    entry.name, entry.buffer = TFLITE_META, len(model.buffers) - 1
    model.metadata = [m for m in (model.metadata or []) if m.name != TFLITE_META.encode()] + [entry]
    builder = flatbuffers.Builder(len(data) + 4096)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def write_tflite(module: nn.Module, target: Path, example: torch.Tensor, calib: list[np.ndarray] | None, metadata: dict[str, Any]) -> None:
    """litert-torch converts the eval graph (static int8 first when `calib` is given) into `target`, metadata inside."""
    import litert_torch

    graph, quant_config = ExportWrapper(module).eval(), None
    if calib is not None:
        graph, quant_config = _quantized(graph, example, calib)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        litert_torch.convert(graph, (example,), quant_config=quant_config).export(str(target))
    target.write_bytes(tflite_with_metadata(target.read_bytes(), metadata))


def write_executorch(module: nn.Module, target: Path, example: torch.Tensor, metadata: dict[str, Any]) -> None:
    """torch.export of the eval graph, lowered to XNNPACK, saved as an ExecuTorch program; the metadata JSON is the
    program's constant method PTE_META (uint8)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(ExportWrapper(module).eval(), (example,))
        meta = torch.tensor(list(json.dumps(metadata).encode()), dtype=torch.uint8)
        edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()], constant_methods={PTE_META: meta})
        target.write_bytes(edge.to_executorch().buffer)


def write_coreml(module: nn.Module, folder: Path, example: torch.Tensor, half: bool, metadata: dict[str, Any]) -> None:
    """coremltools converts the traced eval graph to an ML program (fp16 compute when half) whose package is `folder`."""
    import coremltools as ct

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(ExportWrapper(module).eval(), example, check_trace=False)
        model = ct.convert(traced, inputs=[ct.TensorType(name="images", shape=tuple(example.shape))], outputs=[ct.TensorType(name="output0")],
                           convert_to="mlprogram", minimum_deployment_target=ct.target.iOS16,
                           compute_precision=ct.precision.FLOAT16 if half else ct.precision.FLOAT32)
    for key, value in metadata.items():
        model.user_defined_metadata[str(key)] = value if isinstance(value, str) else json.dumps(value)
    package = folder / "model.mlpackage"  # coremltools saves an ML program only under a .mlpackage name: moved up after
    model.save(str(package))
    for child in package.iterdir():
        child.rename(folder / child.name)
    package.rmdir()


def check_coreml(folder: Path, example: torch.Tensor, reference_shape: tuple[int, ...]) -> dict[str, Any]:
    """The structural check of a CoreML package (its predictions need macOS): the spec loads, input `images` has the example's
    shape and output `output0` PyTorch's; ExportError otherwise."""
    import coremltools as ct

    spec = ct.utils.load_spec(str(folder))
    shapes = {f.name: tuple(f.type.multiArrayType.shape) for f in (*spec.description.input, *spec.description.output)}
    expected = {"images": tuple(example.shape), "output0": tuple(reference_shape)}
    if shapes != expected:
        raise ExportError(f"the CoreML package's inputs / outputs {shapes} are not PyTorch's {expected}")
    return {"inputs": shapes["images"], "outputs": shapes["output0"]}


def write_mobile(fmt: str, staged: Path, stem: str, module: nn.Module, example: torch.Tensor, onnx_data: bytes | None, half: bool,
                 int8: bool, calib: list[np.ndarray] | None, metadata: dict[str, Any]) -> None:
    """Export `module` in mobile format `fmt` into `staged` (a file, or a folder for ncnn and CoreML; `stem`: the file stem
    inside an ncnn folder); `onnx_data`: its exported fp32 ONNX graph (ncnn and MNN convert that). `module` is exported as
    it is: pass focus_as_conv(module) (the exporter does)."""
    if fmt in ("ncnn", "mnn"):
        source = (staged if fmt == "ncnn" else staged.parent) / f".{staged.name}.src.onnx"
        source.write_bytes(onnx_data)
        try:
            if fmt == "ncnn":
                write_ncnn(source, staged, stem, tuple(example.shape), half, metadata)
            else:
                write_mnn(source, staged, half, int8, metadata)
        finally:
            source.unlink(missing_ok=True)
    elif fmt == "tflite":
        write_tflite(module, staged, example, calib if int8 else None, metadata)
    elif fmt == "executorch":
        write_executorch(module, staged, example, metadata)
    else:
        write_coreml(module, staged, example, half, metadata)

