"""Process-wide state a training changes (deterministic algorithms, cuDNN flags, CUBLAS_WORKSPACE_CONFIG, the yolo_cb
log level on non-zero ranks), saved before and put back after, so a run leaves the caller's process as it found it."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

CUBLAS_ENV = "CUBLAS_WORKSPACE_CONFIG"  # deterministic cuBLAS needs it set before the first CUDA matmul


@dataclass(frozen=True)
class ProcessState:
    deterministic: bool
    deterministic_warn_only: bool
    cudnn_deterministic: bool
    cudnn_benchmark: bool
    cublas_workspace: str | None
    log_level: int


def save_process_state(logger: logging.Logger) -> ProcessState:
    import torch

    return ProcessState(torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
                        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark, os.environ.get(CUBLAS_ENV), logger.level)


def restore_process_state(state: ProcessState, logger: logging.Logger) -> None:
    import torch

    now = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    if now != (state.deterministic, state.deterministic_warn_only):  # the setter imports torch._inductor (~2 s of CPU): only on a change
        torch.use_deterministic_algorithms(state.deterministic, warn_only=state.deterministic_warn_only)
    torch.backends.cudnn.deterministic = state.cudnn_deterministic
    torch.backends.cudnn.benchmark = state.cudnn_benchmark
    if state.cublas_workspace is None:
        os.environ.pop(CUBLAS_ENV, None)
    else:
        os.environ[CUBLAS_ENV] = state.cublas_workspace
    logger.setLevel(state.log_level)
