"""GPU check (issue 34): one prepared run of what matters on a CUDA device, printed as one table.

    python benchmarks/gpu_check.py --out DIR [--data DIR] [--full-grid] [--ultralytics-python PY] [--keep]
    python benchmarks/gpu_check.py --dry-run --out DIR        # the same steps on the CPU, tiny sizes (the suite runs this)

Parts, each in its own process with a timeout (the whole fits in 9 minutes on a GPU; a part that fails records its
error and the rest go on):
1. train: 2 epochs of the default model (paths.DEFAULT_MODEL) at imgsz 640, batch 64, with the levers amp (bf16 where
   supported, else fp16 + GradScaler), channels_last and compile (torch.compile of the training forward) one at a time
   and all together (--full-grid: all 8): train images/s, peak GPU memory, final loss;
2. loader: the train loader alone (mosaic, cache=ram, pinned memory) with 0 / 4 / 8 / 14 workers: images/s;
3. ultralytics: its train loader alone (the loader part's settings and worker counts: ours over theirs per count), then
   YOLO11n and YOLO26n, same imgsz / batch / epochs / amp / workers / cache, timed by the same callbacks;
   our images/s (the amp-only row) as a ratio of theirs (a row says why when Ultralytics is not importable);
4. ddp: model.train(nproc=2) on the one GPU (nccl where it allows two ranks on one GPU, else gloo on the GPU), with a
   closure callback that records every batch per rank and sets trainer.stop on rank 1;
5. export: the first training's best.pt to ONNX, validated on the val split against PyTorch; a TensorRT engine from it,
   checked against ONNX Runtime, where tensorrt is importable.
--dry-run: the CPU, imgsz 64, 24 train / 8 val images, 1 epoch (DDP: 2, stopped in the first), compile through the
`eager` backend (dynamo traces, no code generation), workers 0 / 1. Writes DIR/gpu_check.json and DIR/gpu_check.md.

The dataset (--data, default ../shared/datasets/shapes, else the bundled shapes generator) is read through a folder of
symlinks in the work folder, so no label cache is written beside the images.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
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
from benchmarks.gpu_report import markdown, ratios  # noqa: E402

PARTS = ("train", "loader", "ultralytics", "ddp", "export")
# seconds, 525 in all (under 9 minutes): the first H200 run (2026-12-04) needed loader 33, ultralytics 48, ddp 28,
# export 17, and its train part ran out at 200 s after 3 of 6 rows, so train has the rest (ultralytics: + its loader rows)
GPU_TIMEOUTS = {"train": 320, "loader": 40, "ultralytics": 90, "ddp": 45, "export": 30}
DRY_TIMEOUTS = {"train": 180, "loader": 60, "ultralytics": 180, "ddp": 150, "export": 90}
GPU_SIZES = dict(imgsz=640, batch=64, epochs=2, ddp_batch=32, ddp_epochs=2, warm_batches=3, row_min_s=25, loader_workers=[0, 4, 8, 14], loader_batches=24)
DRY_SIZES = dict(imgsz=64, batch=8, epochs=1, ddp_batch=4, ddp_epochs=2, warm_batches=1, row_min_s=5, loader_workers=[0, 1], loader_batches=4)
DRY_IMAGES = (24, 8)  # train / val images of the dry run
SHARED_SHAPES = Path(os.environ.get("YOLO_CB_SHARED", ROOT.parent / "shared")) / "datasets" / "shapes"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for gpu_check.json and gpu_check.md")
    ap.add_argument("--dry-run", action="store_true", help="the CPU, tiny sizes: every step up to the CUDA calls")
    ap.add_argument("--data", help="a YOLO dataset folder with data.yaml, images/ and labels/ (default: ../shared/datasets/shapes)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--full-grid", action="store_true", help="train part: all 8 combinations of amp, channels_last, compile")
    ap.add_argument("--compile", default=None, help="compile= value of the compile rows (default: true; dry run: eager)")
    ap.add_argument("--ultralytics-python", default=sys.executable, help="interpreter of the ultralytics part (one with ultralytics)")
    ap.add_argument("--work", help="work folder (runs, data view); default a temporary folder, removed unless --keep")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.parts.split(",")) - set(PARTS))
    if unknown:
        ap.error(f"--parts: unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    return args


def data_view(src: Path, dest: Path, counts: tuple[int | None, int | None]) -> Path:
    """dest/images/{train,val} and dest/labels/{...} as per-file symlinks to src's first `counts` images (None: all), and
    dest/data.yaml: label caches land in dest, never in src."""
    import yaml

    names = yaml.safe_load((src / "data.yaml").read_text())["names"]
    for split, count in zip(("train", "val"), counts, strict=True):
        images = sorted(p for p in (src / "images" / split).iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))[:count]
        for kind in ("images", "labels"):
            (dest / kind / split).mkdir(parents=True, exist_ok=True)
        for image in images:
            (dest / "images" / split / image.name).symlink_to(image.resolve())
            label = src / "labels" / split / f"{image.stem}.txt"
            if label.is_file():
                (dest / "labels" / split / label.name).symlink_to(label.resolve())
    yaml_path = dest / "data.yaml"
    yaml_path.write_text(yaml.safe_dump({"path": str(dest), "train": "images/train", "val": "images/val", "names": names}))
    return yaml_path


def dataset(args: argparse.Namespace, work: Path) -> tuple[Path, str]:
    """The data YAML every part reads, and where it comes from."""
    src = Path(args.data) if args.data else SHARED_SHAPES
    counts = DRY_IMAGES if args.dry_run else (None, None)
    if (src / "data.yaml").is_file():
        return data_view(src.resolve(), work / "data", counts), str(src)
    if args.data:
        raise SystemExit(f"--data {args.data}: no data.yaml there (a YOLO dataset folder has data.yaml, images/, labels/)")
    from yolo_cb.data.synthetic import generate_shapes

    n_train, n_val = counts if args.dry_run else (512, 128)
    return generate_shapes(work / "shapes", n_train, n_val, seed=0), f"generated shapes ({n_train} train / {n_val} val)"


def train_configs(args: argparse.Namespace) -> list[dict]:
    """amp only (the recipe compared with Ultralytics) first, then each lever changed alone, then all of them."""
    compiled = args.compile if args.compile is not None else ("eager" if args.dry_run else True)
    compiled = {"true": True, "false": False}.get(str(compiled).lower(), compiled)
    if args.full_grid:
        return [{"amp": a, "channels_last": c, "compile": k and compiled} for a in (True, False) for c in (False, True) for k in (False, True)]
    base = {"amp": True, "channels_last": False, "compile": False}
    if args.dry_run:  # each lever's code path once
        return [base, {"amp": True, "channels_last": True, "compile": compiled}]
    return [base, {**base, "amp": False}, {**base, "channels_last": True}, {**base, "compile": compiled}, {**base, "cudnn_benchmark": True},
            {"amp": True, "channels_last": True, "compile": compiled, "cudnn_benchmark": True}]


def make_spec(args: argparse.Namespace, work: Path, data: Path, cuda: bool) -> dict:
    sizes = DRY_SIZES if args.dry_run else GPU_SIZES
    device = "0" if cuda else "cpu"
    workers = 0 if args.dry_run else min(8, os.cpu_count() or 1)
    common = dict(data=str(data), imgsz=sizes["imgsz"], batch=sizes["batch"], epochs=sizes["epochs"], workers=workers, device=device,
                  cache="ram", val=False, plots=False, close_mosaic=0, project=str(work / "runs"), exist_ok=True, seed=0, verbose=False)
    ours = {**common, "mlflow": False, "tensorboard": False, "onnx_check": False}
    theirs = {**common, "amp": True, "pretrained": False, "project": str(work / "runs_ultralytics")}
    from importlib.util import find_spec

    return {**sizes, "dry": args.dry_run, "cuda": cuda, "device": device, "data": str(data), "out": str(work), "train_settings": ours,
            "train_configs": train_configs(args), "ultralytics_settings": theirs, "simplify": find_spec("onnxslim") is not None,
            "deadline": 0.0, "best_pt": None}


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
        return run_all(args, out, work, cuda)
    finally:
        if not args.keep and not args.work:
            shutil.rmtree(work, ignore_errors=True)


def run_all(args: argparse.Namespace, out: Path, work: Path, cuda: bool) -> int:
    data, source = dataset(args, work)
    spec = make_spec(args, work, data, cuda)
    timeouts = DRY_TIMEOUTS if args.dry_run else GPU_TIMEOUTS
    report = {"dry_run": args.dry_run, "command": " ".join([Path(sys.executable).name, *sys.argv]), "data": source,
              "machine": machine(cuda), "parts": {}}
    for name in [p for p in PARTS if p in args.parts.split(",")]:
        python = args.ultralytics_python if name == "ultralytics" else sys.executable
        report["parts"][name] = part = run_part(name, spec, work, timeouts[name], python)
        if name == "train":
            spec["best_pt"] = part["checks"].get("best_pt")
        print(f"[gpu_check] {name}: {part['status']} in {part['seconds']} s, {len(part['rows'])} row(s)", flush=True)
    ratios(report)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    table = markdown(report)
    (out / "gpu_check.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
