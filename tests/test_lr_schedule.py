"""The LR schedule (a recipe part the loop calls by name): bit-identical to the former trainer's LRs by default (real trainings), each built-in schedule
per step against its formula (the callback driven through the trainer's event order), user writes that stick, and
the strict `lr_scheduler=` setting."""

from __future__ import annotations

import csv
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from yolo_cb import YOLO
from yolo_cb.recipe.optim import build_optimizer
from yolo_cb.recipe.schedule import LRSchedule, Warmup
from yolo_cb.settings.config import ConfigError, get_config


# --- the former trainer's formulas, written out here (not taken from the new code) --------------------------------------
def former_lf(epochs, lrf, cosine):
    if cosine:
        return lambda x: ((1 - math.cos(x * math.pi / epochs)) / 2) * (lrf - 1) + 1
    return lambda x: max(1 - x / epochs, 0) * (1.0 - lrf) + lrf


def former_lrs(epoch, batch_i, nb, lr, epochs, lrf, cosine, warmup_epochs, warmup_bias_lr, groups=3):
    """Per group (lr, momentum-or-None) of the trainer before the LR became a callback: warmup per batch, never under
    100 iterations, bias group 0 from warmup_bias_lr; afterwards initial_lr * lf(epoch)."""
    lf = former_lf(epochs, lrf, cosine)
    ni = batch_i + nb * epoch
    warmup_iters = max(round(warmup_epochs * nb), 100) if warmup_epochs > 0 else -1
    if ni <= warmup_iters:
        xi = [0, warmup_iters]
        return [float(np.interp(ni, xi, [warmup_bias_lr if j == 0 else 0.0, lr * lf(epoch)])) for j in range(groups)]
    return [lr * lf(epoch) for _ in range(groups)]


def former_momentum(epoch, batch_i, nb, warmup_epochs, warmup_momentum, momentum, last):
    ni = batch_i + nb * epoch
    warmup_iters = max(round(warmup_epochs * nb), 100) if warmup_epochs > 0 else -1
    return float(np.interp(ni, [0, warmup_iters], [warmup_momentum, momentum])) if ni <= warmup_iters else last


def record_lrs(model, seen):
    def record(trainer):  # user group: runs after the schedule's on_train_batch_start, so it sees the LR of this step
        seen.append((trainer.epoch, trainer.batch_i, [g["lr"] for g in trainer.optimizer.param_groups],
                     [g.get("momentum") for g in trainer.optimizer.param_groups]))
    model.add_callback("on_train_batch_loss_end", record)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer, lr0, cos_lr, batch", [("SGD", 0.01, False, 4), ("AdamW", 0.002, True, 8)])
def test_default_schedule_is_bit_identical_to_the_former_trainer(tiny, optimizer, lr0, cos_lr, batch):
    """Every step of 3 epochs inside the warmup (100 iterations, more than warmup_epochs * batches), across the epoch
    boundaries where the warmup target changes. SGD: bias warmup from 0.1 and momentum warmup; AdamW: the bias warmup
    from warmup_bias_lr too (not capped at lr0: every optimizer honours it), cosine. (The step from warmup into the
    plain schedule is checked per step by the driven tests below.)"""
    seen = []
    model = YOLO("yolox-nano.yaml")
    record_lrs(model, seen)
    epochs = 3
    model.train(**{**tiny, "epochs": epochs, "batch": batch, "optimizer": optimizer, "lr0": lr0, "cos_lr": cos_lr,
                   "warmup_epochs": 3.0, "val": False, "save": False})
    nb = 32 // batch
    assert len(seen) == epochs * nb
    defaults = get_config({})
    bias_start = defaults.warmup_bias_lr  # for every optimizer
    momentum = None
    for epoch, batch_i, lrs, momenta in seen:
        expected = former_lrs(epoch, batch_i, nb, lr0, epochs, defaults.lrf, cos_lr, 3.0, bias_start)
        assert lrs == expected, (epoch, batch_i, lrs, expected)  # bit for bit
        if optimizer == "SGD":
            momentum = former_momentum(epoch, batch_i, nb, 3.0, defaults.warmup_momentum, defaults.momentum, momentum)
            assert momenta == [momentum] * 3, (epoch, batch_i)
    assert seen[0][2][0] == bias_start and len({e for e, _, _, _ in seen}) == epochs


