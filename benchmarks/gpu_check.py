"""GPU check (issues 34, 58): one prepared run of what matters on a CUDA device, printed as one table; it times what a user
feels (whole epochs, boundaries and validation included), with enough work per epoch for the thing measured to show.

    python benchmarks/gpu_check.py --out DIR [--data DIR] [--full-grid] [--ultralytics-python PY] [--keep]
    python benchmarks/gpu_check.py --dry-run --out DIR        # the same steps on the CPU, tiny sizes (the suite runs this)

The data: the bundled shapes generator writes 512 train / 128 val images of 480-640 px (one process per CPU, at most 16;
~3-5 s on 16 cores from the dry run's ~50 CPU-ms an image), and each train image is linked 8 times under distinct names: 4,096 train images, 64 batches an
epoch at batch 64. Links, not 4,096 generated images (~150 CPU-s more of the GPU machine's time), and distinct names
rather than a .txt list naming a file 8 times (no label or image cache of either library can merge them); with
cache=ram a linked image costs a sample what a unique one does (decoded once at caching, resized, augmented per
sample). --data DIR reads a YOLO folder instead, linked as often as it takes to reach 4,096. All through a folder of
symlinks in the work folder, so no cache is written beside the source.

Parts, each in its own process with a timeout (GPU_TIMEOUTS; the whole run, setup and report included, stops within
GPU_TOTAL_S = 9 minutes: a part gets at most what is left; a part that fails records its error and the rest go on):
1. train: 3 epochs of the default model (paths.DEFAULT_MODEL) with its defaults (amp, channels_last, compile as
   cfg/default.yaml has them) at imgsz 640, batch 64, 8 workers, cache=ram, mosaic, validation every epoch: images/s
   over whole epochs (on_train_epoch_start to on_fit_epoch_end, summed: benchmarks/gpu_train.EpochClock), after the
   first epoch, and over the batches alone; per-epoch seconds, boundary waits, validation; peak GPU memory, final loss
   (--full-grid: also the 8 combinations of amp, channels_last, compile: not in the 9 minutes);
2. loader: our train loader alone (mosaic, cache=ram, pinned memory, each batch copied to the GPU) at 8 and 14 workers,
   2 whole epochs of 64 batches each, the boundary between them included (benchmarks/gpu_loader.time_epochs);
3. ultralytics: its train loader alone, timed the same way at the same worker counts, then YOLO11n and YOLO26n with the
   same imgsz / batch / epochs / workers / cache / amp / validation, timed by the same EpochClock; our images/s as a
   ratio of theirs (goal: >= 1.3x YOLO11n's); a row says why when Ultralytics is not importable;
4. augment: the device-side augmentation (--augment-fn, default yolo_cb.data.loading.device_colour:augment_batch: the
   HSV jitter and /255 of colour_on=device, called as fn(batch) on one real batch whose workers left the colour to the
   device, on the device): ms per batch, eager and compiled; "not available in this version" where that function does
   not exist;
5. ddp: model.train(nproc=2) on the one GPU (nccl where it allows two ranks on one GPU, else gloo on the GPU), with a
   closure callback that records every batch per rank and sets trainer.stop on rank 1 (the 512 unique images);
6. export: the first training's best.pt to ONNX, validated on the val split against PyTorch; a TensorRT engine from it,
   checked against ONNX Runtime, where tensorrt is importable.
--dry-run: the CPU, imgsz 64, 16 generated train images linked twice (4 batches of 8 an epoch) / 8 val, 2 epochs,
1 worker (loader: 1 and 2), compile through the `eager` backend (dynamo traces, no code generation); and the harness's
known answers (loader part): a stub loader with a known restart and batch time, and our loader under a consumer that
sleeps 0.25 s a batch (its images/s after each epoch's first batch must be batch / sleep). Writes DIR/gpu_check.json
and DIR/gpu_check.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks.gpu_loader import AUGMENT_FN  # noqa: E402
from benchmarks.gpu_report import markdown, ratios  # noqa: E402

PARTS = ("train", "loader", "ultralytics", "augment", "ddp", "export")
GPU_TOTAL_S = 540  # the whole run, setup and report included, ends within 9 minutes: a part gets at most what is left
# Seconds per part, 490 in all (setup ~15 s: generating 640 images at 480-640 px on 16 processes, the dry run measures it).
# From the first H200 run (2026-12-04: 512 images, 8 batches an epoch; ours 357-499 images/s, our loader 445-458 at 8 / 14
# workers, YOLO11n 999, YOLO26n 472; inferred fixed costs: ~55 s per training of ours (200 s held 3 trainings of ~3 s of
# batches and the start of a 4th), ~20 s per Ultralytics training (48 s for 2 and its import)) and the
# new sizes (4096 images = 64 batches an epoch, 3 epochs with validation of 128 images each):
GPU_TIMEOUTS = {
    "train": 130,        # one training of ours: ~55 s fixed (CUDA, model, 4096 labels, cache=ram) + 3 x (9.1 s of batches at ~450
                         # images/s + ~1.2 s boundary + ~1.5 s validation) = ~95 s, and a third more
    "loader": 75,        # ours alone: ~10 s import + ~6 s dataset (4096 cached) + 8 and 14 workers x 2 epochs x ~9.1 s = ~52 s
    "ultralytics": 150,  # its loader at 8 / 14 workers (~3 s dataset + 2 x 2 x 4.1 s at ~1000 images/s + starts: ~22 s), YOLO11n
                         # (~20 s + 3 x 5.6 s = ~37 s) and YOLO26n (~20 s + 3 x 10.2 s = ~51 s), import ~5 s: ~115 s
    "augment": 60,       # one batch, then eager and compiled calls: torch.compile's first call ~20-40 s; absent: ~2 s
    "ddp": 45,           # 28 s in the first run (the 512 unique images, stopped at batch 1)
    "export": 30,        # 17 s in the first run
}
DRY_TIMEOUTS = {"train": 240, "loader": 120, "ultralytics": 240, "augment": 120, "ddp": 150, "export": 90}
GPU_SIZES = dict(imgsz=640, batch=64, epochs=3, ddp_batch=32, ddp_epochs=2, row_min_s=40, loader_workers=[8, 14], loader_epochs=2,
                 augment_calls=20, unique=(512, 128), train_entries=4096, known_answer=None)
# the dry run: 16 unique train images linked twice (4 batches of 8 an epoch), 8 val; the known-answer rows' sleeps are
# long against a batch (~20-40 ms of CPU at imgsz 64) so the loader cannot be their limit
DRY_SIZES = dict(imgsz=64, batch=8, epochs=2, ddp_batch=2, ddp_epochs=2, row_min_s=5, loader_workers=[1, 2], loader_epochs=2,
                 augment_calls=3, unique=(16, 8), train_entries=32,
                 known_answer={"workers": 1, "consumer_s": 0.25, "stub": {"batches": 4, "start_s": 0.3, "batch_s": 0.05, "consumer_s": 0.1}})
GENERATED_SIZE = (480, 640)  # the generated images' sides in pixels (COCO-like: decoding and resizing cost what a real set's do)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for gpu_check.json and gpu_check.md")
    ap.add_argument("--dry-run", action="store_true", help="the CPU, tiny sizes: every step up to the CUDA calls")
    ap.add_argument("--data", help="a YOLO dataset folder with data.yaml, images/ and labels/ (default: the bundled shapes generator)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--full-grid", action="store_true", help="train part: also all 8 combinations of amp, channels_last, compile")
    ap.add_argument("--compile", default=None, help="compile= of the compile rows and the augmentation's compiled calls "
                                                    "(default: true; dry run: eager; false: none)")
    ap.add_argument("--augment-fn", default=AUGMENT_FN, help="module:function of the device-side augmentation (called as fn(batch))")
    ap.add_argument("--ultralytics-python", default=sys.executable, help="interpreter of the ultralytics part (one with ultralytics)")
    ap.add_argument("--work", help="work folder (runs, data view); default a temporary folder, removed unless --keep")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.parts.split(",")) - set(PARTS))
    if unknown:
        ap.error(f"--parts: unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    return args


def data_view(srcs: list[Path], dest: Path, counts: tuple[int | None, int | None], repeat: int) -> Path:
    """dest/images/{train,val} and dest/labels/{...}: per-file symlinks to the first `counts` images of `srcs` (None: all),
    each train image linked `repeat` times under distinct names (r<j>_s<k>_<name>: no cache of either library can merge
    them), and dest/data.yaml; label caches land in dest, never in a source."""
    import yaml

    names = yaml.safe_load((srcs[0] / "data.yaml").read_text())["names"]
    for split, count in zip(("train", "val"), counts, strict=True):
        images = [(k, p) for k, src in enumerate(srcs) for p in sorted((src / "images" / split).iterdir())
                  if p.suffix.lower() in (".jpg", ".jpeg", ".png")][:count]
        for kind in ("images", "labels"):
            (dest / kind / split).mkdir(parents=True, exist_ok=True)
        for j in range(repeat if split == "train" else 1):
            for k, image in images:
                name = f"r{j}_s{k}_{image.stem}"
                (dest / "images" / split / f"{name}{image.suffix}").symlink_to(image.resolve())
                label = srcs[k] / "labels" / split / f"{image.stem}.txt"
                if label.is_file():
                    (dest / "labels" / split / f"{name}.txt").symlink_to(label.resolve())
    yaml_path = dest / "data.yaml"
    yaml_path.write_text(yaml.safe_dump({"path": str(dest), "train": "images/train", "val": "images/val", "names": names}))
    return yaml_path


def generate(root: Path, n_train: int, n_val: int) -> tuple[list[Path], dict]:
    """The bundled shapes generator, one process per CPU (at most 16), each writing its share under root/part<k> with its
    own seed; (the part folders, what it cost)."""
    procs = max(1, min(os.cpu_count() or 1, 16, n_train))
    code = ("import sys, cv2; cv2.setNumThreads(1); from yolo_cb.data.synthetic import generate_shapes; "
            f"generate_shapes(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), seed=int(sys.argv[4]), min_size={GENERATED_SIZE[0]}, "
            f"max_size={GENERATED_SIZE[1]})")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]), "OMP_NUM_THREADS": "1"}
    start, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    roots = [root / f"part{k}" for k in range(procs)]
    shares = [(n_train * (k + 1) // procs - n_train * k // procs, n_val * (k + 1) // procs - n_val * k // procs) for k in range(procs)]
    running = [subprocess.Popen([sys.executable, "-c", code, str(r), str(t), str(v), str(k)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True) for k, (r, (t, v)) in enumerate(zip(roots, shares, strict=True))]
    for proc in running:
        _, err = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"generating the shapes set failed: {err[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime
    return roots, {"generated": [n_train, n_val], "procs": procs, "generate_s": round(time.perf_counter() - start, 2),
                   "generate_cpu_ms_per_image": round(cpu_s * 1e3 / (n_train + n_val), 1), "image_sides": list(GENERATED_SIZE)}


def dataset(args: argparse.Namespace, work: Path, sizes: dict) -> tuple[Path, Path, str, dict]:
    """(the timed set's YAML: >= sizes["train_entries"] train images by repeated links; the unique set's YAML (DDP, export,
    augment); where they come from; the setup's figures)."""
    start = time.perf_counter()
    if args.data:
        src = Path(args.data).resolve()
        if not (src / "data.yaml").is_file():
            raise SystemExit(f"--data {args.data}: no data.yaml there (a YOLO dataset folder has data.yaml, images/, labels/)")
        srcs, setup, counts = [src], {}, sizes["unique"] if args.dry_run else (None, None)
        source = str(src)
    else:
        counts = sizes["unique"]
        srcs, setup = generate(work / "shapes", *counts)
        source = f"generated shapes ({counts[0]} train / {counts[1]} val, {GENERATED_SIZE[0]}-{GENERATED_SIZE[1]} px)"
    small = data_view(srcs, work / "data_small", counts, 1)
    unique = len(list((work / "data_small" / "images" / "train").iterdir()))
    repeat = max(1, -(-sizes["train_entries"] // max(unique, 1)))
    big = data_view(srcs, work / "data", counts, repeat)
    setup.update(unique_train=unique, repeat=repeat, train_entries=unique * repeat, setup_s=round(time.perf_counter() - start, 2))
    return big, small, f"{source}; each train image linked {repeat} times: {unique * repeat} train images", setup


def compile_setting(args: argparse.Namespace):
    """compile= of the compile rows and the augmentation's compiled calls: --compile, else inductor (dry run: eager)."""
    value = args.compile if args.compile is not None else ("eager" if args.dry_run else True)
    return {"true": True, "false": False}.get(str(value).lower(), value)


def train_configs(args: argparse.Namespace) -> list[dict]:
    """Our defaults (cfg/default.yaml's amp, channels_last, compile: what a user gets, and the row compared with
    Ultralytics) first; --full-grid adds the 8 combinations of the three (not in the 9-minute budget: rows past the
    part's time are recorded as skipped)."""
    import yaml

    defaults = yaml.safe_load((ROOT / "cfg" / "default.yaml").read_text())
    rows = [{key: defaults[key] for key in ("amp", "channels_last", "compile")}]
    if args.full_grid:
        compiled = compile_setting(args)
        rows += [{"amp": a, "channels_last": c, "compile": k and compiled} for a in (True, False) for c in (False, True) for k in (False, True)]
    return rows


def make_spec(args: argparse.Namespace, work: Path, data: tuple[Path, Path], cuda: bool) -> dict:
    """What every part reads: sizes, settings (the same for both libraries), the two data YAMLs."""
    sizes = DRY_SIZES if args.dry_run else GPU_SIZES
    device = "0" if cuda else "cpu"
    workers = 1 if args.dry_run else min(8, os.cpu_count() or 1)
    common = dict(data=str(data[0]), imgsz=sizes["imgsz"], batch=sizes["batch"], epochs=sizes["epochs"], workers=workers, device=device,
                  cache="ram", val=True, plots=False, close_mosaic=0, project=str(work / "runs"), exist_ok=True, seed=0, verbose=False)
    ours = {**common, "mlflow": False, "tensorboard": False, "onnx_check": False}
    theirs = {**common, "amp": True, "pretrained": False, "project": str(work / "runs_ultralytics")}
    from importlib.util import find_spec

    return {**sizes, "dry": args.dry_run, "cuda": cuda, "device": device, "device_name": "cuda" if cuda else "cpu", "data": str(data[0]),
            "data_small": str(data[1]), "out": str(work), "train_settings": ours, "train_configs": train_configs(args),
            "ultralytics_settings": theirs, "simplify": find_spec("onnxslim") is not None, "compile": compile_setting(args),
            "augment_fn": args.augment_fn, "deadline": 0.0, "best_pt": None}


def run_part(name: str, spec: dict, work: Path, timeout: float, python: str) -> dict:
    """One part in its own process group, killed at `timeout`; what it wrote, and how it ended."""
    spec = {**spec, "deadline": time.time() + timeout - 10}
    spec_path, result_path, log_path = (work / f"part_{name}{suffix}" for suffix in (".spec.json", ".json", ".log"))
    spec_path.write_text(json.dumps(spec, indent=1))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "PYTHONUNBUFFERED": "1", "YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(work / "ultralytics_config")}
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([python, str(ROOT / "benchmarks" / "gpu_parts.py"), name, str(spec_path), str(result_path)],
                                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
            status = "ok" if code == 0 else f"exit code {code}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the part and every process it started (DDP workers, loader workers)
            proc.wait()
            status = f"timeout after {timeout:.0f} s"
    written = json.loads(result_path.read_text()) if result_path.is_file() else {"rows": [], "checks": {}}
    tail = log_path.read_text(errors="replace").splitlines()[-25:]
    return {"status": status, "seconds": round(time.perf_counter() - start, 1), "timeout_s": timeout, **written,
            "log_tail": tail if status != "ok" or any(r.get("status") == "error" for r in written["rows"]) else []}


def machine(cuda: bool) -> dict:
    """Date, versions and the device (torch is imported only on a GPU run: the dry run's orchestrator stays light)."""
    import platform
    from importlib.metadata import version

    info = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "torch": version("torch"),
            "python": platform.python_version(), "cpus": os.cpu_count(), "cuda": None, "bf16": False,
            "device": f"CPU ({platform.processor() or platform.machine()})"}
    if cuda:
        import torch

        info.update(cuda=torch.version.cuda, device=torch.cuda.get_device_name(0), bf16=bool(torch.cuda.is_bf16_supported()))
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        info["commit"] = None
    return info


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    cuda = False
    if not args.dry_run:
        import torch

        cuda = torch.cuda.is_available()
    if not cuda and not args.dry_run:
        print("gpu_check: no CUDA device here; run with --dry-run for the CPU check", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="yolo_cb_gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        return run_all(args, out, work, cuda, started)
    finally:
        if not args.keep and not args.work:
            shutil.rmtree(work, ignore_errors=True)


def run_all(args: argparse.Namespace, out: Path, work: Path, cuda: bool, started: float) -> int:
    sizes = DRY_SIZES if args.dry_run else GPU_SIZES
    big, small, source, setup = dataset(args, work, sizes)
    spec = make_spec(args, work, (big, small), cuda)
    timeouts = DRY_TIMEOUTS if args.dry_run else GPU_TIMEOUTS
    report = {"dry_run": args.dry_run, "command": " ".join([Path(sys.executable).name, *sys.argv]), "data": source, "setup": setup,
              "machine": machine(cuda), "total_budget_s": None if args.dry_run else GPU_TOTAL_S, "parts": {}}
    for name in [p for p in PARTS if p in args.parts.split(",")]:
        left = (started + GPU_TOTAL_S - time.perf_counter() - 5) if not args.dry_run else timeouts[name]
        if left < 15:  # the 9 minutes are spent: the part is recorded, not run
            report["parts"][name] = {"status": f"skipped: the run's {GPU_TOTAL_S} s are spent", "seconds": 0, "timeout_s": 0, "rows": [], "checks": {}}
            continue
        python = args.ultralytics_python if name == "ultralytics" else sys.executable
        report["parts"][name] = part = run_part(name, spec, work, min(timeouts[name], left), python)
        if name == "train":
            spec["best_pt"] = part["checks"].get("best_pt")
        print(f"[gpu_check] {name}: {part['status']} in {part['seconds']} s, {len(part['rows'])} row(s)", flush=True)
    report["total_s"] = round(time.perf_counter() - started, 1)
    ratios(report)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    table = markdown(report)
    (out / "gpu_check.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
