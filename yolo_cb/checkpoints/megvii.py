"""Megvii's YOLOX checkpoints (`{"model": state_dict, "start_epoch": ...}`, as published for nano ... x): recognise
them, infer the variant from the tensors, check every key and shape, and convert them to a yolo-cb checkpoint.

Our YOLOX modules have Megvii's parameter names one for one, so the state dict loads as it is. What differs is the
input: Megvii's networks take BGR pixels in [0, 255], ours RGB in [0, 1]. The conversion folds that into the stem
convolution (its 12 input channels are 4 space-to-depth patches of 3 colours: reverse the colours, multiply by 255),
which is exact up to float rounding; after it the model runs in every yolo-cb pipeline (val, predict, export, train)
with no special case. One consequence for fine-tuning: the stem weights are 255x larger than weights trained on
[0, 1] inputs, so that one layer adapts slowly (see docs/pretrained.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from yolo_cb.errors import CheckpointError
from yolo_cb.nn.build import load_model_cfg
from yolo_cb.nn.yolox.model import YOLOX
from yolo_cb.utils.paths import MODELS_DIR, find_dataset_cfg
from yolo_cb.utils.yaml_safe import load_yaml
from yolo_cb.version import __version__

STEM_KEY = "backbone.backbone.stem.conv.conv.weight"  # (64 * width, 12, 3, 3)
CLS_KEY = "head.cls_preds.0.weight"  # (nc, 256 * width, 1, 1)
SIGNATURE = (STEM_KEY, CLS_KEY)  # keys every YOLOX state dict (Megvii's or ours) has
DEPTHWISE_KEY = "backbone.backbone.dark2.0.dconv.conv.weight"  # only depthwise variants (nano) have it
DARK2_BOTTLENECK = re.compile(r"^backbone\.backbone\.dark2\.1\.m\.(\d+)\.")
NATIVE_IMGSZ = {"yolox-nano": 416, "yolox-tiny": 416}  # Megvii's test size per variant; the others 640
FORMAT = "megvii-yolox"


def state_dict_of(obj: Any) -> Mapping[str, torch.Tensor] | None:
    """The state dict in a Megvii file's dict (its 'model'), or None when `obj` has no such mapping of tensors."""
    if not isinstance(obj, Mapping):
        return None
    state = obj.get("model")
    if not isinstance(state, Mapping) or not state or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        return None
    return state


def is_megvii_checkpoint(obj: Any) -> bool:
    """Whether a loaded file is Megvii's format: a 'model' YOLOX state dict and none of yolo-cb's own keys."""
    state = state_dict_of(obj)
    return state is not None and "model_cfg" not in obj and "names" not in obj and all(k in state for k in SIGNATURE)


def bundled_variants() -> dict[str, dict]:
    """Bundled YOLOX model YAMLs: variant name (file stem, e.g. 'yolox-s') -> its architecture dict."""
    variants = {}
    for path in sorted(MODELS_DIR.glob("yolox-*.yaml")):
        arch, _ = load_model_cfg(path)
        arch.pop("nc", None)
        variants[path.stem] = arch
    return variants


def _signature(arch: Mapping) -> tuple[int, int, bool]:
    """(stem channels, bottlenecks in dark2, depthwise): what the tensors of a YOLOX with `arch` reveal."""
    return int(float(arch["width"]) * 64), max(round(float(arch["depth"]) * 3), 1), bool(arch["depthwise"])


def infer_arch(state: Mapping[str, torch.Tensor]) -> tuple[dict, str | None]:
    """(architecture {depth, width, depthwise, act, nc}, bundled variant name or None) from a YOLOX state dict's shapes.

    width = stem channels / 64; depthwise = whether dark2 starts with a depthwise conv; depth from the number of
    bottlenecks in dark2; nc = rows of the class head. The activation cannot be seen in tensors: Megvii's is SiLU."""
    missing = [k for k in SIGNATURE if k not in state]
    if missing:
        raise CheckpointError(f"not a YOLOX state dict: it lacks {', '.join(missing)}")
    stem = int(state[STEM_KEY].shape[0])
    bottlenecks = {int(m.group(1)) for k in state if (m := DARK2_BOTTLENECK.match(k))}
    found = (stem, len(bottlenecks), DEPTHWISE_KEY in state)
    nc = int(state[CLS_KEY].shape[0])
    for name, arch in bundled_variants().items():
        if _signature(arch) == found:
            return {**arch, "nc": nc}, name
    if not bottlenecks:
        raise CheckpointError(f"not a YOLOX state dict: no bottlenecks under backbone.backbone.dark2.1.m (stem {stem} channels)")
    return {"depth": len(bottlenecks) / 3, "width": stem / 64, "depthwise": found[2], "act": "silu", "nc": nc}, None


