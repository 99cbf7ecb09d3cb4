"""The report of benchmarks/gpu_check.py: our images/s as a ratio of Ultralytics', the goals, and one markdown table."""

from __future__ import annotations

BASE_CONFIG = "amp=on channels_last=off compile=off"  # the recipe compared with Ultralytics (amp on, nothing else)
LOADER_GOAL = 1000.0  # images/s at 640 with mosaic on 16 cores (issue 34)
RATIO_GOAL = 1.0  # our train images/s over Ultralytics'


def ok_rows(report: dict, part: str) -> list[dict]:
    return [r for r in report["parts"].get(part, {}).get("rows", []) if r.get("status") == "ok"]


def ratios(report: dict) -> None:
    """Adds each Ultralytics row's `ratio` (our base row's images/s over its own) and report["summary"]."""
    ours = next((r["ips"] for r in ok_rows(report, "train") if r["config"] == BASE_CONFIG and r.get("ips")), None)
    versus = {}
    for row in ok_rows(report, "ultralytics"):
        if ours and row.get("ips") and row.get("kind") != "loader":
            row["ratio"] = ours / row["ips"]
            versus[row["model"]] = row["ratio"]
    loader = [r["ips"] for r in ok_rows(report, "loader") if r.get("ips")]
    theirs = {r["workers"]: r["ips"] for r in ok_rows(report, "ultralytics") if r.get("kind") == "loader" and r.get("ips")}
    loader_vs = {r["workers"]: r["ips"] / theirs[r["workers"]] for r in ok_rows(report, "loader") if r.get("workers") in theirs}
    report["summary"] = {"ours_ips": ours, "ratio_vs": versus, "ratio_goal": RATIO_GOAL, "loader_best_ips": max(loader) if loader else None,
                         "loader_ratio_vs_ultralytics": loader_vs,
                         "loader_goal": LOADER_GOAL,
                         "parts_ok": [n for n, p in report["parts"].items() if p["status"] == "ok"],
                         "parts_failed": {n: p["status"] for n, p in report["parts"].items() if p["status"] != "ok"}}


def fmt(value, digits: int = 1) -> str:
    return "" if value is None else f"{value:,.{digits}f}" if isinstance(value, float) else str(value)


def note(part: str, row: dict) -> str:
    """The last column: the row's own note, its error, or what else it measured."""
    if row.get("status") == "error":
        return row["error"].splitlines()[0].replace("|", "/")[:200]
    if row.get("note"):
        return row["note"].replace("|", "/")
    bits = []
    if row.get("amp"):
        bits.append(f"amp {row['amp']}")
    if row.get("timed_batches") is not None:
        bits.append(f"{row['timed_batches']} batches timed")
    if row.get("ratio"):
        bits.append(f"ours / this: **{row['ratio']:.2f}x**")
    if row.get("pinned") is not None:
        bits.append("pinned memory" if row["pinned"] else "not pinned (CPU)")
    if row.get("map50_95") is not None:
        bits.append(f"mAP50-95 {row['map50_95']:.3f}")
    return "; ".join(bits)


def markdown(report: dict) -> str:
    m = report["machine"]
    label = "**CPU DRY RUN: these are not GPU figures** (tiny sizes; they check that every step runs)" if report["dry_run"] else \
        f"GPU run on {m['device']}"
    lines = [f"GPU check (issue 34), {m['date']}: {label}", "",
             f"`{report['command']}`; torch {m['torch']}, CUDA {m['cuda']}, bf16 {m['bf16']}, {m['cpus']} CPUs, commit {m['commit']}; "
             f"data: {report['data']}", "",
             "| part | configuration | status | images/s | peak GPU MiB | final loss | notes |",
             "|:-----|:--------------|:-------|---------:|-------------:|-----------:|:------|"]
    for name, part in report["parts"].items():
        if part["status"] != "ok":
            lines.append(f"| {name} | (the part's process) | {part['status']} |  |  |  | {part['seconds']} s of {part['timeout_s']} s |")
        for row in part["rows"]:
            lines.append(f"| {name} | {row['config']} | {row['status']} | {fmt(row.get('ips'))} | {fmt(row.get('peak_mib'), 0)} | "
                         f"{fmt(row.get('loss'), 3)} | {note(name, row)} |")
    s = report.get("summary", {})
    versus = ", ".join(f"{k}: {v:.2f}x" for k, v in s.get("ratio_vs", {}).items()) or "no Ultralytics figure"
    lines += ["", f"Ours (amp only) as a ratio of Ultralytics' train images/s: {versus} (goal >= {RATIO_GOAL}x). "
              f"Best loader images/s: {fmt(s.get('loader_best_ips'))} (goal >= {LOADER_GOAL:.0f} at 640 on 16 cores). "
              f"Our loader over Ultralytics' per worker count: "
              + (", ".join(f"{w}: {v:.2f}x" for w, v in s.get("loader_ratio_vs_ultralytics", {}).items()) or "no Ultralytics figure") + ". "
              "Part times (s): " + ", ".join(f"{n} {p['seconds']}" for n, p in report["parts"].items()), ""]
    return "\n".join(lines)
