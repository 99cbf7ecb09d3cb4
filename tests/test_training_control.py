"""Training control: freeze, close_mosaic, monitor/monitor_mode for best.pt, checkpoint rules, the gradient event,
validator events that reach the trainer, trainer.metrics on epochs that do not validate, event names from other
frameworks, and built-in callbacks declared with parameters."""

from __future__ import annotations

import csv
import logging

import pytest
import torch

from yolo_cb import YOLO
from yolo_cb.assembly.assemble import build_trainer_callbacks
from yolo_cb.callbacks import Callbacks
from yolo_cb.callbacks.registry import REGISTRY, register_callback
from yolo_cb.checkpoints.checkpoint import load_checkpoint
from yolo_cb.settings.config import ConfigError, get_config


def weights(run):
    return run / "weights"


@pytest.mark.slow
@pytest.mark.parametrize("model_yaml, freeze, prefix", [("yolox-nano.yaml", 5, "backbone.backbone."),
                                                         ("yolocb-n.yaml", ["backbone.stem", "model.1"], ("model.0.", "model.1."))])
def test_frozen_tensors_are_bit_identical_after_training(tiny, tmp_path, caplog, model_yaml, freeze, prefix):
    caplog.set_level(logging.INFO, logger="yolo_cb")
    model = YOLO(model_yaml)
    groups = {}
    model.add_callback("on_train_start", lambda t: groups.update(ids={id(p) for g in t.optimizer.param_groups for p in g["params"]},
                                                                  frozen={id(p) for p in t.model.parameters() if not p.requires_grad}))
    model.train(**{**tiny, "model": model_yaml, "epochs": 1, "nbs": 8, "freeze": freeze, "save_initial": True})  # a step per batch
    run = tmp_path / "runs" / "exp"
    before, after = load_checkpoint(weights(run) / "initial.pt").model, load_checkpoint(weights(run) / "last.pt").model
    frozen = [k for k in before if k.startswith(prefix)]
    assert any(k.endswith("running_mean") for k in frozen) and any(k.endswith(".weight") for k in frozen)
    for key in frozen:  # weights, biases and the BatchNorm running statistics
        assert torch.equal(before[key], after[key]), key
    assert any(not torch.equal(before[k], after[k]) for k in before if not k.startswith(prefix) and k.endswith(".weight"))
    # in the optimizer's groups (so requires_grad=True later trains them: tests/test_unfreeze.py), but without a gradient
    # the optimizer skips them: no step, no weight decay (the bit-identical check above)
    assert groups["frozen"] and groups["frozen"] <= groups["ids"]
    assert any(f"freeze: {len(groups['frozen'])}/" in r.getMessage() for r in caplog.records)


def test_freeze_setting_is_strict():
    assert get_config({"freeze": "5"}).freeze == 5 and get_config({"freeze": "[backbone.stem]"}).freeze == ["backbone.stem"]
    from yolo_cb.nn import build_model
    from yolo_cb.recipe.freeze import freeze_layers, unfreeze_modules

    net = build_model("yolox-nano.yaml", nc=2, verbose=False, imgsz=64)
    with pytest.raises(ConfigError, match="has 14 layers"):
        freeze_layers(net, 15)
    with pytest.raises(ConfigError, match="backbone.backbone.stem"):
        freeze_layers(net, ["backbone.stem"])  # a YOLOCB name on a YOLOX model: the error names the right one
    cb = build_model("yolocb-n.yaml", nc=2, verbose=False, imgsz=64)  # layers model.0 ... model.11, in flow order
    assert freeze_layers(cb, 2) == ["model.0", "model.1"] and freeze_layers(cb, ["neck.down3", "model.11"]) == ["model.7", "model.11"]
    stage2 = list(cb.model[1].parameters())  # older versions' names unfreeze too
    assert unfreeze_modules(cb, ["backbone.stage2"]) == len(stage2) and all(p.requires_grad for p in stage2)
    with pytest.raises(ConfigError, match=r"has 12 layers \(model.0, model.1, .*model.11\)"):
        freeze_layers(cb, 13)


@pytest.mark.slow
def test_close_mosaic_0_keeps_mosaic_to_the_end(tiny):
    closed = []
    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_train_epoch_start", lambda t: closed.append(t.train_loader.dataset.mosaic_closed))
    model.add_callback("on_train_start", lambda t: closed.append([e.name for e in t.callbacks.entries("on_train_epoch_start")]))
    model.train(**{**tiny, "epochs": 1, "mosaic": 1.0, "close_mosaic": 0})  # close_mosaic=1 (or 15) would close epoch 1
    names, *per_epoch = closed
    assert per_epoch == [False] and not any(n.startswith("stage_switch") for n in names)


