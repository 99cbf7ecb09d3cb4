"""`freeze=`: keep the first N layers (or the named modules) of a model fixed during training.

Ultralytics' freeze=N freezes its first N layers, counted in the order the image flows through them. The same count
over the modules of our two families (see docs/pretrained.md, "Freezing layers"):

    yolox-*   1 stem, 2 dark2, 3 dark3, 4 dark4, 5 dark5 (the backbone), 6 lateral_conv0, 7 C3_p4, 8 reduce_conv1,
              9 C3_p3, 10 bu_conv2, 11 C3_n3, 12 bu_conv1, 13 C3_n4 (the PAFPN), 14 head
    yolocb-*  1 stem, 2 stage2, 3 stage3, 4 stage4, 5 stage5 (the backbone), 6 top_down4, 7 top_down3, 8 down3,
              9 bottom_up4, 10 down4, 11 bottom_up5 (the neck), 12 head

So freeze=5 freezes the backbone of either family (Ultralytics' freeze=10 on YOLOv8/YOLO11). A list names modules by
their dotted path in `model.named_modules()` (e.g. [backbone.backbone.stem, backbone.backbone.dark2]).

A frozen parameter gets requires_grad=False, so it has no gradient: the optimizer, which holds it in its group like
every other parameter, skips it (no step, no weight decay, no state) and it stays bit-identical. BatchNorm layers inside
frozen modules whose own parameters are all still frozen are kept in eval mode, so their running statistics stay
bit-identical too (Ultralytics lets them drift; here frozen means frozen).

Unfreezing is setting requires_grad=True again (`unfreeze_modules`, the `unfreeze` callback, or a user's callback): from
the next optimizer step the tensor trains at its group's current LR (ramped up over unfreeze_warmup epochs: the late
groups of yolo_cb/engine/optim.py), with fresh optimizer state (momentum / Adam moments start at zero, as for a new parameter); its BatchNorm statistics follow from the next epoch on (engine/build.py `sync_trainable`, after
on_train_epoch_start). Under DDP the wrapper registers only trainable tensors when it is built, so `sync_trainable`
builds it again when the set changed (on every rank, at the same epoch start).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from yolo_cb.config import parse_freeze
from yolo_cb.errors import ConfigError
from yolo_cb.utils.log import LOGGER
from yolo_cb.utils.suggest import did_you_mean

__all__ = ["freeze_bn_stats", "freeze_layers", "layer_order", "parse_freeze", "trainable_count", "unfreeze_modules"]

YOLOX_LAYERS = ("backbone.backbone.stem", "backbone.backbone.dark2", "backbone.backbone.dark3", "backbone.backbone.dark4",
                "backbone.backbone.dark5", "backbone.lateral_conv0", "backbone.C3_p4", "backbone.reduce_conv1", "backbone.C3_p3",
                "backbone.bu_conv2", "backbone.C3_n3", "backbone.bu_conv1", "backbone.C3_n4", "head")
YOLOCB_LAYERS = ("backbone.stem", "backbone.stage2", "backbone.stage3", "backbone.stage4", "backbone.stage5", "neck.top_down4",
                 "neck.top_down3", "neck.down3", "neck.bottom_up4", "neck.down4", "neck.bottom_up5", "head")


def layer_order(model: nn.Module) -> tuple[str, ...]:
    """The model's layers in the order the image flows through them (what freeze=N counts)."""
    names = {name for name, _ in model.named_modules()}
    for order in (YOLOX_LAYERS, YOLOCB_LAYERS):
        if all(name in names for name in order):
            return order
    raise ConfigError(f"invalid value for 'freeze': this model ({type(model).__name__}) has no known layer order; "
                      f"expected a list of module names from model.named_modules()")


def freeze_layers(model: nn.Module, value: Any) -> list[str]:
    """Freeze the first N layers or the named modules; returns the frozen module names (logged with the tensor count)."""
    value = parse_freeze(value)
    if value is None:
        return []
    modules = dict(model.named_modules())
    if isinstance(value, int):
        order = layer_order(model)
        if value > len(order):
            raise ConfigError(f"invalid value for 'freeze': {value}; this model has {len(order)} layers ({', '.join(order)})")
        names = list(order[:value])
    else:
        names = [str(v) for v in value]
        for name in names:
            if name not in modules or not any(True for _ in modules[name].parameters()):
                raise ConfigError(f"invalid value for 'freeze': {name!r} is not a module with parameters of this model."
                                  f"{did_you_mean(name, [n for n in modules if n])} Layers in order: {', '.join(layer_order_or_empty(model))}")
    tensors = 0
    for name in names:
        for param in modules[name].parameters():
            if param.requires_grad:
                param.requires_grad_(False)
                tensors += 1
    total = sum(1 for _ in model.parameters())
    LOGGER.info(f"freeze: {tensors}/{total} parameter tensors frozen ({', '.join(names)}); their BatchNorm statistics too")
    return names


def layer_order_or_empty(model: nn.Module) -> tuple[str, ...]:
    try:
        return layer_order(model)
    except ConfigError:
        return ()


def freeze_bn_stats(model: nn.Module, names: list[str]) -> None:
    """Put the normalisation layers of frozen modules in eval mode (call after model.train()); a layer whose parameters
    were unfrozen since (requires_grad=True on any of them) updates its statistics again."""
    modules = dict(model.named_modules())
    for name in names:
        for module in modules[name].modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and not any(p.requires_grad for p in module.parameters()):
                module.eval()


def unfreeze_modules(model: nn.Module, names: list[str]) -> int:
    """requires_grad=True on every parameter of the named modules; returns how many tensors were frozen before."""
    modules = dict(model.named_modules())
    missing = [name for name in names if name not in modules]
    if missing:
        raise ConfigError(f"invalid value for 'unfreeze': {missing[0]!r} is not a module of this model."
                          f"{did_you_mean(missing[0], [n for n in modules if n])}")
    count = 0
    for name in names:
        for param in modules[name].parameters():
            if not param.requires_grad:
                param.requires_grad_(True)
                count += 1
    return count


def trainable_count(model: nn.Module) -> int:
    return sum(1 for p in model.parameters() if p.requires_grad)

