"""The parts of benchmarks/gpu_check.py, each run as its own process: `python benchmarks/gpu_parts.py PART SPEC.json RESULT.json`.

Only the standard library is imported at the top: the `ultralytics` part runs under another interpreter (one with
Ultralytics installed, which need not have yolo-cb's dependencies), and each part imports what it uses. A part writes
RESULT.json after every row, so a part stopped at its timeout still returns the rows it finished.

Parts: train (our default model, whole epochs: gpu_train.py), loader (our train loader alone, whole epochs, and the
harness's known-answer rows: gpu_loader.py), ultralytics (its loader alone, then YOLO11n and YOLO26n, same settings),
augment (the device-side augmentation's ms per batch, eager and compiled: gpu_loader.py), ddp (2 processes on one
device, a closure callback, trainer.stop from rank 1), export (ONNX and a TensorRT engine, each validated). The DDP
part's probe of NCCL is `gpu_parts.py nccl-probe RANK PORT`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks.gpu_loader import augment_part, our_loader_rows  # noqa: E402
from benchmarks.gpu_train import train_rows, ultralytics_rows  # noqa: E402

STOP_BATCH = 1  # the DDP part's callback sets trainer.stop on rank 1 at this batch of the first epoch


class Result:
    """A part's rows and checks, written to its result file after every change."""

    def __init__(self, path: Path):
        self.path, self.rows, self.checks = path, [], {}
        self.save()

    def add(self, row: dict) -> None:
        self.rows.append(row)
        self.save()

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"rows": self.rows, "checks": self.checks}, indent=1, default=str))
        os.replace(tmp, self.path)


def error_row(config: str, error: BaseException) -> dict:
    """A row for a configuration that failed: its error, last line first."""
    return {"config": config, "status": "error", "error": f"{type(error).__name__}: {error}"[:800],
            "traceback": traceback.format_exc()[-2000:]}


# --- ddp: two processes on one device -----------------------------------------------------------------------------------
def nccl_probe(rank: int, port: int) -> int:
    """One rank of a 2-process NCCL all_reduce with both ranks on GPU 0: exit 0 if NCCL allows it."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", 0))
    value = torch.ones(1, device="cuda")
    dist.all_reduce(value)
    torch.cuda.synchronize()
    dist.destroy_process_group()
    return 0 if float(value) == 2.0 else 1


def probe_nccl(timeout: float) -> dict:
    """Whether NCCL runs 2 ranks on one GPU (it refuses duplicate GPUs in most versions): {"allowed", "detail"}."""
    from yolo_cb.training.launch import free_port

    port = free_port()
    procs = [subprocess.Popen([sys.executable, __file__, "nccl-probe", str(r), str(port)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        return {"allowed": False, "detail": f"no answer in {timeout:.0f} s"}
    codes = [p.returncode for p in procs]
    lines = [line for out in outputs for line in out.splitlines() if "Error" in line or "error" in line]
    return {"allowed": codes == [0, 0], "detail": f"exit codes {codes}" + (f": {lines[-1][:300]}" if lines else "")}


def stop_on_rank1(folder: str, stop_batch: int):
    """A closure callback (on_train_batch_end): records (rank, epoch, batch) per rank in `folder`, and on rank 1 sets
    trainer.stop at `stop_batch` of the first epoch. It travels to the DDP workers by value (cloudpickle)."""

    def record(trainer):
        line = {"rank": trainer.rank, "epoch": trainer.epoch, "batch": trainer.batch_i, "stop": bool(trainer.stop)}
        if trainer.rank == 1 and trainer.epoch == 0 and trainer.batch_i == stop_batch:
            trainer.stop = True
            line["set_stop"] = True
        with open(os.path.join(folder, f"rank{trainer.rank}.jsonl"), "a") as f:
            f.write(json.dumps(line) + "\n")

    return record


def ddp_part(spec: dict, result: Result) -> None:
    """model.train(nproc=2) on one device with the closure callback; what each rank recorded, and the run's own records."""
    from yolo_cb import YOLO
    from yolo_cb.utils.paths import DEFAULT_MODEL

    probe = probe_nccl(60) if spec["cuda"] else {"allowed": False, "detail": "no CUDA: gloo on the CPU"}
    result.checks["nccl_two_ranks_one_gpu"] = probe
    folder = Path(spec["out"]) / "ddp_record"
    folder.mkdir(parents=True, exist_ok=True)
    model = YOLO(DEFAULT_MODEL)
    model.add_callback("on_train_batch_end", stop_on_rank1(str(folder), STOP_BATCH))
    config = f"nproc=2 device={spec['device']} batch={spec['ddp_batch']}/rank epochs={spec['ddp_epochs']}"
    start = time.perf_counter()
    try:
        settings = {**spec["train_settings"], "data": spec["data_small"], "batch": spec["ddp_batch"], "epochs": spec["ddp_epochs"], "val": False}
        metrics = model.train(**settings, nproc=2, name="ddp")
    except Exception as error:
        result.add(error_row(config, error))
        return
    seconds = time.perf_counter() - start
    checks = ddp_checks(folder, Path(spec["out"]) / "runs" / "ddp", metrics)
    result.checks.update(checks)
    backend = "nccl" if spec["cuda"] and probe["allowed"] else "gloo"
    result.add({"config": config, "status": "ok" if checks["stopped_together"] else "wrong", "seconds": seconds, "backend": backend,
                "note": f"backend {backend}; stop set on rank 1 at batch {STOP_BATCH}; last batch per rank {checks['last_batch']}; "
                        f"epochs trained {checks['epochs_trained']}/{spec['ddp_epochs']}; callback calls per rank {checks['calls']}"})


