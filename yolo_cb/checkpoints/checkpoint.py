"""Checkpoints: plain dicts of tensors and primitives, written atomically, loaded with weights_only=True only.

Keys: model, ema (state_dicts), optimizer, epoch, best_fitness, train_args, model_cfg, names,
callbacks (callback states), recipe (the loop's schedule, saver and results rows), rng (torch / numpy / python states), metrics, version, date; and for a safe
resume: save_dir (the run folder, absolute), best_epoch and last_is_best (which epoch best.pt holds, and
whether these weights are it), finished (the run ended), data_fingerprint (data YAML, image counts, names); and
tensors_crc32, the checksum every load verifies; format_version (FORMAT_VERSION). In memory a checkpoint is a
`Checkpoint`: load_checkpoint(path) returns one, save_checkpoint writes one; the plain dict (to_dict / from_dict) exists
only at the file's edge.
"""

from __future__ import annotations

import io
import pickle
import random
import zipfile
import zlib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from yolo_cb import nn as detectors  # build_model read at call time (tests wrap it)
from yolo_cb.checkpoints import megvii
from yolo_cb.checkpoints.fields import check_fields, check_tensors
from yolo_cb.errors import CheckpointError, os_reason, short_repr
from yolo_cb.utils.files import atomic_write_bytes
from yolo_cb.utils.log import LOGGER


class UnsafeCheckpointError(RuntimeError):
    """The file holds pickled objects beyond tensors and primitives; it was not loaded."""


CHECKSUM_KEY = "tensors_crc32"  # CRC-32 of every tensor's bytes, in key order: a flipped or torn record fails the load


LEGACY_L1 = "use_l1"  # the key older files kept YOLOX's L1 switch under, before the loss had its own slot (`loss`)
FORMAT_VERSION = 1  # the checkpoint layout written today; files without the key are older ones (0) and load with defaults
VERSION_KEY = "format_version"


