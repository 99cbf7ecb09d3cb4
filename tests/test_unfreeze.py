"""Unfreezing: requires_grad=True on a frozen parameter makes it train (Ultralytics' guide recipe, from a callback), and
`unfreeze_epoch=N`: the freeze= layers are bit-identical before epoch N, change after it, warm up on their own
(unfreeze_warmup: the LR applied to them ramps up while the other groups keep the schedule's), and a resume across the
boundary and during the ramp is the uninterrupted run, bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import TINY

from yolo_cb import YOLO
from yolo_cb.checkpoints.checkpoint import load_checkpoint
from yolo_cb.settings.config import ConfigError

pytestmark = pytest.mark.slow
FROZEN = ("backbone.backbone.stem.", "backbone.backbone.dark2.")  # freeze=2 on yolox-*
EPOCHS, BATCHES, WARMUP = 3, 4, 1.5  # 32 images / batch 8: 4 batches an epoch; the ramp takes 1.5 x 4 = 6 batches
# nbs=8: a step per batch; save_period=1 keeps each epoch's weights (epoch1.pt, epoch2.pt)
RUN = dict(TINY, epochs=EPOCHS, nbs=8, freeze=2, save_period=1, save_initial=True, deterministic=True, unfreeze_warmup=WARMUP)


def changed(a: dict, b: dict, prefixes: tuple[str, ...]) -> list[str]:
    return [k for k in a if k.startswith(prefixes) and not torch.equal(a[k], b[k])]


def weights(run: Path, name: str) -> dict:
    return load_checkpoint(run / "weights" / name).model


class AppliedLR:
    """After every optimizer step: (batch over the run, {parameter name: the LR of the group that holds it})."""

    def __init__(self):
        self.steps: list[tuple[int, dict[str, float]]] = []

    def optimizer_step(self, trainer):
        group_of = {id(p): g["lr"] for g in trainer.optimizer.param_groups for p in g["params"]}
        ni = trainer.batch_i + trainer.num_batches * trainer.epoch
        self.steps.append((ni, {n: group_of[id(p)] for n, p in trainer.model.named_parameters()}))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shapes_small_yaml) -> dict:
    """Three tiny three-epoch runs: unfreeze_epoch=1 straight, the same stopped after epoch 2 (in the middle of the
    ramp) and resumed, and the Ultralytics guide's callback that sets requires_grad=True on the stem at epoch 1. The
    LR applied to every parameter is recorded at each optimizer step."""
    root = tmp_path_factory.mktemp("unfreeze")
    base = {**RUN, "data": str(shapes_small_yaml), "project": str(root / "runs")}
    lrs = {name: AppliedLR() for name in ("straight", "resumed", "guide")}
    straight = YOLO("yolox-nano.yaml")
    straight.add_callback("optimizer_step", lrs["straight"].optimizer_step)
    straight.train(**base, name="straight", unfreeze_epoch=1)

    first = YOLO("yolox-nano.yaml")
    first.add_callback("on_fit_epoch_end", lambda t: setattr(t, "stop", t.epoch == 1))
    first.train(**base, name="split", unfreeze_epoch=1)
    resumed = YOLO()
    resumed.add_callback("optimizer_step", lrs["resumed"].optimizer_step)
    resumed.train(resume=str(root / "runs" / "split" / "weights" / "last.pt"))

    def unfreeze_stem(trainer):  # the guide's recipe: a frozen parameter set trainable from a callback
        if trainer.epoch == 1:
            for name, param in trainer.model.named_parameters():
                if name.startswith("backbone.backbone.stem."):
                    param.requires_grad = True

    guide = YOLO("yolox-nano.yaml")
    guide.add_callback("on_train_epoch_start", unfreeze_stem)
    guide.add_callback("optimizer_step", lrs["guide"].optimizer_step)
    guide.train(**base, name="guide")
    return {"lr": lrs, **{name: root / "runs" / name for name in ("straight", "split", "guide")}}


def scheduled_lr(epoch: int, lr0: float = 0.002, lrf: float = 0.01) -> float:
    """The linear schedule's LR of an epoch (no warmup: warmup_epochs=0), computed here, not by the trainer."""
    return lr0 * ((1 - epoch / EPOCHS) * (1 - lrf) + lrf)


def expected_ramp(ni: int, start: int) -> float:
    """unfreeze_warmup's multiplier: 0 while frozen, (k + 1) / ramp batches at the k-th batch from `start`, then 1."""
    return 0.0 if ni < start else min(1.0, (ni - start + 1) / round(WARMUP * BATCHES))


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


