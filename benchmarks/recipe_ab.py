"""Recipe variants of one yolo-cb model side by side: the per-epoch mAP50-95 of each, on one dataset.

    python benchmarks/recipe_ab.py --data DIR_OR_YAML [--model yolocb-n.yaml] [--epochs 6] [--imgsz 256]
                                   --variant NAME KEY=VALUE ... [--variant NAME KEY=VALUE ...] [--out runs/bench/recipe_ab]

Each variant is the equal recipe of benchmarks/vs_ultralytics.py (batch 16, nbs 16, AdamW lr0 0.002, 1 warmup epoch,
workers 0, seed 0, the last 3 epochs without mosaic when epochs > 3) with its KEY=VALUE settings on top; a variant with
no settings is that recipe itself; `model=PATH` in a variant trains that model YAML instead of --model (an architecture
A/B in one call); `tree=PATH` runs that variant on the yolo-cb source tree at PATH (a code A/B: `git worktree add
/tmp/before <commit>`, then `--variant before tree=/tmp/before --variant after`). All variants start at once, each pinned to its own core with one thread (through
vs_ultralytics.py's worker), so on 2 cores run two variants at a time. Prints the curves as a markdown table.
DIR_OR_YAML: a YOLO dataset folder with data.yaml (e.g. ../shared/datasets/shapes or one made by make_datasets.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.vs_ultralytics import EQUAL, ROOT, SWITCHES, _yaml_scalar, dataset_view, run_group  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--model", default="yolocb-n.yaml")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--imgsz", type=int, default=256)
    ap.add_argument("--variant", nargs="+", action="append", required=True, metavar="NAME [KEY=VALUE ...]")
    ap.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"))
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "recipe_ab")
    a = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    base = {**EQUAL, "epochs": a.epochs, "imgsz": a.imgsz, "close_mosaic": 3 if a.epochs > 3 else 0, **SWITCHES["yolo_cb"]}
    tmp, jobs = Path(tempfile.mkdtemp(prefix="recipe_ab_")), []
    for i, (name, *items) in enumerate(a.variant):
        work = tmp / name
        settings = {**base, **{k: _yaml_scalar(v) for k, v in (s.split("=", 1) for s in items)}}
        model = str(settings.pop("model", a.model))  # the worker runs in a temp folder: a relative YAML path made absolute
        model = str(Path(model).resolve()) if Path(model).is_file() else model
        tree = str(Path(settings.pop("tree", ROOT)).resolve())  # the yolo-cb source this variant imports
        spec = {"lib": "yolo_cb", "model": model, "data": str(dataset_view(work / "data", False, source=a.data)),
                "project": str(a.out.resolve() / name), "settings": settings, "core": cores[i % len(cores)],
                "result": str(work / "result.json"), "tree": tree}
        (work / "spec.json").write_text(json.dumps(spec, indent=1))
        a.out.mkdir(parents=True, exist_ok=True)
        jobs.append({"lib": "yolo_cb", "label": name, "python": a.python, "spec": work / "spec.json", "core": spec["core"],
                     "log": a.out / f"{name}.log", "cwd": work, "items": items})
    run_group(jobs)
    curves = {}
    for job, (name, *_items) in zip(jobs, a.variant, strict=True):
        result = Path(job["cwd"]) / "result.json"
        curves[name] = json.loads(result.read_text())["curve"] if result.exists() else []
    shutil.rmtree(tmp, ignore_errors=True)  # symlinks, label caches and specs only
    print(f"\n`{' '.join(sys.argv)}`\n")
    print("| epoch | " + " | ".join(f"{n} ({' '.join(j['items']) or 'recipe'})" for n, j in zip(curves, jobs, strict=True)) + " |")
    print("|---:|" + "---:|" * len(curves))
    for e in range(1, a.epochs + 1):
        cells = [next((f"{c['map']:.3f}" for c in curve if c["epoch"] == e), "") for curve in curves.values()]
        print(f"| {e} | " + " | ".join(cells) + " |")
    print("| s / epoch (train + val) | " + " | ".join(f"{c[-1]['t'] / len(c):.1f}" if c else "failed" for c in curves.values()) + " |")
    (a.out / "results.json").write_text(json.dumps({"command": sys.argv, "curves": curves}, indent=1))


if __name__ == "__main__":
    main()
