"""Checkpoints: plain dicts of tensors and primitives, written atomically, loaded with weights_only=True only.

Keys: model, ema (state_dicts), optimizer, epoch, best_fitness, train_args, model_cfg, names,
callbacks (callback states), rng (torch / numpy / python states), metrics, version, date.
"""

from __future__ import annotations

import io
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from yolo_cb.utils.files import atomic_write_bytes


class UnsafeCheckpointError(RuntimeError):
    """The file holds pickled objects beyond tensors and primitives; it was not loaded."""


def serialize_checkpoint(ckpt: dict[str, Any]) -> bytes:
    """The checkpoint as bytes (torch.save format), to write to one or several files."""
    buffer = io.BytesIO()
    torch.save(ckpt, buffer)
    return buffer.getvalue()


def save_checkpoint(ckpt: dict[str, Any] | bytes, path: Path) -> Path:
    """Write a checkpoint (a dict, or bytes from serialize_checkpoint) atomically: temp file, fsync, os.replace."""
    atomic_write_bytes(Path(path), ckpt if isinstance(ckpt, bytes) else serialize_checkpoint(ckpt))
    return Path(path)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a yolo-cb checkpoint safely; anything that needs arbitrary unpickling is refused, never run."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint '{path}' does not exist")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise UnsafeCheckpointError(
            f"refused to load '{path}': it contains pickled Python objects, not just tensors and plain data "
            f"(a whole nn.Module, a custom class or a crafted payload). yolo-cb loads checkpoints with "
            f"torch.load(weights_only=True) only. Re-save it as a plain dict of state_dicts. Detail: {str(error).splitlines()[0]}"
        ) from None
    except (RuntimeError, EOFError, ValueError) as error:
        raise RuntimeError(f"cannot read checkpoint '{path}' (truncated or not a torch file?): {error}") from error
    if not isinstance(ckpt, dict) or not ("model" in ckpt or "ema" in ckpt):
        raise ValueError(f"'{path}' is not a yolo-cb checkpoint: expected a dict with 'model'/'ema' state_dicts, got {type(ckpt).__name__}"
                         + (f" with keys {sorted(ckpt)[:8]}" if isinstance(ckpt, dict) else ""))
    return ckpt


def model_from_checkpoint(ckpt: dict[str, Any] | str | Path, verbose: bool = False):
    """Build the YOLOX model a checkpoint describes and load its EMA weights (or raw weights)."""
    from yolo_cb.nn import build_model

    if not isinstance(ckpt, dict):
        ckpt = load_checkpoint(ckpt)
    names = {int(k): v for k, v in ckpt["names"].items()}
    model = build_model(ckpt["model_cfg"], nc=len(names), verbose=verbose)
    state = ckpt.get("ema") or ckpt["model"]
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    model.names = names
    return model.float().eval()


def rng_states() -> dict:
    """torch / numpy / python RNG states as plain data (weights_only-loadable)."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    states = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "python": {"version": py_state[0], "state": list(py_state[1]), "gauss": py_state[2]},
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    npst = states["numpy"]
    np.random.set_state(("MT19937", npst["keys"].numpy().astype(np.uint32), npst["pos"], npst["has_gauss"], npst["cached_gaussian"]))
    py = states["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def strip_optimizer(path: Path) -> None:
    """Drop the optimizer (and scaler) state from a finished checkpoint; weights stay fp32."""
    ckpt = load_checkpoint(path)
    ckpt["optimizer"] = None
    ckpt["scaler"] = None
    save_checkpoint(ckpt, path)
