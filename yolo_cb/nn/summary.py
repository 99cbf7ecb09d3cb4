"""Model size and cost: layer count, parameter count and GFLOPs."""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call
from torch.utils.flop_counter import FlopCounterMode

from .yolox.loss import YOLOXLoss


def count_layers(model: nn.Module) -> int:
    """Leaf modules of the network (convolutions, norms, activations, pools, ...), the loss excluded."""
    return sum(1 for m in model.modules() if not any(True for _ in m.children()) and not isinstance(m, YOLOXLoss))


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def count_gflops(model: nn.Module, imgsz: int | tuple[int, int] = 640) -> float:
    """GFLOPs of one inference forward pass on a 3 x imgsz x imgsz image, as YOLOX reports them (2 x multiply-adds).

    Runs on the meta device (shapes only), so it costs no compute and touches no real weights. The pass runs in eval
    mode (an inference pass; a train-mode BatchNorm refuses the 1 x 1 map a batch of one has at imgsz 32), and every
    module's mode is put back afterwards.
    """
    h, w = (imgsz, imgsz) if isinstance(imgsz, int) else imgsz
    meta_state = {name: torch.empty_like(t, device="meta") for name, t in (*model.named_parameters(), *model.named_buffers())}
    x = torch.empty(1, 3, h, w, device="meta")
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with FlopCounterMode(display=False) as counter:
            functional_call(model, meta_state, (x,))
    finally:
        for module, training in modes:
            module.training = training
    return counter.get_total_flops() / 1e9


def model_info(model: nn.Module, imgsz: int | tuple[int, int] = 640) -> dict:
    """{'layers': int, 'params': int, 'gflops': float at imgsz}."""
    return {"layers": count_layers(model), "params": count_params(model), "gflops": count_gflops(model, imgsz)}


def log_summary(model: nn.Module, imgsz: int | tuple[int, int] = 640, suffix: str = "") -> dict:
    """Log one line (layers, parameters, GFLOPs at imgsz) to the 'yolo_cb' logger; returns model_info."""
    import logging

    info = model_info(model, imgsz)
    size = imgsz if isinstance(imgsz, int) else "x".join(map(str, imgsz))
    logging.getLogger("yolo_cb").info(f"{getattr(model, 'name', type(model).__name__)} summary{suffix}: {info['layers']} layers, "
                                      f"{info['params']:,} parameters, {info['gflops']:.2f} GFLOPs at {size}")
    return info
