"""Unfreezing: requires_grad=True on a frozen parameter makes it train (Ultralytics' guide recipe, from a callback), and
`unfreeze_epoch=N`: the freeze= layers are bit-identical before epoch N, change after it, and a resume across the
boundary is the uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import TINY

from yolo_cb import YOLO
from yolo_cb.config import ConfigError
from yolo_cb.engine.checkpoint import load_checkpoint

pytestmark = pytest.mark.slow
FROZEN = ("backbone.backbone.stem.", "backbone.backbone.dark2.")  # freeze=2 on yolox-*
# nbs=8: a step per batch; save_period=1 keeps each epoch's weights (epoch1.pt, epoch2.pt)
RUN = dict(TINY, epochs=2, nbs=8, freeze=2, save_period=1, save_initial=True, deterministic=True)


def changed(a: dict, b: dict, prefixes: tuple[str, ...]) -> list[str]:
    return [k for k in a if k.startswith(prefixes) and not torch.equal(a[k], b[k])]


def weights(run: Path, name: str) -> dict:
    return load_checkpoint(run / "weights" / name)["model"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shapes_small_yaml) -> dict[str, Path]:
    """Three tiny two-epoch runs: unfreeze_epoch=1 straight, the same stopped after epoch 1 and resumed, and the
    Ultralytics guide's callback that sets requires_grad=True on the stem at epoch 1."""
    root = tmp_path_factory.mktemp("unfreeze")
    base = {**RUN, "data": str(shapes_small_yaml), "project": str(root / "runs")}
    YOLO("yolox-nano.yaml").train(**base, name="straight", unfreeze_epoch=1)

    first = YOLO("yolox-nano.yaml")
    first.add_callback("on_fit_epoch_end", lambda t: setattr(t, "stop", True))
    first.train(**base, name="split", unfreeze_epoch=1)
    YOLO().train(resume=str(root / "runs" / "split" / "weights" / "last.pt"))

    def unfreeze_stem(trainer):  # the guide's recipe: a frozen parameter set trainable from a callback
        if trainer.epoch == 1:
            for name, param in trainer.model.named_parameters():
                if name.startswith("backbone.backbone.stem."):
                    param.requires_grad = True

    guide = YOLO("yolox-nano.yaml")
    guide.add_callback("on_train_epoch_start", unfreeze_stem)
    guide.train(**base, name="guide")
    return {name: root / "runs" / name for name in ("straight", "split", "guide")}


def test_a_parameter_set_trainable_from_a_callback_trains(runs):
    run = runs["guide"]
    initial, epoch1, epoch2 = weights(run, "initial.pt"), weights(run, "epoch1.pt"), weights(run, "epoch2.pt")
    assert not changed(initial, epoch1, FROZEN)  # frozen for epoch 0: weights and BatchNorm statistics
    stem = [k for k in initial if k.startswith(FROZEN[0])]
    trained = [k for k in changed(epoch1, epoch2, (FROZEN[0],))]
    tensors = [k for k in stem if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
    assert set(tensors) <= set(trained), f"unfrozen tensors that did not train: {set(tensors) - set(trained)}"
    assert any(k.endswith("running_mean") for k in trained)  # its BatchNorm statistics update again
    assert not changed(epoch1, epoch2, (FROZEN[1],))  # dark2 stays frozen


def test_unfreeze_epoch_keeps_layers_fixed_before_and_trains_them_after(runs):
    run = runs["straight"]
    initial, epoch1, epoch2 = weights(run, "initial.pt"), weights(run, "epoch1.pt"), weights(run, "epoch2.pt")
    frozen = [k for k in initial if k.startswith(FROZEN)]
    assert frozen and not changed(initial, epoch1, FROZEN)
    after = changed(epoch1, epoch2, FROZEN)
    assert {k for k in frozen if k.endswith(".weight")} <= set(after)


def test_a_resume_across_the_boundary_is_the_uninterrupted_run(runs):
    a, b = load_checkpoint(runs["straight"] / "weights" / "last.pt"), load_checkpoint(runs["split"] / "weights" / "last.pt")
    assert b["epoch"] == a["epoch"] == 1
    for key in ("model", "ema"):
        diff = max((a[key][k].float() - b[key][k].float()).abs().max().item() for k in a[key])
        assert diff <= 1e-6, (key, diff)


def test_unfreeze_epoch_without_freeze_is_refused(tmp_path, shapes_small_yaml):
    with pytest.raises(ConfigError, match="nothing is frozen: set freeze="):
        YOLO("yolox-nano.yaml").train(**{**TINY, "data": str(shapes_small_yaml), "project": str(tmp_path), "unfreeze_epoch": 1})


def test_unfreeze_stages_are_checked():
    from yolo_cb.integrations.unfreeze import parse_stages

    assert parse_stages({"3": ["a.b"], 1: "all"}) == {1: "all", 3: ["a.b"]}
    for bad in ({-1: "all"}, {1: "some"}, {}, [1]):
        with pytest.raises(ConfigError, match="unfreeze"):
            parse_stages(bad)
