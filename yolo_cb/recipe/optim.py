"""Optimizer with decay / no-decay parameter groups (the learning-rate schedule is recipe/schedule.py).

Groups 0-2 are the scheduled ones: biases, weights with decay, normalisation weights. With `unfreeze_warmup > 0` the
tensors freeze= froze go into late groups of their own after them, per frozen module and kind (bias / decay / norm),
each following one scheduled group: `sync_late_groups`, before every optimizer step, gives it that group's
hyperparameters (momentum, weight decay, betas) and its LR times a ramp. The ramp is 0 while the group is frozen and
(k + 1) / ramp_iters at the k-th batch from the first optimizer step at which a tensor of the group is trainable, then 1:
unfrozen layers warm up on their own while the others go on at the schedule's LR. The ramp's start is a key of the
group, so it is in the optimizer's state_dict and a resume continues the ramp where it was. A state_dict saved before late
groups existed (groups 0-2 holding every tensor, as 4f22c48 wrote it) is laid out as today's groups by `fit_saved_layout`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from yolo_cb.utils.log import LOGGER

FOLLOWS = "follows"  # key of a late group: the index of the scheduled group it follows
RAMP_START = "ramp_start"  # key of a late group: the batch (over the run) its warmup ramp began; -1 while frozen
RAMP_ITERS = "ramp_iters"  # key of a late group: batches its ramp takes from ~0 to the followed group's LR


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


def late_groups(model: nn.Module, frozen: list[str], groups: tuple[list, list, list]) -> list[tuple[int, list]]:
    """(scheduled group index, tensors) per frozen module and kind; the tensors are taken out of `groups` (bias, decay,
    norm: groups 0, 1, 2 of the optimizer)."""
    modules = dict(model.named_modules())
    kind = {id(p): index for index, group in zip((1, 2, 0), groups, strict=True) for p in group}
    taken: set[int] = set()
    late = []
    for name in frozen:
        per_kind: dict[int, list] = {0: [], 1: [], 2: []}
        for param in modules[name].parameters():
            if not param.requires_grad and id(param) not in taken and id(param) in kind:
                per_kind[kind[id(param)]].append(param)
                taken.add(id(param))
        late += [(index, params) for index, params in per_kind.items() if params]
    for group in groups:
        group[:] = [p for p in group if id(p) not in taken]
    return late


def sync_late_groups(optimizer: torch.optim.Optimizer, ni: int) -> None:
    """Before an optimizer step at batch `ni` (over the run): each late group takes its scheduled group's
    hyperparameters and LR times its ramp; its ramp starts at the first step that finds one of its tensors trainable."""
    for group in optimizer.param_groups:
        if FOLLOWS not in group:
            continue
        if group[RAMP_START] < 0 and any(p.requires_grad for p in group["params"]):
            group[RAMP_START] = ni
        start = group[RAMP_START]
        ramp = 0.0 if start < 0 else min(1.0, (ni - start + 1) / group[RAMP_ITERS])
        leader = optimizer.param_groups[group[FOLLOWS]]
        group.update({k: v for k, v in leader.items() if k not in ("params", "lr", "initial_lr")})
        group["lr"] = leader["lr"] * ramp


def fit_saved_layout(state: dict, optimizer: torch.optim.Optimizer, model: nn.Module) -> dict:
    """`state` (an optimizer state_dict) as `optimizer` lays its tensors out. Saved before late groups existed, it has
    groups 0-2 holding every tensor, frozen ones too (parameter_groups' lists): each tensor's state moves from its
    position there to its position in today's groups, and groups 0-2 keep their saved hyperparameters. A late group
    with a tensor that has state was unfrozen and trained in that run, at the schedule's LR: its ramp counts as over.
    Any other state_dict is returned unchanged (torch's load_state_dict refuses a layout that does not fit)."""
    saved = state["param_groups"]
    if len(saved) != 3 or any(FOLLOWS in group for group in saved) or not any(FOLLOWS in g for g in optimizer.param_groups):
        return state
    decay, norm, bias = parameter_groups(model)
    old = (bias, decay, norm)
    if [len(group["params"]) for group in saved] != [len(params) for params in old]:
        raise ValueError(f"the saved optimizer state has groups of {[len(g['params']) for g in saved]} tensors, but this model's "
                         f"biases / weights / norm weights are {[len(p) for p in old]}: it was not saved for this model")
    position = {id(p): i for i, p in enumerate(p for group in optimizer.param_groups for p in group["params"])}
    moved = {position[id(p)]: state["state"][key] for group, params in zip(saved, old, strict=True)
             for key, p in zip(group["params"], params, strict=True) if key in state["state"]}
    groups = optimizer.state_dict()["param_groups"]  # today's layout, tensors numbered in order
    for index, group in enumerate(groups):
        if index < 3:
            groups[index] = {**saved[index], "params": group["params"]}
        elif any(key in moved for key in group["params"]):
            group.update({RAMP_START: 0, RAMP_ITERS: 1})  # trained without a ramp before the checkpoint: full LR from now on
    LOGGER.info(f"optimizer state saved in 3 groups (before unfreeze_warmup): {len(moved)} tensors' state laid out in today's "
                f"{len(groups)} groups")
    return {"state": moved, "param_groups": groups}


def resolve_optimizer(name: str, lr0: float, momentum: float, iterations: int) -> tuple[str, float, float]:
    """'auto' picks AdamW (lr 0.002) for short runs and SGD (lr 0.01) for long ones, as it is logged."""
    if name != "auto":
        return name, lr0, momentum
    choice = ("SGD", 0.01, 0.9) if iterations > 10_000 else ("AdamW", 0.002, 0.9)
    LOGGER.info(f"optimizer=auto: {choice[0]}(lr={choice[1]}, momentum={choice[2]}) for {iterations} iterations; set optimizer= and lr0= to choose")
    return choice


def build_optimizer(model: nn.Module, name: str, lr: float, momentum: float, weight_decay: float, frozen: Sequence[str] = (),
                    ramp_iters: int = 0) -> torch.optim.Optimizer:
    """Groups 0-2 (biases, decay weights, norm weights); with ramp_iters > 0, the frozen modules' tensors in late groups."""
    decay, norm, bias = parameter_groups(model)
    late = late_groups(model, list(frozen), (decay, norm, bias)) if ramp_iters > 0 else []
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
    for index, params in late:
        optimizer.add_param_group({"params": params, "lr": 0.0, "initial_lr": lr, "weight_decay": weight_decay if index == 1 else 0.0,
                                   FOLLOWS: index, RAMP_START: -1, RAMP_ITERS: ramp_iters})
    count = sum(1 for group in (decay, norm, bias) for p in group if not p.requires_grad)
    note = f"; {count} of them frozen (no gradient, so no step until requires_grad is set)" if count else ""
    if late:
        note += (f"; {sum(len(p) for _, p in late)} frozen tensors in {len(late)} groups of their own (pg3-pg{2 + len(late)}) that "
                 f"warm up over {ramp_iters} batches from their first step once unfrozen (unfreeze_warmup)")
    LOGGER.info(f"optimizer: {name}(lr={lr}, momentum={momentum}) with groups: {len(bias)} biases, {len(decay)} weights "
                f"(decay {weight_decay:.3g}), {len(norm)} norm weights{note}")
    return optimizer



def adopt_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """An optimizer from any build_optimizer (a trainer subclass's too), ready for the LR schedule: each group's
    `initial_lr` (the LR the schedule scales) is its LR where the builder set none."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"build_optimizer() returned {type(optimizer).__name__}, not a torch.optim.Optimizer")
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
    return optimizer
