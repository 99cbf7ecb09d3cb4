"""YOLOX network: sizes and costs, forward contracts, fusing, channels_last, export, post-processing."""

from __future__ import annotations

import copy
import io
import logging

import pytest
import torch

from yolo_cb.nn import YOLOX, Detector, build_model, model_info, postprocess, scale_boxes
from yolo_cb.nn.yolocb.loss import YOLOCBLoss
from yolo_cb.nn.yolox.loss import YOLOXLoss

# name -> (params in millions at nc=80, GFLOPs, imgsz at which YOLOX reports them)
REFERENCE = {
    "nano": (0.91, 1.08, 416),
    "tiny": (5.06, 6.45, 416),
    "s": (9.0, 26.8, 640),
    "m": (25.3, 73.8, 640),
    "l": (54.2, 155.6, 640),
    "x": (99.1, 281.9, 640),
}


@pytest.fixture(scope="module")
def nano() -> YOLOX:
    torch.manual_seed(0)
    return build_model("yolox-nano", nc=3, verbose=False)


def randomise_bn_statistics(model: torch.nn.Module) -> None:
    """Non-trivial running statistics, so that fusing is actually exercised."""
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.1)


@pytest.mark.parametrize("name", list(REFERENCE))
def test_params_and_gflops_match_yolox(name):
    params_m, gflops, imgsz = REFERENCE[name]
    with torch.device("meta"):  # shapes only: no memory, no init cost
        model = build_model(f"yolox-{name}", nc=80, verbose=False)
    info = model_info(model, imgsz)
    assert info["params"] / 1e6 == pytest.approx(params_m, rel=0.02)
    assert info["gflops"] == pytest.approx(gflops, rel=0.05)
    assert info["layers"] > 100


def test_gflops_equal_what_torch_flop_counter_counts(nano):
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        nano.eval()(torch.zeros(1, 3, 96, 128))
    assert model_info(nano, (96, 128))["gflops"] == pytest.approx(counter.get_total_flops() / 1e9)
    assert nano.training is False  # model_info leaves the mode alone


def test_gflops_of_a_training_model_at_imgsz_32():
    """At imgsz 32 the stride-32 map is 1 x 1: the count must not run train-mode BatchNorm on it (a training at imgsz 32
    crashed in its summary line), and the model stays in train mode."""
    with torch.device("meta"):
        model = build_model("yolox-nano", nc=3, verbose=False)
    assert model.training
    assert model_info(model, 32)["gflops"] == pytest.approx(model_info(model, 64)["gflops"] / 4, rel=0.05)
    assert all(m.training for m in model.modules())


def test_build_model_from_name_path_and_dict(caplog, tmp_path):
    with caplog.at_level(logging.INFO, logger="yolo_cb"):
        model = build_model("yolox-nano.yaml", nc=5, imgsz=416)
    assert any(r.getMessage().startswith("YOLOX-nano summary: ") and "GFLOPs at 416" in r.getMessage() for r in caplog.records)
    assert model.nc == 5 and model.names == {i: str(i) for i in range(5)}
    assert model.cfg == {"depth": 0.33, "width": 0.25, "depthwise": True, "act": "silu", "nc": 5}
    assert torch.equal(model.stride, torch.tensor([8.0, 16.0, 32.0]))
    assert model.criterion.use_l1 is False
    rebuilt = build_model(model.cfg, nc=model.nc, verbose=False)  # the stored cfg is enough to rebuild
    assert rebuilt.name == "YOLOX-nano"
    rebuilt.load_state_dict(model.state_dict())
    yaml_path = tmp_path / "custom.yaml"
    yaml_path.write_text("depth: 0.33\nwidth: 0.25\ndepthwise: true\nact: relu\nnc: 80\n")
    assert build_model(yaml_path, nc=2, verbose=False).cfg["act"] == "relu"
    with pytest.raises(FileNotFoundError):
        build_model("yolox-nope", nc=2, verbose=False)


def test_bias_priors(nano):
    prior = torch.sigmoid(torch.cat([c.bias for c in (*nano.head.obj_preds, *nano.head.cls_preds)]))
    assert torch.allclose(prior, torch.full_like(prior, 0.01))


def test_forward_modes(nano):
    x = torch.rand(2, 3, 96, 160)
    nano.train()
    raw = nano(x)
    assert [tuple(r.shape) for r in raw] == [(2, 8, 12, 20), (2, 8, 6, 10), (2, 8, 3, 5)]
    nano.eval()
    with torch.no_grad():
        preds = nano(x)
    assert preds.shape == (2, 12 * 20 + 6 * 10 + 3 * 5, 8)
    assert ((preds[..., 4:] >= 0) & (preds[..., 4:] <= 1)).all()
    assert (preds[..., 2:4] > 0).all()
    # first cell of the stride-8 level sits near (4, 4); the last cell of the stride-32 level near (144, 80)
    assert preds[0, 0, :2].sub(torch.tensor([4.0, 4.0])).abs().max() < 8
    assert preds[0, -1, :2].sub(torch.tensor([144.0, 80.0])).abs().max() < 32


