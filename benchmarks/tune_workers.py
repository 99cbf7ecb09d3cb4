"""One tune budget, two ways: one `yolo-cb tune` worker on SQLite, and two workers sharing one study on PostgreSQL.

    python benchmarks/tune_workers.py [--iterations 8] [--epochs 3] [--imgsz 96] [--train-images 128] [--val-images 64]
                                      [--batch 16] [--nbs 16] [--model yolocb-n.yaml] [--out /tmp/tune_workers]

Both parts run the same `yolo-cb tune` settings (model, data, epochs, image size, the default search space, the default
median pruner, iterations=N): the SQLite part as one process on the study.db of its tune folder, using every core;
the PostgreSQL part as two processes started together on one study in a fresh PostgreSQL server on loopback (started
and stopped here with tests/pg_server.py, as the tests do), each using half of the cores, so both parts have the same
machine. Printed: per part the wall time, the trials in the study by state (the budget is N counted trials across all
workers) and the best mAP50-95; raw figures in OUT/results.json. ../shared/datasets/shapes is used in place (the first
--train-images / --val-images of each split, sorted by name).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("YOLO_CB_SHARED", ROOT.parent / "shared"))
NAMES = ["circle", "rectangle", "triangle", "cross"]
STUDY = "workers"


def subset_yaml(out: Path, train_images: int, val_images: int) -> Path:
    images = SHARED / "datasets" / "shapes" / "images"
    for split, count in (("train", train_images), ("val", val_images)):
        (out / f"{split}.txt").write_text("\n".join(map(str, sorted((images / split).glob("*.jpg"))[:count])) + "\n")
    data = out / "shapes.yaml"
    data.write_text(f"path: {out}\ntrain: train.txt\nval: val.txt\nnames: {NAMES}\n")
    return data


def start_worker(settings: dict, threads: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    env.pop("MLFLOW_TRACKING_URI", None)
    args = [f"{k}={v}" for k, v in settings.items()]
    return subprocess.Popen([sys.executable, "-m", "yolo_cb", "tune", *args], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def run_part(settings_per_worker: list[dict], threads: int, out: Path, part: str) -> float:
    t0 = time.perf_counter()
    procs = [start_worker(s, threads, out / f"{part}_worker{i}.log") for i, s in enumerate(settings_per_worker)]
    codes = [p.wait() for p in procs]
    seconds = time.perf_counter() - t0
    if any(codes):
        raise SystemExit(f"{part}: a worker exited with {codes}; see {out}/{part}_worker*.log")
    return seconds


def study_figures(storage: str) -> dict:
    import optuna

    study = optuna.load_study(study_name=STUDY, storage=storage)
    states = Counter(t.state.name for t in study.trials)
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    best = max(done, key=lambda t: t.value) if done else None
    best_map = best.user_attrs.get("metrics", {}).get("metrics/mAP50-95(B)") if best else None
    return {"trials": dict(states), "best_trial": best.number if best else None, "best_fitness": best.value if best else None,
            "best_map50_95": best_map}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="yolocb-n.yaml")
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--imgsz", type=int, default=96)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--nbs", type=int, default=16, help="nominal batch: 16 = one optimizer step per batch of 16")
    parser.add_argument("--train-images", type=int, default=128)
    parser.add_argument("--val-images", type=int, default=64)
    parser.add_argument("--out", default="/tmp/tune_workers")
    opt = parser.parse_args()

    sys.path.insert(0, str(ROOT / "tests"))
    from pg_server import PostgresServer

    out = Path(opt.out)
    out.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 2
    common = dict(model=opt.model, data=subset_yaml(out, opt.train_images, opt.val_images), epochs=opt.epochs, imgsz=opt.imgsz,
                  batch=opt.batch, nbs=opt.nbs, workers=0, iterations=opt.iterations, name=STUDY, mlflow=False, tensorboard=False,
                  onnx_check=False, plots=False, exist_ok=True)
    results = {"settings": {k: str(v) for k, v in common.items()}, "cores": cores}

    sqlite_project = out / "sqlite"
    seconds = run_part([{**common, "project": sqlite_project, "seed": 0}], cores, out, "sqlite")
    results["sqlite_1_worker"] = {"seconds": seconds, **study_figures(f"sqlite:///{sqlite_project / STUDY / 'study.db'}")}

    server = PostgresServer().start()
    try:
        storage = server.database("tune_workers")
        workers = [{**common, "project": out / f"postgresql_worker{i}", "seed": i, "storage": storage} for i in (0, 1)]
        seconds = run_part(workers, max(1, cores // 2), out, "postgresql")
        results["postgresql_2_workers"] = {"seconds": seconds, **study_figures(storage)}
    finally:
        server.stop()

    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"{'part':<24} {'wall s':>8} {'best mAP50-95':>14}  trials")
    for part in ("sqlite_1_worker", "postgresql_2_workers"):
        r = results[part]
        best = f"{r['best_map50_95']:.3f}" if r["best_map50_95"] is not None else "-"
        print(f"{part:<24} {r['seconds']:8.1f} {best:>14}  {r['trials']}")
    ratio = results["postgresql_2_workers"]["seconds"] / results["sqlite_1_worker"]["seconds"]
    print(f"2 workers on PostgreSQL / 1 worker on SQLite, wall time: {ratio:.2f}x")


if __name__ == "__main__":
    main()
