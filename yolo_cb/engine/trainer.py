"""The training loop: setup, epochs, batches, optimizer steps, validation, saving — every step fires its event.

Everything around the loop (progress, results.csv, checkpoints, early stopping, integrations, the
user's callbacks) is a callback; the loop only computes and keeps the state callbacks read.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import random
import re
import signal
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from yolo_cb.callbacks.engine import Callbacks
from yolo_cb.config import Config, save_config
from yolo_cb.data.loader import close_loaders
from yolo_cb.engine import resume, resume_state
from yolo_cb.engine.checkpoint import load_checkpoint, rng_states, save_checkpoint, strip_optimizer
from yolo_cb.engine.ema import ModelEMA, unwrap
from yolo_cb.engine.freeze import freeze_bn_stats, freeze_layers
from yolo_cb.engine.monitor import Monitor
from yolo_cb.engine.optim import build_optimizer, resolve_optimizer
from yolo_cb.engine.stop import StopCause
from yolo_cb.nn.yolox.loss import YOLOXLoss
from yolo_cb.paths import DEFAULT_MODEL
from yolo_cb.utils import dist as distributed
from yolo_cb.utils.files import run_dir
from yolo_cb.utils.log import LOGGER
from yolo_cb.utils.process_state import CUBLAS_ENV, restore_process_state, save_process_state
from yolo_cb.utils.run_lock import RunFolderInUse, RunLock, lock_run_folder

MAX_NONFINITE_IN_A_ROW = 5  # consecutive non-finite losses tolerated (each skips its step) before the run fails
# exit codes after a signal (last.pt saved first); 143 and 138 tell a job script to requeue (docs/distributed.md)
SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143, **({signal.SIGUSR1: 138} if hasattr(signal, "SIGUSR1") else {})}
STALE_TEMP = re.compile(r"^\..+\.[A-Za-z0-9_]+\.tmp$")  # atomic writes' temp files (.last.pt.<random>.tmp) a kill left behind


class NonFiniteLossError(RuntimeError):
    """The loss was NaN/inf for too many batches in a row."""


class Trainer:
    """Trains a YOLOX model. `trainer.train()` returns the final metrics dict.

    State callbacks read: epoch, epochs, start_epoch, batch_i, batch, loss, loss_items, tloss, metrics,
    metrics_epoch, validated_this_epoch, fitness, monitor, monitor_value, best_fitness, model, ema, optimizer,
    criterion, train_loader, test_loader, save_dir, args, stop, stop_cause (a StopCause), stop_reason (its message),
    exception, data, device, rank, world_size, frozen, lr_schedule, batches_done, optimizer_steps, save_step_due; and,
    as Ultralytics names them, best, last, plots, epoch_time, batch_size, lr, validator, add_callback. A callback ends
    the run with `trainer.request_stop(StopCause.X, message)` (or `trainer.stop = True`). The LR is the lr_schedule
    callback's (yolo_cb/callbacks/lr_schedule.py): nothing here writes it.
    """

    def __init__(self, args: Config, callbacks: Callbacks | None = None, model: Any = None):
        self.args = args
        self.model_source = model if model is not None else (args.model or DEFAULT_MODEL)
        if args.model is None and isinstance(model, (str, Path)):
            args.model = str(model)  # args.yaml and checkpoints record the model really used, never null
        self.callbacks = callbacks if callbacks is not None else Callbacks()
        self.epochs = args.epochs
        self.start_epoch = 0
        self.epoch = 0
        self.batch_i = 0
        self.batch = None
        self.loss = None
        self.loss_items = None
        self.tloss = None
        self.loss_names: tuple[str, ...] = ()  # train/<name> keys, from the criterion once it is built
        self.metrics: dict[str, float] = {}  # the latest validated metrics (NaN placeholders until the first validation)
        self.metrics_epoch: int | None = None  # the 0-based epoch trainer.metrics belong to (None: nothing validated yet)
        self.fitness: float | None = None
        self.monitor = Monitor.from_args(args)  # monitor / monitor_mode / min_delta: what best.pt, top-k and early stopping follow
        self.monitor_value: float | None = None  # the monitored metric's latest validated value
        self.best_fitness: float | None = None  # the best monitored value so far (fitness by default)
        self.improved = False
        self.lr: dict[str, float] = {}
        self.stop = False
        self.stop_cause: StopCause | None = None
        self.stop_reason = ""
        self.exception: BaseException | None = None
        self.validate_every_epoch = False  # set by the YOLOX stage switch: validate each epoch after the switch
        self.frozen: list[str] = []  # the modules freeze= froze (their parameters and BatchNorm statistics stay as loaded)
        self.model = self.ema = self.optimizer = self.criterion = None
        self.train_loader = self.test_loader = self.validator = None
        self.data: dict = {}
        self.resume_ckpt: dict | None = None
        self.save_dir: Path | None = None
        self.wdir: Path | None = None
        self._run_lock: RunLock | None = None  # rank 0's exclusive hold on save_dir while the run lasts
        self.num_batches = 0
        self.batch_instances = 0
        self.batch_size_px = args.imgsz
        self.setup_done = False
        self.completed_epoch = -1  # last epoch whose batches all ran (what a checkpoint's `epoch` means)
        self.best_epoch: int | None = None  # the epoch whose weights best.pt holds (recorded in every checkpoint)
        self._stepped = False  # an optimizer step since the last completed epoch: weights are no longer that epoch's
        self.batches_done = 0  # batches of the current epoch trained so far (a mid-epoch checkpoint's position)
        self.optimizer_steps = 0  # optimizer steps since the run began (save_steps counts these)
        self.save_step_due = False  # set after the batch whose optimizer step is a multiple of save_steps: the checkpoint callback writes last.pt
        self._mid_epoch: resume_state.MidEpoch | None = None  # on a mid-epoch resume: where the first epoch continues
        self._rank_rng: list | None = None  # under DDP: every rank's RNG states, gathered on rank 0 just before a checkpoint
        self._signal_agreed = False  # every rank knows of the signal and stopped at the same batch: a save there is exact
        self._loop_done = False  # every epoch ran: last.pt is final, an error or signal after this must not overwrite it
        self._data_fingerprint: dict | None = None
        self._signal: int | None = None
        self._nonfinite_in_a_row = 0
        self._t0 = time.time()
        self.rank = distributed.rank()
        self._owns_process_group = False  # whether _setup_distributed created the process group
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.device = torch.device("cpu")
        self.epoch_time: float | None = None  # seconds the last epoch took (set before on_fit_epoch_end)
        self.epoch_time_start: float | None = None

    # --- small helpers ------------------------------------------------------------------
    @property
    def is_main(self) -> bool:
        return self.rank in (-1, 0)

    @property
    def validated_this_epoch(self) -> bool:
        """Whether trainer.metrics come from this epoch's validation (val_period and val=False skip some epochs)."""
        return self.metrics_epoch is not None and self.metrics_epoch == self.epoch

    @property
    def elapsed(self) -> float:
        return time.time() - self._t0

    def run_callbacks(self, event: str) -> None:
        self._time_epoch(event)
        self.callbacks.run(event, self)

    def request_stop(self, cause: StopCause, reason: str) -> None:
        """End the run at the next batch or epoch boundary on every rank; the first cause given is kept."""
        if not self.stop or self.stop_cause is None:
            self.stop, self.stop_cause, self.stop_reason = True, StopCause(cause), reason

    # --- what Ultralytics' trainer exposes to callbacks and integrations -------------------
    def add_callback(self, event: str, fn, on_error: str = "raise") -> None:
        """Register `fn(trainer)` on `event` (Ultralytics' trainer.add_callback); it runs from the event's next firing."""
        self.callbacks.add_callback(event, fn, on_error=on_error)

    @property
    def last(self) -> Path | None:
        """<run folder>/weights/last.pt (a Path, known once the run folder exists)."""
        return self.wdir / "last.pt" if self.wdir else None

    @property
    def best(self) -> Path | None:
        """<run folder>/weights/best.pt (a Path, known once the run folder exists)."""
        return self.wdir / "best.pt" if self.wdir else None

    @property
    def batch_size(self) -> int:
        """Images per batch in this process (the batch= setting)."""
        return self.args.batch

    @property
    def plots(self) -> dict[Path, dict]:
        """Plot images written in the run folder so far: path -> {"data": None, "timestamp": modification time}."""
        if not self.save_dir or not Path(self.save_dir).is_dir():
            return {}
        files = sorted(p for p in Path(self.save_dir).iterdir() if p.suffix in (".png", ".jpg") and p.is_file())
        return {p: {"data": None, "timestamp": p.stat().st_mtime} for p in files}

    def _time_epoch(self, event: str) -> None:
        """epoch_time (s): from on_train_epoch_start to on_fit_epoch_end, training, validation and saving included."""
        if event == "on_train_epoch_start":
            self.epoch_time_start = time.time()
        elif event == "on_fit_epoch_end" and self.epoch_time_start is not None:
            self.epoch_time = time.time() - self.epoch_time_start

    def label_loss_items(self, items=None, prefix: str = "train") -> dict[str, float]:
        if items is None:
            return {f"{prefix}/{name}": 0.0 for name in self.loss_names}
        return {f"{prefix}/{name}": round(float(v), 5) for name, v in zip(self.loss_names, items, strict=True)}

    # --- the run ------------------------------------------------------------------------
    def train(self) -> dict:
        """Run the whole training; teardown always fires; errors re-raise after last.pt and on_exception."""
        previous_handlers = self._install_signal_handlers()
        previous_state = save_process_state(LOGGER)
        try:
            self._setup()
            self.run_callbacks("on_train_start")
            for epoch in range(self.start_epoch, self.epochs):
                self.epoch = epoch
                self._train_epoch()
                self._raise_on_signal()
                self.completed_epoch, self._stepped = epoch, False
                self._validate_and_save()
                self.run_callbacks("on_fit_epoch_end")
                if self._agree_to_stop():
                    self._raise_on_signal()
                    LOGGER.info(f"stopping after epoch {epoch + 1}: {self.stop_reason or 'trainer.stop was set'}")
                    break
                if epoch + 1 < self.epochs:
                    self.run_callbacks("on_params_update")  # the LR schedule callback set the next epoch's LR in on_model_save
            self._loop_done = True
            self._final_validation()
            self._agree_to_stop()
            self._raise_on_signal()  # a SIGINT/SIGTERM during the final validation still exits 130 / 143
            self.run_callbacks("on_train_end")
            self._raise_on_signal()  # ... and so does one during on_train_end
            self._log_callback_stats()
            return self.metrics
        except BaseException as error:
            self.exception = error
            self._save_on_error()
            try:
                self.run_callbacks("on_exception")
            except Exception as callback_error:  # the original error is what the user must see, not the handler's
                LOGGER.error(f"ERROR on_exception failed ({callback_error}); re-raising the original error: {type(error).__name__}: {error}")
            raise
        finally:
            self._restore_signal_handlers(previous_handlers)
            self.run_callbacks("teardown")
            close_loaders(self.train_loader, self.test_loader)
            self._teardown_distributed(clean_exit=self.exception is None)
            restore_process_state(previous_state, LOGGER)
            if self._run_lock is not None:
                self._run_lock.release()

    # --- setup ----------------------------------------------------------------------------
    def _setup(self) -> None:
        from yolo_cb.engine.backend import select_device

        args = self.args
        self._setup_distributed()
        if self.world_size == 1:
            self.device = select_device(args.device)
        resume_state.agree_on_checkpoint(self)  # under DDP: every rank on rank 0's checkpoint
        self._make_save_dir()
        self.run_callbacks("on_pretrain_routine_start")
        self._seed(args.seed + max(self.rank, 0), args.deterministic)
        from yolo_cb.data.resolve import check_data

        if self.rank > 0:
            distributed.barrier()  # let rank 0 download or generate the dataset first
        self.data = check_data(args.data or "shapes.yaml", args.datasets_dir)
        if self.rank == 0:
            distributed.barrier()
        self._build_model()
        self._build_loaders()
        self._build_optimizer()
        self.ema = ModelEMA(self.model) if self.is_main else None
        if self.resume_ckpt is not None:
            resume_state.load_state(self, self.resume_ckpt)
        self._wrap_distributed()
        from yolo_cb.engine.validator import Validator

        self.validator = Validator(args, save_dir=self.save_dir, callbacks=self.callbacks, dataloader=self.test_loader)
        self.validator.trainer = self  # validator events reach the trainer (and its epoch) during training
        if self.metrics_epoch is None and not self.metrics:
            names = ("precision(B)", "recall(B)", "mAP50(B)", "mAP50-95(B)")
            keys = [f"metrics/{n}" for n in names] + ["fitness"] + [f"val/{n}" for n in self.loss_names]
            self.metrics = dict.fromkeys(keys, float("nan"))  # a callback reading a metric before the first validation gets NaN
            self.monitor.value(self.metrics)  # monitor= names a metric of this run, or the run stops here, before any epoch
        self.setup_done = True
        if args.verbose and self.is_main:
            LOGGER.info("callbacks (event, group, on_error, callback):\n" + self.callbacks.table())
        self.run_callbacks("on_pretrain_routine_end")

    def _setup_distributed(self) -> None:
        if "LOCAL_RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            self.rank, self.world_size = -1, 1
            return
        local_rank = int(os.environ["LOCAL_RANK"])
        use_cuda = torch.cuda.is_available() and str(self.args.device or "").lower() != "cpu"
        if use_cuda:
            torch.cuda.set_device(local_rank)
            self.device = torch.device("cuda", local_rank)
        if not torch.distributed.is_initialized():
            distributed.init_process_group("nccl" if use_cuda else "gloo")
            self._owns_process_group = True  # we created it, so we destroy it; a caller's group is left to the caller
        self.rank, self.world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        if self.rank > 0:
            LOGGER.setLevel(logging.WARNING)  # one rank speaks; the others only warn

    def _teardown_distributed(self, clean_exit: bool) -> None:
        """Leave DDP so that no rank exits while another still talks to it, and destroy the group exactly once.

        DDP's reducer holds a reference to the process group: destroy_process_group() alone only unregisters
        it, and the group's threads were then torn down at interpreter exit, racing the other rank's exit
        (gloo: "terminate called without an active exception", SIGABRT). So: every rank passes a final
        barrier (after a clean run only: after an error the ranks are no longer in step), the DDP wrapper
        is dropped and collected, then the group is destroyed by whoever created it.
        """
        if not distributed.is_distributed():
            return
        if clean_exit:
            distributed.barrier()
        self.model = unwrap(self.model)
        gc.collect()
        if self._owns_process_group:
            torch.distributed.destroy_process_group()
            self._owns_process_group = False

    @property
    def _flag_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def _make_save_dir(self) -> None:
        self._record_data_path()
        folder, refusal = self.save_dir, None
        if self.is_main:
            try:
                folder = folder or (resume.run_folder(self.args, self.resume_ckpt) if self.resume_ckpt is not None else run_dir(self.args, "train"))
                self._run_lock = lock_run_folder(folder)  # one run per folder: a second one is refused before writing
            except RunFolderInUse as error:
                refusal = str(error)
        folder, refusal = distributed.broadcast_object((str(folder) if folder else None, refusal))
        if refusal:
            raise RunFolderInUse(refusal)
        self.save_dir = Path(folder)
        self.wdir = self.save_dir / "weights"
        if self.is_main:
            self.wdir.mkdir(parents=True, exist_ok=True)
            remove_stale_temp_files(self.save_dir, self.wdir)
            save_config(self.args, self.save_dir / "args.yaml")
            if self.resume_ckpt is not None:
                resume_state.restore_best(self.resume_ckpt, self.args.resume, self.wdir / "best.pt")

    def _record_data_path(self) -> None:
        """Record the data YAML as an absolute path (args.yaml, checkpoints): a resume from any folder finds the same one."""
        from yolo_cb.paths import find_dataset_cfg

        try:
            self.args.data = str(find_dataset_cfg(str(self.args.data or "shapes.yaml")).resolve())
        except (FileNotFoundError, OSError):
            pass  # check_data reports it, with every place it looked

    def _seed(self, seed: int, deterministic: bool) -> None:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
        if deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False
            os.environ.setdefault(CUBLAS_ENV, ":4096:8")

    def _build_model(self) -> None:
        from yolo_cb.nn import build_model
        from yolo_cb.weights import resolve_weights

        nc, names = int(self.data["nc"]), self.data["names"]
        source = resolve_weights(self.model_source, self.args.weights_dir)  # official weights by name (yolox-s.pt): the verified file
        init_ckpt = None
        if self.resume_ckpt is not None:
            cfg = self.resume_ckpt["model_cfg"]
        elif isinstance(source, (str, Path)) and str(source).endswith((".pt", ".pth")):  # .pth: Megvii's files too
            init_ckpt = load_checkpoint(source)
            cfg = init_ckpt["model_cfg"]
        else:
            cfg = source
        model = build_model(cfg, nc=nc, verbose=self.is_main, imgsz=self.args.imgsz)
        if self.args.pretrained and not isinstance(self.args.pretrained, bool):
            init_ckpt = load_checkpoint(resolve_weights(self.args.pretrained, self.args.weights_dir))
        if init_ckpt is not None:
            self._load_matching_weights(model, init_ckpt)
        model.names = dict(names)
        self.model_cfg = dict(model.cfg)
        self.model = model.to(self.device)
        if self.args.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.frozen = freeze_layers(unwrap(self.model), self.args.freeze)  # before the optimizer: frozen tensors get no group
        # the loss is built from the loss settings (each family's reads those in its reads_settings; L1 starts off)
        self.criterion = unwrap(self.model).build_loss({key: getattr(self.args, key) for key in LOSS_SETTINGS})
        self.loss_names = tuple(f"{name}_loss" for name in self.criterion.loss_names)
        refuse_unread_loss_settings(self.args, self.criterion)

    @staticmethod
    def _load_matching_weights(model: torch.nn.Module, ckpt: dict) -> int:
        """Copy every tensor whose key and shape match; another class count re-initialises the class head (fresh weights,
        YOLOX's prior bias). Returns the number of tensors transferred."""
        from yolo_cb.nn.yolox.head import PRIOR_PROB

        source = ckpt.get("ema") or ckpt["model"]
        own = model.state_dict()
        matching = {k: v for k, v in source.items() if k in own and own[k].shape == v.shape}
        model.load_state_dict(matching, strict=False)
        fresh = [conv for i, conv in enumerate(getattr(getattr(model, "head", None), "cls_preds", None) or [])
                 if f"head.cls_preds.{i}.weight" in source and f"head.cls_preds.{i}.weight" not in matching]
        with torch.no_grad():
            for conv in fresh:  # fresh weights from the build; YOLOX's prior bias set here, whatever the head's own init
                conv.bias.fill_(-math.log((1 - PRIOR_PROB) / PRIOR_PROB))
        classes = f"; class head re-initialised for {int(getattr(model, 'nc', 0))} classes (checkpoint: {len(ckpt.get('names') or {})}) " \
                  f"with prior probability {PRIOR_PROB}" if fresh else ""
        LOGGER.info(f"transferred {len(matching)}/{len(own)} tensors from the initial checkpoint{classes}")
        return len(matching)

    def _build_loaders(self) -> None:
        from yolo_cb.data.loader import build_dataloader, build_yolo_dataset

        args, names, stride = self.args, self.data["names"], 32
        if self.rank > 0:
            distributed.barrier()  # rank 0 verifies the labels and writes the caches first; the others read them
        train_set = build_yolo_dataset(args, self.data["train"], "train", names, stride=stride, batch=args.batch, write_caches=self.is_main)
        if self.rank == 0:
            distributed.barrier()
        self.train_loader = build_dataloader(train_set, args.batch, args.workers, shuffle=True, rank=self.rank, seed=args.seed)
        self.num_batches = len(self.train_loader)
        if self.is_main:
            split = self.data.get(args.split if args.split != "train" else "val") or self.data.get("val")
            val_set = build_yolo_dataset(args, split, "val", names, stride=stride, batch=args.batch * 2)
            self.test_loader = build_dataloader(val_set, args.batch * 2, args.workers, shuffle=False, rank=-1, seed=args.seed)

    def _build_optimizer(self) -> None:
        args = self.args
        self.global_batch = args.batch * self.world_size  # `batch` is per process under DDP
        self.accumulate = max(round(args.nbs / self.global_batch), 1)
        weight_decay = args.weight_decay * self.global_batch * self.accumulate / args.nbs
        iterations = math.ceil(len(self.train_loader.dataset) / max(args.batch, args.nbs)) * self.epochs
        name, lr, momentum = resolve_optimizer(args.optimizer, args.lr0, args.momentum, iterations)
        self.optimizer_name, self.momentum = name, momentum
        self.optimizer = build_optimizer(self.model, name, lr, momentum, weight_decay)
        self.warmup_iters = max(round(args.warmup_epochs * self.num_batches), 100) if args.warmup_epochs > 0 else -1
        # Adam-family optimizers diverge with SGD's large warmup bias lr: never start the bias above lr
        self.warmup_bias_lr = args.warmup_bias_lr if name == "SGD" else min(args.warmup_bias_lr, lr)
        use_amp = bool(args.amp) and self.device.type == "cuda"
        self.amp_dtype = torch.bfloat16 if use_amp and torch.cuda.is_bf16_supported() else torch.float16
        self.use_amp = use_amp
        self.scaler = torch.amp.GradScaler("cuda", enabled=use_amp and self.amp_dtype == torch.float16)
        self.last_opt_step = -1

    def _wrap_distributed(self) -> None:
        if self.world_size <= 1:
            return
        from torch.nn.parallel import DistributedDataParallel

        if self.args.sync_bn and self.device.type == "cuda":
            self.model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(self.model)
        elif self.args.sync_bn:
            LOGGER.warning("WARNING sync_bn=True needs CUDA (PyTorch's SyncBatchNorm runs on GPUs only); plain BatchNorm is used on CPU")
        ids = [self.device.index] if self.device.type == "cuda" else None
        self.model = DistributedDataParallel(self.model, device_ids=ids, find_unused_parameters=False)

    # --- epoch / batch ------------------------------------------------------------------
    def _train_epoch(self) -> None:
        self.model.train()
        freeze_bn_stats(unwrap(self.model), self.frozen)  # frozen layers' BatchNorm keeps its running statistics
        self.run_callbacks("on_train_epoch_start")  # the stage switch may close mosaic here, before the iterator exists
        self.train_loader.set_epoch(self.epoch)
        self.optimizer.zero_grad(set_to_none=True)
        self.tloss = None
        skip = resume_state.continue_epoch(self)  # a mid-epoch resume: the batches already trained are skipped
        self.batches_done = skip
        for batch_i, batch in enumerate(self.train_loader, start=skip):
            self.batch_i, self.batch = batch_i, batch
            steps = self.optimizer_steps
            self._train_batch()
            self.batches_done = batch_i + 1
            n = self.args.save_steps
            self.save_step_due = bool(n) and self.optimizer_steps > steps and self.optimizer_steps % n == 0 and self.batches_done < self.num_batches
            if self.save_step_due:
                self._gather_rank_rng()
            self.run_callbacks("on_train_batch_end")
            self.save_step_due = False
            if self.args.time and self.elapsed > self.args.time * 3600 and not self.stop:
                self.request_stop(StopCause.TIME_LIMIT, f"time limit of {self.args.time} h reached")
            if self._agree_to_stop():
                break
        self.lr = {f"lr/pg{i}": group["lr"] for i, group in enumerate(self.optimizer.param_groups)}
        self.run_callbacks("on_train_epoch_end")

    def _train_batch(self) -> None:
        self.run_callbacks("on_train_batch_start")
        ni = self.batch_i + self.num_batches * self.epoch
        self._warmup_accumulate(ni)
        images = self.batch["img"].to(self.device, non_blocking=True).float() / 255
        if self.args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        targets = self.batch["targets"].to(self.device)
        self.batch_instances, self.batch_size_px = int(targets.shape[0]), int(images.shape[-1])
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.use_amp):
            loss_dict = self.model(images, targets)
        self.loss = loss_dict["total"]
        self.loss_items = torch.stack([loss_dict[name] for name in self.criterion.loss_names]).detach().float().cpu()
        self.run_callbacks("on_train_batch_loss_end")
        if distributed.any_rank(not torch.isfinite(self.loss).item(), self._flag_device):
            self._skip_nonfinite()
            return
        self._nonfinite_in_a_row = 0
        self.tloss = self.loss_items if self.tloss is None else (self.tloss * self.batch_i + self.loss_items) / (self.batch_i + 1)
        # scaling by batch/nbs makes the accumulated gradient a mean over the nominal batch
        # DDP averages gradients over ranks; * world_size makes that a sum over the global batch
        self.scaler.scale(self.loss * self.global_batch / self.args.nbs).backward()
        self.run_callbacks("on_after_backward")
        if ni - self.last_opt_step >= self.accumulate:
            self._optimizer_step()
            self.last_opt_step = ni

    def _agree_to_stop(self) -> bool:
        """Combine trainer.stop and any received signal over all ranks (one all-reduce), so every rank stops together."""
        stop, signum = distributed.max_over_ranks([self.stop, self._signal or 0], self._flag_device)
        self._signal_agreed = self._signal_agreed or bool(signum)
        if signum and self._signal is None:
            self._signal = signum
            self.stop_cause = self.stop_cause or StopCause.SIGNAL
            self.stop_reason = self.stop_reason or f"{signal.Signals(signum).name} received on another rank"
        if stop and not self.stop:
            self.stop = True
            self.stop_reason = self.stop_reason or "trainer.stop was set on another rank"
        if stop and self.stop_cause is None:
            self.stop_cause = StopCause.CALLBACK
        return bool(stop)

    def _skip_nonfinite(self) -> None:
        self._nonfinite_in_a_row += 1
        LOGGER.warning(f"WARNING non-finite loss {self.loss.item()} at epoch {self.epoch + 1} batch {self.batch_i}: step skipped "
                       f"({self._nonfinite_in_a_row}/{MAX_NONFINITE_IN_A_ROW} in a row)")
        self.optimizer.zero_grad(set_to_none=True)
        if self._nonfinite_in_a_row >= MAX_NONFINITE_IN_A_ROW:
            raise NonFiniteLossError(f"the loss was NaN/inf for {self._nonfinite_in_a_row} batches in a row (epoch {self.epoch + 1}, "
                                     f"batch {self.batch_i}); last.pt holds the weights before. Try a lower lr0, amp=False or check the labels.")

    def _optimizer_step(self) -> None:
        self.scaler.unscale_(self.optimizer)
        self.run_callbacks("on_before_optimizer_step")  # unscaled, accumulated gradients; before clipping
        if self.args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=self.args.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self._stepped = True
        self.optimizer_steps += 1
        self.run_callbacks("optimizer_step")
        self.run_callbacks("on_before_zero_grad")
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update(self.model)

    def _warmup_accumulate(self, ni: int) -> None:
        """During warmup, accumulate from 1 batch up to the nominal batch. The LR and momentum are the lr_schedule callback's."""
        if ni > self.warmup_iters:
            return
        self.accumulate = max(1, int(np.interp(ni, [0, self.warmup_iters], [1, self.args.nbs / self.global_batch]).round()))

    # --- validation and saving ------------------------------------------------------------
    def _should_validate(self) -> bool:
        final = self.epoch + 1 == self.epochs
        periodic = self.args.val and (self.epoch + 1) % self.args.val_period == 0
        return final or periodic or self.stop or (self.args.val and self.validate_every_epoch)

    def _validate_and_save(self) -> None:
        self.improved = False
        if self._should_validate():
            metrics = self.validator(trainer=self) if self.is_main else None
            metrics = distributed.broadcast_object(metrics)
            self.metrics, self.metrics_epoch = dict(metrics), self.epoch
            self.fitness = float(self.metrics.get("fitness", 0.0))
            self.monitor_value = self.monitor.value(self.metrics)
            if self.monitor.improved(self.monitor_value, self.best_fitness):
                self.best_fitness, self.improved = self.monitor_value, True
        elif self.best_fitness is None:
            self.improved = True  # nothing validated yet: best.pt follows last.pt
        if self.improved:
            self.best_epoch = self.epoch
        self._gather_rank_rng()
        self.run_callbacks("on_model_save")

    def checkpoint_dict(self, epoch: int | None = None, batches_done: int | None = None) -> dict:
        """The plain-data checkpoint (see DESIGN.md): loadable with torch.load(weights_only=True).

        `epoch` is the last completed epoch; mid-epoch (a save_steps or signal save) `epoch_batches` says how many batches
        of the next one are trained, with what resuming there needs: that epoch's mean losses, accumulated gradients, and
        every rank's RNG states under DDP (gathered on rank 0 just before)."""
        from yolo_cb.version import __version__

        model = unwrap(self.model)
        epoch = self.completed_epoch if epoch is None else epoch
        batches_done = (self.batches_done if self.completed_epoch < self.epoch else 0) if batches_done is None else batches_done
        return {
            "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "ema": {k: v.detach().clone() for k, v in self.ema.ema.state_dict().items()} if self.ema else None,
            "ema_updates": self.ema.updates if self.ema else 0,
            "last_opt_step": self.last_opt_step,
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
            "epoch": epoch,
            "epochs": self.epochs,
            "best_fitness": self.best_fitness,
            "best_epoch": self.best_epoch,
            # these weights are best.pt's (written just before it): on resume they restore a best.pt a kill left behind
            "last_is_best": self.best_epoch is not None and self.best_epoch == epoch and not self._stepped,
            "finished": False,  # set when the run ends (strip_optimizer): a finished run is not resumed
            "save_dir": str(Path(self.save_dir).resolve()) if self.save_dir else None,  # resume verifies it
            "data_fingerprint": self.data_fingerprint(),
            "fitness": self.fitness,
            "train_args": self.args.as_dict(),
            "model_cfg": dict(self.model_cfg),
            "names": {int(k): str(v) for k, v in self.data["names"].items()},
            "callbacks": self.callbacks.state_dict(),
            "rng": rng_states(),
            "rank_rng": self._rank_rng if self.world_size > 1 else None,
            "epoch_batches": batches_done,
            "world_size": self.world_size,
            "optimizer_steps": self.optimizer_steps,
            "tloss": self.tloss.tolist() if batches_done and self.tloss is not None else None,
            "grads": resume_state.partial_grads(self.model) if batches_done else None,
            "use_l1": isinstance(self.criterion, YOLOXLoss) and self.criterion.use_l1,
            "metrics": {k: float(v) for k, v in self.metrics.items()},
            "metrics_epoch": self.metrics_epoch,
            "monitor_value": self.monitor_value,
            "version": __version__,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }

    def data_fingerprint(self) -> dict | None:
        """The dataset's identity stored in checkpoints (data YAML, image counts, names); resume refuses another one."""
        if self._data_fingerprint is None and self.data:
            self._data_fingerprint = resume.dataset_fingerprint(self.data)
        return self._data_fingerprint

    def _save_on_error(self) -> None:
        """On an exception or signal: save last.pt with the current weights (epoch = last completed one).

        After a signal every rank agreed on, the loop stopped after a whole batch: the save records that batch, and a resume
        continues exactly there. Under DDP nothing else is saved: after a failure (a rank killed, a collective broken) the
        ranks are no longer in step, so last.pt keeps the last checkpoint they all reached."""
        if not (self.setup_done and self.is_main and self.args.save) or self._loop_done:
            return  # after the last epoch, last.pt is already the final checkpoint
        if self.world_size > 1 and not self._signal_agreed:
            LOGGER.warning(f"WARNING not saving last.pt after {type(self.exception).__name__}: the ranks are no longer in step; "
                           f"it keeps the last checkpoint every rank reached")
            return
        batches = self.batches_done if self._signal_agreed and self.completed_epoch < self.epoch else 0
        try:
            save_checkpoint(self.checkpoint_dict(epoch=self.completed_epoch, batches_done=batches), self.wdir / "last.pt")
            LOGGER.info(f"saved {self.wdir / 'last.pt'} (resume with: yolo-cb train resume={self.wdir / 'last.pt'})")
        except Exception as error:  # the original error matters more than this one
            LOGGER.error(f"ERROR could not save last.pt after the failure: {error}")

    def _final_validation(self) -> None:
        """Validate best.pt on rank 0 (firing on_val_*), strip the optimizer from finished checkpoints, share the metrics."""
        if self.is_main:
            self._validate_best()
        self.metrics = distributed.broadcast_object(self.metrics)

    def _validate_best(self) -> None:
        best, last = self.wdir / "best.pt", self.wdir / "last.pt"
        finished = self.completed_epoch + 1 >= self.epochs or (self.stop_cause is not None and self.stop_cause.finishes_run)
        if finished:
            for path in (last, best):
                if path.is_file():
                    strip_optimizer(path, finished=True)
        if best.is_file() and self.args.val:
            from yolo_cb.engine.checkpoint import model_from_checkpoint

            LOGGER.info(f"validating {best}")
            self.validator.plot = True
            model = model_from_checkpoint(best).to(self.device)
            self.metrics, self.metrics_epoch = dict(self.validator(model=model)), self.best_epoch  # best.pt's epoch
            self.validator.plot = False

    def _gather_rank_rng(self) -> None:
        """Under DDP: every rank's RNG states to rank 0, for the checkpoint about to be written (a collective: all ranks call it)."""
        if self.world_size > 1:
            self._rank_rng = distributed.gather_object(rng_states())

    # --- signals and summaries ------------------------------------------------------------
    def _install_signal_handlers(self) -> dict:
        if not threading_main():  # signal handlers can only be installed from the main thread
            return {}
        previous = {}

        def handler(signum, frame):
            if self._signal is not None:  # a second signal: stop now
                raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(SIGNAL_EXIT[signum])
            self._signal = signum
            self.request_stop(StopCause.SIGNAL, f"{signal.Signals(signum).name} received")
            LOGGER.warning(f"{signal.Signals(signum).name} received: stopping at the end of this batch and saving last.pt (again to abort now)")

        for sig in SIGNAL_EXIT:
            previous[sig] = signal.signal(sig, handler)
        return previous

    def _raise_on_signal(self) -> None:
        """After a SIGINT/SIGTERM/SIGUSR1: leave the loop as an interrupt (exit 130 / 143 / 138 on the CLI)."""
        if self._signal is not None and self._signal_agreed and not self._loop_done:
            self._gather_rank_rng()  # every rank is here (they agreed to stop at the same batch): the save that follows is exact
        if self._signal is not None:
            raise KeyboardInterrupt if self._signal == signal.SIGINT else SystemExit(SIGNAL_EXIT[self._signal])

    @staticmethod
    def _restore_signal_handlers(previous: dict) -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    def _log_callback_stats(self, top: int = 5) -> None:
        if not self.is_main:
            return
        rows = [r for r in self.callbacks.stats() if r["calls"]][:top]
        if rows:
            LOGGER.info("slowest callbacks: " + "; ".join(f"{r['callback']} ({r['event']}) {r['total_s']:.2f}s/{r['calls']} calls" for r in rows))


