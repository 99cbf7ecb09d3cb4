"""Exponential moving average of model weights, with the usual ramp for early updates."""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads with the model; `unwrap` serves callbacks that are registered before any model exists
    from torch import nn


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model under a DDP/DataParallel wrapper."""
    return model.module if hasattr(model, "module") else model


class ModelEMA:
    """ema = d * ema + (1 - d) * model, with d = decay * (1 - exp(-updates / tau)) (small early, so EMA tracks)."""

    def __init__(self, model: nn.Module, decay: float = 0.9999, tau: float = 2000.0, updates: int = 0):
        self.ema = copy.deepcopy(unwrap(model)).eval()
        for p in self.ema.parameters():
            p.requires_grad_(False)
        self.decay, self.tau, self.updates = decay, tau, updates

    def current_decay(self) -> float:
        return self.decay * (1 - math.exp(-self.updates / self.tau))

    def update(self, model: nn.Module) -> None:
        import torch  # here, not at the top: importing this module (for `unwrap`) must not load torch

        self.updates += 1
        d = self.current_decay()
        with torch.no_grad():
            model_state = unwrap(model).state_dict()
            averaged, sources = [], []
            for name, value in self.ema.state_dict().items():
                if value.dtype.is_floating_point:
                    averaged.append(value)
                    sources.append(model_state[name].detach())
                else:
                    value.copy_(model_state[name])
            if averaged:  # one fused kernel per op over every tensor, not two launches per tensor (~600 a step on CUDA)
                torch._foreach_mul_(averaged, d)
                torch._foreach_add_(averaged, sources, alpha=1 - d)