def test_train_forward_with_targets_returns_loss_dict(nano):
    nano.train()
    x = torch.rand(2, 3, 64, 64)
    targets = torch.tensor([[0, 1, 30.0, 30, 20, 16], [1, 2, 10, 50, 8, 8]])
    out = nano(x, targets)
    assert set(out) == {"total", "iou", "obj", "cls", "l1", "num_fg"}
    assert out["total"].requires_grad and not out["obj"].requires_grad
    assert isinstance(out["num_fg"], float) and out["num_fg"] >= 2
    out["total"].backward()
    assert nano.head.obj_preds[0].bias.grad is not None
    nano.zero_grad(set_to_none=True)


def test_fuse_keeps_outputs(nano):
    model = copy.deepcopy(nano)
    randomise_bn_statistics(model)
    model.eval()
    x = torch.rand(1, 3, 64, 96)
    with torch.no_grad():
        before = model(x)
        fused = model.fuse()
        after = fused(x)
    assert fused is model
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    assert (before - after).abs().max() < 1e-4


def test_channels_last(nano):
    model = copy.deepcopy(nano).eval()
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        expected = model(x)
        model = model.to(memory_format=torch.channels_last)
        got = model(x.contiguous(memory_format=torch.channels_last))
    assert (expected - got).abs().max() < 1e-4
    model.train()
    out = model(x.contiguous(memory_format=torch.channels_last), torch.tensor([[0, 0, 32.0, 32, 20, 20]]))
    out["total"].backward()


@pytest.mark.filterwarnings("ignore")
def test_onnx_export_matches_and_uses_simple_ops(nano):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    model = copy.deepcopy(nano).eval().fuse()
    x = torch.rand(1, 3, 64, 96)
    buffer = io.BytesIO()
    torch.onnx.export(model, (x,), buffer, opset_version=17, dynamo=False, input_names=["images"], output_names=["output"])
    graph = onnx.load_from_string(buffer.getvalue()).graph
    ops = {n.op_type for n in graph.node}
    # the grid and strides are constants: nothing computes shapes or ranges at run time
    assert ops <= {"Conv", "Sigmoid", "Mul", "Add", "Concat", "Slice", "MaxPool", "Resize", "Reshape", "Transpose", "Exp", "Constant", "Identity"}
    session = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"images": x.numpy()})[0]
    with torch.no_grad():
        assert abs(got - model(x).numpy()).max() < 1e-4


def test_postprocess_scores_nms_and_filters():
    # image 0: two overlapping class-0 boxes (NMS keeps the better), one class-1 box over them, one low-score box
    preds = torch.zeros(2, 4, 4 + 1 + 2)
    preds[0, 0] = torch.tensor([50, 50, 20, 20, 0.9, 0.9, 0.1])
    preds[0, 1] = torch.tensor([51, 50, 20, 20, 0.8, 0.9, 0.1])
    preds[0, 2] = torch.tensor([50, 50, 20, 20, 0.9, 0.1, 0.8])
    preds[0, 3] = torch.tensor([10, 10, 4, 4, 0.1, 0.5, 0.5])
    out = postprocess(preds, conf=0.25, iou=0.45)
    assert len(out) == 2 and out[1].shape == (0, 6)
    det = out[0]
    assert det.shape == (2, 6)
    assert torch.allclose(det[0], torch.tensor([40, 40, 60, 60, 0.81, 0]))
    assert torch.allclose(det[1], torch.tensor([40, 40, 60, 60, 0.72, 1]))
    assert postprocess(preds, conf=0.25, iou=0.45, agnostic=True)[0].shape == (1, 6)
    assert postprocess(preds, conf=0.25, classes=[1])[0][:, 5].tolist() == [1.0]
    assert postprocess(preds, conf=0.25, max_det=1)[0].shape == (1, 6)
    assert postprocess(preds.numpy(), conf=0.25)[0].shape == (2, 6)


