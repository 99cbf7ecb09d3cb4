"""Cell grids of multi-level head outputs, shared by the detector heads: flattening per-level maps and each cell's
coordinates and stride."""

from __future__ import annotations

import numpy as np
import torch

GRID_CACHE_SIZE = 32  # distinct input sizes whose cell grids are kept (rectangular val batches vary in shape)


def flatten_levels(outputs: list[torch.Tensor]) -> torch.Tensor:
    """Per-level maps (B, C, H, W) as one (B, A, C) tensor over all A cells of all levels."""
    flat = []
    for o in outputs:
        b, c, h, w = (int(v) for v in o.shape)  # plain ints: a static export sees constants
        flat.append(o.reshape(b, c, h * w))
    return torch.cat(flat, dim=2).permute(0, 2, 1)


def cell_grid(outputs: list[torch.Tensor], level_strides, cache: dict, offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Cell coordinates (A, 2) as (column + offset, row + offset) and strides (A, 1) for the levels of `outputs`, kept in
    `cache` per feature-map sizes, device and dtype. Built with numpy from plain ints so that tracing/ONNX export
    records them as constants."""
    sizes = tuple((int(o.shape[2]), int(o.shape[3])) for o in outputs)
    ref = outputs[0]
    key = (sizes, ref.device, ref.dtype)
    if key not in cache:
        if len(cache) >= GRID_CACHE_SIZE:
            cache.clear()
        grids, strides = [], []
        for (h, w), stride in zip(sizes, level_strides, strict=True):
            ys, xs = np.meshgrid(np.arange(h, dtype=np.float32), np.arange(w, dtype=np.float32), indexing="ij")
            grids.append(np.stack((xs, ys), axis=-1).reshape(-1, 2) + np.float32(offset))
            strides.append(np.full((h * w, 1), stride, dtype=np.float32))
        with torch.inference_mode(False):  # a normal tensor even when built under inference_mode: training may reuse it
            grid = torch.from_numpy(np.concatenate(grids)).to(device=ref.device, dtype=ref.dtype)
            stride = torch.from_numpy(np.concatenate(strides)).to(device=ref.device, dtype=ref.dtype)
        cache[key] = (grid, stride)
    return cache[key]
