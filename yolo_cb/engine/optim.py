"""Optimizer with decay / no-decay parameter groups (the learning-rate schedule is the lr_schedule callback)."""

from __future__ import annotations

import torch
from torch import nn

from yolo_cb.utils.log import LOGGER


def parameter_groups(model: nn.Module) -> tuple[list, list, list]:
    """(weights with decay, normalisation weights without decay, biases without decay).

    Frozen parameters (requires_grad=False) are in their groups too: without a gradient the optimizer skips them (no step,
    no weight decay, no state), and once a callback or unfreeze_epoch= sets requires_grad=True they train at the group's LR."""
    decay, norm, bias = [], [], []
    norm_types = tuple(v for k, v in vars(nn).items() if "Norm" in k and isinstance(v, type))
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if name == "bias":
                bias.append(param)
            elif isinstance(module, norm_types):
                norm.append(param)
            else:
                decay.append(param)
    return decay, norm, bias


def resolve_optimizer(name: str, lr0: float, momentum: float, iterations: int) -> tuple[str, float, float]:
    """'auto' picks AdamW (lr 0.002) for short runs and SGD (lr 0.01) for long ones, as it is logged."""
    if name != "auto":
        return name, lr0, momentum
    choice = ("SGD", 0.01, 0.9) if iterations > 10_000 else ("AdamW", 0.002, 0.9)
    LOGGER.info(f"optimizer=auto: {choice[0]}(lr={choice[1]}, momentum={choice[2]}) for {iterations} iterations; set optimizer= and lr0= to choose")
    return choice


def build_optimizer(model: nn.Module, name: str, lr: float, momentum: float, weight_decay: float) -> torch.optim.Optimizer:
    decay, norm, bias = parameter_groups(model)
    if name == "SGD":
        optimizer = torch.optim.SGD(bias, lr=lr, momentum=momentum, nesterov=True)
    elif name == "Adam":
        optimizer = torch.optim.Adam(bias, lr=lr, betas=(momentum, 0.999))
    elif name == "AdamW":
        optimizer = torch.optim.AdamW(bias, lr=lr, betas=(momentum, 0.999), weight_decay=0.0)
    else:
        raise ValueError(f"optimizer '{name}' is not supported: use SGD, Adam, AdamW or auto")
    optimizer.add_param_group({"params": decay, "weight_decay": weight_decay})
    optimizer.add_param_group({"params": norm, "weight_decay": 0.0})
    for group in optimizer.param_groups:
        group["initial_lr"] = lr
    frozen = sum(1 for group in (decay, norm, bias) for p in group if not p.requires_grad)
    note = f"; {frozen} of them frozen (no gradient, so no step until requires_grad is set)" if frozen else ""
    LOGGER.info(f"optimizer: {name}(lr={lr}, momentum={momentum}) with groups: {len(bias)} biases, {len(decay)} weights "
                f"(decay {weight_decay:.3g}), {len(norm)} norm weights{note}")
    return optimizer

