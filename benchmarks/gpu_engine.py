"""The TensorRT row of benchmarks/gpu_check.py's export part: an engine built from our ONNX file and checked against ONNX
Runtime on the same input (yolo-cb has no `engine` format of its own yet: this is TensorRT's own ONNX parser).

TensorRT is not on the GPU image (/work/.library/device/KINDS.md), and its wheels (hundreds of MB) are over the
64 MiB a device call carries: the row says so unless a later image has it. Written against the TensorRT 10 API
(named I/O tensors, execute_async_v3); runs only where `import tensorrt` works and CUDA is there.
"""

from __future__ import annotations

import time
from pathlib import Path

ENGINE_WORKSPACE = 4 << 30  # bytes of GPU memory the builder may use for tactics
TIMED_RUNS = 20  # engine runs timed after 3 warm-ups


def build_engine(onnx_path: str):
    """(deserialised engine, build seconds, engine path) for the ONNX file, in fp32."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # TensorRT 10: explicit batch is the only mode
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(Path(onnx_path).read_bytes()):
        raise RuntimeError("TensorRT's ONNX parser: " + "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)))
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, ENGINE_WORKSPACE)
    start = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError("TensorRT could not build an engine from the ONNX file (see its log above)")
    seconds = time.perf_counter() - start
    path = Path(onnx_path).with_suffix(".engine")
    path.write_bytes(bytes(serialized))
    return trt.Runtime(logger).deserialize_cuda_engine(serialized), seconds, path


def run_engine(engine, x) -> tuple[dict, float]:
    """({output name: tensor on the GPU}, ms per run) for input x (a CUDA tensor)."""
    import numpy as np
    import tensorrt as trt
    import torch

    context = engine.create_execution_context()
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    outputs = {}
    for name in names:
        if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
            context.set_input_shape(name, tuple(x.shape))
            context.set_tensor_address(name, x.data_ptr())
    for name in names:
        if engine.get_tensor_mode(name) == trt.TensorIOMode.OUTPUT:
            dtype = torch.from_numpy(np.empty(0, dtype=trt.nptype(engine.get_tensor_dtype(name)))).dtype
            outputs[name] = torch.empty(tuple(context.get_tensor_shape(name)), dtype=dtype, device=x.device)
            context.set_tensor_address(name, outputs[name].data_ptr())
    stream = torch.cuda.current_stream()
    for i in range(3 + TIMED_RUNS):
        if i == 3:
            stream.synchronize()
            start = time.perf_counter()
        context.execute_async_v3(stream.cuda_stream)
    stream.synchronize()
    return outputs, (time.perf_counter() - start) * 1e3 / TIMED_RUNS


def check_engine(onnx_path: str, imgsz: int) -> dict:
    """Build, run and compare with ONNX Runtime (CPU) on one random image: the row's figures."""
    import onnxruntime as ort
    import tensorrt as trt
    import torch

    engine, build_s, path = build_engine(onnx_path)
    x = torch.rand(1, 3, imgsz, imgsz, device="cuda")
    outputs, ms = run_engine(engine, x)
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    reference = dict(zip([o.name for o in session.get_outputs()], session.run(None, {session.get_inputs()[0].name: x.cpu().numpy()}), strict=True))
    diffs = {name: float((outputs[name].float().cpu() - torch.from_numpy(ref).float()).abs().max()) for name, ref in reference.items()}
    worst = max(diffs.values())
    scale = max(float(abs(torch.from_numpy(ref).float()).max()) for ref in reference.values())
    return {"max_diff": worst, "ms": ms, "build_s": build_s,
            "note": f"TensorRT {trt.__version__} fp32 engine ({path.stat().st_size / 1e6:.1f} MB, built in {build_s:.0f} s): "
                    f"max |diff| vs ONNX Runtime {worst:.2e} (outputs up to {scale:.1f}); {ms:.2f} ms per image at batch 1"}
