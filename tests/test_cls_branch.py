"""The YOLOCB class branch chosen by a model YAML's `cls_branch:` (issue 44): full (the default) or depthwise, YOLO11's
shape; both build, give the same output shapes with different parameter counts, and an unknown value is refused."""

from __future__ import annotations

import pytest
import torch

from yolo_cb.errors import ConfigError
from yolo_cb.nn import build_model
from yolo_cb.nn.blocks import DWConv
from yolo_cb.nn.yolocb.head import DistributionHead

NC = 3


def test_the_bundled_yaml_keeps_the_full_branch():
    model = build_model("yolocb-n", nc=NC, verbose=False)
    assert model.cfg["cls_branch"] == "full"
    assert not any(isinstance(m, DWConv) for m in model.head.cls_branches.modules())


def test_depthwise_builds_from_a_yaml_with_fewer_parameters_and_the_same_outputs(yolocb_yaml):
    full = build_model("yolocb-n", nc=NC, verbose=False).eval()
    depthwise = build_model(yolocb_yaml(cls_branch="depthwise"), nc=NC, verbose=False).eval()
    assert depthwise.cfg["cls_branch"] == "depthwise"
    assert all(isinstance(branch[0], DWConv) and isinstance(branch[1], DWConv) for branch in depthwise.head.cls_branches)
    assert all(not isinstance(branch[0], DWConv) for branch in depthwise.head.box_branches)  # the box branch is unchanged
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(depthwise) < count(full) and count(depthwise.head.box_branches) == count(full.head.box_branches)
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        assert [o.shape for o in depthwise.head_outputs(x)] == [o.shape for o in full.head_outputs(x)]
        assert depthwise(x).shape == full(x).shape


def test_the_class_bias_prior_is_set_on_both_kinds():
    for kind in ("full", "depthwise"):
        head = DistributionHead(NC, (64, 128, 256), cls_branch=kind)
        assert all(torch.all(branch[-1].bias < -5) for branch in head.cls_branches), kind


def test_an_unknown_cls_branch_is_refused(yolocb_yaml):
    with pytest.raises(ConfigError, match=r"cls_branch='dw' is not one of full, depthwise"):
        build_model(yolocb_yaml(cls_branch="dw"), nc=NC, verbose=False)
    with pytest.raises(ValueError, match="unknown cls_branch 'dw'"):
        DistributionHead(NC, (64, 128, 256), cls_branch="dw")