@dataclass
class Checkpoint:
    """A checkpoint, typed. On disk it is the plain dict to_dict() gives (weights_only-loadable); from_dict reads one back,
    and the defaults for keys older files lack live there only. Keys this version does not know are kept in `extras`."""

    model: dict | None = None  # the model's state_dict (fp32 or the training dtype)
    ema: dict | None = None  # the EMA model's state_dict; None: trained without EMA
    ema_updates: int = 0  # EMA updates done (drives its decay ramp)
    last_opt_step: int | None = None  # the iteration of the last optimizer step; None: not recorded (resume derives it)
    optimizer: dict | None = None  # the optimizer's state_dict; None: stripped at the end of the run
    scaler: dict | None = None  # the AMP GradScaler's state_dict; None: AMP off, or stripped
    epoch: int = -1  # the last completed epoch (0-based; -1: none)
    epochs: int | None = None  # the run's epochs setting; None: not recorded
    best_fitness: float | None = None  # the best fitness so far (the one best.pt holds)
    best_epoch: int | None = None  # the epoch best.pt holds; None: not recorded (older files) or none yet
    last_is_best: bool = False  # these weights are best.pt's: a resume restores a best.pt a kill left behind
    finished: bool = False  # the run ended (all epochs, or stopped early): not resumed
    save_dir: str | None = None  # the run folder, absolute; resume only checks whether the file still lies in it
    data_fingerprint: dict | None = None  # data YAML, image counts and names; None: older file (only names are compared)
    fitness: float | None = None  # the last epoch's fitness
    train_args: dict = field(default_factory=dict)  # the run's resolved settings, plain strings and numbers
    model_cfg: dict = field(default_factory=dict)  # the architecture record (family, depth, width, nc, ...)
    names: dict = field(default_factory=dict)  # class index -> name
    callbacks: dict = field(default_factory=dict)  # the callbacks' states, by callback
    recipe: dict = field(default_factory=dict)  # the loop's recipe parts' states (lr_schedule, saver, results); older files: in callbacks
    rng: dict | None = None  # torch / numpy / python (/ cuda) RNG states of rank 0
    rank_rng: list | None = None  # under DDP: every rank's RNG states; None in a single process
    epoch_batches: int = 0  # batches of the next epoch already trained (a mid-epoch save); 0: at an epoch boundary
    world_size: int = 1  # the number of ranks that trained
    optimizer_steps: int = 0  # optimizer steps taken in the whole run
    tloss: list | None = None  # a mid-epoch save: that epoch's mean losses so far
    grads: dict | None = None  # a mid-epoch save: the gradients accumulated towards the next optimizer step
    loss: dict | None = None  # the loss's training_state() (YOLOX: its L1 switch, on in the no-aug stage); None: none recorded
    metrics: dict = field(default_factory=dict)  # the last validation metrics, name -> float
    metrics_epoch: int | None = None  # the epoch those metrics are of
    monitor_value: float | None = None  # the value the early-stopping / top-k monitor last saw
    version: str | None = None  # the yolo-cb version that wrote it
    date: str | None = None  # when it was written, UTC ISO 8601
    format_version: int = FORMAT_VERSION  # the layout of this dict (FORMAT_VERSION); a newer one is refused
    extras: dict = field(default_factory=dict)  # keys this version does not know (e.g. a converted file's source), kept as they are

    KEYS: ClassVar[tuple[str, ...]] = ()  # the dict's keys, in order (set below)

    def ended_for(self, epochs: int | None) -> bool:
        """Whether the run ended for a resume that asks for `epochs` (None: not given): it finished, and a larger epochs=
        than it trained is what trains it further."""
        return self.finished and (epochs is None or int(epochs) <= int(self.epoch) + 1)

    def to_dict(self) -> dict[str, Any]:
        """The plain dict written to disk: every field under its own key, then the extras."""
        return {**{key: getattr(self, key) for key in self.KEYS}, **self.extras}

    @classmethod
    def from_dict(cls, d: dict[str, Any], path: Any = None) -> Checkpoint:
        """The typed checkpoint of a loaded dict (`path` names it in errors). A newer format_version is refused; keys an
        older file lacks get the defaults above, except `finished`: older files marked a finished run by a stripped
        optimizer. The checksum key is not kept: it was verified on load and is written again by every save."""
        check_format_version(d, path)
        known = {key: d[key] for key in cls.KEYS if key in d and key != VERSION_KEY}
        if "finished" not in d:
            known["finished"] = d.get("optimizer") is None
        if "loss" not in d and LEGACY_L1 in d:  # files before the loss slot (up to 7d42114) kept YOLOX's L1 switch here
            known["loss"] = {"use_l1": bool(d[LEGACY_L1])}
        extras = {k: v for k, v in d.items() if k not in cls.KEYS and k not in (CHECKSUM_KEY, LEGACY_L1)}
        return cls(**known, extras=extras)


Checkpoint.KEYS = tuple(f.name for f in fields(Checkpoint) if f.name != "extras")


def check_format_version(d: dict[str, Any], path: Any) -> None:
    """CheckpointError in one line, naming the file and its version, when `d` has a layout newer than FORMAT_VERSION."""
    version = d.get(VERSION_KEY, 0)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(f"checkpoint '{path or '?'}' has format_version {short_repr(version)}, newer than this yolo-cb reads "
                              f"({FORMAT_VERSION}): upgrade yolo-cb to load it")


def tensors_checksum(obj: Any) -> int:
    """CRC-32 over the bytes of every tensor in `obj` (dicts in sorted-key order, lists in order), with their dtypes and
    shapes: catches corruption (a flipped block, a torn write), not a forger, who could recompute it."""
    crc = 0

    def visit(value: Any) -> None:
        nonlocal crc
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().contiguous().reshape(-1)
            crc = zlib.crc32(f"{tensor.dtype}{tuple(value.shape)}".encode(), crc)
            crc = zlib.crc32(tensor.view(torch.uint8).numpy().data if tensor.numel() else b"", crc)
        elif isinstance(value, dict):
            for key in sorted(value, key=str):
                if key != CHECKSUM_KEY:
                    visit(value[key])
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)

    visit(obj)
    return crc


