"""The report of benchmarks/gpu_check.py: our images/s over whole epochs as a ratio of Ultralytics', the goals, and one
markdown table."""

from __future__ import annotations

LOADER_GOAL = 1000.0  # images/s at 640 with mosaic on 16 cores (issue 34)
RATIO_GOAL = 1.3  # our training images/s over YOLO11n's, whole epochs at 640 (issue 58)


def ok_rows(report: dict, part: str, kind: str | None = None) -> list[dict]:
    return [r for r in report["parts"].get(part, {}).get("rows", []) if r.get("status") == "ok" and (kind is None or r.get("kind") == kind)]


def ratios(report: dict) -> None:
    """Adds each Ultralytics training row's `ratio` (our compared row's whole-epoch images/s over its own, and the same
    without the first epoch) and report["summary"]."""
    ours = next((r for r in ok_rows(report, "train", "train") if r.get("compared") and r.get("ips")), None)
    versus, versus_after_first = {}, {}
    for row in ok_rows(report, "ultralytics", "train"):
        if ours and row.get("ips"):
            row["ratio"] = versus[row["model"]] = ours["ips"] / row["ips"]
            if ours.get("ips_after_first") and row.get("ips_after_first"):
                versus_after_first[row["model"]] = ours["ips_after_first"] / row["ips_after_first"]
    loader = [r["ips"] for r in ok_rows(report, "loader", "loader") if r.get("ips")]
    theirs = {r["workers"]: r["ips"] for r in ok_rows(report, "ultralytics", "loader") if r.get("ips")}
    loader_vs = {r["workers"]: r["ips"] / theirs[r["workers"]] for r in ok_rows(report, "loader", "loader") if r.get("workers") in theirs}
    report["summary"] = {"ours_ips": ours and ours["ips"], "ratio_vs": versus, "ratio_vs_after_first": versus_after_first,
                         "ratio_goal": RATIO_GOAL, "loader_best_ips": max(loader) if loader else None,
                         "loader_ratio_vs_ultralytics": loader_vs, "loader_goal": LOADER_GOAL,
                         "parts_ok": [n for n, p in report["parts"].items() if p["status"] == "ok"],
                         "parts_failed": {n: p["status"] for n, p in report["parts"].items() if p["status"] != "ok"}}


def fmt(value, digits: int = 1) -> str:
    return "" if value is None else f"{value:,.{digits}f}" if isinstance(value, float) else str(value)


def seconds_list(values) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def note(row: dict) -> str:
    """The last column: the row's own note, its error, or what else it measured."""
    if row.get("status") == "error":
        return row["error"].splitlines()[0].replace("|", "/")[:200]
    if row.get("note"):
        return row["note"].replace("|", "/")
    epochs, bits = row.get("epochs") or [], []
    if row.get("amp"):
        bits.append(f"amp {row['amp']}")
    if epochs:
        what = "wait + step of each epoch's first batch" if row.get("kind") == "train" else "wait for each epoch's first batch"
        bits.append(f"{len(epochs)} epochs of {epochs[0]['batches']} batches; {what} (s): {seconds_list(e['first_batch_s'] for e in epochs)}")
    if epochs and "val_s" in epochs[0]:
        bits.append(f"validation + checkpoints (s): {seconds_list(e['val_s'] for e in epochs)}")
    if row.get("gap_s"):
        bits.append(f"between epochs (s): {seconds_list(row['gap_s'])}")
    if row.get("ips_after_first"):
        bits.append(f"{row['ips_after_first']:,.1f} images/s after the first epoch")
    if row.get("expected_ips") is not None:
        bits.append(f"known answer {row['expected_ips']:.1f} images/s ({row['expected_epoch_s']:.2f} s an epoch)")
    if row.get("expected_steady_ips") is not None:
        bits.append(f"known answer {row['expected_steady_ips']:.1f} images/s after each epoch's first batch (batch / sleep)")
    if row.get("ratio"):
        bits.append(f"ours / this: **{row['ratio']:.2f}x**")
    if row.get("pinned") is not None:
        bits.append("pinned memory, copied to the GPU" if row["pinned"] else "not pinned (CPU)")
    if row.get("map50_95") is not None:
        bits.append(f"mAP50-95 {row['map50_95']:.3f}")
    return "; ".join(bits)


def markdown(report: dict) -> str:
    m = report["machine"]
    label = "**CPU DRY RUN: these are not GPU figures** (tiny sizes; they check that every step runs and that the harness " \
            "sees what it reports)" if report["dry_run"] else f"GPU run on {m['device']}"
    setup = report.get("setup", {})
    lines = [f"GPU check (issues 34, 58), {m['date']}: {label}", "",
             f"`{report['command']}`; torch {m['torch']}, CUDA {m['cuda']}, bf16 {m['bf16']}, {m['cpus']} CPUs, commit {m['commit']}; "
             f"data: {report['data']}; setup {setup.get('setup_s')} s"
             + (f" (generating {sum(setup['generated'])} images on {setup['procs']} processes: {setup['generate_s']} s, "
                f"{setup['generate_cpu_ms_per_image']} CPU-ms an image)" if "generated" in setup else "")
             + f"; whole run {report.get('total_s')} s" + (f" of {report['total_budget_s']}" if report.get("total_budget_s") else ""), "",
             "| part | configuration | status | images/s, whole epochs | images/s, batches after each epoch's first | s per epoch | "
             "peak GPU MiB | final loss | notes |",
             "|:-----|:--------------|:-------|------:|------:|:------|------:|------:|:------|"]
    for name, part in report["parts"].items():
        if part["status"] != "ok":
            lines.append(f"| {name} | (the part's process) | {part['status']} |  |  |  |  |  | {part['seconds']} s of {part['timeout_s']} s |")
        for row in part["rows"]:
            epochs = row.get("epochs") or []
            lines.append(f"| {name} | {row['config']} | {row['status']} | {fmt(row.get('ips'))} | {fmt(row.get('steady_ips'))} | "
                         f"{seconds_list(e['epoch_s'] for e in epochs)} | {fmt(row.get('peak_mib'), 0)} | {fmt(row.get('loss'), 3)} | {note(row)} |")
    s = report.get("summary", {})
    versus = ", ".join(f"{k}: {v:.2f}x" for k, v in s.get("ratio_vs", {}).items()) or "no Ultralytics figure"
    after = ", ".join(f"{k}: {v:.2f}x" for k, v in s.get("ratio_vs_after_first", {}).items()) or "none"
    lines += ["", f"Ours (defaults) as a ratio of Ultralytics' training images/s over whole epochs: {versus} (goal >= {RATIO_GOAL}x "
              f"YOLO11n's); without the first epoch: {after}. Best loader images/s over whole epochs: {fmt(s.get('loader_best_ips'))} "
              f"(goal >= {LOADER_GOAL:.0f} at 640 on 16 cores). Our loader over Ultralytics' per worker count: "
              + (", ".join(f"{w}: {v:.2f}x" for w, v in s.get("loader_ratio_vs_ultralytics", {}).items()) or "no Ultralytics figure") + ". "
              "Part times (s): " + ", ".join(f"{n} {p['seconds']}" for n, p in report["parts"].items()), ""]
    return "\n".join(lines)
