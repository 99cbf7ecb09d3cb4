"""torch.distributed helpers: who am I, and agreeing on a flag or a dict across ranks.

Each function imports torch itself: the callbacks that import this module are registered (and `yolo-cb callbacks`
lists them) without loading torch."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ.get("RANK", "-1"))


def world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def any_rank(flag: bool, device: torch.device | str = "cpu") -> bool:
    """True on every rank if `flag` is True on any rank (all-reduce MAX); the flag itself when not distributed."""
    if not is_distributed():
        return bool(flag)
    import torch
    import torch.distributed as dist

    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def max_over_ranks(values: list[int], device: torch.device | str = "cpu") -> list[int]:
    """Element-wise maximum of small integer flags over all ranks (one all-reduce); the values when not distributed."""
    if not is_distributed():
        return [int(v) for v in values]
    import torch
    import torch.distributed as dist

    t = torch.tensor([int(v) for v in values], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [int(v) for v in t.tolist()]


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s object on every rank."""
    if not is_distributed():
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_object(obj: Any, dst: int = 0) -> list[Any] | None:
    """Every rank's object, as a list indexed by rank, on rank `dst` (None elsewhere); [obj] when not distributed."""
    if not is_distributed():
        return [obj]
    import torch.distributed as dist

    gathered = [None] * dist.get_world_size() if dist.get_rank() == dst else None
    dist.gather_object(obj, gathered, dst=dst)
    return gathered


def init_process_group(backend: str) -> None:
    """Join the process group torchrun (or yolo-cb's launcher) describes in the environment.

    After a torchrun restart (TORCHELASTIC_RESTART_COUNT > 0) the workers get the same store as the attempt that
    failed, which still holds that attempt's keys: a rank could read a dead rank's address and fail to connect
    ("Connection refused"). Each attempt's keys therefore go under their own prefix."""
    import torch.distributed as dist

    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if attempt == "0":
        dist.init_process_group(backend)
        return
    store, rank_, world = next(dist.rendezvous("env://"))
    dist.init_process_group(backend, store=dist.PrefixStore(f"yolo_cb/attempt_{attempt}", store), rank=rank_, world_size=world)


def barrier() -> None:
    if is_distributed():
        import torch.distributed as dist

        dist.barrier()
