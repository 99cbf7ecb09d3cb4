"""Megvii's YOLOX checkpoints: equality with Megvii's outputs, official weights by name (download + verification),
fine-tuning to another class count, and `yolo-cb val` on a Megvii file.

The oracle (../shared/golden/yolox, or $YOLO_CB_GOLDEN_DIR): for nano (416) and s (640), a checkpoint in Megvii's file
format with random weights and randomised BatchNorm statistics, a letterboxed input (BGR, 0-255, as Megvii's model takes
it) and the decoded output Megvii's code produced for it. Our pipelines take RGB in [0, 1]; the conversion folds that
into the stem (yolo_cb.checkpoints.megvii), so the converted model gets `input.flip(1) / 255`.

Tolerance: 1e-4 absolute on every output (boxes in pixels up to ~630, scores ~0.01); measured 3.1e-5 (nano) and
6.1e-5 (s), one float32 ulp of the largest coordinates, for the raw load, the converted and fused model, and ONNX.

NMS: random weights give near-constant scores (about 1e-4, many exactly tied: letterbox padding cells have identical
outputs), and ours differ from Megvii's by up to 2e-10. Greedy NMS is decided by the order of overlapping boxes of a
class, so a threshold is chosen where that order cannot flip: the kept candidates' scores are separated from the
threshold, and each same-class overlapping pair from each other, by more than MARGIN (50x the measured difference), and
no pair's IoU is within 1e-3 of the NMS threshold. Then the boxes after NMS must be equal (same count, classes; boxes
within 1e-3 px, scores within MARGIN).
"""

from __future__ import annotations

import hashlib
import http.server
import logging
import math
import shutil
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from shared_data import GOLDEN_DIR

from yolo_cb import YOLO
from yolo_cb.checkpoints import megvii, weights
from yolo_cb.checkpoints.checkpoint import UnsafeCheckpointError, load_checkpoint, model_from_checkpoint
from yolo_cb.errors import CheckpointError
from yolo_cb.nn import build_model
from yolo_cb.nn.postprocess import postprocess, scale_boxes
from yolo_cb.prediction.backend import load_backend

