"""The tables benchmarks/vs_ultralytics.py prints: curves, costs, time to each target and its ratio to Ultralytics'."""

from __future__ import annotations

import json
import sys
import time

TARGETS = (0.14, 0.35, 0.5)


def reached(curve: list[dict], target: float):
    return next((c for c in curve if c["map"] >= target), None)


def fmt_reach(run: dict, target: float) -> str:
    curve = run.get("curve") or []
    hit = reached(curve, target)
    if hit:
        return f"epoch {hit['epoch']}, {hit['t']:.0f} s"
    return f"not reached in {len(curve)} epoch{'s' * (len(curve) != 1)} ({curve[-1]['t']:.0f} s)" if curve else "no data"


def per_epoch(run: dict, key: str) -> str:
    curve = run.get("curve") or []
    if not curve:
        return "n/a"
    if key == "t":
        return f"{curve[-1]['t'] / len(curve):.1f}"
    return f"{sum(c['train_s'] for c in curve) / len(curve):.1f}"


def ratio(run: dict, runs: list[dict], target: float) -> str:
    """Our time to `target` over that of the Ultralytics run of the same group ("-" for Ultralytics' own column)."""
    if run["lib"] == "ultralytics":
        return "-"
    theirs = next((r for r in runs if r["lib"] == "ultralytics" and r["group"] == run["group"]), None)
    ours_hit, their_hit = reached(run.get("curve") or [], target), reached((theirs or {}).get("curve") or [], target)
    if ours_hit and their_hit:
        return f"{ours_hit['t'] / their_hit['t']:.2f}x"
    return "neither reached" if not (ours_hit or their_hit) else ("ours only" if ours_hit else "theirs only")


def markdown(recipe: str, runs: list[dict]) -> str:
    """Tables for one recipe: curves, then per-epoch costs and time to targets, then resolved settings."""
    heads = [r["title"] for r in runs]
    out = [f"### Recipe `{recipe}`: " + ("each library's defaults" if recipe == "defaults" else "one equal recipe"), ""]
    out += ["| epoch | " + " | ".join(f"{h} mAP50-95 | s" for h in heads) + " |",
            "|---:|" + "---:|---:|" * len(runs)]
    n = max((len(r.get("curve") or []) for r in runs), default=0)
    for e in range(1, n + 1):
        cells = []
        for r in runs:
            c = next((c for c in r.get("curve") or [] if c["epoch"] == e), None)
            cells += [f"{c['map']:.3f}", f"{c['t']:.0f}"] if c else ["", ""]
        out.append(f"| {e} | " + " | ".join(cells) + " |")
    if any(r.get("judged") for r in runs):
        out += judged_table(runs, heads, n)
    out += ["", "| | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(runs)]
    out.append("| seconds per epoch (train + val) | " + " | ".join(per_epoch(r, "t") for r in runs) + " |")
    out.append("| seconds per epoch (train only) | " + " | ".join(per_epoch(r, "train_s") for r in runs) + " |")
    out.append("| final mAP50-95 | " + " | ".join(f"{r['curve'][-1]['map']:.3f}" if r.get("curve") else "n/a" for r in runs) + " |")
    for target in TARGETS:
        out.append(f"| mAP50-95 ≥ {target} | " + " | ".join(fmt_reach(r, target) for r in runs) + " |")
    for target in TARGETS:
        out.append(f"| time to ≥ {target} / Ultralytics' | " + " | ".join(ratio(r, runs, target) for r in runs) + " |")
    out.append("| setup before epoch 1, s (not counted) | " + " | ".join(str(r.get("setup_s", "n/a")) for r in runs) + " |")
    keys = []
    for r in runs:
        keys += [k for k in r.get("resolved", {}) if k not in keys]
    out += ["", "<details><summary>settings each side resolved</summary>", "",
            "| setting | " + " | ".join(heads) + " |", "|---|" + "---|" * len(runs)]
    for k in keys:
        out.append(f"| {k} | " + " | ".join(str(r.get("resolved", {}).get(k, "—")) for r in runs) + " |")
    out += ["", "</details>", ""]
    return "\n".join(out)




def judged_table(runs: list[dict], heads: list[str], n: int) -> list[str]:
    """Both sides' epochs by one yardstick (--judge): pycocotools' mAP50-95 of each validation's detections, beside the
    mAP50-95 each library reported."""
    out = ["", "By one yardstick (`--judge`): pycocotools' COCOeval of the same validations (reported by the library -> "
           "pycocotools)", "", "| epoch | " + " | ".join(heads) + " |", "|---:|" + "---:|" * len(runs)]
    for e in range(1, n + 1):
        cells = []
        for r in runs:
            own = next((c["map"] for c in r.get("curve") or [] if c["epoch"] == e), None)
            judged = (r.get("judged") or {}).get(e) or (r.get("judged") or {}).get(str(e))
            cells.append(f"{own:.3f} -> **{judged[0]:.3f}**" if own is not None and judged else "")
        out.append(f"| {e} | " + " | ".join(cells) + " |")
    return out


def report(a, recipes, results, cores, concurrent, epochs, imgsz, out, t_all) -> None:
    """Print the markdown tables and save results.json with the versions and the total wall time."""
    meta = results["meta"]
    meta["total_wall_s"] = round(time.perf_counter() - t_all, 1)
    versions = {r["lib"]: r.get("version") for r in results["runs"] if r.get("version")}
    meta["versions"] = versions
    meta["torch"] = sorted({r.get("torch") for r in results["runs"] if r.get("torch")})
    (out / "results.json").write_text(json.dumps(results, indent=1))

    print("\n" + "=" * 100)
    print(f"\n`{meta['command']}`\n\nyolo-cb {versions.get('yolo_cb')}, Ultralytics {versions.get('ultralytics')}, torch "
          f"{', '.join(meta['torch'])}; {meta['cpu']}; {'each run pinned to its own core' if concurrent else 'one core, runs in turn'}"
          f" ({', '.join(map(str, cores))}), 1 thread; {meta['date']}; {epochs} epoch{'s' * (epochs != 1)}, imgsz {imgsz}"
          + (", QUICK smoke subset (32 train / 16 val images)" if a.quick else f", {meta['dataset']}") + "\n")
    for recipe in recipes:
        runs = [r for r in results["runs"] if r["recipe"] == recipe]
        print(markdown(recipe, runs))
    attempts = sum(len(r.get("network_attempts") or []) for r in results["runs"])
    print(f"network accesses blocked: {attempts}; total wall {meta['total_wall_s']:.0f} s; raw figures: {out / 'results.json'}")
    if any(r.get("rc") for r in results["runs"]):
        sys.exit(1)


