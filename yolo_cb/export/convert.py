"""Conversions of the exported fp32 ONNX graph: fp16 (`half=True`), int8 static quantization (`int8=True`, ONNX
Runtime), and OpenVINO IR (fp32, fp16 weights, int8 from that same quantized graph); plus the calibration images.

Calibration: the first `fraction` of the train split of `data=` (at most CALIB_MAX images), letterboxed exactly as
predict does. int8 without `data=` is refused before any work (ExportSettingError).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from yolo_cb.data.resolve import check_data
from yolo_cb.data.verify import imread, list_image_files
from yolo_cb.errors import ConfigError
from yolo_cb.export.formats import ExportError, ExportSettingError, export_write_error
from yolo_cb.export.mobile import MOBILE_FORMATS, check_mobile
from yolo_cb.prediction.backend import OPENVINO_META
from yolo_cb.prediction.predictor import preprocess
from yolo_cb.settings.schema import RULES
from yolo_cb.settings.values import parse_variant, variant_conflict
from yolo_cb.utils.log import LOGGER

# the export formats offered, the `format` setting's choices; the last five are mobile and edge formats (export/mobile.py),
# each with its own extra
FORMATS = RULES["format"].choices
CALIB_MAX = 300  # calibration images at most (the first 300 of the train split: more adds time, not accuracy)
INSTALL = {"openvino": "pip install 'yolo-cb[openvino]'", "onnx_int8": "pip install onnxruntime"}


def calibration_images(data: Any, datasets_dir: Any, fraction: float, imgsz: tuple[int, int]) -> list[np.ndarray]:
    """(1, 3, H, W) float32 letterboxed RGB [0, 1] arrays of the first `fraction` of data's train split (<= CALIB_MAX)."""
    if not data:
        raise ExportSettingError("int8=True needs data= (a dataset YAML): the int8 ranges are calibrated on its train split, "
                                 "e.g. yolo-cb export model=best.pt format=onnx int8=True data=shapes.yaml")
    split = check_data(data, datasets_dir).get("train")
    files = list_image_files(split) if split else []
    files = files[: max(1, round(len(files) * float(fraction)))][:CALIB_MAX]
    images = []
    for file in files:
        img = imread(str(file))
        if img is not None:
            images.append(preprocess(img, imgsz, auto=False)[0][None].numpy().astype(np.float32))
    if not images:
        raise ExportSettingError(f"int8=True: no readable image in the train split of data={data} to calibrate on")
    LOGGER.info(f"int8 calibration on {len(images)} train image(s) of {data}")
    return images


def half_onnx(proto_bytes: bytes) -> bytes:
    """The fp32 ONNX graph with fp16 weights and activations, fp16 input and output (ONNX Runtime's float16 converter)."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    proto = convert_float_to_float16(onnx.load_from_string(proto_bytes), keep_io_types=False,
                                     op_block_list=["NonMaxSuppression", "TopK", "ScatterND", "Cast"])
    return proto.SerializeToString()


class _Reader:
    """ONNX Runtime's CalibrationDataReader over a list of input arrays."""

    def __init__(self, name: str, images: list[np.ndarray]):
        self.items = iter([{name: x} for x in images])

    def get_next(self):
        return next(self.items, None)


ACTIVATIONS = {"Sigmoid", "Mul", "Relu", "LeakyRelu", "HardSwish", "HardSigmoid", "Clip", "PRelu", "Elu", "Tanh"}


def prediction_convs(proto: Any) -> list[str]:
    """Names of the Conv nodes with no activation after them: the head's box / objectness / class predictions, whose
    outputs are the detections themselves (kept in float by int8_onnx)."""
    consumers: dict[str, set[str]] = {}
    for node in proto.graph.node:
        for name in node.input:
            consumers.setdefault(name, set()).add(node.op_type)
    return [n.name for n in proto.graph.node if n.op_type == "Conv" and not consumers.get(n.output[0], set()) & ACTIVATIONS]


