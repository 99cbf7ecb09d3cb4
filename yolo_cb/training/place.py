"""Where a training runs and writes: its device, rank and world size (joining and leaving DDP), and its run folder
(made, locked, cleared of a killed write's temp files, with args.yaml)."""

from __future__ import annotations

import gc
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from yolo_cb.checkpoints.checkpoint import Checkpoint
from yolo_cb.recipe.ema import unwrap
from yolo_cb.settings.config import save_config
from yolo_cb.training import resume, resume_state
from yolo_cb.utils import dist as distributed
from yolo_cb.utils.files import own_folder, run_dir
from yolo_cb.utils.log import LOGGER
from yolo_cb.utils.run_lock import RunFolderInUse, RunLock, lock_run_folder

STALE_TEMP = re.compile(r"^\..+\.[A-Za-z0-9_]+\.tmp$")  # atomic writes' temp files (.last.pt.<random>.tmp) a kill left behind


@dataclass
class Place:
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    rank: int = field(default_factory=distributed.rank)
    world_size: int = field(default_factory=lambda: int(os.environ.get("WORLD_SIZE", "1")))
    owns_process_group: bool = False  # whether join_distributed created the process group
    save_dir: Path | None = None
    wdir: Path | None = None
    run_lock: RunLock | None = None  # rank 0's exclusive hold on save_dir while the run lasts

    @property
    def flag_device(self) -> torch.device:
        """Where the small all-reduced flags live (the GPU under NCCL, else the CPU)."""
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def join_distributed(self, device_setting) -> None:
        if "LOCAL_RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            self.rank, self.world_size = -1, 1
            return
        local_rank = int(os.environ["LOCAL_RANK"])
        use_cuda = torch.cuda.is_available() and str(device_setting or "").lower() != "cpu"
        gpus = torch.cuda.device_count() if use_cuda else 0
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
        if use_cuda:
            torch.cuda.set_device(rank_gpu(local_rank, gpus))
            self.device = torch.device("cuda", rank_gpu(local_rank, gpus))
        if not torch.distributed.is_initialized():
            backend = ddp_backend(use_cuda, local_world, gpus)
            if use_cuda and backend == "gloo" and local_rank == 0:
                LOGGER.warning(f"WARNING {local_world} processes share {gpus} GPU(s): gloo on the GPU (NCCL refuses two ranks on one GPU)")
            distributed.init_process_group(backend)
            self.owns_process_group = True  # we created it, so we destroy it; a caller's group is left to the caller
        self.rank, self.world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        if self.rank > 0:
            LOGGER.setLevel(logging.WARNING)  # one rank speaks; the others only warn

    def leave_distributed(self, parts: Any, clean_exit: bool) -> None:
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
        parts.model = unwrap(parts.model)
        gc.collect()
        if self.owns_process_group:
            torch.distributed.destroy_process_group()
            self.owns_process_group = False

    def release(self) -> None:
        if self.run_lock is not None:
            self.run_lock.release()


def rank_gpu(local_rank: int, gpus: int) -> int:
    """The visible GPU of a local rank: its own while there are enough, else shared round-robin (nproc=2 on one GPU)."""
    return local_rank % max(gpus, 1)


def ddp_backend(use_cuda: bool, local_world: int, gpus: int) -> str:
    """nccl when every local rank has a GPU of its own; gloo on the CPU, and when ranks share a GPU."""
    return "nccl" if use_cuda and local_world <= gpus else "gloo"


def make_save_dir(place: Place, args: Any, ckpt: Checkpoint | None) -> None:
    """The run folder, on rank 0 made and locked (a second run there is refused), shared with every rank; `ckpt`: the
    checkpoint a resume continues (its run folder, verified)."""
    folder, refusal = place.save_dir, None
    is_main = place.rank in (-1, 0)
    if is_main:
        try:
            folder = folder or (resume.run_folder(args, ckpt) if ckpt is not None else run_dir(args, "train"))
            place.run_lock = lock_run_folder(folder)  # one run per folder: a second one is refused before writing
        except RunFolderInUse as error:
            refusal = str(error)
    folder, refusal = distributed.broadcast_object((str(folder) if folder else None, refusal))
    if refusal:
        raise RunFolderInUse(refusal)
    place.save_dir = Path(folder)
    place.wdir = place.save_dir / "weights"
    if is_main:
        own_folder(place.save_dir, "weights")  # a link planted at weights/ is replaced by a real folder, never written through
        remove_stale_temp_files(place.save_dir, place.wdir)
        save_config(args, place.save_dir / "args.yaml")
        if ckpt is not None:
            resume_state.restore_best(ckpt, args.resume, place.wdir / "best.pt")


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
