"""What a training is built from: the model (initial weights, freeze=, its loss), the loaders, the validator; seeding.

`Parts` holds them (the trainer's private `_parts`); the Trainer exposes each to callbacks under its usual name (`trainer.model`, `trainer.train_loader`, ...).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from yolo_cb.checkpoints.checkpoint import Checkpoint, load_checkpoint
from yolo_cb.data.check import training_summary
from yolo_cb.data.loading.device_colour import colour_on_device
from yolo_cb.data.loading.loader import build_dataloader, build_yolo_dataset
from yolo_cb.data.resolve import check_data as resolve
from yolo_cb.data.resolve import single_class
from yolo_cb.errors import ConfigError
from yolo_cb.evaluation.val_sets import extra_sets, placeholder_keys
from yolo_cb.nn import build_model as build
from yolo_cb.recipe.ema import unwrap
from yolo_cb.recipe.freeze import freeze_bn_stats, trainable_count
from yolo_cb.settings.config import Config, load_defaults
from yolo_cb.utils import dist as distributed
from yolo_cb.utils.log import LOGGER
from yolo_cb.utils.process_state import CUBLAS_ENV


def loss_settings(args: Config) -> dict[str, Any]:
    """The settings that configure a loss (a criterion lists those it takes in `reads_settings`)."""
    return {"box": args.box, "iou_type": args.iou_type}
METRIC_NAMES = ("precision(B)", "recall(B)", "mAP50(B)", "mAP50-95(B)")


@dataclass
class Parts:
    model: Any = None
    ema: Any = None
    optimizer: Any = None
    criterion: Any = None
    train_loader: Any = None
    test_loader: Any = None
    validator: Any = None
    data: dict = field(default_factory=dict)
    model_cfg: dict = field(default_factory=dict)
    loss_names: tuple[str, ...] = ()  # train/<name> keys, from the criterion once it is built
    frozen: list[str] = field(default_factory=list)  # the modules freeze= froze (parameters and BatchNorm statistics as loaded)
    extra_val: dict = field(default_factory=dict)  # name -> loader of each validation set after the first (evaluation/val_sets.py)
    ddp_trainable: int = 0  # trainable tensors when the DDP wrapper was built (it all-reduces the gradients of those only)
    num_batches: int = 0
    compiled: Any = None  # compile=: torch.compile over `model` (the DDP wrapper under DDP), the forward the step calls; None = eager


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        os.environ.setdefault(CUBLAS_ENV, ":4096:8")


def check_data(args: Config, rank: int) -> dict:
    """The dataset dict; rank 0 downloads or generates it first."""

    if rank > 0:
        distributed.barrier()  # let rank 0 download or generate the dataset first
    data = resolve(args.data or "shapes.yaml", args.datasets_dir)
    if rank == 0:
        distributed.barrier()
    return single_class(data) if args.single_cls else data


def initial_model(args: Config, model_source: Any, resume_ckpt: Any, data: dict, device: torch.device, verbose: bool) -> torch.nn.Module:
    """The model on `device`: the architecture of the checkpoint resumed, of the initial checkpoint or of the YAML, with
    the initial checkpoint's (or pretrained=) matching weights, and the dataset's class names. Official weights named by
    name were resolved to their files by the plan (training/plan.py fresh_train_args); a resume loads no pretrained=
    weights (the checkpoint's replace them)."""
    source, init_ckpt = model_source, None
    if resume_ckpt is not None:
        cfg = resume_ckpt.model_cfg
    elif isinstance(source, (str, Path)) and str(source).endswith((".pt", ".pth")):  # .pth: Megvii's files too
        init_ckpt = load_checkpoint(source)
        cfg = init_ckpt.model_cfg
    elif isinstance(source, torch.nn.Module):  # YOLO(yaml).load(weights).train(): the facade's in-memory model is the start
        init_ckpt = Checkpoint(model=dict(source.state_dict()), model_cfg=dict(source.cfg), names=dict(source.names))
        cfg = init_ckpt.model_cfg
    else:
        cfg = source
    model = build(cfg, nc=int(data["nc"]), verbose=verbose, imgsz=args.imgsz)
    if resume_ckpt is None and args.pretrained and not isinstance(args.pretrained, bool):
        init_ckpt = load_checkpoint(args.pretrained)
    if init_ckpt is not None:
        load_matching_weights(model, init_ckpt)
    model.names = dict(data["names"])
    model = model.to(device)
    return model.to(memory_format=torch.channels_last) if args.channels_last else model


def build_criterion(args: Config, model: torch.nn.Module) -> tuple[Any, tuple[str, ...]]:
    """(the loss built from the loss settings, its train/<name> keys): each family takes the settings in its
    reads_settings (a setting it does not take must stay at its default); YOLOX's L1 starts off."""
    criterion = unwrap(model).build_loss(loss_settings(args))
    refuse_unread_loss_settings(args, criterion)
    return criterion, tuple(f"{name}_loss" for name in criterion.loss_names)


def load_matching_weights(model: torch.nn.Module, ckpt: Checkpoint) -> int:
    """Copy every tensor whose key and shape match; the others keep the build's initialisation (another class count: the
    class head starts as the family's head does, e.g. YOLOX's prior bias). Returns the number of tensors transferred."""

    source = ckpt.ema or ckpt.model
    own = model.state_dict()
    matching = {k: v for k, v in source.items() if k in own and own[k].shape == v.shape}
    model.load_state_dict(matching, strict=False)
    reshaped = any(k in own and own[k].shape != v.shape for k, v in source.items())
    nc, saved_nc = int(getattr(model, "nc", 0)), len(ckpt.names or {})
    classes = f"; class head re-initialised for {nc} classes (checkpoint: {saved_nc}) as the model's head starts" \
        if reshaped and saved_nc and nc != saved_nc else ""
    LOGGER.info(f"transferred {len(matching)}/{len(own)} tensors from the initial checkpoint{classes}")
    return len(matching)


@dataclass
class Loaders:
    train: Any  # this rank's shard of the training set
    test: Any = None  # the first validation set (rank 0 only)
    extra: dict = field(default_factory=dict)  # name -> loader of each validation set after the first (rank 0 only)


def build_loaders(args: Config, data: dict, rank: int, is_main: bool, device: torch.device) -> Loaders:
    """The training loader (workers that run through the whole run, batches in the model's memory format, pinned for a
    CUDA device) and rank 0's validation loaders."""
    stride, names = 32, data.get("label_names", data["names"])  # single_cls: the YAML's, by which labels are checked
    if rank > 0:
        distributed.barrier()  # rank 0 verifies the labels and writes the caches first; the others read them
    on_device = colour_on_device(args.colour_on, device.type)
    if on_device and is_main:
        LOGGER.info(f"colour_on={args.colour_on}: the HSV jitter of training batches runs on {device.type} (the workers draw the gains)")
    train_set = build_yolo_dataset(args, data["train"], "train", names, stride=stride, batch=args.batch, write_caches=is_main,
                                   colour_on_device=on_device)
    if rank == 0:
        distributed.barrier()
    pin = device.type == "cuda"  # page-locked batches: the copy to the device overlaps the step (non_blocking)
    loaders = Loaders(build_dataloader(train_set, args.batch, args.workers, shuffle=True, rank=rank, seed=args.seed, pin_memory=pin,
                                       channels_last=bool(args.channels_last), span_epochs=True))
    if is_main:
        split = data.get(args.split if args.split != "train" else "val") or data.get("val")
        val_set = build_yolo_dataset(args, split, "val", names, stride=stride, batch=args.batch * 2)
        LOGGER.info(training_summary({"train": train_set.labels, "val": val_set.labels}, dict(names)))
        loaders.test = build_dataloader(val_set, args.batch * 2, args.workers, shuffle=False, rank=-1, seed=args.seed, pin_memory=pin)
        if args.split == "val":
            for name, split in extra_sets(data).items():
                dataset = build_yolo_dataset(args, split, "val", names, stride=stride, batch=args.batch * 2)
                loaders.extra[name] = build_dataloader(dataset, args.batch * 2, args.workers, shuffle=False, rank=-1, seed=args.seed,
                                                       pin_memory=pin)
    return loaders


def wrap_distributed(model: torch.nn.Module, sync_bn: bool, device: torch.device) -> tuple[torch.nn.Module, int]:
    """(the model in a DistributedDataParallel wrapper, the number of trainable tensors it registered)."""
    from torch.nn.parallel import DistributedDataParallel

    if sync_bn and device.type == "cuda":
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    elif sync_bn:
        LOGGER.warning("WARNING sync_bn=True needs CUDA (PyTorch's SyncBatchNorm runs on GPUs only); plain BatchNorm is used on CPU")
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, find_unused_parameters=False), trainable_count(model)


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # inductor's modes; other names: backends