LOSS_SETTINGS = ("box", "iou_type")  # settings that configure a loss; a criterion lists those it takes in `reads_settings`


def refuse_unread_loss_settings(args: Config, criterion) -> None:
    """A loss setting the model's criterion does not take (YOLOCB: CIoU + DFL, fixed gains) must stay at its default."""
    from yolo_cb.config import load_defaults
    from yolo_cb.errors import ConfigError

    defaults = load_defaults()
    for key in LOSS_SETTINGS:
        if key not in criterion.reads_settings and getattr(args, key) != defaults[key]:
            raise ConfigError(f"invalid value for '{key}': {getattr(args, key)!r}; it sets the YOLOX loss, and this model trains with "
                              f"{type(criterion).__name__} (CIoU + DFL with fixed gains): leave {key} at {defaults[key]!r} or train a "
                              f"yolox-* model")


def remove_stale_temp_files(*folders: Path) -> None:
    """Delete the temp files of atomic writes (.last.pt.<random>.tmp, ...) that a killed run left in its folders."""
    removed = []
    for folder in folders:
        for path in Path(folder).glob(".*.tmp"):
            if STALE_TEMP.match(path.name) and path.is_file():
                path.unlink(missing_ok=True)
                removed.append(path.name)
    if removed:
        LOGGER.info(f"removed {len(removed)} temp file(s) left by an interrupted write: {', '.join(sorted(removed))}")


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