VARIANTS = {"nano": ("yolox-nano", 416, 912_159), "s": ("yolox-s", 640, 8_968_255)}  # name, Megvii's input size, parameters
TOL = 1e-4
MARGIN = 1e-8  # score separation that float noise cannot flip (measured difference: 2e-10)
IOU = 0.65  # the predict default (cfg/default.yaml iou)
ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not all((GOLDEN_DIR / f"yolox_{v}_{kind}").is_file() for v in VARIANTS for kind in ("megvii.pth", "io.pt")),
                                reason=f"Megvii reference files not found in {GOLDEN_DIR}")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Copies of the golden Megvii files in a temp folder (export writes the .onnx beside its input)."""
    folder = tmp_path_factory.mktemp("megvii")
    return {v: Path(shutil.copy(GOLDEN_DIR / f"yolox_{v}_megvii.pth", folder / f"yolox_{v}.pth")) for v in VARIANTS}


def golden(variant: str) -> dict:
    return torch.load(GOLDEN_DIR / f"yolox_{variant}_io.pt", map_location="cpu", weights_only=True)


def ours(io: dict) -> torch.Tensor:
    """The golden input as our pipelines feed it: RGB in [0, 1]."""
    return io["input"].flip(1) / 255


def image(io: dict) -> np.ndarray:
    """The golden input as an image file would decode: HWC BGR uint8 (its values are whole numbers)."""
    return io["input"][0].permute(1, 2, 0).numpy().astype(np.uint8).copy()


def stable_conf(output: torch.Tensor, iou: float = IOU, max_candidates: int = 200) -> float:
    """A confidence threshold where greedy NMS on `output` cannot change under score noise below MARGIN (module docstring)."""
    from torchvision.ops import box_convert, box_iou

    p = output[0].double()
    cls_prob, cls = p[:, 5:].max(1)
    score = p[:, 4] * cls_prob
    order = score.argsort(descending=True)[: max_candidates + 1]
    s, cls, boxes = score[order], cls[order], box_convert(p[order, :4], "cxcywh", "xyxy")
    for k in range(max_candidates, 9, -1):
        if s[k - 1] - s[k] <= MARGIN:
            continue
        overlap, same = box_iou(boxes[:k], boxes[:k]), cls[:k, None] == cls[None, :k]
        close = (s[:k, None] - s[None, :k]).abs() <= MARGIN
        risky = same & (((overlap > iou - 0.01) & close) | ((overlap - iou).abs() < 1e-3))
        risky.fill_diagonal_(False)
        if not risky.any():
            return float((s[k - 1] + s[k]) / 2)
    raise AssertionError("no threshold with a stable NMS result among the top candidates")


def sorted_rows(det: torch.Tensor) -> torch.Tensor:
    det = det.double()
    keys = det[:, 5] * 1e8 + det[:, 0].round() * 1e4 + det[:, 1].round()
    return det[keys.argsort()]


def assert_same_detections(det: torch.Tensor, ref: torch.Tensor) -> None:
    assert len(det) == len(ref) and len(ref) >= 10, (len(det), len(ref))
    a, b = sorted_rows(det), sorted_rows(ref)
    assert torch.equal(a[:, 5], b[:, 5])
    assert (a[:, :4] - b[:, :4]).abs().max() <= 1e-3
    assert (a[:, 4] - b[:, 4]).abs().max() <= MARGIN


def golden_detections(io: dict, conf: float) -> torch.Tensor:
    size = io["input"].shape[-2:]
    det = postprocess(io["output"], conf=conf, iou=IOU, max_det=300)[0]
    return scale_boxes(det, (1.0, (0.0, 0.0)), size)  # what predict does on an image already at the input size (clipped to it)


# --- equality with Megvii's outputs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_megvii_file_loads_strictly_and_reproduces_megvii_outputs(variant, files):
    name, imgsz, params = VARIANTS[variant]
    io = golden(variant)
    state = torch.load(files[variant], map_location="cpu", weights_only=True)["model"]
    arch, found = megvii.infer_arch(state)
    assert found == name and arch["nc"] == 80
    model = build_model(name, nc=80, verbose=False)
    model.load_state_dict(state)  # strict: Megvii's parameter names and shapes, one for one
    assert sum(p.numel() for p in model.parameters()) == params
    with torch.no_grad():
        assert (model.eval()(io["input"]) - io["output"]).abs().max() <= TOL

    ckpt = load_checkpoint(files[variant])  # the converted checkpoint: weights_only load, variant and classes from the tensors
    assert ckpt.model_cfg == {k: v for k, v in arch.items() if k != "nc"} and ckpt.train_args["imgsz"] == imgsz
    assert len(ckpt.names) == 80 and ckpt.names[0] == "person" and ckpt.extras["source"]["variant"] == name
    with torch.no_grad():
        assert (model_from_checkpoint(ckpt)(ours(io)) - io["output"]).abs().max() <= TOL


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_yolo_predict_on_megvii_file_matches_megvii(variant, files, tmp_path):
    """YOLO(path): its backend (fused) reproduces the outputs; predict on the golden input gives the same boxes after NMS."""
    io = golden(variant)
    conf = stable_conf(io["output"])
    seen = {}

    def grab(predictor):
        seen["imgsz"], seen["output"] = predictor.imgsz, predictor.backend(ours(io))

    results = YOLO(str(files[variant])).add_callback("on_predict_postprocess_end", grab).predict(
        image(io), conf=conf, save=False, project=str(tmp_path))
    assert seen["imgsz"] == tuple(io["input"].shape[-2:])  # the variant's own input size, from the checkpoint
    assert (seen["output"] - io["output"]).abs().max() <= TOL
    assert_same_detections(results[0].boxes.data, golden_detections(io, conf))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_exported_onnx_matches_megvii(variant, files, tmp_path):
    io = golden(variant)
    onnx_file = YOLO(str(files[variant])).export(format="onnx")
    assert Path(onnx_file).parent == files[variant].parent
    assert (load_backend(onnx_file)(ours(io)) - io["output"]).abs().max() <= TOL
    conf = stable_conf(io["output"])
    results = YOLO(onnx_file).predict(image(io), conf=conf, save=False, project=str(tmp_path))
    assert_same_detections(results[0].boxes.data, golden_detections(io, conf))


# --- files that are neither format ---------------------------------------------------------------------------------
class Payload:
    """A custom class: pickled in a checkpoint, weights_only loading refuses it."""


def test_neither_format_names_what_does_not_match(tmp_path, files):
    other = tmp_path / "other.pth"
    torch.save({"model": {"conv.weight": torch.zeros(1)}, "epoch": 3}, other)
    with pytest.raises(CheckpointError, match=r"neither a yolo-cb checkpoint .*model_cfg.* nor a Megvii .*lacks backbone\.backbone\.stem"):
        load_checkpoint(other)

    obj = torch.load(files["nano"], weights_only=True)
    state = dict(obj["model"])
    del state["head.reg_preds.2.bias"]
    state["head.stems.0.conv.weight"] = torch.zeros(3, 3, 1, 1)
    broken = tmp_path / "broken.pth"
    torch.save({**obj, "model": state}, broken)
    with pytest.raises(CheckpointError, match=r"1 missing: head\.reg_preds\.2\.bias; 1 wrong shape: head\.stems\.0\.conv\.weight \(3, 3, 1, 1\)"):
        load_checkpoint(broken)

    pickled = tmp_path / "pickled.pth"
    torch.save({**obj, "extra": Payload()}, pickled)
    with pytest.raises(UnsafeCheckpointError, match="pickled Python objects"):
        load_checkpoint(pickled)


# --- official weights by name: download, verification ----------------------------------------------------------------
class _Handler(http.server.SimpleHTTPRequestHandler):
    requests: list[str]

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        self.requests.append(self.path)
        if self.path.startswith("/drop/"):  # announces the whole file, sends half of it, then closes
            data = (Path(self.directory) / self.path[len("/drop/"):]).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.close_connection = True
            return
        super().do_GET()


@pytest.fixture
def server(tmp_path):
    """A local http.server on 127.0.0.1 serving tmp_path/served: (folder, base URL, list of requested paths)."""
    folder = tmp_path / "served"
    folder.mkdir()
    handler = type("Handler", (_Handler,), {"requests": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(folder)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield folder, f"http://127.0.0.1:{httpd.server_address[1]}/", handler.requests
    httpd.shutdown()
    httpd.server_close()


def official(monkeypatch, url: str, sha256: str | None = None) -> None:
    monkeypatch.setitem(weights.OFFICIAL, "yolox-nano", weights.Official("yolox-nano", "yolox_nano.pth", url, sha256))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_download_verifies_records_converts_and_reuses(server, monkeypatch, tmp_path):
    served, base, requests = server
    shutil.copy(GOLDEN_DIR / "yolox_nano_megvii.pth", served / "yolox_nano.pth")
    digest = sha256(served / "yolox_nano.pth")
    official(monkeypatch, base + "yolox_nano.pth", digest)  # pinned: the served file's hash
    folder = tmp_path / "weights"
    io = golden("nano")
    results = YOLO("yolox-nano.pt").predict(image(io), weights_dir=str(folder), conf=stable_conf(io["output"]), save=False,
                                            project=str(tmp_path / "runs"))
    assert_same_detections(results[0].boxes.data, golden_detections(io, stable_conf(io["output"])))
    assert sorted(p.name for p in folder.iterdir()) == ["yolox-nano.pt", "yolox_nano.pth", "yolox_nano.pth.sha256"]
    assert (folder / "yolox_nano.pth.sha256").read_text() == f"{digest}  yolox_nano.pth\n"
    converted = load_checkpoint(folder / "yolox-nano.pt")
    assert converted.model_cfg and converted.extras["source"]["sha256"] == digest
    stamp = (folder / "yolox-nano.pt").stat().st_mtime_ns

    monkeypatch.setenv("YOLO_CB_WEIGHTS_DIR", str(folder))  # the env override; Megvii's asset name works too
    assert weights.resolve_weights("yolox_nano.pth") == folder / "yolox-nano.pt"
    assert requests == ["/yolox_nano.pth"] and (folder / "yolox-nano.pt").stat().st_mtime_ns == stamp  # reused, not redone
    monkeypatch.delenv("YOLO_CB_WEIGHTS_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert weights.weights_dir() == tmp_path / "cache" / "yolo_cb" / "weights"
    assert weights.resolve_weights("runs/yolox-nano.pt") == "runs/yolox-nano.pt"  # a path, not a name: left alone


@pytest.mark.parametrize("case", ["truncated", "dropped", "wrong_variant", "pinned_hash"])
def test_refused_download_is_removed_and_leaves_nothing(case, server, monkeypatch, tmp_path):
    served, base, _ = server
    data = (GOLDEN_DIR / ("yolox_s_megvii.pth" if case == "wrong_variant" else "yolox_nano_megvii.pth")).read_bytes()
    (served / "yolox_nano.pth").write_bytes(data[: len(data) // 2] if case == "truncated" else data)
    official(monkeypatch, base + ("drop/" if case == "dropped" else "") + "yolox_nano.pth", "0" * 64 if case == "pinned_hash" else None)
    expected = {"truncated": r"refused the download .*(truncated|weights_only)", "dropped": "cannot download the yolox-nano weights",
                "wrong_variant": r"refused the download .*not yolox-nano's .*it looks like yolox-s", "pinned_hash": "not the known hash"}[case]
    folder = tmp_path / "weights"
    with pytest.raises(CheckpointError, match=expected):
        weights.resolve_weights("yolox-nano.pt", folder)
    assert list(folder.iterdir()) == []  # no temp file, no record, no converted file


def test_later_file_with_another_hash_is_refused(server, monkeypatch, tmp_path):
    served, base, _ = server
    shutil.copy(GOLDEN_DIR / "yolox_nano_megvii.pth", served / "yolox_nano.pth")
    official(monkeypatch, base + "yolox_nano.pth")  # no pinned hash: the first verified download's is recorded
    folder = tmp_path / "weights"
    weights.resolve_weights("yolox-nano.pt", folder)
    recorded = (folder / "yolox_nano.pth.sha256").read_text()
    obj = torch.load(served / "yolox_nano.pth", weights_only=True)
    obj["model"]["head.obj_preds.0.bias"] += 1.0  # a valid nano file, but not the one first verified
    torch.save(obj, served / "yolox_nano.pth")
    for name in ("yolox_nano.pth", "yolox-nano.pt"):
        (folder / name).unlink()
    with pytest.raises(CheckpointError, match="differs from .* recorded in .*yolox_nano.pth.sha256"):
        weights.resolve_weights("yolox-nano.pt", folder)
    assert [p.name for p in folder.iterdir()] == ["yolox_nano.pth.sha256"] and (folder / "yolox_nano.pth.sha256").read_text() == recorded


def test_offline_error_says_where_to_put_the_file(monkeypatch, tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    official(monkeypatch, f"http://127.0.0.1:{port}/yolox_nano.pth")
    folder = tmp_path / "weights"
    with pytest.raises(CheckpointError, match=f"put it at {folder / 'yolox_nano.pth'}"):
        weights.resolve_weights("yolox-nano.pt", folder)
    assert list(folder.iterdir()) == []


# --- fine-tuning to another class count ------------------------------------------------------------------------------
def test_finetune_from_megvii_nano_to_shapes(files, tiny, caplog):
    megvii_state = torch.load(files["nano"], weights_only=True)["model"]
    folded = megvii.fold_input_convention(megvii_state)
    start = {}

    def snapshot(trainer):
        from yolo_cb.recipe.ema import unwrap

        start.update({k: v.detach().clone() for k, v in unwrap(trainer.model).state_dict().items()})

    with caplog.at_level(logging.INFO, logger="yolo_cb"):
        metrics = YOLO().add_callback("on_train_start", snapshot).train(**{**tiny, "model": str(files["nano"])})
    log = caplog.text
    assert "transferred 636/642 tensors" in log  # all but the class head's 3 weights and 3 biases (80 -> 4 rows)
    assert "class head re-initialised for 4 classes (checkpoint: 80)" in log
    for key in ("backbone.backbone.stem.conv.conv.weight", "backbone.backbone.dark2.0.dconv.conv.weight", "head.obj_preds.2.bias",
                "head.reg_preds.0.weight", "backbone.C3_n4.m.0.conv2.pconv.bn.running_var"):
        assert torch.equal(start[key], folded[key]), key
    prior = -math.log((1 - 0.01) / 0.01)
    for i in range(3):
        assert start[f"head.cls_preds.{i}.weight"].shape[0] == 4 and torch.allclose(start[f"head.cls_preds.{i}.bias"], torch.full((4,), prior))
    assert metrics and all(math.isfinite(float(v)) for v in metrics.values())
    assert all(math.isfinite(float(v)) for k, v in metrics.items() if k.startswith("train/"))


def test_pretrained_megvii_file_initialises_a_yaml_model(files, tmp_path):
    from yolo_cb.settings.config import get_config
    from yolo_cb.training.trainer import Trainer

    trainer = Trainer(get_config({"model": "yolox-nano.yaml", "pretrained": str(files["nano"]), "project": str(tmp_path)}))
    trainer._parts.data = {"nc": 4, "names": {0: "circle", 1: "rectangle", 2: "triangle", 3: "cross"}}
    trainer._build_model()
    folded = megvii.fold_input_convention(torch.load(files["nano"], weights_only=True)["model"])
    state = trainer.model.state_dict()
    assert sum(torch.equal(state[k], v) for k, v in folded.items() if k in state and state[k].shape == v.shape) == 636


# --- the CLI ---------------------------------------------------------------------------------------------------------
def test_cli_val_on_a_megvii_file(files, coco8_yaml, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "yolo_cb", "val", f"model={files['nano']}", f"data={coco8_yaml}", f"project={tmp_path}",
                           "workers=0", "plots=false"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout.split("mAP50-95", 1)[1]  # the metrics table, with COCO's class names from the converted checkpoint
    assert "person" in table and "elephant" in table