@pytest.mark.slow
def test_monitor_and_mode_pick_best_pt(tiny, tmp_path):
    key, mode = "val/obj_loss", "max"  # against the key's natural direction (auto: min), so the mode is what decides
    values = []
    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_fit_epoch_end", lambda t: values.append(t.metrics[key]))  # full precision, every epoch validates
    model.train(**{**tiny, "epochs": 3, "monitor": key, "monitor_mode": mode, "save_topk": 2, "save_epochs": [2]})
    run = tmp_path / "runs" / "exp"
    assert len(values) == 3 and len(set(values)) > 1
    best_epoch = values.index(max(values))  # 0-based; the first of equal values (only a strict improvement counts)
    assert load_checkpoint(weights(run) / "best.pt").epoch == best_epoch
    with open(run / "results.csv") as f:
        assert [float(r[key]) for r in csv.DictReader(f)] == pytest.approx(values, rel=1e-5)
    ranked = sorted(range(3), key=lambda e: -values[e])  # stable: an earlier epoch first among equals
    assert sorted(p.name for p in weights(run).glob("best_epoch*.pt")) == sorted(f"best_epoch{e + 1}.pt" for e in ranked[:2])
    assert (weights(run) / "epoch2.pt").is_file() and not (weights(run) / "epoch1.pt").exists()  # save_epochs
    assert load_checkpoint(weights(run) / "best.pt").best_fitness == max(values)  # the monitored value, not fitness


def test_monitor_improvement_rules():
    from yolo_cb.recipe.monitor import Monitor

    assert Monitor("val/iou_loss").mode == "min" and Monitor("fitness").mode == "max"
    m = Monitor("fitness", "max", min_delta=0.01)
    assert m.improved(0.5, None) and not m.improved(0.505, 0.5) and m.improved(0.52, 0.5) and not m.improved(float("nan"), 0.1)
    assert Monitor("val/iou_loss", "auto", 0.1).improved(0.3, 0.5) and not Monitor("val/iou_loss", "auto", 0.1).improved(0.45, 0.5)


@pytest.mark.slow
def test_gradient_event_validator_reach_and_metrics_on_a_non_validating_epoch(tiny):
    """val_period=2: epoch 1 does not validate; a monitor reading trainer.metrics gets NaN, not a KeyError. The gradient event
    sees accumulated, unclipped gradients before each step; the validator's events see the trainer and its epoch."""
    seen = {"grad": [], "clipped": [], "val": [], "metrics": []}

    def norm(trainer):
        return float(torch.norm(torch.stack([p.grad.norm() for p in trainer.model.parameters() if p.grad is not None])))

    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_before_optimizer_step", lambda t: seen["grad"].append(norm(t)))
    model.add_callback("optimizer_step", lambda t: seen["clipped"].append(norm(t)))
    model.add_callback("on_val_end", lambda v: seen["val"].append((v.trainer is not None, v.epoch)))
    model.add_callback("on_fit_epoch_end", lambda t: seen["metrics"].append((t.metrics["metrics/mAP50-95(B)"], t.metrics_epoch)))
    model.train(**{**tiny, "epochs": 2, "val_period": 2, "grad_clip": 1e-3, "nbs": 16})
    assert len(seen["grad"]) == len(seen["clipped"]) == 4  # 4 batches of 8, accumulate 2: one step per 2 batches, 2 epochs
    # grad_clip is in Ultralytics' units (the gradient of the loss summed over nbs images); the step holds the mean's: / nbs
    limit = 1e-3 / 16
    assert all(g > limit for g in seen["grad"]) and all(c <= limit * 1.001 for c in seen["clipped"])  # before clipping
    assert seen["val"] == [(True, 1), (True, 1)]  # epoch 2's validation, then best.pt's final validation
    (first, first_epoch), (second, second_epoch) = seen["metrics"]
    assert first != first and first_epoch is None  # NaN: nothing validated yet
    assert second == second and second_epoch == 1


def test_event_names_of_other_frameworks_point_to_ours():
    callbacks = Callbacks()
    for name, ours in [("on_step_end", "on_train_batch_end"), ("on_epoch_end", "on_fit_epoch_end"),
                       ("on_train_batch_gradient_step_end", "optimizer_step"), ("on_validation_epoch_end", "on_val_end"),
                       ("on_train_begin", "on_train_start"), ("after_train_iter", "on_train_batch_end"),
                       ("before_epoch", "on_train_epoch_start"), ("on_pre_optimizer_step", "on_before_optimizer_step")]:
        with pytest.raises(ValueError, match=f"here it is '{ours}'") as error:
            callbacks.add_callback(name, print)
        assert "on_export_end" not in str(error.value)

    class KerasStyle:
        def on_epoch_end(self, trainer):
            pass

    with pytest.raises(ValueError, match="here it is 'on_fit_epoch_end'"):
        callbacks.add_callbacks(KerasStyle())
    with pytest.raises(ConfigError, match="here it is 'optimizer_step'"):
        get_config({"callbacks": "on_train_batch_gradient_step_end=cbpkg:log_epoch"})


