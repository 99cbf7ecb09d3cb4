"""Stress check for the DDP tests (not part of the suite): run them N times in a row, idle and busy.

    .venv/bin/python scripts/stress_ddp.py --runs 30 --busy 0 2     # 30 idle runs, then 30 with two busy processes

"Busy" means that many `python -c "while True: pass"` processes run beside the tests; they are
started before and ended by PID after each phase. Prints one line per run and a summary per phase;
exit status 1 if any run failed. Failed runs keep their output in --log-dir.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def start_busy(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop_busy(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait()


def run_phase(busy: int, runs: int, tests: str, log_dir: Path) -> int:
    procs = start_busy(busy)
    passed = 0
    try:
        for i in range(1, runs + 1):
            started = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", tests],
                                  cwd=ROOT, capture_output=True, text=True)
            ok = proc.returncode == 0
            passed += ok
            if not ok:
                log = log_dir / f"busy{busy}_run{i}.log"
                log.write_text(proc.stdout + proc.stderr)
            print(f"busy={busy} run {i:>2}/{runs}: {'pass' if ok else 'FAIL (' + str(log) + ')'} in {time.monotonic() - started:.0f} s"
                  f" (load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        stop_busy(procs)
    print(f"busy={busy}: {passed}/{runs} passed", flush=True)
    return passed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30, help="runs per phase")
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 2], help="busy background processes per phase")
    parser.add_argument("--tests", default="tests/test_ddp.py", help="pytest target")
    parser.add_argument("--log-dir", type=Path, default=Path("runs/stress_ddp"), help="where failed runs' output goes")
    args = parser.parse_args()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    results = {busy: run_phase(busy, args.runs, args.tests, args.log_dir) for busy in args.busy}
    total, runs = sum(results.values()), args.runs * len(results)
    print(f"total: {total}/{runs} passed ({', '.join(f'busy={b}: {p}/{args.runs}' for b, p in results.items())})")
    return 0 if total == runs else 1


if __name__ == "__main__":
    sys.exit(main())
