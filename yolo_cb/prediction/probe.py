"""A model file we did not write is loaded and run once in a separate process, bounded in memory and time, before this
process loads it (issue 59, section 4).

A few hundred bytes of ONNX (`ConstantOfShape` / `Expand` to [1, 60000, 60000]), ncnn (`Interp` to 30000 x 30000), MNN
(`broadcast_to`) or TorchScript (`torch.ones(60000, 60000)`, all allowed ops) took 3 GB within seconds, and an ONNX
`Loop` or a TorchScript `for` of 10^12 iterations hung predict. What a graph allocates and how long it runs is known
only when its runtime runs it, so the runtime runs it first where running out harms nothing: a child process
(probe_child.py) loads the file and runs one inference at the input size this process will use, under an address-space
limit (RLIMIT_AS) of half of what this process may still take (utils/memory.py) and PROBE_SECONDS. A file whose probe
does not finish is never loaded here: one line says what it needed (CheckpointError: exit status 2 on the CLI).

A verdict is kept for the process, by the file's size, mtime and SHA-256 and the input size, so a second predict of the
same file pays nothing. A probe costs one process start and one inference: for ONNX the child imports only ONNX Runtime
and numpy; the other formats load through the same backend as here (PyTorch's import, about 2 s of CPU).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from yolo_cb import errors
from yolo_cb.utils.memory import available_memory

PROBE_SECONDS = 120  # loading the file and one inference, in the child, after its imports
IMPORT_SECONDS = 120  # the child's start and imports (PyTorch's, on a busy machine) before PROBE_SECONDS begin
MEMORY_SHARE = 0.5  # of what this process may still take: the rest stays for this process's own load after the probe
PASSED_ERRORS = (*(c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.UserError)), FileNotFoundError)
RUNTIMES = {".onnx": "ONNX Runtime", ".torchscript": "PyTorch", ".ts": "PyTorch", ".jit": "PyTorch", ".mnn": "MNN",
            ".tflite": "LiteRT", ".pte": "ExecuTorch", ".xml": "OpenVINO", ".param": "ncnn"}
COMPANIONS = {".xml": ".bin", ".param": ".bin"}  # the weights file beside a graph file
FOLDER_FILES = (".xml", ".bin", ".param", ".json")  # what an OpenVINO or ncnn folder's model is made of

_verdicts: dict[tuple, tuple[type, str] | None] = {}


def probed(path: Path) -> bool:
    """Whether `path` is a model file (or an OpenVINO / ncnn folder) that a runtime runs: every model file but our .pt."""
    if path.is_dir():
        return any(path.glob("*.xml")) or any(path.glob("*.ncnn.param"))
    return path.is_file() and path.suffix.lower() in RUNTIMES


def check_model_file(path: Path, imgsz: Any = None, threads: int | None = None, trust: bool = False,
                     seconds: float = PROBE_SECONDS) -> None:
    """Return when `path` loads and runs one inference at `imgsz` within the bounds (or did before in this process); raise
    the one-line error otherwise: the loader's own (a file that is no model, a TorchScript file yolo-cb did not write and
    `trust` does not vouch for: refused in the child before anything in it is loaded), or CheckpointError naming the bound."""
    size = input_size(imgsz)
    key = (identity(path), size, trust)
    if key not in _verdicts:
        _verdicts[key] = run_probe(path, size, threads, seconds, trust)
    verdict = _verdicts[key]
    if verdict is not None:
        kind, message = verdict
        raise kind(message)


def input_size(imgsz: Any) -> tuple[int, int]:
    """(height, width) of the probe's image where the model does not fix it: predict's / val's imgsz, 640 when none."""
    if imgsz is None:
        return 640, 640
    if isinstance(imgsz, int):
        return imgsz, imgsz
    sizes = [int(v) for v in imgsz]
    return (sizes[0], sizes[-1]) if sizes else (640, 640)


