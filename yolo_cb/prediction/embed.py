"""Embeddings (`predict(embed=[layers])`, `model.embed(source)`): one feature vector per image instead of Results, as
Ultralytics' embed: each listed layer's output (an index into `model.model.layers`, the order freeze=N counts) averaged
over its pixels, the layers' vectors joined in index order. A layer with several outputs (the head's levels) gives each
one's average, joined. Needs a PyTorch model (an export has no layers to read); Ultralytics' default layer for
`model.embed()` is the one before the head: `default_layer`."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from yolo_cb.errors import ConfigError


def layer_names(backend: Any, wanted: list[int]) -> list[str]:
    """The module names of layers `wanted` of a PyTorch backend's model; anything else is refused in one line."""
    layers = tuple(getattr(getattr(backend, "model", None), "layers", ()) or ())
    if getattr(backend, "kind", None) != "pytorch" or not layers:
        raise ConfigError(f"embed= needs a PyTorch model (.pt, or a model loaded with weights); {getattr(backend, 'path', None) or type(backend).__name__} "
                          f"is a {getattr(backend, 'kind', 'other')} model, whose layers cannot be read: drop embed=")
    bad = [i for i in wanted if not 0 <= i < len(layers)]
    if bad:
        raise ConfigError(f"invalid value for 'embed': {wanted}; layer indices run from 0 to {len(layers) - 1} (model.model.layers)")
    return [layers[i] for i in sorted(set(wanted))]


def default_layer(module: Any) -> int:
    """The layer model.embed() reads when embed= is not given: the one before the head (Ultralytics': len(model) - 2)."""
    return max(len(getattr(module, "layers", ()) or ()) - 2, 0)


def pooled(output: Any) -> torch.Tensor:
    """(B, C) per-channel averages of a layer's output: a (B, C, H, W) map, or a list of them joined along C."""
    if isinstance(output, (list, tuple)):
        return torch.cat([pooled(o) for o in output], dim=1)
    return F.adaptive_avg_pool2d(output, 1).flatten(1) if output.ndim == 4 else output.flatten(1)


def embeddings(backend: Any, x: torch.Tensor, wanted: list[int]) -> list[torch.Tensor]:
    """One 1-D float tensor per image of `x`: layers `wanted`'s pooled outputs, joined in index order."""
    names = layer_names(backend, wanted)
    model, seen = backend.model, {}
    hooks = [model.get_submodule(n).register_forward_hook(lambda m, i, o, n=n: seen.__setitem__(n, pooled(o))) for n in names]
    try:
        backend(x)
    finally:
        for hook in hooks:
            hook.remove()
    return list(torch.cat([seen[n].float() for n in names], dim=1).unbind(0))