def expected_shapes(arch: Mapping) -> dict[str, tuple[int, ...]]:
    """Every state-dict key of a YOLOX with `arch` and its shape (built on the meta device: no memory, no init cost)."""
    with torch.device("meta"):
        model = YOLOX(depth=arch["depth"], width=arch["width"], nc=int(arch["nc"]), depthwise=arch["depthwise"], act=arch.get("act", "silu"))
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def describe_mismatch(state: Mapping[str, torch.Tensor], expected: Mapping[str, tuple[int, ...]], shown: int = 4) -> str:
    """'' when `state` has exactly the keys and shapes of `expected`; else what differs (a few of each kind)."""
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [f"{k} {tuple(state[k].shape)} (expected {expected[k]})" for k in expected if k in state and tuple(state[k].shape) != expected[k]]
    parts = []
    for label, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", shapes)):
        if items:
            parts.append(f"{len(items)} {label}: {', '.join(items[:shown])}{', ...' if len(items) > shown else ''}")
    return "; ".join(parts)


def check_state(state: Mapping[str, torch.Tensor], arch: Mapping, what: str) -> None:
    """Raise CheckpointError naming what differs unless `state` has every key and shape of a YOLOX with `arch`."""
    problem = describe_mismatch(state, expected_shapes(arch))
    if problem:
        raise CheckpointError(f"{what}: its tensors do not match a YOLOX (depth {arch['depth']}, width {arch['width']}, "
                              f"depthwise {arch['depthwise']}, {arch['nc']} classes): {problem}")


def fold_input_convention(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of a Megvii state dict whose stem takes RGB in [0, 1] instead of BGR in [0, 255] (see the module docstring)."""
    out = dict(state)
    weight = state[STEM_KEY]
    groups = weight.shape[1] // 3  # space-to-depth patches, 3 colour channels each
    order = [3 * g + 2 - c for g in range(groups) for c in range(3)]  # RGB channel c reads Megvii's BGR channel 2 - c
    out[STEM_KEY] = (weight.double()[:, order] * 255.0).to(weight.dtype)
    return out


def coco_names() -> dict[int, str]:
    """COCO's 80 class names in Megvii's (and Ultralytics') order, from the bundled coco8.yaml."""
    names = load_yaml(find_dataset_cfg("coco8.yaml"), CheckpointError, "dataset YAML")["names"]
    return {int(k): str(v) for k, v in names.items()}


def convert(obj: Mapping, source: str | Path | None = None) -> dict[str, Any]:
    """A yolo-cb checkpoint (plain data, weights_only-loadable) from a loaded Megvii file; CheckpointError naming what
    does not match when its tensors are not a YOLOX's."""
    what = f"'{source}'" if source else "the Megvii checkpoint"
    state = state_dict_of(obj)
    if state is None:
        raise CheckpointError(f"{what} is not a Megvii YOLOX checkpoint: no 'model' state dict of tensors")
    arch, variant = infer_arch(state)
    check_state(state, arch, what)
    nc = int(arch.pop("nc"))
    names = coco_names() if nc == 80 else {i: str(i) for i in range(nc)}
    folded = fold_input_convention({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    return {
        "model": folded,
        "ema": None,
        "optimizer": None,
        "epoch": -1,
        "epochs": 0,
        "finished": True,  # nothing to resume: a starting point for val / predict / export / fine-tuning
        "best_fitness": None,
        "train_args": {"imgsz": NATIVE_IMGSZ.get(variant or "", 640)},  # YOLO(file) uses the variant's own input size
        "model_cfg": arch,
        "names": names,
        "metrics": {},
        "source": {"format": FORMAT, "file": str(source) if source else None, "variant": variant,
                   "start_epoch": int(obj["start_epoch"]) if isinstance(obj.get("start_epoch"), int) else None},
        "version": __version__,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def describe_format_mismatch(obj: Any) -> str:
    """Why a loaded file is neither a yolo-cb checkpoint nor a Megvii one, naming what each format lacks."""
    if not isinstance(obj, Mapping):
        return (f"is neither a yolo-cb checkpoint (.pt) nor a Megvii YOLOX checkpoint (.pth): it holds a {type(obj).__name__}, "
                f"not a dict")
    ours = [k for k in ("model", "model_cfg", "names") if k not in obj]
    state = state_dict_of(obj)
    lacking = [k for k in SIGNATURE if k not in state] if state is not None else []
    if state is None:
        theirs = "no 'model' state dict of tensors"
    elif lacking:
        theirs = f"its 'model' state dict lacks {', '.join(lacking)}"
    else:
        theirs = "its 'model' state dict is a YOLOX one, but the file also has yolo-cb's 'names' without 'model_cfg'"
    keys = sorted(map(str, obj))
    return (f"is neither a yolo-cb checkpoint (.pt: it lacks {', '.join(ours)}) nor a Megvii YOLOX checkpoint (.pth: {theirs}); "
            f"its keys: {', '.join(keys[:8])}{', ...' if len(keys) > 8 else ''}")
