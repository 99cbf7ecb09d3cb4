"""Latency side by side (BENCHMARKS.md): letterbox + runtime + decode/NMS, batch 1, same image, same runtime options and threads.

Run in a folder holding s{320,640}_{yolox-nano,yolocb-n,yolo11n,yolo26n}.onnx and ..._openvino_model/ folders:
    /work/venv-ul/bin/python benchmarks/export_latency_ul.py          # Ultralytics' exports (its own venv, ultralytics==8.4.190)
    python benchmarks/export_latency_ul.py ours yolox-nano.yaml        # ours (and yolocb-n.yaml)
    python benchmarks/export_latency.py
"""
import glob
import json
import statistics
import time

import cv2
import onnxruntime as ort
import openvino as ov
import torch
from torchvision.ops import batched_nms

from yolo_cb.prediction.predictor import preprocess
from yolo_cb.utils.signal_stack import kept_signal_stack

IMAGES = "/work/shared/datasets/coco8/images/val/*.jpg"  # the first one is timed


def post(y, kind, conf=0.25, iou=0.65):
    """Detections (n, 6) from one model's raw output, the same way for every model that needs NMS."""
    y = torch.from_numpy(y[0])
    if kind == "yolo26n":  # (300, 6) xyxy score cls: NMS-free
        return y[y[:, 4] > conf]
    if kind == "yolo11n":  # (84, A): cx cy w h, 80 class scores
        y = y.T
        score, cls = y[:, 4:].max(1)
    else:  # ours (A, 85): cx cy w h obj cls...
        prob, cls = y[:, 5:].max(1)
        score = y[:, 4] * prob
    keep = score > conf
    box, score, cls = y[keep, :4], score[keep], cls[keep]
    xyxy = torch.cat((box[:, :2] - box[:, 2:] / 2, box[:, :2] + box[:, 2:] / 2), 1)
    kept = batched_nms(xyxy, score, cls, iou)[:300]
    return torch.cat((xyxy[kept], score[kept, None], cls[kept, None].float()), 1)


def runner(path, runtime, threads):
    if runtime == "onnxruntime":
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        return lambda x: session.run(None, {name: x})[0]
    xml = glob.glob(path + "/*.xml")[0]
    with kept_signal_stack():  # OpenVINO's plugin swaps the signal stack (yolo_cb/utils/signal_stack.py)
        compiled = ov.Core().compile_model(xml, "CPU", {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32"})
    return lambda x: compiled(x)[compiled.output(0)]


def median_ms(run, kind, size, img):
    times = []
    for i in range(25):
        t0 = time.perf_counter()
        x = preprocess(img, size)[0][None].numpy()
        post(run(x), kind)
        if i >= 5:
            times.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(times), 2)


MODELS = (("ours", "yolox-nano"), ("ours", "yolocb-n"), ("yolo11n", "yolo11n"), ("yolo26n", "yolo26n"))

if __name__ == "__main__":
    img = cv2.imread(sorted(glob.glob(IMAGES))[0])
    rows = []
    for size in (320, 640):
        for runtime in ("onnxruntime", "openvino"):
            for threads in (1, 2):
                for kind, stem in MODELS:
                    path = f"s{size}_{stem}" + (".onnx" if runtime == "onnxruntime" else "_openvino_model")
                    rows.append((stem, runtime, size, threads, median_ms(runner(path, runtime, threads), kind, size, img)))
                    print(*rows[-1], flush=True)
    with open("lat.json", "w") as f:
        json.dump(rows, f)