# --- each schedule per step, called as the training loop calls it -------------------------------------------
def drive(lr_scheduler, epochs=6, nb=4, warmup_epochs=1.0, metrics=None, lr0=0.01, optimizer="SGD", user=None, **settings):
    """Call the schedule as the training loop does; returns [(epoch, batch_i, [lr per group])] and a stand-in trainer
    (its optimizer, metrics and schedule) that `user(trainer)` may change after each epoch's step."""
    args = get_config({"lr_scheduler": lr_scheduler, "warmup_epochs": warmup_epochs, "lr0": lr0, "epochs": epochs, **settings})
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    optim = build_optimizer(net, optimizer, lr0, args.momentum, args.weight_decay)
    schedule = LRSchedule()
    trainer = SimpleNamespace(args=args, optimizer=optim, epoch=0, metrics={}, lr_schedule=schedule)
    warmup_iters = max(round(warmup_epochs * nb), 100) if warmup_epochs > 0 else -1
    schedule.start(optim, args, epochs, 0, Warmup(warmup_iters, args.warmup_bias_lr, args.warmup_momentum, args.momentum))
    seen = []
    for epoch in range(epochs):
        trainer.epoch = epoch
        for batch_i in range(nb):
            schedule.warmup_batch(epoch, batch_i + nb * epoch)
            seen.append((epoch, batch_i, [g["lr"] for g in optim.param_groups]))
        if metrics is not None:
            trainer.metrics = metrics(epoch)
        schedule.next_epoch(epoch, trainer.metrics, validated=metrics is not None)
        if user is not None:
            user(trainer)
    return seen, trainer


def expect_with_warmup(seen, factor, lr0=0.01, nb=4, warmup_iters=100, bias=0.1):
    for epoch, batch_i, lrs in seen:
        ni = batch_i + nb * epoch
        target = lr0 * factor(epoch)
        if ni <= warmup_iters:
            want = [float(np.interp(ni, [0, warmup_iters], [bias if j == 0 else 0.0, target])) for j in range(3)]
        else:
            want = [target] * 3
        assert lrs == pytest.approx(want, rel=1e-12, abs=0.0), (epoch, batch_i)