def ddp_checks(folder: Path, run: Path, metrics: dict) -> dict:
    """What the closure callback recorded on each rank, results.csv's rows and callbacks.json's per-rank calls."""
    seen = {r: [json.loads(line) for line in (folder / f"rank{r}.jsonl").read_text().splitlines()]
            for r in (0, 1) if (folder / f"rank{r}.jsonl").is_file()}
    last = {r: (rows[-1]["epoch"], rows[-1]["batch"]) for r, rows in seen.items() if rows}
    results_csv = run / "results.csv"
    epochs = max(len(results_csv.read_text().splitlines()) - 1, 0) if results_csv.is_file() else None
    record = json.loads((run / "callbacks.json").read_text()) if (run / "callbacks.json").is_file() else {}
    return {"calls": {r: len(rows) for r, rows in seen.items()}, "last_batch": {r: list(v) for r, v in last.items()},
            "stop_set_on_rank1": any(row.get("set_stop") for row in seen.get(1, [])),
            "stopped_together": len(last) == 2 and len(set(last.values())) == 1 and last[0] == (0, STOP_BATCH),
            "epochs_trained": epochs, "final_map50_95": metrics.get("metrics/mAP50-95(B)"),
            "callbacks_json": {"world_size": record.get("world_size"), "ranks_missing": record.get("ranks_missing"),
                               "closure_calls_by_rank": next((row["calls_by_rank"] for row in record.get("callbacks", [])
                                                              if row.get("event") == "on_train_batch_end" and "record" in str(row.get("name"))), None)}}


# --- export: ONNX and TensorRT, each validated ---------------------------------------------------------------------------
def export_part(spec: dict, result: Result) -> None:
    """Export the train part's best.pt to ONNX and validate both on the val split; then a TensorRT engine if importable."""
    from yolo_cb import YOLO

    weights = spec.get("best_pt")
    if not weights or not Path(weights).is_file():
        result.add({"config": "format=onnx", "status": "skipped", "note": f"no best.pt from the train part ({weights})"})
        return
    common = dict(data=spec["data_small"], imgsz=spec["imgsz"], batch=spec["batch"], device=spec["device"], plots=False,
                  project=str(Path(spec["out"]) / "runs"), exist_ok=True)
    try:
        torch_map = YOLO(weights).val(**common, name="val_pt")["metrics/mAP50-95(B)"]
        onnx_path = YOLO(weights).export(format="onnx", imgsz=spec["imgsz"], device=spec["device"], simplify=spec["simplify"])
        onnx_map = YOLO(onnx_path).val(**common, name="val_onnx")["metrics/mAP50-95(B)"]
        result.add({"config": "format=onnx", "status": "ok", "map_torch": torch_map, "map_export": onnx_map,
                    "note": f"mAP50-95 {onnx_map:.4f} (PyTorch {torch_map:.4f}, drop {torch_map - onnx_map:+.4f}); {Path(onnx_path).name} "
                            f"{Path(onnx_path).stat().st_size / 1e6:.1f} MB"})
    except Exception as error:
        result.add(error_row("format=onnx", error))
        return
    result.add(engine_row(onnx_path, spec))


def engine_row(onnx_path: str, spec: dict) -> dict:
    """A TensorRT engine built from the ONNX file and checked against ONNX Runtime on the same batch, or why not."""
    try:
        import tensorrt  # noqa: F401
    except ImportError as error:
        return {"config": "format=engine", "status": "unavailable", "note": f"tensorrt is not importable ({error})"}
    if not spec["cuda"]:
        return {"config": "format=engine", "status": "unavailable", "note": "TensorRT needs CUDA"}
    try:
        from benchmarks.gpu_engine import check_engine

        return {"config": "format=engine", "status": "ok", **check_engine(onnx_path, spec["imgsz"])}
    except Exception as error:
        return error_row("format=engine", error)


PARTS = {"train": lambda spec, result: train_rows(spec, result, error_row),
         "loader": lambda spec, result: our_loader_rows(spec, result, error_row),
         "ultralytics": lambda spec, result: ultralytics_rows(spec, result, error_row),
         "augment": lambda spec, result: augment_part(spec, result, error_row), "ddp": ddp_part, "export": export_part}


def main(argv: list[str]) -> int:
    if argv[0] == "nccl-probe":
        return nccl_probe(int(argv[1]), int(argv[2]))
    part, spec = argv[0], json.loads(Path(argv[1]).read_text())
    result = Result(Path(argv[2]))
    os.chdir(spec["out"])  # runs/, datasets caches and exports land in the output folder
    try:
        PARTS[part](spec, result)
    except Exception as error:  # the part's setup failed: recorded as one row
        result.add(error_row(part, error))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
