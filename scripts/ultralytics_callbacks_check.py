"""Ultralytics' own TensorBoard and MLflow integration callbacks, registered on a yolo-cb training run (issue 15).

Run it in a scratch environment that has the `ultralytics` package (never a dependency of yolo-cb) besides yolo-cb's
own dependencies, from the repository root:

    PYTHONPATH=. /path/to/scratch-venv/bin/python scripts/ultralytics_callbacks_check.py \
        --data coco8.yaml --datasets-dir ../shared/datasets --out /tmp/ultralytics_check

It starts a real MLflow tracking server on 127.0.0.1 (SQLite store and artifacts under --out), registers the
`callbacks` dicts of `ultralytics.utils.callbacks.tensorboard` and `.mlflow` with `model.add_callback` exactly as
Ultralytics' docs do, trains a tiny YOLOX-nano for 2 epochs, then reads back the MLflow run (status, params,
per-epoch metric history, artifacts) and the TensorBoard scalars, prints a JSON summary, and exits 1 if a check fails.
yolo-cb's own MLflow/TensorBoard integrations are switched off for the run, so every record read back was written by
Ultralytics' callbacks.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

EPOCHS = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_mlflow_server(out: Path) -> tuple[subprocess.Popen, str]:
    """`mlflow server` on 127.0.0.1 with a SQLite store and an artifact folder under `out`; returns (process, URI)."""
    port = free_port()
    cmd = [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
           "--backend-store-uri", f"sqlite:///{out / 'mlflow.db'}", "--artifacts-destination", str(out / "artifacts")]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no background job workers
    env.pop("MLFLOW_TRACKING_URI", None)
    log = open(out / "mlflow_server.log", "wb")  # noqa: SIM115 - the server process writes it until it ends
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=out, env=env)
    uri = f"http://127.0.0.1:{port}"
    for _ in range(240):
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited ({proc.returncode}); see {out / 'mlflow_server.log'}")
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=1) as response:
                if response.status == 200:
                    return proc, uri
        except OSError:
            time.sleep(0.5)
    proc.terminate()
    raise RuntimeError(f"mlflow server did not answer on {uri}; see {out / 'mlflow_server.log'}")


def train_with_ultralytics_callbacks(args) -> object:
    from ultralytics.utils.callbacks import mlflow as ul_mlflow
    from ultralytics.utils.callbacks import tensorboard as ul_tensorboard

    from yolo_cb import YOLO

    for module in (ul_tensorboard, ul_mlflow):
        if not module.callbacks:
            raise RuntimeError(f"{module.__name__}.callbacks is empty: its dependency is missing in this environment")
    model = YOLO("yolox-nano.yaml")
    for module in (ul_tensorboard, ul_mlflow):  # as Ultralytics' docs register callbacks
        for event, func in module.callbacks.items():
            model.add_callback(event, func)
    model.train(data=args.data, datasets_dir=args.datasets_dir, epochs=EPOCHS, imgsz=args.imgsz, batch=args.batch, workers=0,
                project=str(args.out / "runs"), name="train", mlflow=False, tensorboard=False, onnx_check=False, plots=False)
    return model


def read_mlflow(uri: str, experiment: str) -> dict:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id]) if exp else []
    if len(runs) != 1:
        return {"runs": len(runs)}
    run = runs[0]
    history = {key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)] for key in run.data.metrics}
    return {"runs": 1, "run_id": run.info.run_id, "status": run.info.status, "params": len(run.data.params),
            "param_epochs": run.data.params.get("epochs"), "param_imgsz": run.data.params.get("imgsz"),
            "metric_history": {k: v for k, v in sorted(history.items())},
            "artifacts": sorted(a.path for a in client.list_artifacts(run.info.run_id))}


def read_tensorboard(save_dir: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(save_dir.glob("events.out.tfevents.*"))
    scalars = {}
    for f in files:
        acc = EventAccumulator(str(f))
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            scalars.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return {"event_files": len(files), "scalars": dict(sorted(scalars.items()))}


def checks(ml: dict, tb: dict) -> dict[str, bool]:
    hist = ml.get("metric_history", {})
    per_epoch = [k for k in ("metrics/mAP50-95B", "metrics/mAP50B", "train/iou_loss", "lr/pg0") if k in hist]
    scalars = tb.get("scalars", {})
    return {
        "one MLflow run": ml.get("runs") == 1,
        "MLflow run FINISHED": ml.get("status") == "FINISHED",
        "MLflow params from dict(trainer.args)": ml.get("params", 0) > 50 and ml.get("param_epochs") == str(EPOCHS),
        "MLflow per-epoch metrics": len(per_epoch) == 4 and all(len(hist[k]) == EPOCHS for k in per_epoch),
        "MLflow artifacts (weights/)": "weights" in ml.get("artifacts", []),
        "TensorBoard scalars per epoch": all(len(scalars.get(t, [])) == EPOCHS for t in ("metrics/mAP50-95(B)", "train/iou_loss", "lr/pg0")),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="coco8.yaml", help="dataset YAML (default coco8.yaml)")
    parser.add_argument("--datasets-dir", default=None, help="datasets_dir holding the dataset (no download when it is there)")
    parser.add_argument("--imgsz", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("/tmp/ultralytics_check"), help="server store, run folder, summary")
    args = parser.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=False)
    os.environ.setdefault("YOLO_CONFIG_DIR", str(args.out / "ultralytics_settings"))  # keep Ultralytics' settings file here
    server, uri = start_mlflow_server(args.out)
    try:
        os.environ["MLFLOW_TRACKING_URI"] = uri
        os.environ["MLFLOW_EXPERIMENT_NAME"] = experiment = "ultralytics-callbacks-on-yolo-cb"
        started = time.time()
        model = train_with_ultralytics_callbacks(args)
        seconds = time.time() - started
        ml = read_mlflow(uri, experiment)
        tb = read_tensorboard(Path(model.trainer.save_dir))
    finally:
        server.terminate()
        server.wait(timeout=30)
    import ultralytics

    result = {"ultralytics": ultralytics.__version__, "train_seconds": round(seconds, 1), "checks": checks(ml, tb),
              "mlflow": ml, "tensorboard": tb}
    (args.out / "summary.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    failed = [name for name, ok in result["checks"].items() if not ok]
    print("FAILED: " + ", ".join(failed) if failed else f"all {len(result['checks'])} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
