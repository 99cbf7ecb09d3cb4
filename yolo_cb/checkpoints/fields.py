"""The form of each field of a checkpoint we did not write, checked when it is loaded: a crafted or damaged file is one
line naming the file, the field and what it must be (CheckpointError), never a traceback from deep inside a load.

Before: `model_cfg: "oops"`, `names: [1, 2]`, `tensors_crc32: "zz"`, `epoch: "x"`, `train_args: [1]` or an optimizer state of
another form each ended in an AttributeError, ValueError or TypeError, some only at resume.
"""

from __future__ import annotations

from numbers import Real
from pathlib import Path
from typing import Any

import torch

from yolo_cb.errors import CheckpointError
from yolo_cb.utils.files import size_text
from yolo_cb.utils.log import printable

MAPPINGS = ("train_args", "metrics", "callbacks", "recipe", "data_fingerprint", "rng", "loss")  # plain mappings
INTEGERS = ("epoch", "epochs", "ema_updates", "last_opt_step", "best_epoch", "metrics_epoch", "epoch_batches", "world_size",
            "optimizer_steps", "tensors_crc32", "format_version")
NUMBERS = ("best_fitness", "fitness", "monitor_value")


def check_fields(ckpt: dict[str, Any], path: Path) -> None:
    """CheckpointError naming `path` and the first field whose form is wrong; None / absent fields pass (older files)."""
    problem = _first_problem(ckpt)
    if problem is not None:
        raise CheckpointError(f"checkpoint '{path}' is damaged or was not written by yolo-cb: {problem}")


def check_tensors(loaded: Any, path: Path) -> None:
    """CheckpointError naming `path` and the first tensor anywhere in `loaded` that holds no values of its own: one on the
    meta device (a shape, no data: copying it raised NotImplementedError), or a view needing more values than its stored
    bytes (torch.save keeps an expanded, stride-0 view as its one stored element: 4 bytes that stood for 10^10 values,
    and the checksum's copy of it asked for 40 GB). Nothing is copied or allocated to find out."""
    stack: list[tuple[Any, str]] = [(loaded, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, torch.Tensor):
            problem = _tensor_problem(value)
            if problem is not None:
                raise CheckpointError(f"checkpoint '{path}' is damaged or was not written by yolo-cb: tensor "
                                      f"'{printable(where)[:120]}' {problem}; use another checkpoint")
        elif isinstance(value, dict):
            stack.extend((v, f"{where}.{k}" if where else str(k)) for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(value))


def _tensor_problem(tensor: torch.Tensor) -> str | None:
    if tensor.is_meta:
        return "is on the meta device: it has a shape and no values"
    if tensor.layout != torch.strided:
        return f"is a {tensor.layout} tensor; a checkpoint holds dense tensors"
    needed, stored = tensor.numel() * tensor.element_size(), tensor.untyped_storage().nbytes()
    if needed > stored:
        return (f"is a view of {tensor.numel():,} values ({size_text(needed)}) on {size_text(stored)} of stored data (an expanded, "
                f"stride-0 or overlapping view): a checkpoint's tensors hold each of their values")
    return None


def _first_problem(ckpt: dict[str, Any]) -> str | None:
    for check in (_state_dicts, _architecture, _names, _scalars, _mappings, _optimizer):
        problem = check(ckpt)
        if problem is not None:
            return problem
    return None


def _state_dicts(ckpt: dict) -> str | None:
    for key in ("model", "ema"):
        value = ckpt.get(key)
        if value is not None and not (isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items())):
            return f"'{key}' is {_kind(value)}; it must map parameter names to tensors"
    return None


def _architecture(ckpt: dict) -> str | None:
    cfg = ckpt.get("model_cfg")
    if not isinstance(cfg, dict):
        return f"'model_cfg' is {_kind(cfg)}; it must be the architecture mapping (family, depth, width, ...)"
    for key in ("depth", "width"):
        if key in cfg and (isinstance(cfg[key], bool) or not isinstance(cfg[key], Real)):
            return f"model_cfg '{key}' is {_kind(cfg[key])}; it must be a number"
    return None


def _names(ckpt: dict) -> str | None:
    names = ckpt.get("names")
    if names is None:
        return None
    if isinstance(names, dict) and all(isinstance(k, int) and not isinstance(k, bool) and isinstance(v, str) for k, v in names.items()):
        return None
    return f"'names' is {_kind(names)}; it must map class indices (integers) to names (text)"


def _scalars(ckpt: dict) -> str | None:
    for key in INTEGERS:
        value = ckpt.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return f"'{key}' is {_kind(value)}; it must be an integer"
    for key in NUMBERS:
        value = ckpt.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, Real)):
            return f"'{key}' is {_kind(value)}; it must be a number"
    return None


def _mappings(ckpt: dict) -> str | None:
    for key in (*MAPPINGS, "scaler"):
        value = ckpt.get(key)
        if value is not None and not isinstance(value, dict):
            return f"'{key}' is {_kind(value)}; it must be a mapping"
    return None


def _optimizer(ckpt: dict) -> str | None:
    state = ckpt.get("optimizer")
    if state is None:
        return None
    if not (isinstance(state, dict) and isinstance(state.get("state"), dict) and isinstance(state.get("param_groups"), list)
            and all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in state["param_groups"])):
        return "'optimizer' is not an optimizer state (a mapping of 'state' and a list of 'param_groups', each with its 'params')"
    return None


def _kind(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"
