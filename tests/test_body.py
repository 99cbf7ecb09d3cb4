"""The YOLOCB body chosen by a model YAML's `body:` (issue 44): split_csp (the default) or c3k2_psa, YOLO11's backbone
and neck; both build, train a step, fuse and export, with the head reading their map widths; an unknown value is refused
with one line, and an architecture record without the key (older checkpoints) reads as split_csp."""

from __future__ import annotations

import pytest
import torch

from yolo_cb.errors import ConfigError
from yolo_cb.nn import build_model
from yolo_cb.nn.yolocb.attention_body import AttentionCSP, HalfBottleneck, KernelCSP, PositionAttention
from yolo_cb.nn.yolocb.model import YOLOCB, parse_yolocb_cfg

NC = 3
FINGERPRINT_0AE5E97 = 10586.740920942782  # sum of the bundled yolocb-n state (nc 3) under torch.manual_seed(0), at 0ae5e97


def test_the_default_body_is_split_csp_and_older_records_read_as_it():
    model = build_model("yolocb-n", nc=NC, verbose=False)
    assert model.cfg["body"] == "split_csp" and not any(isinstance(m, (HalfBottleneck, KernelCSP)) for m in model.modules())
    record = {k: v for k, v in model.cfg.items() if k != "body"}  # a checkpoint written before the key
    assert parse_yolocb_cfg(record)["body"] == "split_csp"


def test_c3k2_psa_has_yolo11s_map_widths_blocks_and_outputs(yolocb_yaml):
    model = build_model(yolocb_yaml(body="c3k2_psa"), nc=NC, verbose=False).eval()
    default = build_model("yolocb-n", nc=NC, verbose=False).eval()
    assert model.cfg["body"] == "c3k2_psa" and len(model.model) == len(default.model) == 12
    assert [branch[0].conv.in_channels for branch in model.head.box_branches] == [64, 128, 256]  # YOLO11n's P3-P5
    assert sum(isinstance(m, KernelCSP) for m in model.modules()) == 3  # stride-16, stride-32 and the last neck block
    assert sum(isinstance(m, AttentionCSP) for m in model.modules()) == 1
    attention = next(m for m in model.modules() if isinstance(m, PositionAttention))
    assert (attention.heads, attention.value_dim, attention.key_dim) == (2, 64, 32)
    x = torch.rand(2, 3, 96, 64)
    with torch.no_grad():
        assert [o.shape for o in model.head_outputs(x)] == [o.shape for o in default.head_outputs(x)]
        before = model(x)
        model.fuse()
        assert torch.allclose(model(x), before, atol=1e-4)


def test_c3k2_psa_trains_a_step(yolocb_yaml):
    model = build_model(yolocb_yaml(body="c3k2_psa"), nc=NC, verbose=False).train()
    targets = torch.tensor([[0, 1, 32.0, 32.0, 20.0, 24.0]])  # image, class, cx, cy, w, h in input pixels
    losses = model.loss(model.head_outputs(torch.rand(1, 3, 64, 64)), targets)
    losses["total"].backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_an_unknown_body_is_refused(yolocb_yaml):
    with pytest.raises(ConfigError, match=r"body='c2f' is not one of split_csp, c3k2_psa"):
        build_model(yolocb_yaml(body="c2f"), nc=NC, verbose=False)
    with pytest.raises(ValueError, match="unknown body 'c2f'"):
        YOLOCB(nc=NC, body="c2f")


def test_c3k2_psa_exports_to_onnx_faithfully(yolocb_yaml):
    """The attention's reshapes and matmuls convert: onnxruntime gives PyTorch's outputs on a 64 x 64 image."""
    from yolo_cb.export.checks import onnx_roundtrip

    model = build_model(yolocb_yaml(body="c3k2_psa"), nc=NC, verbose=False)
    assert onnx_roundtrip(model, torch.rand(1, 3, 64, 64), simplify=False)["max_err"] < 1e-3


def test_a_seed_draws_the_default_models_weights_of_before_the_body_key():
    """The split_csp body makes its layers in the order it always did (head before neck), so a seeded run starts from
    the weights it started from before `body:` existed (the state's sum under torch.manual_seed(0), nc 3, at 0ae5e97)."""
    torch.manual_seed(0)
    model = build_model("yolocb-n", nc=NC, verbose=False)
    total = sum(float(v.double().sum()) for v in model.state_dict().values() if v.is_floating_point())
    assert total == pytest.approx(FINGERPRINT_0AE5E97, abs=1e-6)