@pytest.mark.parametrize("setting, factor", [
    ("linear", lambda e: max(1 - e / 30, 0) * 0.99 + 0.01),
    ("cosine", lambda e: ((1 - math.cos(e * math.pi / 30)) / 2) * (0.01 - 1) + 1),
    ("constant", lambda e: 1.0),
    ({"step": {"step_size": 7, "gamma": 0.5}}, lambda e: 0.5 ** (e // 7)),
    ({"multistep": {"milestones": [5, 20]}}, lambda e: 0.1 ** ((e >= 5) + (e >= 20))),
    ("exponential", lambda e: (0.01 ** (1 / 30)) ** e),
    ({"exponential": {"gamma": 0.9}}, lambda e: 0.9 ** e),
    ({"polynomial": {"power": 3.0}}, lambda e: (1 - e / 30) ** 3 * 0.99 + 0.01),
    ("cbpkg:half_every_two_epochs", lambda e: 0.5 ** (e // 2)),
    ({"linear": {"cooldown_epochs": 10}}, lambda e: max(1 - min(e, 20) / 20, 0) * 0.99 + 0.01),
])
def test_builtin_schedules_follow_their_formula_per_step_with_warmup(setting, factor):
    seen, _ = drive(setting, epochs=30, nb=4, warmup_epochs=1.0)  # warmup: 100 iterations = 25 epochs of 4 batches
    assert len(seen) == 120
    expect_with_warmup(seen, factor)


def test_warmup_by_epoch_ramps_once_per_epoch():
    seen, _ = drive({"cosine": {"warmup_by": "epoch"}}, epochs=10, nb=4, warmup_epochs=3.0)
    factor = lambda e: ((1 - math.cos(e * math.pi / 10)) / 2) * (0.01 - 1) + 1  # noqa: E731
    for epoch, _, lrs in seen:
        target = 0.01 * factor(epoch)
        fraction = (epoch + 1) / 4 if epoch < 3 else 1.0
        want = [start + fraction * (target - start) for start in (0.1, 0.0, 0.0)]
        assert lrs == pytest.approx(want, rel=1e-12), epoch
    assert len({tuple(lrs) for e, _, lrs in seen if e == 1}) == 1  # constant within an epoch


@pytest.mark.filterwarnings("ignore:Detected call of")  # the driver has no optimizer.step()
def test_wrapped_torch_schedulers():
    seen, _ = drive({"StepLR": {"step_size": 2, "gamma": 0.5}}, epochs=6, warmup_epochs=0.0)
    assert [lrs[1] for e, b, lrs in seen if b == 0] == pytest.approx([0.01 * 0.5 ** (e // 2) for e in range(6)])
    # ReduceLROnPlateau on any metric key: mode follows the key (a loss shrinks); only validated epochs step it
    losses = [1.0, 0.5, 0.6, 0.7, 0.8, 0.9]
    seen, trainer = drive({"ReduceLROnPlateau": {"monitor": "val/iou_loss", "patience": 1, "factor": 0.1}}, epochs=6,
                          warmup_epochs=0.0, metrics=lambda e: {"val/iou_loss": losses[e], "fitness": 0.0})
    per_epoch = [lrs[1] for e, b, lrs in seen if b == 0]
    assert per_epoch == pytest.approx([0.01, 0.01, 0.01, 0.01, 0.001, 0.001])  # two bad epochs (0.6, 0.7) after the best 0.5
    assert trainer.lr_schedule.scheduler.mode == "min"


def test_a_user_write_sticks_and_the_schedule_continues_from_it():
    def halve_after_epoch_2(trainer):  # in on_fit_epoch_end of epoch 2, after the schedule set epoch 3's LR
        if trainer.epoch == 1:
            for group in trainer.optimizer.param_groups:
                group["lr"] *= 0.5
    seen, _ = drive("linear", epochs=5, warmup_epochs=0.0, user=halve_after_epoch_2)
    lf = former_lf(5, 0.01, False)
    per_epoch = [lrs[1] for e, b, lrs in seen if b == 0]
    assert per_epoch == pytest.approx([0.01 * lf(0), 0.01 * lf(1), 0.005 * lf(2), 0.005 * lf(3), 0.005 * lf(4)])


def test_the_schedule_still_applies_after_a_callback_reloads_the_optimizer_state():
    """optimizer.load_state_dict replaces the optimizer's group dicts: the schedule writes the groups the optimizer holds
    now (it once kept the dicts it had placed, and the LR froze at the reload)."""
    def reload_after_epoch_2(trainer):
        if trainer.epoch == 1:
            trainer.optimizer.load_state_dict(trainer.optimizer.state_dict())
    seen, trainer = drive("linear", epochs=5, warmup_epochs=1.0, user=reload_after_epoch_2)
    plain, _ = drive("linear", epochs=5, warmup_epochs=1.0)
    assert seen == plain  # the same LRs, batch for batch, as without the reload (inside the warmup, then after it)
    seen, trainer = drive("linear", epochs=5, warmup_epochs=0.0, user=reload_after_epoch_2)
    lf = former_lf(5, 0.01, False)
    assert [lrs[1] for e, b, lrs in seen if b == 0] == pytest.approx([0.01 * lf(e) for e in range(5)])
    trainer.lr_schedule.set_lr(0.003)  # the control reaches the groups the optimizer holds now
    assert [g["lr"] for g in trainer.optimizer.param_groups] == [0.003] * 3


@pytest.mark.slow
def test_a_training_whose_callback_reloads_the_optimizer_keeps_its_lr_schedule(tiny):
    """In a real training: a callback that reloads the optimizer's state after each epoch changes no LR of the run."""
    def reload(trainer):
        trainer.optimizer.load_state_dict(trainer.optimizer.state_dict())

    runs = []
    for name, callback in (("plain", None), ("reloaded", reload)):
        seen = []
        model = YOLO("yolox-nano.yaml")
        record_lrs(model, seen)
        if callback is not None:
            model.add_callback("on_fit_epoch_end", callback)
        model.train(**{**tiny, "epochs": 3, "name": name, "val": False, "save": False})
        runs.append([(e, lrs) for e, b, lrs, _ in seen if b == 0])
    assert runs[1] == runs[0] and len({tuple(lrs) for _, lrs in runs[0]}) == 3  # the LR changed each epoch, alike


def test_set_lr_is_the_control_and_sticks_per_group():
    def set_group_1_after_epoch_2(trainer):
        if trainer.epoch == 1:
            trainer.lr_schedule.set_lr(0.004, group=1)
    seen, trainer = drive("linear", epochs=5, warmup_epochs=0.0, user=set_group_1_after_epoch_2)
    lf = former_lf(5, 0.01, False)
    group_1 = [lrs[1] for e, b, lrs in seen if b == 0]
    group_0 = [lrs[0] for e, b, lrs in seen if b == 0]
    assert group_1 == pytest.approx([0.01 * lf(0), 0.01 * lf(1), 0.004, 0.004 * lf(3) / lf(2), 0.004 * lf(4) / lf(2)])
    assert group_0 == pytest.approx([0.01 * lf(e) for e in range(5)])  # the other groups keep their schedule
    for bad, words in [(float("nan"), "finite number"), (-1.0, "finite number"), (True, "finite number")]:
        with pytest.raises(ValueError, match=words):
            trainer.lr_schedule.set_lr(bad)
    with pytest.raises(ValueError, match="scheduled group from 0 to 2"):
        trainer.lr_schedule.set_lr(0.1, group=3)


def test_lr_scheduler_setting_is_strict():
    for bad, words in [("stepp", "Did you mean 'step'"), ({"step": {}}, "needs step_size"), ({"cosine": {"gamma": 2}}, "no parameter gamma"),
                       ({"StepLR": {"step_sze": 2}}, "no parameter step_sze"), ({"multistep": {"milestones": [5, 2]}}, "increasing"),
                       ("cbpkg:nothing_here", "has no attribute"), ({"linear": {"warmup_by": "week"}}, "batch or epoch")]:
        with pytest.raises(ConfigError, match=words):
            get_config({"lr_scheduler": bad})
    with pytest.raises(ConfigError, match="cos_lr"):
        get_config({"lr_scheduler": {"step": {"step_size": 3}}, "cos_lr": True})
    with pytest.raises(ConfigError, match="warmup_epochs"):
        get_config({"lr_scheduler": "none"})
    assert get_config({"lr_scheduler": "{step: {step_size: 3}}"}).lr_scheduler == {"step": {"step_size": 3}}  # CLI text


@pytest.mark.slow
def test_user_reduce_lr_on_plateau_changes_the_lr_in_results_csv(tiny, tmp_path):
    """A torch ReduceLROnPlateau stepped by a user callback in on_fit_epoch_end: its reduction shows in results.csv and the
    default schedule continues from it (it is not undone at the next epoch)."""
    plateau = {}

    def step_plateau(trainer):
        if "p" not in plateau:
            plateau["p"] = torch.optim.lr_scheduler.ReduceLROnPlateau(trainer.optimizer, mode="max", patience=0, factor=0.5, cooldown=10)
            plateau["p"].best = 1.0  # nothing reaches a fitness of 1: the first step is a bad epoch and reduces
        plateau["p"].step(trainer.metrics["fitness"])

    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_fit_epoch_end", step_plateau)
    model.train(**{**tiny, "epochs": 3})
    with open(tmp_path / "runs" / "exp" / "results.csv") as f:
        rows = list(csv.DictReader(f))
    lf, lr0 = former_lf(3, 0.01, False), 0.002
    lrs = [float(r["lr/pg1"]) for r in rows]
    assert lrs == pytest.approx([lr0 * lf(0), 0.5 * lr0 * lf(1), 0.5 * lr0 * lf(2)], rel=1e-5)


@pytest.mark.slow
def test_a_callback_class_replaces_the_schedule(tiny):
    seen = []
    model = YOLO("yolox-nano.yaml")
    record_lrs(model, seen)
    model.train(**{**tiny, "epochs": 1, "lr_scheduler": "cbpkg:FixedLR"})
    assert {lr for _, _, lrs, _ in seen for lr in lrs} == {0.0042}


@pytest.mark.slow
def test_a_user_lr_change_survives_stop_and_resume(tiny, tmp_path):
    """The schedule's state (rescaled by a user write made before the epoch's checkpoint) is in last.pt: the resumed run
    continues from the user's LR."""
    def halve(trainer):
        for group in trainer.optimizer.param_groups:
            group["lr"] *= 0.5

    first = YOLO("yolox-nano.yaml")
    first.add_callback("on_train_epoch_end", halve)
    first.add_callback("on_fit_epoch_end", lambda trainer: setattr(trainer, "stop", True))
    first.train(**{**tiny, "epochs": 3})
    seen = []
    resumed = YOLO("yolox-nano.yaml")
    record_lrs(resumed, seen)
    resumed.train(resume=str(tmp_path / "runs" / "exp" / "weights" / "last.pt"))
    lf = former_lf(3, 0.01, False)
    assert sorted({e for e, _, _, _ in seen}) == [1, 2]
    for epoch, _, lrs, _ in seen:
        assert lrs == pytest.approx([0.5 * 0.002 * lf(epoch)] * 3, rel=1e-9), epoch


@pytest.mark.slow
def test_a_declared_lr_schedule_replaces_the_setting_and_is_refused_once_started(tiny):
    """`- lr_schedule: {lr_scheduler: constant}` in callbacks= makes the loop's schedule constant (the setting says linear):
    the settings fold it in when read; no control chooses a schedule at run time (trainer.use_schedule is gone)."""
    seen = []
    model = YOLO("yolox-nano.yaml")
    record_lrs(model, seen)
    model.train(**{**tiny, "epochs": 2, "warmup_epochs": 0.0, "callbacks": [{"lr_schedule": {"lr_scheduler": "constant"}}]})
    lr0 = model.trainer.args.lr0
    assert {lr for _, _, lrs, _ in seen for lr in lrs} == {lr0}  # linear would have been lr0 * 0.505 in epoch 2
    assert model.trainer.args.lr_scheduler == "constant" and not hasattr(model.trainer, "use_schedule")