def int8_onnx(fp32_file: Path, out_file: Path, images: list[np.ndarray]) -> None:
    """Static int8 quantization (QDQ, per-channel int8 weights, uint8 activations) of the convolutions of fp32_file but
    the prediction convolutions (see prediction_convs), activation ranges from the 99.999th percentile of the calibration
    values. Measured on the test model (mAP50-95 0.3091 in PyTorch): MinMax 0.2866, MinMax without the prediction convs
    0.2870, Entropy 0.2870, MinMax with moving average 0.2899, Percentile 0.3067 (drop 0.0024)."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    name = ort.InferenceSession(str(fp32_file), providers=["CPUExecutionProvider"]).get_inputs()[0].name
    quantize_static(str(fp32_file), str(out_file), _Reader(name, images), quant_format=QuantFormat.QDQ, per_channel=True,
                    weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8, op_types_to_quantize=["Conv"],
                    nodes_to_exclude=prediction_convs(onnx.load(str(fp32_file))), calibrate_method=CalibrationMethod.Percentile)


def openvino_model(onnx_file: Path) -> Any:
    """The OpenVINO model of onnx_file. For int8 that file is int8_onnx's QDQ graph: OpenVINO runs its quantize /
    dequantize pairs as int8, so both formats share one int8 recipe (NNCF's MIXED preset lost 0.06-0.07 mAP50-95 on the
    test model on an AMD EPYC, docs/export.md)."""
    try:
        import openvino as ov
    except ImportError as error:
        raise ExportSettingError(f"format=openvino needs OpenVINO: {INSTALL['openvino']}") from error
    return ov.convert_model(str(onnx_file))


def save_openvino(model: Any, folder: Path, stem: str, half: bool, metadata: dict[str, Any]) -> None:
    """Write `stem`.xml / .bin (fp16 weights when half) and metadata.json into folder."""
    import openvino as ov

    ov.save_model(model, str(folder / f"{stem}.xml"), compress_to_fp16=bool(half))
    (folder / OPENVINO_META).write_text(json.dumps(metadata, indent=1))


class StagedDir:
    """A temp folder beside `target` that replaces `target` only on commit(); removed otherwise (like StagedFile, and like
    it one WriteError line ending in `hint` when the folder cannot be written)."""

    def __init__(self, target: Path, hint: str = ""):
        self.target = Path(target)
        self.hint = hint
        self.path = self.target.parent / f".{self.target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        self.committed = False

    def __enter__(self) -> StagedDir:
        for stale in self.target.parent.glob(f".{self.target.name}.*.tmp"):
            pid = stale.name[len(self.target.name) + 2:].split(".")[0]
            if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
                shutil.rmtree(stale, ignore_errors=True)
        try:
            self.path.mkdir(parents=True)
        except OSError as error:
            raise export_write_error(error, self.target, self.hint) from error
        return self

    def commit(self) -> Path:
        old = None
        if self.target.exists():
            old = self.target.parent / f".{self.target.name}.{os.getpid()}.old.tmp"
            os.replace(self.target, old)
        os.replace(self.path, self.target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        self.committed = True
        return self.target

    def __exit__(self, *exc: object) -> None:
        if not self.committed:
            shutil.rmtree(self.path, ignore_errors=True)


def parse_spec(token: str) -> dict[str, Any]:
    """An export variant named as in formats= / export_check= (the settings' parse_variant) -> {"format", "half", "int8",
    "nms"}, its combination checked; ExportSettingError naming the known ones."""
    try:
        spec = parse_variant(token)
    except ConfigError as error:
        raise ExportSettingError(str(error)) from None
    check_format_combo(spec["format"], spec["half"], spec["int8"], spec["nms"])
    return spec


def check_format_combo(fmt: str, half: bool, int8: bool, nms: bool, dynamic: bool = False) -> None:
    """Refuse combinations that cannot be honoured (and a mobile format whose converter is not installed), before any work."""
    conflict = variant_conflict(fmt, half, int8, nms)
    if conflict:
        raise ExportSettingError(conflict)
    if fmt not in FORMATS:
        raise ExportError(f"format={fmt!r} is not supported")
    if fmt in MOBILE_FORMATS:
        check_mobile(fmt, half, int8, nms, dynamic)


def set_onnx_metadata(file: Path, metadata: dict[str, Any]) -> None:
    """Replace the metadata of the ONNX file `file` (quantization drops it)."""
    import onnx

    proto = onnx.load(str(file))
    del proto.metadata_props[:]
    for key, value in metadata.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = str(key), value if isinstance(value, str) else json.dumps(value)
    onnx.save(proto, str(file))


def file_size(path: Path) -> int:
    """Bytes of a file, or of every file in a folder (an OpenVINO, ncnn or CoreML model)."""
    path = Path(path)
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size
