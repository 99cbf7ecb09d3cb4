"""Model size and cost: layer count, parameter count and GFLOPs."""

from __future__ import annotations

import torch
from torch import nn


def count_layers(model: nn.Module) -> int:
    """Leaf modules of the network (convolutions, norms, activations, pools, ...), the loss excluded: a detector's
    `criterion`, whichever family's loss it is, is no layer of the network."""
    criterion = getattr(model, "criterion", None)
    loss_modules = {id(m) for m in criterion.modules()} if isinstance(criterion, nn.Module) else set()
    return sum(1 for m in model.modules() if not any(True for _ in m.children()) and id(m) not in loss_modules)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def count_gflops(model: nn.Module, imgsz: int | tuple[int, int] = 640) -> float:
    """GFLOPs of one inference forward pass on a 3 x imgsz x imgsz image, as YOLOX reports them (2 x multiply-adds of the
    convolutions and linear layers, what torch.utils.flop_counter counts for these models).

    Forward hooks read each layer's output shape during one real batch-of-one pass without gradients, on the model's own
    device and dtype: for YOLOX-nano at imgsz 64 on one CPU core, 39 ms the first time in a process and 11 ms after (a
    meta-device pass under FlopCounterMode took 1.2 s and 0.13 s, and imported torch._dynamo into every process that
    built a model). The pass runs in eval mode
    (a train-mode BatchNorm refuses the 1 x 1 map a batch of one has at imgsz 32), and every module's mode is put back.
    """
    h, w = (imgsz, imgsz) if isinstance(imgsz, int) else imgsz
    total = 0

    def count(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        nonlocal total
        total += 2 * module.weight.numel() * _positions(module, inputs[0], output)

    hooks = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, (nn.modules.conv._ConvNd, nn.Linear))]
    modes = [(m, m.training) for m in model.modules()]
    like = next(model.parameters(), torch.empty(0))  # the input takes the model's device and dtype
    x = torch.zeros(1, 3, h, w, device=like.device, dtype=like.dtype)
    model.eval()
    try:
        with torch.no_grad():
            model(x)
    finally:
        for hook in hooks:
            hook.remove()
        for module, training in modes:
            module.training = training
    return total / 1e9


def _positions(module: nn.Module, inputs: torch.Tensor, output: torch.Tensor) -> int:
    """How many times the layer applies its whole weight: output positions (input ones for a transposed convolution)."""
    if isinstance(module, nn.Linear):
        return output.numel() // module.out_features
    if getattr(module, "transposed", False):
        return inputs.numel() // inputs.shape[1]
    return output.numel() // output.shape[1]


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


def layer_table(model: nn.Module) -> str:
    """One row per layer in flow order (model.layers, else the top-level modules): index, name, parameters, module type."""
    modules = dict(model.named_modules())
    names = [n for n in (getattr(model, "layers", ()) or ()) if n in modules] or [n for n, _ in model.named_children()]
    rows = [f"{'':>3}  {'layer':<32} {'params':>10}  module"]
    for i, name in enumerate(names):
        rows.append(f"{i:>3}  {name:<32} {count_params(modules[name]):>10,}  {type(modules[name]).__name__}")
    return "\n".join(rows)


def parameter_table(model: nn.Module) -> str:
    """One row per parameter tensor, as Ultralytics' info(detailed=True): name, gradient, count, shape, mean, std."""
    rows = [f"{'':>5} {'name':<56} {'gradient':>8} {'params':>10} {'shape':>20} {'mu':>10} {'sigma':>10}"]
    for i, (name, p) in enumerate(model.named_parameters()):
        sigma = p.detach().float().std().item() if p.numel() > 1 else 0.0
        rows.append(f"{i:>5} {name:<56} {p.requires_grad!s:>8} {p.numel():>10,} {str(list(p.shape)):>20} "
                    f"{p.detach().float().mean().item():>10.3g} {sigma:>10.3g}")
    return "\n".join(rows)