def test_register_callback_defaults_to_the_class_name():
    @register_callback()
    class CountEpochsForTest:
        def on_train_epoch_end(self, trainer):
            pass

    @register_callback
    class BareDecoratorForTest:
        def on_train_epoch_end(self, trainer):
            pass

    try:
        assert REGISTRY["CountEpochsForTest"] is CountEpochsForTest and REGISTRY["BareDecoratorForTest"] is BareDecoratorForTest
    finally:
        REGISTRY.pop("CountEpochsForTest", None)
        REGISTRY.pop("BareDecoratorForTest", None)


def test_builtin_callbacks_declared_with_parameters_from_yaml_and_cli(tmp_path):
    from yolo_cb.cli import parse_args

    cfg = tmp_path / "cb.yaml"
    cfg.write_text("callbacks:\n  - stage_switch: {next_stage_start_epoch: 5}\n  - early_stopping: {patience: 3}\n")
    _, overrides = parse_args(["train", 'callbacks=[{stage_switch: {next_stage_start_epoch: 5}}, {early_stopping: {patience: 3}}]'])
    for args in (get_config({"cfg": str(cfg)}), get_config(overrides)):
        callbacks = build_trainer_callbacks(args)
        switches = {e.owner for e in callbacks.entries() if getattr(e.owner, "registry_name", "") == "stage_switch"}
        stoppers = {e.owner for e in callbacks.entries() if getattr(e.owner, "registry_name", "") == "early_stopping"}
        assert len(switches) == 1 and not stoppers  # the declared one replaces the one the settings registered
        assert switches.pop().next_stage_start_epoch == 5 and args.patience == 3  # early_stopping: folded into the settings
    with pytest.raises(ConfigError, match="next_stage.*it takes: next_stage_start_epoch, close_mosaic"):
        build_trainer_callbacks(get_config({"callbacks": [{"stage_switch": {"next_stage": 5}}]}))  # the names: checked when built


@pytest.mark.slow
def test_a_monitor_that_names_no_metric_fails_before_the_first_epoch(tiny):
    epochs = []
    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_train_epoch_start", lambda t: epochs.append(t.epoch))
    with pytest.raises(ConfigError, match=r"'monitor'.*metrics/mAP50-95\(B\)"):  # the message lists the keys there are
        model.train(**{**tiny, "monitor": "metrics/mAP5095"})
    assert epochs == []


@pytest.mark.parametrize("setting, words", [("lr_scheduler={step: {stepsize: 3}}", "'step' has no parameter stepsize"),
                                            ("close_mosaic=3", "no_aug_epochs is YOLOX's name for close_mosaic"),
                                            ("freeze=[nowhere]", "'nowhere' is not a module")])
def test_bad_training_control_settings_on_the_cli_are_one_line(tmp_path, shapes_small_yaml, setting, words):
    from test_bad_input import QUICK, cli

    extra = ["no_aug_epochs=4"] if setting.startswith("close_mosaic") else []
    result = cli(["train", f"data={shapes_small_yaml}", f"project={tmp_path / 'runs'}", *QUICK, setting, *extra], cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], result.stderr[-2000:]


def test_the_trainer_builds_the_loss_from_the_loss_settings(tmp_path):
    from yolo_cb.training.trainer import Trainer

    trainer = Trainer(get_config({"model": "yolox-nano.yaml", "box": 2.5, "iou_type": "giou", "project": str(tmp_path)}))
    trainer._parts.data = {"nc": 2, "names": {0: "a", 1: "b"}}
    trainer._build_model()
    criterion = trainer.criterion
    assert criterion is trainer.model.criterion and (criterion.box_weight, criterion.loss_type, criterion.use_l1) == (2.5, "giou", False)
    trainer = Trainer(get_config({"model": "yolocb-n.yaml", "box": 2.5, "project": str(tmp_path)}))
    trainer._parts.data = {"nc": 2, "names": {0: "a", 1: "b"}}
    with pytest.raises(ConfigError, match="'box'.*YOLOCBLoss"):
        trainer._build_model()


def test_yolox_loss_settings_are_refused_for_a_model_that_does_not_read_them():
    from yolo_cb.nn.yolocb.loss import YOLOCBLoss
    from yolo_cb.nn.yolox.loss import YOLOXLoss
    from yolo_cb.training.build import refuse_unread_loss_settings

    yolocb, yolox = YOLOCBLoss(nc=4, reg_max=16), YOLOXLoss(nc=4)
    refuse_unread_loss_settings(get_config({}), yolocb)  # the defaults pass
    for key, value in (("box", 7.5), ("iou_type", "giou")):
        refuse_unread_loss_settings(get_config({key: value}), yolox)  # the YOLOX loss takes them
        with pytest.raises(ConfigError, match=f"'{key}'.*YOLOCBLoss"):
            refuse_unread_loss_settings(get_config({key: value}), yolocb)