def test_unfrozen_layers_warm_up_on_their_own_while_the_others_keep_the_schedule(runs):
    steps = runs["lr"]["straight"].steps
    assert [ni for ni, _ in steps] == list(range(EPOCHS * BATCHES))
    for ni, lr in steps:
        scheduled = scheduled_lr(ni // BATCHES)
        for name, value in lr.items():
            want = scheduled * expected_ramp(ni, start=BATCHES) if name.startswith(FROZEN) else scheduled
            assert value == pytest.approx(want, rel=1e-9, abs=1e-12), (ni, name, value, want)
    ramp = [lr[f"{FROZEN[0]}conv.conv.weight"] for ni, lr in steps if BATCHES <= ni < BATCHES + 6]
    assert 0 < ramp[0] < ramp[1] < ramp[-1] < scheduled_lr(1)  # really a ramp, not a jump to the schedule's LR


def test_each_frozen_module_ramps_from_its_own_unfreeze(runs):
    """The guide's callback unfreezes the stem only: its groups ramp from epoch 1, dark2's stay at 0."""
    for ni, lr in runs["lr"]["guide"].steps:
        scheduled = scheduled_lr(ni // BATCHES)
        assert lr[f"{FROZEN[0]}conv.conv.weight"] == pytest.approx(scheduled * expected_ramp(ni, start=BATCHES), rel=1e-9, abs=1e-12)
        assert all(v == 0.0 for name, v in lr.items() if name.startswith(FROZEN[1])), ni
        assert lr["head.stems.0.conv.weight"] == pytest.approx(scheduled, rel=1e-9)


def test_a_resume_across_the_boundary_and_during_the_ramp_is_the_uninterrupted_run(runs):
    a, b = load_checkpoint(runs["straight"] / "weights" / "last.pt"), load_checkpoint(runs["split"] / "weights" / "last.pt")
    assert b.epoch == a.epoch == EPOCHS - 1
    for key, one, other in (("model", a.model, b.model), ("ema", a.ema, b.ema)):
        unequal = [k for k in one if not torch.equal(one[k], other[k])]
        assert not unequal, (key, unequal[:5])
    straight = dict(runs["lr"]["straight"].steps)
    resumed = runs["lr"]["resumed"].steps  # epoch 2 only: the ramp's last two batches, then the schedule's LR
    assert [ni for ni, _ in resumed] == list(range(2 * BATCHES, 3 * BATCHES))
    assert all(lr == straight[ni] for ni, lr in resumed)


@pytest.mark.parametrize("setting", [{"unfreeze_epoch": 1}, {"unfreeze_warmup": 2.0}])
def test_unfreeze_settings_without_freeze_are_refused(tmp_path, shapes_small_yaml, setting):
    with pytest.raises(ConfigError, match=f"'{next(iter(setting))}'.*nothing is frozen: set freeze="):
        YOLO("yolox-nano.yaml").train(**{**TINY, "data": str(shapes_small_yaml), "project": str(tmp_path), **setting})


def test_unfreeze_stages_are_checked():
    from yolo_cb.recipe.unfreeze import parse_stages

    assert parse_stages({"3": ["a.b"], 1: "all"}) == {1: "all", 3: ["a.b"]}
    for bad in ({-1: "all"}, {1: "some"}, {}, [1]):
        with pytest.raises(ConfigError, match="unfreeze"):
            parse_stages(bad)


def test_declared_stages_replace_unfreeze_epoch_through_the_control(tmp_path, shapes_small_yaml):
    """`- unfreeze: {stages: {1: [stem]}}` (no unfreeze_epoch): the stem is fixed in epoch 0 and trains in epoch 1, dark2
    stays frozen; the settings keep the stages (no control changes them at run time: use_unfreeze_stages is gone)."""
    late: list[str] = []

    def too_late(trainer):
        assert not hasattr(trainer, "use_unfreeze_stages") and trainer._recipe.unfreeze.stages == {1: [stem]}
        late.append("refused")

    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_train_start", too_late)
    stem = FROZEN[0].rstrip(".")
    model.train(**{**RUN, "epochs": 2, "data": str(shapes_small_yaml), "project": str(tmp_path), "name": "declared",
                   "callbacks": [{"unfreeze": {"stages": {1: [stem]}}}]})
    run = tmp_path / "declared"
    initial, epoch1, epoch2 = weights(run, "initial.pt"), weights(run, "epoch1.pt"), weights(run, "epoch2.pt")  # 1-based files
    assert late == ["refused"]
    assert not changed(initial, epoch1, FROZEN)
    assert {k for k in initial if k.startswith(FROZEN[0]) and k.endswith(".weight")} <= set(changed(epoch1, epoch2, FROZEN))
    assert not changed(epoch1, epoch2, (FROZEN[1],))
