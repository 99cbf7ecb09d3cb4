"""Self-launched DDP: `model.train(nproc=2)` / `yolo-cb train device=0,1` start one worker process per rank.

The parent serialises the settings and the user's callbacks — closures and lambdas included — with
cloudpickle into a payload file; each worker (`python -m yolo_cb.training.launch PAYLOAD`) restores them,
so callbacks added in Python run on every rank instead of being lost. torchrun users skip this
module: `torchrun --nproc_per_node N -m yolo_cb train ...` sets the environment itself.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from yolo_cb.evaluation.val_metrics import DetectionMetrics
from yolo_cb.training.plan import RunPlan, plan_worker
from yolo_cb.training.signals import SIGNAL_EXIT
from yolo_cb.utils.log import LOGGER


def _signal_exits() -> dict:
    """{signal: a worker's exit code after it} for the signals passed on to the workers (training/signals.py)."""

    return SIGNAL_EXIT


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_list(device) -> list[str]:
    """The GPU indices a device setting names ('0,1', 'cuda:1', 1) as strings; [] for cpu, mps or none named."""
    entries = [d.strip().lower().removeprefix("cuda:") for d in str(device if device is not None else "").split(",") if d.strip()]
    return entries if entries and all(e.isdigit() for e in entries) else []


def _pickle_user_code_by_value(callbacks) -> None:
    """Callbacks from modules a worker may not import (a script, a test file) travel by value."""
    import cloudpickle

    for entry in callbacks.entries():
        fn = getattr(entry.fn, "__func__", entry.fn)
        module = sys.modules.get(getattr(fn, "__module__", None) or "")
        if module is None or module.__name__ == "__main__":
            continue
        path = getattr(module, "__file__", None) or ""
        if "site-packages" not in path and not module.__name__.startswith("yolo_cb"):
            try:
                cloudpickle.register_pickle_by_value(module)
            except ValueError:
                pass


def launch_ddp(plan: RunPlan, user_callbacks, timeout: float | None = None) -> tuple[DetectionMetrics, Path | None]:
    """Start the plan's `world_size` workers on this node, wait for them; (rank 0's final metrics, the weights its run
    ends on: Trainer.final_weights). Each worker plans its own run from the plan's settings (plan_worker)."""
    import cloudpickle

    args, world, model, resume = plan.args, plan.world_size, plan.start, plan.resume_path
    workdir = Path(tempfile.mkdtemp(prefix="yolo_cb_ddp_"))
    payload, result = workdir / "payload.pkl", workdir / "result.json"
    _pickle_user_code_by_value(user_callbacks)
    settings = args.as_dict()
    settings["nproc"] = 1  # the workers must not launch again
    payload.write_bytes(cloudpickle.dumps({"args": settings, "callbacks": user_callbacks, "model": model, "resume": str(resume) if resume else None,
                                           "result": str(result), "sys_path": list(sys.path), "cwd": os.getcwd()}))
    devices = gpu_list(args.device)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world),
           "LOCAL_WORLD_SIZE": str(world), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world)))}
    if devices:  # the GPUs named, renumbered 0.. for the workers (device=1 nproc=2: both ranks on GPU 1, not on 0 and 1)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    where = f"GPU(s) {','.join(devices)}" if devices else ("the CPU" if str(args.device).lower() == "cpu" else "the visible GPUs, else the CPU")
    LOGGER.info(f"DDP: starting {world} worker processes on {where} (nccl when each has a GPU of its own, else gloo)")
    procs = [subprocess.Popen([sys.executable, "-m", "yolo_cb.training.launch", str(payload)], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in range(world)]
    codes = _wait(procs, timeout)
    try:
        failed = [(r, c) for r, c in enumerate(codes) if c != 0]
        if failed:
            interrupted = [c for _, c in failed if c in _signal_exits().values()]
            if interrupted:
                raise KeyboardInterrupt if interrupted[0] == 130 else SystemExit(interrupted[0])
            raise RuntimeError(f"DDP training failed: worker exit codes {codes} (rank, code): {failed}; see the worker output above")
        values = json.loads(result.read_text())
        weights = values.pop("_weights")  # taken out first: the metrics are the validation's keys only
        return DetectionMetrics(values), Path(weights) if weights else None
    finally:
        payload.unlink(missing_ok=True)
        result.unlink(missing_ok=True)
        workdir.rmdir()


def _wait(procs: list[subprocess.Popen], timeout: float | None) -> list[int]:
    """Wait for every worker; forward SIGINT/SIGTERM/SIGUSR1; if one fails, stop the rest (they would hang in a collective)."""
    forwarded = {}

    def forward(signum, frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    for sig in _signal_exits():
        forwarded[sig] = signal.signal(sig, forward)
    deadline = time.time() + timeout if timeout else None
    try:
        while any(p.poll() is None for p in procs):
            bad = [p for p in procs if p.poll() not in (None, 0, *_signal_exits().values())]
            if bad or (deadline and time.time() > deadline):
                time.sleep(5)  # give the others a moment to fail on their own with a clearer message
                for p in procs:
                    if p.poll() is None:
                        p.terminate()
                break
            time.sleep(0.2)
        return [p.wait() for p in procs]
    finally:
        for sig, old in forwarded.items():
            signal.signal(sig, old)


def worker(payload_path: str) -> int:
    """One rank: restore settings and callbacks, train, rank 0 writes the final metrics."""
    import cloudpickle

    payload = cloudpickle.loads(Path(payload_path).read_bytes())
    for entry in reversed(payload["sys_path"]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    os.chdir(payload["cwd"])
    plan = plan_worker(payload["args"], payload["callbacks"], payload["model"], payload["resume"])
    rank = int(os.environ["RANK"])
    if rank != 0:
        import logging

        logging.getLogger("yolo_cb").setLevel(logging.WARNING)
    trainer = plan.trainer()  # the trainer finds (and verifies) the run folder of a resumed checkpoint
    try:
        metrics = trainer.train()
    except KeyboardInterrupt:
        return 130
    except SystemExit as exit_:
        return int(exit_.code or 0)
    if rank == 0:
        weights = trainer.final_weights()
        Path(payload["result"]).write_text(json.dumps({**metrics, "_weights": str(weights) if weights else ""}))
    return 0


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1]))
