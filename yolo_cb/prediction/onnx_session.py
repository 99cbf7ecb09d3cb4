"""An ONNX Runtime session over a model file, and one inference on it at the model's input size, without PyTorch.

The ONNX backend (backend.ONNXBackend) and the probe of a model file (probe_child.py, which must start fast) open the
file the same way here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from yolo_cb.prediction.model_metadata import bad_model_file, unusable_onnx


def onnx_session(path: str | Path, providers: list, threads: int | None = None) -> Any:
    """An onnxruntime.InferenceSession of `path`; a file that is no usable ONNX model is one line saying why."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = int(threads)
    # no busy-waiting worker threads between runs: they would steal the CPU from pre/post-processing (and other processes)
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=providers)
    except Exception:  # onnxruntime's own Fail / InvalidProtobuf / InvalidGraph: a user error only when the file is at fault
        reason = unusable_onnx(Path(path))
        if reason is None:
            raise
        raise bad_model_file(Path(path), "ONNX", reason) from None


def input_shape(dims: list[Any], imgsz: tuple[int, int]) -> list[int]:
    """The shape of one input batch for declared input `dims`: batch 1, 3 channels and `imgsz` where they are not fixed."""
    fill = [1, 3, *imgsz] if len(dims) == 4 else [1] * len(dims)
    return [d if isinstance(d, int) and d > 0 else fill[i] for i, d in enumerate(dims)]


def run_once(session: Any, imgsz: tuple[int, int]) -> None:
    """One inference of the first output, as the backend runs it, on a black image batch of the model's input size."""
    first = session.get_inputs()[0]
    dtype = np.float16 if "float16" in first.type else np.float32
    session.run([session.get_outputs()[0].name], {first.name: np.zeros(input_shape(list(first.shape), imgsz), dtype)})
