"""The colour jitter (HSV) and /255 of a training batch on the device, after the copy (issue 58 item 2).

A loader worker that defers colour (`colour_on=`) draws each sample's HSV gains exactly as RandomHSV does (the same
numpy calls, in the same order: a seeded run's draws do not change) and records them as ``sample["hsv_gains"]``
(float64 (3,), the multipliers ``1 + uniform(-1, 1) * gain``); collate stacks them into ``batch["hsv_gains"]`` (B, 3).
Here one batched torch function does what the worker's OpenCV path does per image: RGB -> OpenCV's 8-bit HSV (H in
[0, 180), the integer arithmetic of cv2.cvtColor), the per-channel tables RandomHSV builds (hue ``(x * gain) % 180``,
saturation and value ``clip(x * gain, 0, 255)``, truncated to uint8), HSV -> RGB (OpenCV's float formula, rounded to
uint8 as its vectorised loop does), then /255. The same code runs on the CPU (tests, CPU training) and on CUDA.
"""

from __future__ import annotations

import torch

COLOUR_ON = ("auto", "worker", "device")
HSV_SHIFT = 12  # OpenCV's fixed-point shift in its 8-bit RGB -> HSV
# (b, g, r) of each hue sector as indices into (v, v(1-s), v(1-sf), v(1-s(1-f))): OpenCV's HSV2RGB sector_data, here (r, g, b)
SECTORS = ((0, 3, 1), (2, 0, 1), (1, 0, 3), (1, 2, 0), (3, 1, 0), (0, 1, 2))


def colour_on_device(setting: str, device_type: str) -> bool:
    """Whether training batches get their colour here (True) or in the loader's workers (False). `auto`: on a CUDA
    device (its pixel work is nearly free there and a worker's most expensive stage leaves the CPU); elsewhere in the
    workers, where OpenCV's lookup tables cost a worker less than this batched torch code costs the main process
    (BENCHMARKS.md, issue 58 item 2)."""
    if setting not in COLOUR_ON:
        raise ValueError(f"colour_on={setting!r} must be one of {', '.join(COLOUR_ON)}")
    return device_type == "cuda" if setting == "auto" else setting == "device"


def _opencv_divisors(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """OpenCV's sdiv_table and hdiv_table (hue range 180): round((255 << 12) / i) and round((180 << 12) / (6 i))."""
    i = torch.arange(256, dtype=torch.float64, device=device)
    sdiv = torch.round((255 << HSV_SHIFT) / i)
    hdiv = torch.round((180 << HSV_SHIFT) / (6 * i))
    sdiv[0] = hdiv[0] = 0
    return sdiv.to(torch.int32), hdiv.to(torch.int32)


def rgb_to_hsv(img: torch.Tensor) -> torch.Tensor:
    """uint8 RGB (B, 3, H, W) -> int32 HSV (B, 3, H, W) as cv2.cvtColor(COLOR_RGB2HSV) computes it, exactly (int32
    throughout, lookups by index_select: half the memory of int64 indices, 0.3 GB at batch 64 x 640)."""
    sdiv, hdiv = _opencv_divisors(img.device)
    x = img.to(torch.int32)
    r, g, b = x.unbind(1)
    v = torch.maximum(torch.maximum(r, g), b)
    diff = v - torch.minimum(torch.minimum(r, g), b)
    half = 1 << (HSV_SHIFT - 1)
    s = (diff * _lookup(sdiv, v) + half) >> HSV_SHIFT
    h = torch.where(v == r, g - b, torch.where(v == g, b - r + 2 * diff, r - g + 4 * diff))
    h = (h * _lookup(hdiv, diff) + half) >> HSV_SHIFT
    h = torch.where(h < 0, h + 180, h)
    return torch.stack((h, s, v), 1)


def _lookup(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """table[index] for an int32 index of any shape (index_select takes int32; advanced indexing would want int64)."""
    return table.index_select(0, index.reshape(-1)).view(index.shape)


def hsv_tables(gains: torch.Tensor) -> torch.Tensor:
    """(B, 3) float64 multipliers -> (B, 3, 256) uint8 tables, RandomHSV's: hue (x * g) % 180, the others clipped."""
    x = torch.arange(256, dtype=torch.float64, device=gains.device)
    scaled = x * gains.to(torch.float64)[:, :, None]
    hue = torch.remainder(scaled[:, :1], 180)
    return torch.cat((hue, scaled[:, 1:].clamp(0, 255)), 1).to(torch.uint8)


def hsv_to_rgb(hsv: torch.Tensor) -> torch.Tensor:
    """8-bit HSV (B, 3, H, W) integers -> uint8 RGB as cv2.cvtColor(COLOR_HSV2RGB)'s vectorised loop computes it: float32,
    truncated (its scalar loop, which OpenCV runs on the last pixels of a row short of a full vector, rounds instead)."""
    h, s, v = hsv.to(torch.float32).unbind(1)
    s, v = s * (1 / 255), v * (1 / 255)
    h = h * torch.tensor(6 / 180, dtype=torch.float32)
    sector = torch.floor(h)
    f = h - sector
    tab = torch.stack((v, v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))), 1)
    sector = sector.to(torch.int32).clamp(0, 5)
    choice = torch.tensor(SECTORS, dtype=torch.int32, device=hsv.device)
    # one output channel at a time: gather wants int64 indices, and one channel's are a third of the batch's
    rgb = torch.cat([tab.gather(1, _lookup(choice[:, c].contiguous(), sector).long().unsqueeze(1)) for c in range(3)], 1)
    return (rgb * 255).clamp(0, 255).to(torch.uint8)  # float -> uint8 truncates, as v_trunc


def jitter(img: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """uint8 RGB (B, 3, H, W) through each sample's three tables (B, 3, 256) in OpenCV's HSV: uint8 RGB."""
    hsv = rgb_to_hsv(img)
    offsets = torch.arange(tables.shape[0] * 3, dtype=torch.int32, device=img.device).view(-1, 3, 1, 1) * 256
    return hsv_to_rgb(_lookup(tables.to(img.device).reshape(-1), hsv + offsets))


def model_input(images: torch.Tensor, gains: torch.Tensor | None) -> torch.Tensor:
    """The model's float input from a uint8 batch on its device: each sample's colour (gains (B, 3), wherever they are;
    None: colour was done in the workers, or is off), then /255. Keeps the memory format of `images`."""
    if gains is not None:
        tables = hsv_tables(gains).to(images.device, non_blocking=True)
        images = jitter(images, tables).contiguous(memory_format=_format_of(images))
    return images.float() / 255


def _format_of(images: torch.Tensor) -> torch.memory_format:
    return torch.channels_last if images.dim() == 4 and images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous() else torch.contiguous_format


def augment_batch(batch: dict) -> torch.Tensor:
    """The device-side augmentation of a loader batch whose tensors are on the device (benchmarks/gpu_check.py)."""
    return model_input(batch["img"], batch.get("hsv_gains"))
