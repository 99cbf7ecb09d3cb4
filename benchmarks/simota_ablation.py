"""SimOTA ablation: learning speed of yolo-cb's assignment deviations from Megvii's YOLOX, one switch at a time.

    python benchmarks/simota_ablation.py [--variants ours megvii ...] [--seeds 0 1] [--jobs 2] [--epochs 8]
                                         [--out runs/bench/simota_ablation.json] [--report-only]

Trains YOLOX-nano from scratch on ../shared/datasets/shapes with one fixed recipe (RECIPE below), once per variant and
seed, validating every epoch. A variant sets switches of the YOLOXLoss criterion (see yolo_cb/nn/yolox/loss.py, ASSIGNERS)
from an `on_pretrain_routine_end` callback, i.e. after the model (and its criterion) is built and before the first
batch; the switches the criterion actually trained with are recorded per run. Variants:

    ours              the default ("yolo-cb" preset)
    megvii            every switch set to Megvii's current YOLOX ("megvii" preset)
    center_radius     ours with center_radius 1.5 (Megvii's)
    box_prior         ours with box_prior False
    rescue_unmatched  ours with rescue_unmatched False
    outside_penalty, neither_penalty, max_log_wh   (also available; not in the default set: on the golden batch
                      they changed nothing)

Each run is its own subprocess (`nice -n 10`, OMP_NUM_THREADS=1, torch.set_num_threads(1)); at most --jobs run at once.
Per-run results go to <out stem>_runs/<variant>_seed<seed>.json (a finished run is not rerun unless --force), the
merged results to --out, and a markdown table of per-epoch mAP50-95, the final value and the area under the curve
(mean mAP50-95 over the epochs: the rectangle-rule area divided by the number of epochs) is printed. Seconds per run
are recorded but depend on machine load; they are not a result of this benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("YOLO_CB_SHARED", ROOT.parent / "shared"))
DATASET = SHARED / "datasets" / "shapes"
DEFAULT_OUT = ROOT / "runs" / "bench" / "simota_ablation.json"  # runs/ is git-ignored

RECIPE = dict(imgsz=256, epochs=8, batch=16, nbs=16, optimizer="AdamW", lr0=0.002, warmup_epochs=1.0, workers=0, seed=0,
              no_aug_epochs=2, val=True, val_period=1, mlflow=False, tensorboard=False, onnx_check=False, plots=False,
              exist_ok=True)

# Megvii's value of each switch (yolo_cb.nn.yolox.loss.ASSIGNERS["megvii"], repeated here so that a variant's meaning is fixed
# even if the presets change; the worker checks them against the presets and says so when they differ).
MEGVII = {"center_radius": 1.5, "box_prior": False, "outside_penalty": 1e6, "neither_penalty": False,
          "rescue_unmatched": False, "max_log_wh": None}
VARIANTS: dict[str, dict] = {"ours": {}, "megvii": dict(MEGVII), **{k: {k: v} for k, v in MEGVII.items()}}
DEFAULT_VARIANTS = ["ours", "megvii", "center_radius", "box_prior", "rescue_unmatched"]


# --- worker: one training run ----------------------------------------------------------------------------------------
def worker(variant: str, seed: int, epochs: int, result_path: Path) -> None:
    import torch

    torch.set_num_threads(1)
    from yolo_cb import YOLO
    from yolo_cb.nn.yolox.loss import ASSIGNERS

    if ASSIGNERS["megvii"] != MEGVII:
        print(f"[simota_ablation] WARNING: loss.ASSIGNERS['megvii'] {ASSIGNERS['megvii']} != this script's {MEGVII}",
              flush=True)
    switches = VARIANTS[variant]
    tmp = Path(tempfile.mkdtemp(prefix=f"simota_{variant}_s{seed}_"))
    data = tmp / "shapes.yaml"  # points at the shared dataset; nothing is copied
    data.write_text(f"path: {DATASET}\ntrain: images/train\nval: images/val\n"
                    "names: [circle, rectangle, triangle, cross]\n")
    curve: list[dict] = []
    record: dict = {}

    def set_switches(trainer) -> None:
        criteria = [trainer.criterion]
        ema_model = getattr(trainer.ema, "ema", None)
        if getattr(ema_model, "criterion", None) is not None:
            criteria.append(ema_model.criterion)  # only used for the val/*_loss figures; kept consistent anyway
        for criterion in criteria:
            for name, value in switches.items():
                if not hasattr(criterion, name):
                    raise AttributeError(f"criterion {type(criterion).__name__} has no SimOTA switch '{name}'")
                setattr(criterion, name, value)
        record["switches"] = trainer.criterion.switches()
        print(f"[simota_ablation] {variant} seed {seed}: {trainer.criterion!r}", flush=True)

    def on_train_start(trainer) -> None:
        record["t0"] = time.perf_counter()

    def on_fit_epoch_end(trainer) -> None:
        metrics = trainer.metrics or {}
        row = {"epoch": trainer.epoch + 1, "seconds": round(time.perf_counter() - record["t0"], 1),
               "map50_95": float(metrics.get("metrics/mAP50-95(B)", 0.0)),
               "map50": float(metrics.get("metrics/mAP50(B)", 0.0)),
               "train_loss": {k: round(float(v), 5) for k, v in trainer.label_loss_items(trainer.tloss).items()}
               if getattr(trainer, "tloss", None) is not None else None}
        curve.append(row)
        print(f"[simota_ablation] {variant} seed {seed} epoch {row['epoch']}: mAP50-95 {row['map50_95']:.4f} "
              f"({row['seconds']:.0f}s)", flush=True)

    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_pretrain_routine_end", set_switches)
    model.add_callback("on_train_start", on_train_start)
    model.add_callback("on_fit_epoch_end", on_fit_epoch_end)
    settings = {**RECIPE, "epochs": epochs, "seed": seed, "data": str(data), "project": str(tmp / "runs"),
                "name": f"{variant}_seed{seed}"}
    model.train(**settings)
    result = {"variant": variant, "seed": seed, "variant_switches": {k: v for k, v in switches.items()},
              "criterion_switches": record.get("switches"),
              "recipe": {k: v for k, v in settings.items() if k not in ("data", "project", "name")},
              "curve": curve, **summarise(curve)}
    result_path.parent.mkdir(parents=True, exist_ok=True)
    result_path.write_text(json.dumps(result, indent=1))


def summarise(curve: list[dict]) -> dict:
    scores = [row["map50_95"] for row in curve]
    return {"final": scores[-1] if scores else None, "auc": sum(scores) / len(scores) if scores else None,
            "seconds": curve[-1]["seconds"] if curve else None}


# --- driver ----------------------------------------------------------------------------------------------------------
def run_all(jobs_todo: list[tuple[str, int]], epochs: int, runs_dir: Path, max_jobs: int) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    pending, running = list(jobs_todo), []
    failed = []
    while pending or running:
        while pending and len(running) < max_jobs:
            variant, seed = pending.pop(0)
            stem = runs_dir / f"{variant}_seed{seed}"
            log = open(f"{stem}.log", "w")
            cmd = ["nice", "-n", "10", sys.executable, str(Path(__file__).resolve()), "--worker", variant,
                   "--seed", str(seed), "--epochs", str(epochs), "--result", f"{stem}.json"]
            print(f"start {variant} seed {seed} (log {stem}.log)", flush=True)
            running.append((variant, seed, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                            cwd=ROOT), log))
        time.sleep(5)
        for item in list(running):
            variant, seed, proc, log = item
            if proc.poll() is not None:
                log.close()
                running.remove(item)
                print(f"done  {variant} seed {seed}: exit {proc.returncode}", flush=True)
                if proc.returncode:
                    failed.append((variant, seed))
    if failed:
        print(f"FAILED runs (see their logs): {failed}", flush=True)


def load_results(runs_dir: Path, variants: list[str], seeds: list[int]) -> list[dict]:
    results = []
    for variant in variants:
        for seed in seeds:
            path = runs_dir / f"{variant}_seed{seed}.json"
            if path.is_file():
                results.append(json.loads(path.read_text()))
    return results


def describe(variant: str) -> str:
    if variant == "ours":
        return "ours (yolo-cb defaults)"
    if variant == "megvii":
        return "megvii (all switches Megvii's)"
    return f"ours, {variant}={VARIANTS[variant][variant]}"


def table(results: list[dict]) -> str:
    if not results:
        return "(no results)"
    epochs = max(len(r["curve"]) for r in results)
    head = "| variant | seed | " + " | ".join(f"ep {e}" for e in range(1, epochs + 1)) + " | final | AUC (mean) | final mAP50 |"
    lines = [head, "|---|---:|" + "---:|" * (epochs + 3)]
    for r in results:
        scores = [f"{row['map50_95']:.4f}" for row in r["curve"]] + [""] * (epochs - len(r["curve"]))
        lines.append(f"| {describe(r['variant'])} | {r['seed']} | " + " | ".join(scores)
                     + f" | {r['final']:.4f} | {r['auc']:.4f} | {r['curve'][-1]['map50']:.4f} |")
    by_variant: dict[str, list[dict]] = {}
    for r in results:
        by_variant.setdefault(r["variant"], []).append(r)
    if any(len(v) > 1 for v in by_variant.values()):
        lines += ["", "| variant | seeds | final (mean) | final (range) | AUC (mean) | AUC (range) |",
                  "|---|---:|---:|---|---:|---|"]
        for variant, rs in by_variant.items():
            finals, aucs = [r["final"] for r in rs], [r["auc"] for r in rs]
            lines.append(f"| {describe(variant)} | {len(rs)} | {sum(finals) / len(finals):.4f} | "
                         f"{min(finals):.4f}-{max(finals):.4f} | {sum(aucs) / len(aucs):.4f} | "
                         f"{min(aucs):.4f}-{max(aucs):.4f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=sorted(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--epochs", type=int, default=RECIPE["epochs"])
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (default 2)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="merged JSON (per-run files in <stem>_runs/)")
    parser.add_argument("--force", action="store_true", help="rerun runs whose result file already exists")
    parser.add_argument("--report-only", action="store_true", help="only merge and print existing results")
    parser.add_argument("--worker", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        worker(opts.worker, opts.seed, opts.epochs, opts.result)
        return

    if not DATASET.is_dir():
        sys.exit(f"dataset not found: {DATASET} (set YOLO_CB_SHARED)")
    runs_dir = opts.out.with_name(opts.out.stem + "_runs")
    runs_dir.mkdir(parents=True, exist_ok=True)
    todo = [(v, s) for s in opts.seeds for v in opts.variants
            if opts.force or not (runs_dir / f"{v}_seed{s}.json").is_file()]
    if todo and not opts.report_only:
        run_all(todo, opts.epochs, runs_dir, opts.jobs)
    results = load_results(runs_dir, opts.variants, opts.seeds)
    opts.out.write_text(json.dumps({"recipe": {**RECIPE, "epochs": opts.epochs}, "model": "yolox-nano.yaml",
                                    "dataset": str(DATASET), "results": results}, indent=1))
    print("\nmAP50-95 per epoch (val every epoch); AUC = mean mAP50-95 over the epochs\n")
    print(table(results))
    print(f"\nresults: {opts.out}")


if __name__ == "__main__":
    main()
