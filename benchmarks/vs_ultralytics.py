"""yolo-cb against Ultralytics YOLO11n or YOLO26n, side by side in one run: accuracy per second on a dataset.

    python benchmarks/vs_ultralytics.py [--recipe both|equal|defaults] [--epochs 12] [--imgsz 320] [--data DIR]
                                        [--ours yolocb-n.yaml yolox-nano.yaml] [--ultralytics-model yolo11n|yolo26n]
                                        [--out runs/bench/vs_ultralytics] [--quick]

--data: a YOLO dataset folder (data.yaml, images/ and labels/ {train,val}); default ../shared/datasets/shapes.
Ultralytics is never a dependency: it runs in its own venv (--ultralytics-python, default /work/venv-ul/bin/python),
and so does yolo-cb (--ours-python, default this checkout's .venv). This file is its own worker: each side is a
subprocess of `<python> benchmarks/vs_ultralytics.py --worker SPEC.json`, which imports only its own library.

The Ultralytics venv (outside the repo; measured with ultralytics 8.4.190, torch 2.14.1 on both sides):
    python3.11 -m venv /work/venv-ul && /work/venv-ul/bin/pip install torch==2.14.1 torchvision==0.29.1 ultralytics==8.4.190

What runs, per recipe (the method of ../shared/tools/time_to_accuracy.py: the same callbacks on both libraries):
- each side from scratch, at the same time, each pinned to its own CPU core with 1 thread (torch, OpenMP/MKL, OpenCV);
- with N free cores, one Ultralytics run shares a group with up to N-1 of our models; on 2 cores that is one pair
  per model (every model of ours gets its own Ultralytics run beside it, so each comparison is one side-by-side run);
- `defaults`: each library's own defaults; only data, imgsz, epochs, batch 16, workers 0, seed 0 given;
- `equal`: imgsz, batch 16, nbs 16, AdamW lr0 0.002, warmup_epochs 1, workers 0, seed 0, cos_lr off, the last 3 epochs
  without mosaic (Ultralytics close_mosaic=3, ours no_aug_epochs=3), same epochs.
Both sides also get switches that are not part of a recipe: device cpu, no plots; Ultralytics pretrained=False
amp=False; ours mlflow/tensorboard/onnx_check off. --ours-set / --ultralytics-set add more (e.g. amp=False channels_last=False);
the settings table prints what each side resolved (optimizer, learning rate, accumulation, mosaic epochs).

Per epoch: mAP50-95 (`metrics/mAP50-95(B)` on both) and the wall seconds since on_train_start at on_fit_epoch_end
(training + validation + checkpoint). Printed: the curves, seconds per epoch, time to 0.14 / 0.35 / 0.5 and each as a ratio of Ultralytics', as markdown
tables for BENCHMARKS.md; raw figures in OUT/results.json, each run's log in OUT/<recipe>/*.log.

The dataset is read in place: each run gets a temp folder whose images/ and labels/ split folders are symlinks to
the shared ones (so label caches are written in the temp folder, never into ../shared). Workers run offline
(YOLO_OFFLINE=1; Ultralytics' font check finds a local font; any non-loopback network access is blocked and counted).
--quick: a smoke test (1 epoch, imgsz 64, 32 train / 16 val images via .txt lists).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: benchmarks/ itself is not on the path as a package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.coco_judge import judge_group  # noqa: E402
from benchmarks.vs_report import report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("YOLO_CB_SHARED", ROOT.parent / "shared"))
MAP_KEY = "metrics/mAP50-95(B)"
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")

# Train settings given to each side, per recipe. `common` are the only ones the `defaults` recipe sets.
COMMON = dict(batch=16, workers=0, seed=0)
EQUAL = dict(batch=16, nbs=16, optimizer="AdamW", lr0=0.002, warmup_epochs=1.0, workers=0, seed=0, cos_lr=False)
NO_MOSAIC_EPOCHS = 3  # equal recipe: the last 3 epochs without mosaic
SWITCHES = {"ultralytics": dict(device="cpu", pretrained=False, amp=False, plots=False),
            "yolo_cb": dict(device="cpu", plots=False, mlflow=False, tensorboard=False, onnx_check=False)}
# Resolved settings shown side by side (read from the trainer's args at on_train_start).
SHOWN = ("epochs", "imgsz", "batch", "nbs", "optimizer", "lr0", "lrf", "momentum", "weight_decay", "warmup_epochs", "cos_lr",
         "mosaic", "mixup", "close_mosaic", "no_aug_epochs", "scale", "translate", "fliplr", "hsv_s", "hsv_v", "box",
         "channels_last", "amp", "deterministic")


def recipe_settings(lib: str, recipe: str, epochs: int, imgsz: int) -> dict:
    """The train() settings of one side for one recipe (without data/project/name)."""
    base = dict(COMMON) if recipe == "defaults" else dict(EQUAL)
    if recipe == "equal":
        base.update(close_mosaic=NO_MOSAIC_EPOCHS) if lib == "ultralytics" else base.update(no_aug_epochs=NO_MOSAIC_EPOCHS)
    return {**base, "epochs": epochs, "imgsz": imgsz, **SWITCHES[lib]}


# ----------------------------------------------------------------------------------------------------------------------
# worker: runs inside either venv; imports only its own library
# ----------------------------------------------------------------------------------------------------------------------
def _guard_network(attempts: list) -> None:
    """Block and count every non-loopback network access (nothing may download at run time)."""
    local = ("localhost", "127.", "::1", "0.0.0.0")

    def hook(event, args):
        if event in ("socket.getaddrinfo", "socket.connect"):
            host = args[0] if event == "socket.getaddrinfo" else args[1]
            host = host[0] if isinstance(host, tuple) else host
            if isinstance(host, (bytes, bytearray)):
                host = host.decode(errors="replace")
            if isinstance(host, str) and host and not host.startswith(local) and not host.startswith("/"):
                attempts.append(f"{event} {host}")
                print(f"[vs_ultralytics] blocked network access: {event} {host}", file=sys.stderr, flush=True)
                raise OSError(f"network access blocked by benchmarks/vs_ultralytics.py: {host}")

    sys.addaudithook(hook)


def _ultralytics_offline_config() -> None:
    """A config dir of the Ultralytics venv with a local stand-in for Arial.ttf, so its font check never downloads."""
    cfg = Path(os.environ.setdefault("YOLO_CONFIG_DIR", str(Path(sys.prefix) / "ultralytics-config")))
    font = cfg / "Ultralytics" / "Arial.ttf"
    if not font.exists():
        import matplotlib

        font.parent.mkdir(parents=True, exist_ok=True)
        font.symlink_to(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf")


def _jsonable(v):
    return v if isinstance(v, (int, float, str, bool, type(None))) else str(v)


def worker(spec_path: Path) -> None:
    spec = json.loads(spec_path.read_text())
    t_process = time.perf_counter()
    os.sched_setaffinity(0, {spec["core"]})
    for name in THREAD_ENV:
        os.environ[name] = "1"
    os.environ["YOLO_OFFLINE"] = "1"
    attempts: list[str] = []
    _guard_network(attempts)
    lib = spec["lib"]
    if lib == "ultralytics":
        _ultralytics_offline_config()
        import ultralytics
        from ultralytics import YOLO

        version = ultralytics.__version__
    else:
        sys.path.insert(0, spec.get("tree", str(ROOT)))  # the yolo-cb source this side trains with (recipe_ab.py's tree=)
        import yolo_cb
        from yolo_cb import YOLO

        version = yolo_cb.__version__
        print(f"[vs_ultralytics] yolo_cb from {Path(yolo_cb.__file__).parent}", flush=True)
    import cv2
    import torch

    def one_thread():
        torch.set_num_threads(1)  # Ultralytics' select_device resets it to min(8, cpu_count - 1); set it after
        cv2.setNumThreads(0)      # OpenCV without its own thread pool (what both libraries use in loader workers)

    one_thread()
    epochs = int(spec["settings"]["epochs"])
    curve: list[dict] = []
    state: dict = {}

    def on_pretrain_routine_start(trainer):
        one_thread()

    def on_train_start(trainer):
        one_thread()
        state["t0"] = time.perf_counter()
        args = vars(trainer.args) if not isinstance(trainer.args, dict) else trainer.args
        opt = trainer.optimizer
        state["resolved"] = {
            **{k: _jsonable(args[k]) for k in SHOWN if k in args},
            "optimizer (resolved)": type(opt).__name__ if opt is not None else None,
            "lr0 (resolved, pg0)": opt.param_groups[0].get("initial_lr", opt.param_groups[0]["lr"]) if opt is not None else None,
            "accumulate (after warmup)": max(round(args.get("nbs", args["batch"]) / args["batch"]), 1),
            "train images": len(trainer.train_loader.dataset),
            "torch threads": torch.get_num_threads(),
            "cpu affinity": sorted(os.sched_getaffinity(0)),
        }
        state["setup_s"] = round(state["t0"] - t_process, 2)

    def on_train_epoch_start(trainer):
        state["te"] = time.perf_counter()

    def on_train_epoch_end(trainer):
        state["train_s"] = time.perf_counter() - state["te"]

    def on_fit_epoch_end(trainer):
        epoch = trainer.epoch + 1
        if epoch > epochs or any(c["epoch"] == epoch for c in curve):
            return  # Ultralytics fires it once more after validating best.pt (as epoch epochs + 1)
        score = float(trainer.metrics.get(MAP_KEY, float("nan")))
        curve.append({"epoch": epoch, "t": round(time.perf_counter() - state["t0"], 2), "map": round(score, 4),
                      "train_s": round(state.get("train_s", float("nan")), 2)})
        if capture is not None:
            capture.dump(epoch)  # after the clock is read: the judge's file is not part of the epoch's time
        print(f"VSU epoch {epoch}/{epochs} t={curve[-1]['t']:.1f}s train={curve[-1]['train_s']:.1f}s {MAP_KEY}={score:.4f}",
              flush=True)

    model = YOLO(spec["model"])
    capture = None
    if spec.get("judge"):  # --judge: keep each validation's detections for pycocotools (benchmarks/coco_judge.py)
        from benchmarks.coco_judge import PredictionCapture

        capture = PredictionCapture(Path(spec["judge"]))
        capture.install(lib, model, spec["settings"])
    for fn in (on_pretrain_routine_start, on_train_start, on_train_epoch_start, on_train_epoch_end, on_fit_epoch_end):
        model.add_callback(fn.__name__, fn)
    model.train(data=spec["data"], project=spec["project"], name="run", exist_ok=True, **spec["settings"])
    result = {"lib": lib, "version": version, "torch": torch.__version__, "model": spec["model"], "curve": curve,
              "setup_s": state.get("setup_s"), "process_s": round(time.perf_counter() - t_process, 2),
              "resolved": state.get("resolved", {}), "network_attempts": attempts}
    Path(spec["result"]).write_text(json.dumps(result, indent=1))


# ----------------------------------------------------------------------------------------------------------------------
# driver: runs under any python; only the standard library
# ----------------------------------------------------------------------------------------------------------------------
def dataset_view(root: Path, quick: bool, n_train: int = 32, n_val: int = 16, source: Path | None = None) -> Path:
    """A temp folder viewing a dataset folder (default ../shared/datasets/shapes) in place (symlinked split folders) and
    its data YAML. The folder holds data.yaml (names one per indented `i: name` line), images/ and labels/ {train,val}."""
    src = Path(source or SHARED / "datasets" / "shapes").resolve()
    src = src.parent if src.is_file() else src
    names = [line.split(":", 1)[1].strip().strip("'\"") for line in (src / "data.yaml").read_text().splitlines() if line.startswith("  ")]
    root.mkdir(parents=True, exist_ok=True)
    for kind in ("images", "labels"):
        for split in ("train", "val"):
            (root / kind).mkdir(exist_ok=True)
            (root / kind / split).symlink_to(src / kind / split, target_is_directory=True)
    splits = {"train": "images/train", "val": "images/val"}
    if quick:
        for split, n in (("train", n_train), ("val", n_val)):
            files = sorted(p.name for p in (src / "images" / split).iterdir())[:n]
            (root / f"{split}.txt").write_text("".join(f"{root / 'images' / split / f}\n" for f in files))
            splits[split] = f"{split}.txt"
    yaml = root / "data.yaml"
    yaml.write_text(f"path: {root}\ntrain: {splits['train']}\nval: {splits['val']}\nnames:\n"
                    + "".join(f"  {i}: {n}\n" for i, n in enumerate(names)))
    return yaml


def run_group(jobs: list[dict], echo: bool = True) -> None:
    """Start all jobs of a group at once (each already has its core); wait for all; stream epoch lines."""
    threads = []
    for job in jobs:
        env = {**os.environ, "YOLO_OFFLINE": "1", **{k: "1" for k in THREAD_ENV}}
        if job["lib"] == "yolo_cb":
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        log = open(job["log"], "w")
        job["t_start"] = time.perf_counter()
        job["proc"] = subprocess.Popen([job["python"], str(Path(__file__).resolve()), "--worker", str(job["spec"])],
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, env=env,
                                       cwd=str(job["cwd"]))

        def pump(job=job, log=log):
            for line in job["proc"].stdout:
                log.write(line)
                log.flush()
                if echo and (line.startswith("VSU ") or "Traceback" in line or "blocked network" in line):
                    print(f"  [{job['label']} core {job['core']}] {line.rstrip()}", flush=True)
            log.close()

        t = threading.Thread(target=pump, daemon=True)
        t.start()
        threads.append(t)
    for job in jobs:
        job["rc"] = job["proc"].wait()
        job["wall_s"] = round(time.perf_counter() - job["t_start"], 1)
    for t in threads:
        t.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--recipe", choices=("both", "equal", "defaults"), default="both")
    ap.add_argument("--epochs", type=int, default=None, help="epochs per run (default 12; 1 with --quick)")
    ap.add_argument("--imgsz", type=int, default=None, help="image size (default 320; 64 with --quick)")
    ap.add_argument("--data", type=Path, default=None, help="a YOLO dataset folder with data.yaml, images/ and labels/ "
                    "{train,val} (default ../shared/datasets/shapes; benchmarks/make_datasets.py makes others)")
    ap.add_argument("--ours", nargs="+", default=["yolocb-n.yaml"], help="our model YAMLs, each compared with --ultralytics-model")
    ap.add_argument("--ultralytics-model", default="yolo11n", help="yolo11n | yolo26n (built from their YAML, no weights) or any "
                    "model YAML Ultralytics takes")
    ap.add_argument("--ultralytics-python", default="/work/venv-ul/bin/python")
    ap.add_argument("--ours-python", default=str(ROOT / ".venv" / "bin" / "python"))
    ap.add_argument("--ours-set", nargs="*", default=[], metavar="KEY=VALUE", help="extra non-recipe settings for our side")
    ap.add_argument("--ultralytics-set", nargs="*", default=[], metavar="KEY=VALUE", help="extra settings for Ultralytics")
    ap.add_argument("--cores", default=None, help="CPU cores to use, e.g. 0,1 (default: all this process may use)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "vs_ultralytics")
    ap.add_argument("--quick", action="store_true", help="smoke test: 1 epoch, imgsz 64, 32 train / 16 val images")
    ap.add_argument("--judge", action="store_true", help="also score every epoch of both sides with pycocotools, from the "
                    "detections of each side's own validation (benchmarks/coco_judge.py; Ultralytics' then runs with save_json)")
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker)

    epochs = a.epochs or (1 if a.quick else 12)
    imgsz = a.imgsz or (64 if a.quick else 320)
    recipes = ["defaults", "equal"] if a.recipe == "both" else [a.recipe]
    cores = sorted(int(c) for c in a.cores.split(",")) if a.cores else sorted(os.sched_getaffinity(0))
    for py in (a.ultralytics_python, a.ours_python):
        if not Path(py).exists():
            sys.exit(f"python not found: {py}")
    per_group = max(len(cores) - 1, 1)
    groups = [a.ours[i:i + per_group] for i in range(0, len(a.ours), per_group)]
    concurrent = len(cores) >= 2
    if not concurrent:
        print(f"only core {cores} available: the two sides run one after the other, NOT side by side", flush=True)

    def parse_set(items):
        return {k: _yaml_scalar(v) for k, v in (s.split("=", 1) for s in items)}

    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="vs_ultralytics_"))
    meta = {"command": " ".join(shlex.quote(x) for x in [sys.executable, *sys.argv]), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "host": platform.node(), "cpu": _cpu_name(), "cores": cores, "epochs": epochs, "imgsz": imgsz, "quick": a.quick,
            "dataset": str(a.data or SHARED / "datasets" / "shapes"), "ultralytics_python": a.ultralytics_python, "ours_python": a.ours_python}
    results = {"meta": meta, "runs": []}
    n_groups = len(recipes) * len(groups)
    print(f"vs_ultralytics: {n_groups} group(s) of concurrent runs; cores {cores}; {epochs} epoch(s); imgsz {imgsz}; out {out}",
          flush=True)
    t_all = time.perf_counter()
    try:
        run_all(a, recipes, groups, cores, concurrent, epochs, imgsz, out, tmp, results, parse_set)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # symlinks and label caches only; the shared data is untouched
    report(a, recipes, results, cores, concurrent, epochs, imgsz, out, t_all)


def run_all(a, recipes, groups, cores, concurrent, epochs, imgsz, out, tmp, results, parse_set) -> None:
    """Every group of every recipe, one group after the other; results.json rewritten after each group."""
    n_groups = len(recipes) * len(groups)
    k = 0
    for recipe in recipes:
        for gi, models in enumerate(groups):
            k += 1
            jobs = []
            sides = [("yolo_cb", m, a.ours_python, parse_set(a.ours_set)) for m in models]
            sides += [("ultralytics", ultralytics_yaml(a.ultralytics_model), a.ultralytics_python, parse_set(a.ultralytics_set))]
            for si, (lib, model, py, extra) in enumerate(sides):
                stem = Path(model).stem
                tag = f"{'ultralytics' if lib == 'ultralytics' else 'yolo-cb'}-{stem}" + (f"-g{gi + 1}" if lib == "ultralytics" and len(groups) > 1 else "")
                work = tmp / recipe / tag
                data = dataset_view(work / "data", a.quick, source=a.data)
                spec = {"lib": lib, "model": model, "data": str(data), "project": str(out / recipe / tag),
                        "settings": {**recipe_settings(lib, recipe, epochs, imgsz), **extra},
                        "core": cores[si % len(cores)], "result": str(work / "result.json"),
                        "judge": str(out / recipe / tag / "judged") if a.judge else None}
                (work / "spec.json").write_text(json.dumps(spec, indent=1))
                (out / recipe).mkdir(parents=True, exist_ok=True)
                title = f"yolo-cb {stem}" if lib == "yolo_cb" else f"Ultralytics {stem}" + (f" (beside {', '.join(models)})" if len(groups) > 1 else "")
                jobs.append({"lib": lib, "label": f"{recipe}/{tag}", "title": title, "python": py, "spec": work / "spec.json",
                             "core": spec["core"], "log": out / recipe / f"{tag}.log", "cwd": work, "result": work / "result.json",
                             "settings": spec["settings"], "recipe": recipe, "group": gi + 1})
            print(f"[{k}/{n_groups}] recipe {recipe}: " + ", ".join(f"{j['title']} on core {j['core']}" for j in jobs), flush=True)
            for batch in ([jobs] if concurrent else [[j] for j in jobs]):
                run_group(batch)
            for job in jobs:
                run = {key: job[key] for key in ("lib", "title", "recipe", "group", "core", "settings", "rc", "wall_s")}
                run["log"] = str(job["log"])
                if job["result"].exists():
                    run.update(json.loads(job["result"].read_text()))
                else:
                    tail = Path(job["log"]).read_text(errors="replace").splitlines()[-25:]
                    print(f"  {job['label']} FAILED (rc {job['rc']}); last lines of {job['log']}:\n    " + "\n    ".join(tail))
                results["runs"].append(run)
            if a.judge:
                judge_group(a.ours_python, data, jobs, results["runs"][-len(jobs):])
            (out / "results.json").write_text(json.dumps(results, indent=1))


def ultralytics_yaml(name: str) -> str:
    """yolo11n / yolo26n (with or without .yaml) as the YAML Ultralytics builds from scratch; other names as given."""
    return name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"


def _yaml_scalar(v: str):
    """key=value values as YAML scalars (true/false, numbers, strings) without needing PyYAML here."""
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null", ""):
        return None
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def _cpu_name() -> str:
    try:
        return next(x.split(":", 1)[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "cpu"


if __name__ == "__main__":
    main()