def serialize_checkpoint(ckpt: dict[str, Any]) -> bytes:
    """A checkpoint's plain dict (Checkpoint.to_dict, or Trainer.checkpoint_dict) as bytes (torch.save format), with its
    tensors' checksum, to write to one or several files."""
    buffer = io.BytesIO()
    torch.save({**ckpt, CHECKSUM_KEY: tensors_checksum(ckpt)}, buffer)
    return buffer.getvalue()


def verify_checksum(ckpt: dict[str, Any], path: Path) -> None:
    """Raise CheckpointError naming `path` when its tensors are not the ones written (files without a checksum pass)."""
    recorded = ckpt.get(CHECKSUM_KEY)
    if recorded is not None and int(recorded) != tensors_checksum(ckpt):
        raise CheckpointError(f"checkpoint '{path}' is corrupt: its tensors do not match the checksum written with them "
                              f"(a damaged disk, copy or download); use another copy, e.g. best.pt, or an earlier checkpoint")


def save_checkpoint(ckpt: Checkpoint | bytes, path: Path) -> Path:
    """Write a checkpoint (or bytes from serialize_checkpoint) atomically: temp file, fsync, os.replace."""
    data = ckpt if isinstance(ckpt, bytes) else serialize_checkpoint(ckpt.to_dict())
    atomic_write_bytes(Path(path), data)
    return Path(path)


