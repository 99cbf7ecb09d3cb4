"""Work lost per kill: train with resume=auto, kill -9 at random moments, restart, measure the training redone.

    python benchmarks/kill_recovery.py --kills 6                     # the default checkpoint interval (once per epoch)
    python benchmarks/kill_recovery.py --kills 6 --save-steps 4      # plus last.pt every 4 optimizer steps

Each start of `python -m yolo_cb train ... resume=auto` runs until a random moment, uniform over two epochs'
time after its first batch, then gets SIGKILL; the next start continues from last.pt. A callback (BatchClock)
logs when each batch ends. Per kill:
  redone  = seconds the killed start trained past the point the next start resumed from (training repeated),
  restart = seconds from the next start's launch to its first batch, less one batch (process start, imports,
            model build, checkpoint load): paid on every restart, whatever the checkpoint interval.
Outputs (runs, logs) go under --out (default /tmp/yolo_cb_kill_recovery).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class BatchClock:
    """Appends {"epoch", "batch", "t"} to $KILL_RECOVERY_LOG when each batch ends (rank 0 / single process)."""

    def on_train_batch_end(self, trainer):
        if trainer.is_main:
            with open(os.environ["KILL_RECOVERY_LOG"], "a") as f:
                f.write(json.dumps({"epoch": trainer.epoch, "batch": trainer.batch_i, "t": time.time()}) + "\n")


def read_clock(path: Path, since: float) -> list[dict]:
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["t"] >= since]


def write_data(out: Path, shapes: Path, n_train: int) -> Path:
    train = sorted((shapes / "images" / "train").glob("*.jpg"))[:n_train]
    val = sorted((shapes / "images" / "val").glob("*.jpg"))[:16]
    (out / "train.txt").write_text("\n".join(map(str, train)) + "\n")
    (out / "val.txt").write_text("\n".join(map(str, val)) + "\n")
    path = out / "shapes.yaml"
    path.write_text(f"path: {out}\ntrain: train.txt\nval: val.txt\nnames: [circle, rectangle, triangle, cross]\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=6)
    parser.add_argument("--save-steps", type=int, default=0, help="0 = the default: last.pt once per epoch")
    parser.add_argument("--images", type=int, default=256, help="train images (shapes); batch 16: images/16 batches an epoch")
    parser.add_argument("--imgsz", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    parser.add_argument("--out", type=Path, default=Path("/tmp/yolo_cb_kill_recovery"))
    parser.add_argument("--shapes", type=Path, default=ROOT.parent / "shared" / "datasets" / "shapes")
    opt = parser.parse_args()

    out = opt.out / f"save_steps{opt.save_steps}"
    out.mkdir(parents=True, exist_ok=True)
    clock = out / "clock.jsonl"
    clock.unlink(missing_ok=True)
    data = write_data(out, opt.shapes, opt.images)
    settings = dict(data=data, model="yolox-nano.yaml", imgsz=opt.imgsz, batch=16, nbs=16, epochs=1000, workers=0, val=False,
                    mlflow=False, tensorboard=False, onnx_check=False, plots=False, project=out / "runs", name="run", resume="auto",
                    save_steps=opt.save_steps, callbacks="benchmarks.kill_recovery:BatchClock")
    cmd = [sys.executable, "-m", "yolo_cb", "train", *[f"{k}={v}" for k, v in settings.items()]]
    env = {**os.environ, "KILL_RECOVERY_LOG": str(clock), "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    rng = random.Random(opt.seed)
    batches_per_epoch = -(-opt.images // 16)
    previous = None  # (kill time, that start's rows)
    epoch_s = batch_s = None
    results = []
    for start in range(opt.kills + 1):
        launched = time.time()
        with open(out / f"start{start}.log", "w") as log:
            proc = subprocess.Popen(cmd, cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT)
        while not read_clock(clock, launched) and proc.poll() is None:
            time.sleep(0.05)
        rows = read_clock(clock, launched)
        if not rows:
            sys.exit(f"start {start} ended without training; see {out / f'start{start}.log'}")
        if previous is not None:
            killed_at, killed_rows = previous
            resumed = (rows[0]["epoch"], rows[0]["batch"])
            times = sorted(r["t"] for r in killed_rows)
            if len(times) > 1:  # a start killed after its first batch keeps the previous estimate
                batch_s = (times[-1] - times[0]) / (len(times) - 1)
            before = [r["t"] for r in killed_rows if (r["epoch"], r["batch"]) < resumed]
            trained_from = max(before) if before else killed_rows[0]["t"] - batch_s
            results.append({"redone_s": killed_at - trained_from, "restart_s": rows[0]["t"] - launched - batch_s, "batch_s": batch_s,
                            "resumed_at": f"epoch {resumed[0] + 1} batch {resumed[1]}"})
            r = results[-1]
            print(f"kill {start}: redone {r['redone_s']:.1f} s, restart {r['restart_s']:.1f} s, resumed at {r['resumed_at']} "
                  f"({batch_s:.2f} s/batch)", flush=True)
        if start == opt.kills:
            proc.kill()
            proc.wait()
            break
        if epoch_s is None:  # the first start: train one epoch (the first last.pt) and time it
            while not [r for r in read_clock(clock, launched) if r["epoch"] >= 1] and proc.poll() is None:
                time.sleep(0.05)
            first_epoch = [r["t"] for r in read_clock(clock, launched) if r["epoch"] == 0]
            batch_s = (first_epoch[-1] - first_epoch[0]) / max(1, len(first_epoch) - 1)
            epoch_s = batch_s * batches_per_epoch
        deadline = time.time() + rng.uniform(0, 2 * epoch_s)  # a moment uniform over two epochs: any phase of the interval
        while time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        killed_at = time.time()
        proc.wait()
        previous = (killed_at, read_clock(clock, launched))

    redone = [r["redone_s"] for r in results]
    restart = [r["restart_s"] for r in results]
    batch_s = sum(r["batch_s"] for r in results) / len(results)
    print(f"\nsave_steps={opt.save_steps}, {batches_per_epoch} batches/epoch at {batch_s:.2f} s/batch "
          f"(epoch {batches_per_epoch * batch_s:.1f} s), {len(results)} kills")
    print(f"training redone per kill: mean {sum(redone) / len(redone):.1f} s, max {max(redone):.1f} s")
    print(f"restart overhead per kill: mean {sum(restart) / len(restart):.1f} s")


if __name__ == "__main__":
    main()