def compile_forward(model: torch.nn.Module, setting: Any) -> Any:
    """compile=: the training forward is torch.compile over the model as wrapped for DDP (None: eager); the model
    itself stays the eager module the EMA, validation, checkpoints and exports read (same parameters, same state_dict
    keys). The loss inside the forward has data-dependent shapes: dynamo splits the graph there (graph breaks) and
    marks the target count dynamic after the first recompilation."""
    if setting is False:
        return None
    mode = None if setting is True or setting not in COMPILE_MODES else setting
    backend = "inductor" if setting is True or setting in COMPILE_MODES else setting
    compiled = torch.compile(model, mode=mode, backend=backend)
    LOGGER.info(f"compile={setting}: the training forward runs through torch.compile (backend {backend}, mode {mode or 'default'}); "
                "the first batches are slow while it compiles")
    return compiled


def stale_wrapper(parts: Parts, world_size: int) -> bool:
    """After on_train_epoch_start: frozen BatchNorm statistics stay as loaded (those of unfrozen layers update again);
    True under DDP when the wrapper was built for another set of trainable tensors (DDP all-reduces only the gradients
    of the tensors it registered): it must be built again, on every rank at the same epoch start."""
    model = unwrap(parts.model)
    freeze_bn_stats(model, parts.frozen)
    if world_size > 1 and trainable_count(model) != parts.ddp_trainable:
        LOGGER.info(f"trainable tensors changed ({parts.ddp_trainable} -> {trainable_count(model)}): DDP wrapper rebuilt")
        return True
    return False


def placeholder_metrics(loss_names: tuple[str, ...], data: dict | None = None) -> dict[str, float]:
    """NaN for every metric a validation gives (of every validation set): what a callback reading one before the first
    validation gets."""
    keys = [f"metrics/{n}" for n in METRIC_NAMES] + ["fitness"] + [f"val/{n}" for n in loss_names]
    values = dict.fromkeys(keys, float("nan"))
    return {**values, **placeholder_keys(data or {}, values)}


def refuse_unread_loss_settings(args: Config, criterion) -> None:
    """A loss setting the model's criterion does not take (YOLOCB: CIoU + DFL, fixed gains) must stay at its default."""
    defaults = load_defaults()
    for key, value in loss_settings(args).items():
        if key not in criterion.reads_settings and value != defaults[key]:
            raise ConfigError(f"invalid value for '{key}': {value!r}; it sets the YOLOX loss, and this model trains with "
                              f"{type(criterion).__name__} (CIoU + DFL with fixed gains): leave {key} at {defaults[key]!r} or train a "
                              f"yolox-* model")
