"""`python -m yolo_cb.prediction.probe_child REQUEST`: the probe's child process (probe.py). It loads one model file
and runs one inference on a black image batch, under the bounds REQUEST gives, and writes one JSON line to stdout:
{"ok": true}, or what went wrong ({"error": class name, "message": ..., "memory": true when an allocation failed}).

Its runtime is imported first, then the bounds are set: an address-space limit (RLIMIT_AS) of what it has mapped plus
`bound` bytes, and an alarm of `seconds` (SIGALRM at its default ends the process even inside a C++ loop). It dies
with its parent (PR_SET_PDEATHSIG on Linux): a SIGTERM or kill -9 of predict never leaves it running.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from yolo_cb.errors import UserError
from yolo_cb.prediction.onnx_session import onnx_session, run_once

PR_SET_PDEATHSIG = 1  # <sys/prctl.h>
MEMORY_WORDS = ("alloc", "memory")  # in a runtime's message for a failed allocation (ONNX Runtime, PyTorch, OpenVINO)


def main(argv: list[str]) -> None:
    request = json.loads(argv[0])
    tie_to_parent(int(request["parent"]))
    report_fd = os.dup(1)
    os.dup2(2, 1)  # what a runtime prints goes to stderr; stdout carries the report alone
    try:
        run = runner(request["kind"])
        set_bounds(request["bound"], request["seconds"])
        run(Path(request["path"]), tuple(request["imgsz"]), request["threads"], bool(request.get("trust")))
        report: dict[str, Any] = {"ok": True}
    except BaseException as error:  # noqa: BLE001 - every failure is the report (an interrupt too: the parent decides)
        report = describe(error)
    os.write(report_fd, (json.dumps(report) + "\n").encode())
    os._exit(0 if report.get("ok") else 3)  # no teardown: a runtime's destructors are no part of the verdict


def tie_to_parent(parent: int) -> None:
    """Die with the parent (Linux); leave at once when it is already gone."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(4)


def runner(kind: str) -> Callable[[Path, tuple[int, int], int | None], None]:
    """The runtime imported, and the function that loads a file and runs it once: ONNX Runtime alone for ONNX (a fast
    start), the yolo-cb backend (with PyTorch) for the other formats, loading exactly as predict does."""
    if kind == "onnx":
        import onnxruntime  # noqa: F401 - imported before the bounds

        return run_onnx
    import torch

    from yolo_cb.prediction.backend import open_model_file  # here: it loads PyTorch, which an ONNX probe starts without

    def run_backend(path: Path, imgsz: tuple[int, int], threads: int | None, trust: bool = False) -> None:
        open_model_file(path, torch.device("cpu"), False, threads, trust).warmup(imgsz)  # trust: model_trust.py, before any load

    return run_backend


def run_onnx(path: Path, imgsz: tuple[int, int], threads: int | None, trust: bool = False) -> None:
    run_once(onnx_session(path, ["CPUExecutionProvider"], threads), imgsz)


def set_bounds(bound: int | None, seconds: float) -> None:
    if bound is not None:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = mapped_bytes() + int(bound)
        resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(max(int(seconds), 1))


def mapped_bytes() -> int:
    """The address space this process has mapped (VmSize)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def describe(error: BaseException) -> dict[str, Any]:
    """The report of a failure: its class, its first line, where it was raised, whether an allocation failed."""
    text = str(error).strip()
    frames = traceback.extract_tb(error.__traceback__)
    where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    user = isinstance(error, (UserError, FileNotFoundError))
    memory = not user and (isinstance(error, MemoryError) or any(word in text.lower() for word in MEMORY_WORDS))
    first = text.splitlines()[0][:300] if text else ""
    return {"ok": False, "error": type(error).__name__, "message": text if user else first + where, "memory": memory}


if __name__ == "__main__":
    main(sys.argv[1:])