def identity(path: Path) -> tuple:
    """The file (or folder's model files) by name, size, mtime and SHA-256: a file changed in place is probed again."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in FOLDER_FILES)
    else:
        companion = path.with_suffix(COMPANIONS.get(path.suffix.lower(), path.suffix))
        files = [path, *([companion] if companion != path and companion.is_file() else [])]
    return (str(path.resolve()), *(fingerprint(f) for f in files))


def fingerprint(file: Path) -> tuple[str, int, int, str]:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    stat = file.stat()
    return file.name, stat.st_size, stat.st_mtime_ns, digest.hexdigest()


def run_probe(path: Path, size: tuple[int, int], threads: int | None, seconds: float, trust: bool = False) -> tuple[type, str] | None:
    """The verdict of one probe in a child process: None (it passed), or (error class, one-line message)."""
    bound = memory_bound()
    request = {"path": str(path), "kind": "onnx" if path.suffix.lower() == ".onnx" else "backend", "imgsz": list(size),
               "threads": threads, "trust": trust, "bound": bound, "seconds": seconds, "parent": os.getpid()}
    command = [sys.executable, "-m", "yolo_cb.prediction.probe_child", json.dumps(request)]
    try:  # an interrupt (Ctrl-C, a handler's SystemExit) kills the child before it goes on (subprocess.run does)
        done = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              env=child_env(), timeout=seconds + IMPORT_SECONDS)
    except subprocess.TimeoutExpired:
        return errors.CheckpointError, refusal(path, size, f"it did not finish in {seconds:.0f} s")
    report = last_json_line(done.stdout)
    return verdict(path, size, bound, seconds, done.returncode, report)


def memory_bound() -> int | None:
    """Bytes of address space the child may add to what its runtime mapped: MEMORY_SHARE of this process's room."""
    room = available_memory()
    return int(room * MEMORY_SHARE) if room is not None else None


def child_env() -> dict[str, str]:
    """The child imports this same yolo_cb; one malloc arena per thread less (each reserves address space)."""
    package_root = str(Path(__file__).resolve().parents[2])  # the folder holding yolo_cb/
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX", "2")}


def last_json_line(output: bytes) -> dict | None:
    lines = output.decode(errors="replace").strip().splitlines()
    try:
        report = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


def verdict(path: Path, size: tuple[int, int], bound: int | None, seconds: float, code: int, report: dict | None) -> tuple[type, str] | None:
    runtime = runtime_name(path)
    if code == 0 and report and report.get("ok"):
        return None
    if report and report.get("error") in {c.__name__ for c in PASSED_ERRORS}:  # the loader's own one-line error
        return next(c for c in PASSED_ERRORS if c.__name__ == report["error"]), str(report.get("message", ""))
    if report and report.get("memory") and bound is not None:
        return errors.CheckpointError, refusal(path, size, f"it needs more than {gib(bound)} GiB of memory (half of what "
                                                           f"this process may take)")
    if report:
        return errors.CheckpointError, refusal(path, size, f"{runtime} failed on it: {report.get('error')}: {report.get('message')}")
    if code == -signal.SIGALRM:
        return errors.CheckpointError, refusal(path, size, f"it did not finish in {seconds:.0f} s")
    within = f" within {gib(bound)} GiB of memory" if bound is not None else ""
    if code == -signal.SIGKILL:  # not ours: the kernel's out-of-memory killer (a cgroup's limit), or a user's kill -9
        what = "was killed on it (SIGKILL: out of memory?)"
    else:
        what = f"crashed on it ({signal_name(-code)})" if code < 0 else f"ended with status {code} on it and no report"
    return errors.CheckpointError, refusal(path, size, f"{runtime} {what}{within}")


def refusal(path: Path, size: tuple[int, int], why: str) -> str:
    return (f"model={path}: not loaded: {why}, in a probe (a separate process loading it and running one inference at "
            f"{size[0]}x{size[1]} or the size the model fixes); a model file must pass one before it is loaded (docs/security.md)")


def runtime_name(path: Path) -> str:
    if path.is_dir():
        return "ncnn" if any(path.glob("*.ncnn.param")) else "OpenVINO"
    return RUNTIMES.get(path.suffix.lower(), "the runtime")


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def gib(size: int) -> str:
    return f"{size / 2**30:.1f}"