def test_multi_label_postprocess_keeps_a_box_under_every_class_above_conf():
    # one box unsure between classes 0 and 1 (0.6 / 0.4 of objectness 1), one sure box of class 2 elsewhere
    preds = torch.zeros(1, 2, 4 + 1 + 3)
    preds[0, 0] = torch.tensor([50, 50, 20, 20, 1.0, 0.6, 0.4, 0.0])
    preds[0, 1] = torch.tensor([10, 10, 8, 8, 1.0, 0.0, 0.0, 0.9])
    single = postprocess(preds, conf=0.25, iou=0.45)[0]
    multi = postprocess(preds, conf=0.25, iou=0.45, multi_label=True)[0]
    assert single[:, 5].tolist() == [2.0, 0.0]
    assert multi[:, 5].tolist() == [2.0, 0.0, 1.0]  # sorted by score: 0.9, 0.6, 0.4
    assert torch.allclose(multi[:, 4], torch.tensor([0.9, 0.6, 0.4]))
    assert torch.equal(multi[1, :4], multi[2, :4])  # the same box under both classes
    assert postprocess(preds, conf=0.5, iou=0.45, multi_label=True)[0][:, 5].tolist() == [2.0, 0.0]  # 0.4 is under conf
    assert postprocess(preds, conf=0.25, iou=0.45, multi_label=True, agnostic=True)[0].shape == (2, 6)
    assert postprocess(preds, conf=0.25, iou=0.45, multi_label=True, classes=[1])[0][:, 5].tolist() == [1.0]


def test_scale_boxes_undoes_letterbox():
    # original 200 x 100 (h x w) letterboxed to 320: ratio 1.6, image 160 wide, pad 80 left, 0 top
    boxes = torch.tensor([[80.0 + 16, 32, 80 + 48, 64, 0.9, 2], [0, 0, 320, 320, 0.5, 0]])
    out = scale_boxes(boxes, (1.6, (80, 0)), (200, 100))
    assert torch.allclose(out[0], torch.tensor([10.0, 20, 30, 40, 0.9, 2]))
    assert torch.allclose(out[1, :4], torch.tensor([0.0, 0, 100, 200]))
    assert boxes[0, 0] == 96  # input untouched


def test_both_families_are_detectors_that_build_their_loss_from_settings():
    yolox, yolocb = build_model("yolox-nano", nc=3, verbose=False), build_model("yolocb-n", nc=3, verbose=False)
    assert isinstance(yolox, Detector) and isinstance(yolocb, Detector)
    assert (yolox.family, yolocb.family) == ("yolox", "yolocb") and yolox.strides == yolocb.strides == (8, 16, 32)
    keys = list(yolox.state_dict())
    loss = yolox.build_loss({"box": 2.0, "iou_type": "giou"})
    assert yolox.criterion is loss and isinstance(loss, YOLOXLoss)
    assert (loss.box_weight, loss.loss_type, loss.use_l1) == (2.0, "giou", False)
    loss.set_l1(True)
    assert loss.use_l1 is True
    assert list(yolox.state_dict()) == keys  # a new loss changes no parameter name
    assert isinstance(yolocb.build_loss({"box": 5.0, "iou_type": "iou"}), YOLOCBLoss) and yolocb.criterion.reads_settings == ()
    with pytest.raises(TypeError, match="abstract"):
        Detector({"nc": 1}, "incomplete")


def test_box_functions_equal_torchvisions():
    """nn/boxes.py (written so that a process need not import torchvision.ops) against torchvision.ops on random boxes,
    empty and degenerate ones included."""
    import torchvision.ops as tv

    from yolo_cb.nn import boxes

    torch.manual_seed(0)
    cxcywh = torch.rand(64, 4) * torch.tensor([100.0, 100.0, 40.0, 40.0])
    cxcywh[:4, 2:] = 0  # empty boxes
    xyxy = boxes.cxcywh_to_xyxy(cxcywh)
    other = boxes.cxcywh_to_xyxy(torch.rand(64, 4) * torch.tensor([100.0, 100.0, 40.0, 40.0]))
    assert torch.equal(xyxy, tv.box_convert(cxcywh, "cxcywh", "xyxy"))
    assert torch.equal(boxes.box_area(other), tv.box_area(other))
    assert torch.allclose(boxes.box_iou(other, xyxy[4:]), tv.box_iou(other, xyxy[4:]), atol=1e-7)
    assert torch.allclose(boxes.giou_loss(xyxy, other), tv.generalized_box_iou_loss(xyxy, other, reduction="none"), atol=1e-6)


def test_importing_the_facade_does_not_import_torchvision():
    """torchvision.ops costs ~1.5 s of CPU per process (it loads torch._dynamo): only NMS needs it, where it runs."""
    import subprocess
    import sys

    code = "import sys, yolo_cb.model, yolo_cb.cli; print('torchvision' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_a_training_refused_before_it_starts_never_imports_dynamo(tmp_path):
    """A run that stops at its settings or data (most CLI refusals) costs only the torch import: putting the process's
    deterministic-algorithms flag back (torch's setter imports torch._inductor and torch._dynamo, ~2 s of CPU) happens
    only when the run changed it."""
    import subprocess
    import sys

    code = ("import sys\nfrom yolo_cb import YOLO\n"
            "try:\n    YOLO('yolox-nano.yaml').train(data='missing.yaml')\nexcept FileNotFoundError:\n    print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path).stdout.strip()
    assert out == "False"
