"""`freeze=`: keep the first N layers (or the named modules) of a model fixed during training.

Ultralytics' freeze=N freezes its first N layers, counted in the order the image flows through them. The same count
over the layers each family's detector lists in that order, `model.layers` (see docs/pretrained.md, "Freezing layers"):

    yolox-*   1 stem, 2 dark2, 3 dark3, 4 dark4, 5 dark5 (the backbone), 6 lateral_conv0, 7 C3_p4, 8 reduce_conv1,
              9 C3_p3, 10 bu_conv2, 11 C3_n3, 12 bu_conv1, 13 C3_n4 (the PAFPN), 14 head (Megvii's module names)
    yolocb-*  model.0 stem, model.1-4 stage2-5 (the backbone), model.5-10 top_down4, top_down3, down3, bottom_up4,
              down4, bottom_up5 (the neck), model.11 head: freeze=N freezes model.0 ... model.<N-1>, as in Ultralytics

So freeze=5 freezes the backbone of either family (Ultralytics' freeze=10 on YOLOv8/YOLO11). A list names modules by
their dotted path in `model.named_modules()` (e.g. [backbone.backbone.stem, backbone.backbone.dark2], [model.0, model.1]);
a YOLOCB name of older versions (backbone.stem) is read as today's (model.0).

A frozen parameter gets requires_grad=False, so it has no gradient: the optimizer, which holds it in its group like
every other parameter, skips it (no step, no weight decay, no state) and it stays bit-identical. BatchNorm layers inside
frozen modules whose own parameters are all still frozen are kept in eval mode, so their running statistics stay
bit-identical too (Ultralytics lets them drift; here frozen means frozen).

Unfreezing is setting requires_grad=True again (`unfreeze_modules`: the loop's unfreeze stages, recipe/unfreeze.py, or a user's callback): from
the next optimizer step the tensor trains at its group's current LR (ramped up over unfreeze_warmup epochs: the late
groups of yolo_cb/recipe/optim.py), with fresh optimizer state (momentum / Adam moments start at zero, as for a new parameter); its BatchNorm statistics follow from the next epoch on (training/build.py `sync_trainable`, after
on_train_epoch_start). Under DDP the wrapper registers only trainable tensors when it is built, so `sync_trainable`
builds it again when the set changed (on every rank, at the same epoch start).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from yolo_cb.errors import ConfigError
from yolo_cb.settings.config import parse_freeze
from yolo_cb.utils.log import LOGGER
from yolo_cb.utils.suggest import did_you_mean

if TYPE_CHECKING:  # torch loads with the model this works on, not with the callbacks that import the module
    from torch import nn

__all__ = ["freeze_bn_stats", "freeze_layers", "layer_order", "parse_freeze", "trainable_count", "unfreeze_modules"]


def layer_order(model: nn.Module) -> tuple[str, ...]:
    """The model's layers in the order the image flows through them (what freeze=N counts): the detector's `layers`."""
    order = tuple(getattr(model, "layers", ()))
    if order:
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
        names = [current_name(model, str(v)) for v in value]
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


def current_name(model: nn.Module, name: str) -> str:
    """A module name as the model names it now (a detector maps names of older versions; any other module: unchanged)."""
    rename = getattr(model, "current_name", None)
    return rename(name) if callable(rename) else name


def layer_order_or_empty(model: nn.Module) -> tuple[str, ...]:
    try:
        return layer_order(model)
    except ConfigError:
        return ()


def freeze_bn_stats(model: nn.Module, names: list[str]) -> None:
    """Put the normalisation layers of frozen modules in eval mode (call after model.train()); a layer whose parameters
    were unfrozen since (requires_grad=True on any of them) updates its statistics again."""
    from torch.nn.modules.batchnorm import _BatchNorm

    modules = dict(model.named_modules())
    for name in names:
        for module in modules[name].modules():
            if isinstance(module, _BatchNorm) and not any(p.requires_grad for p in module.parameters()):
                module.eval()


def unfreeze_modules(model: nn.Module, names: list[str]) -> int:
    """requires_grad=True on every parameter of the named modules; returns how many tensors were frozen before."""
    modules = dict(model.named_modules())
    names = [current_name(model, name) for name in names]
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

