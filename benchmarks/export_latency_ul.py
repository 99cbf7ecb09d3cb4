"""Exports for benchmarks/export_latency.py: Ultralytics' YOLO11n / YOLO26n (run with Ultralytics' venv), or ours
(`ours MODEL.yaml`, run with yolo-cb's), static, at 320 and 640, to ONNX and OpenVINO, named s<size>_<stem>..."""

import os
import sys


def ultralytics_exports():
    from ultralytics import YOLO

    for name in ("yolo11n.yaml", "yolo26n.yaml"):
        for size in (320, 640):
            for fmt in ("onnx", "openvino"):
                out = str(YOLO(name).export(format=fmt, imgsz=size, dynamic=False, simplify=True)).rstrip("/")
                os.replace(out, f"s{size}_{out}")


def our_exports(cfg: str):
    from yolo_cb.export.exporter import Exporter
    from yolo_cb.nn import build_model

    for size in (320, 640):
        for fmt in ("onnx", "openvino"):
            out = Exporter({"format": fmt, "imgsz": size, "project": "."})(build_model(cfg, nc=80, verbose=False)).rstrip("/")
            os.replace(out, f"s{size}_{os.path.basename(out)}")


if __name__ == "__main__":
    our_exports(sys.argv[2]) if sys.argv[1:2] == ["ours"] else ultralytics_exports()