def _check_torch_file(path: Path) -> None:
    """CheckpointError unless the file starts as torch.save writes (a zip archive, or a legacy pickle): a text or empty
    file is named as such, not as pickled objects or an unpickler's IndexError."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as error:
        raise CheckpointError(f"cannot read checkpoint '{path}': {os_reason(error)}") from error
    if not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):
        what = "an empty file" if not head else f"it starts with {head!r}, a text file?" if head.isascii() else f"it starts with {head!r}"
        raise CheckpointError(f"'{path}' is not a checkpoint ({what}): yolo-cb checkpoints are torch.save files (.pt) written by "
                              f"yolo-cb train; name a .pt from a run's weights/ folder, or a model YAML to build a fresh model")


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Load a yolo-cb checkpoint safely, typed; anything that needs arbitrary unpickling is refused, never run. The file's
    checksum and format_version are verified, a Megvii YOLOX file is converted, and module names of older versions are
    read as today's."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint '{path}' does not exist")
    _check_torch_file(path)
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise UnsafeCheckpointError(
            f"refused to load '{path}': it contains pickled Python objects, not just tensors and plain data "
            f"(a whole nn.Module, a custom class or a crafted payload). yolo-cb loads checkpoints with "
            f"torch.load(weights_only=True) only. Re-save it as a plain dict of state_dicts. Detail: {str(error).splitlines()[0]}"
        ) from None
    except (RuntimeError, EOFError, ValueError, IndexError, KeyError, AttributeError, OSError, zipfile.BadZipFile) as error:
        if isinstance(error, OSError) and not isinstance(error, zipfile.BadZipFile) and error.errno is not None:
            raise CheckpointError(f"cannot read checkpoint '{path}': {os_reason(error)}") from error
        raise CheckpointError(f"cannot read checkpoint '{path}' (truncated, or not a torch file?): {str(error).splitlines()[0] if str(error) else type(error).__name__}") from error
    check_tensors(ckpt, path)  # before anything copies one: a meta tensor, or a stride-0 view of 10^10 values on 4 bytes
    if not isinstance(ckpt, dict) or not ("model" in ckpt or "ema" in ckpt) or "model_cfg" not in ckpt:
        if megvii.is_megvii_checkpoint(ckpt):  # Megvii's official YOLOX file: converted in memory (docs/pretrained.md)
            return Checkpoint.from_dict(megvii.convert(ckpt, path), path)
        raise CheckpointError(f"'{path}' {megvii.describe_format_mismatch(ckpt)}. To build a fresh model, name a model YAML (.yaml, e.g. yolox-nano.yaml)")
    check_fields(ckpt, path)  # each field's form: a crafted or damaged file is one line, not a traceback deep in a load
    verify_checksum(ckpt, path)
    check_format_version(ckpt, path)
    # module names of older versions (YOLOCB's backbone.*) read as today's
    return Checkpoint.from_dict(detectors.with_current_names(ckpt), path)


def model_from_checkpoint(ckpt: Checkpoint | str | Path, verbose: bool = False):
    """Build the YOLOX model a checkpoint (or the file at a path) describes and load its EMA weights (or raw weights)."""
    where = "the checkpoint" if isinstance(ckpt, Checkpoint) else f"checkpoint '{ckpt}'"
    if not isinstance(ckpt, Checkpoint):
        ckpt = load_checkpoint(ckpt)
    names = {int(k): v for k, v in ckpt.names.items()}
    model = detectors.build_model(ckpt.model_cfg, nc=len(names), verbose=verbose)
    state = ckpt.ema or ckpt.model
    load_weights_strictly(model, {k: v.float() if v.is_floating_point() else v for k, v in state.items()}, where)
    model.names = names
    return model.float().eval()


def restore_best_weights(best: Path | None, model: torch.nn.Module, ema_model: torch.nn.Module | None) -> bool:
    """Load best.pt's weights into the model (unwrapped from DDP) and the EMA's (restore_best); False without best.pt."""
    if best is None or not best.is_file():
        return False
    ckpt = load_checkpoint(best)
    model = model.module if hasattr(model, "module") else model
    load_weights_strictly(model, ckpt.model, f"checkpoint '{best}'")
    if ema_model is not None and ckpt.ema:
        load_weights_strictly(ema_model, ckpt.ema, f"checkpoint '{best}'")
    LOGGER.info(f"restore_best: the model holds best.pt's weights (epoch {int(ckpt.epoch) + 1}), not those of the last epoch")
    return True


def load_weights_strictly(model: torch.nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """load_state_dict, or CheckpointError in one line when the weights do not fit the architecture the file records."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    reshaped = [k for k in own if k in state and tuple(own[k].shape) != tuple(state[k].shape)]
    if missing or unexpected or reshaped:
        first = (reshaped or missing or unexpected)[0]
        raise CheckpointError(f"{where}: its weights do not fit the architecture it records "
                              f"({len(missing)} missing, {len(unexpected)} unexpected, {len(reshaped)} of another shape, e.g. "
                              f"'{first}'); the file was altered or assembled from two models: use another checkpoint")
    model.load_state_dict(state)


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


def strip_optimizer(path: Path, finished: bool = False, copies: tuple[Path, ...] = ()) -> Checkpoint:
    """Drop the optimizer (and scaler) state from a finished checkpoint; weights stay fp32. `finished` marks the run as ended.
    `copies`: files holding the same bytes as `path` (best.pt when the last epoch was the best), written from the same
    serialization. Returns the stripped checkpoint."""
    ckpt = load_checkpoint(path)
    ckpt.optimizer = None
    ckpt.scaler = None
    if finished:
        ckpt.finished = True
    data = serialize_checkpoint(ckpt.to_dict())
    for file in (path, *copies):
        save_checkpoint(data, file)
    return ckpt


def checkpoint_epoch(path: str | Path) -> int | None:
    """The epoch a checkpoint file holds; None if it is missing or unreadable (read memory-mapped, weights_only)."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return int(ckpt["epoch"])
    except Exception:
        return None
