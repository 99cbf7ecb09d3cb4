"""The memory the device-side colour takes (issue 58 item 2): the peak resident memory, above the batch itself, of one
`model_input(batch, gains)` call (data/loading/device_colour.py: colour and /255), on the CPU, for a yolo-cb source tree.

    python benchmarks/colour_memory.py [--tree PATH] [--batch 32] [--imgsz 640]

Each measurement is a fresh process (the peak RSS of a process only grows), so trees compare side by side: run it once
with `--tree` at each checkout (`git worktree add --detach /tmp/before <commit>`). The batch is random uint8 pixels with
random gains; the output's checksum is printed so that two trees can be seen to compute the same thing. On a GPU the
same tensors are made, so the figure is what a batch of that size asks of the device's memory on top of the model's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, resource, sys, torch
sys.path.insert(0, sys.argv[1])
from yolo_cb.data.loading.device_colour import model_input
batch, imgsz = int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
images = torch.randint(0, 256, (batch, 3, imgsz, imgsz), dtype=torch.uint8)
gains = torch.rand(batch, 3, dtype=torch.float64) + 0.5
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = model_input(images, gains)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"peak_mb": (peak - before) / 1024, "output_mb": out.numel() * out.element_size() / 2**20,
                  "checksum": float(out.double().sum())}))
"""


def measure(tree: Path, batch: int, imgsz: int) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(tree), str(batch), str(imgsz)], capture_output=True, text=True,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    if done.returncode:
        sys.exit(f"{tree}: {(done.stderr.strip().splitlines() or ['no output'])[-1]} (a tree without device colour?)")
    return json.loads(done.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", type=Path, default=ROOT, help="the yolo-cb source tree to measure (default: this one)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--imgsz", type=int, default=640)
    a = ap.parse_args()
    result = measure(a.tree.resolve(), a.batch, a.imgsz)
    print(f"{a.tree}: batch {a.batch} x {a.imgsz}: peak {result['peak_mb']:.0f} MB above the batch "
          f"(of which the float output {result['output_mb']:.0f} MB), checksum {result['checksum']:.6g}")


if __name__ == "__main__":
    main()
