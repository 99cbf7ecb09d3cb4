"""Which files of a run are written, and when: the checkpoints (`Saver`) and results.csv (`ResultsLog`), parts of the
training recipe the loop calls by name.

last.pt after every epoch (and every save_steps optimizer steps), best.pt when the monitored metric improves,
epoch{N}.pt every save_period and after each epoch of save_epochs, top-k best_epoch{N}.pt by the monitored metric,
initial.pt before the first epoch (save_initial). An epoch's checkpoint is serialized and written (fsync) once, as
last.pt; best.pt, epoch{N}.pt and best_epoch{N}.pt of that epoch are hard links of it (copies where links fail).

The files are written before on_model_save fires (Ultralytics' order), so what a callback changes later (its
state_dict in on_fit_epoch_end, or an LR there) goes into the next epoch's files, and when the loop ends into the
closing last.pt (`save_closing`), the loop's last step: a run that stops, or ends, keeps every epoch's update; a kill
in between loses only what changed since the last checkpoint.

results.csv has one row per epoch (epoch, time, train losses, metrics, val losses, LRs), added before the checkpoint and
stored in it, so a run killed right after last.pt still has its rows, and a resume rewrites results.csv from them (a
kill may have cut the file short).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from yolo_cb.checkpoints.checkpoint import save_checkpoint
from yolo_cb.utils.files import atomic_link, atomic_write_text


class EpochOutcome(NamedTuple):
    """What decides an epoch's files: the epoch (0-based), whether the monitored metric improved, its value when this
    epoch validated (else None)."""

    epoch: int
    improved: bool
    monitored: float | None


class Saver:
    """Writes the checkpoint files of a run into its weights folder; keeps the top-k list as its state."""

    def __init__(self, args: Any):
        self.args = args
        self.topk: list[tuple[float, int]] = []  # (monitored value, epoch) of the kept best_epoch{N}.pt files

    @property
    def active(self) -> bool:
        return bool(self.args.save)

    def save_initial(self, ckpt: bytes, wdir: Path) -> None:
        save_checkpoint(ckpt, Path(wdir) / "initial.pt")

    def save_step(self, ckpt: bytes, wdir: Path) -> None:
        """save_steps: a mid-epoch last.pt, from which a resume continues after this batch."""
        save_checkpoint(ckpt, Path(wdir) / "last.pt")

    def save_epoch(self, ckpt: bytes, wdir: Path, outcome: EpochOutcome, best_first: Callable[[float], Any]) -> None:
        """last.pt, then the epoch's other files as hard links of it."""
        wdir, n = Path(wdir), outcome.epoch + 1
        last = wdir / "last.pt"
        save_checkpoint(ckpt, last)
        copies = ["best.pt"] if outcome.improved else []
        period = self.args.save_period
        if (period > 0 and n % period == 0) or n in (self.args.save_epochs or ()):
            copies.append(f"epoch{n}.pt")
        if self._keep_topk(wdir, outcome, best_first):
            copies.append(f"best_epoch{n}.pt")
        for name in copies:
            atomic_link(last, wdir / name, ckpt)

    def save_closing(self, checkpoint: Callable[[], bytes], wdir: Path) -> None:
        """The loop's last step: the epochs' last.pt again as the run ends (after the last on_fit_epoch_end), when an epoch
        wrote one (a save_model override may write none); the epoch's links keep theirs."""
        last = Path(wdir) / "last.pt"
        if last.is_file():
            save_checkpoint(checkpoint(), last)

    def _keep_topk(self, wdir: Path, outcome: EpochOutcome, best_first: Callable[[float], Any]) -> bool:
        """Update the top-k list, deleting the files that left it; whether this epoch's best_epoch{N}.pt is to be written."""
        k = self.args.save_topk
        if k <= 0 or outcome.monitored is None:
            return False
        entry = (float(outcome.monitored), outcome.epoch + 1)
        self.topk.append(entry)
        self.topk.sort(key=lambda item: best_first(item[0]))
        kept = entry in self.topk[:k]
        for _, epoch in self.topk[k:]:
            (wdir / f"best_epoch{epoch}.pt").unlink(missing_ok=True)
        self.topk = self.topk[:k]
        return kept

    def state_dict(self) -> dict:
        return {"topk": [[f, e] for f, e in self.topk]}

    def load_state_dict(self, state: dict) -> None:
        self.topk = [(float(f), int(e)) for f, e in state.get("topk", [])]


class ResultsLog:
    """The rows of results.csv, written whole (atomically) after each epoch."""

    def __init__(self):
        self.rows: list[dict[str, str]] = []

    def add(self, row: dict) -> None:
        """This epoch's row (an EpochRecord's); a resumed run replaces the rows of epochs it repeats."""
        self.rows = [r for r in self.rows if int(float(r["epoch"])) < row["epoch"]]
        self.rows.append({k: f"{v:.6g}" if isinstance(v, float) else str(v) for k, v in row.items()})

    def resume(self, save_dir: Path, start_epoch: int) -> None:
        """On resume: the rows up to the resumed epoch, from the checkpoint (or, for a checkpoint without rows, the file)."""
        if not self.rows:
            self.rows = read_results(Path(save_dir) / "results.csv")
        self.rows = [r for r in self.rows if int(float(r["epoch"])) <= start_epoch]
        if self.rows:
            self.write(save_dir)

    def write(self, save_dir: Path) -> None:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(self.rows[-1].keys()), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(self.rows)
        atomic_write_text(Path(save_dir) / "results.csv", buffer.getvalue())

    def state_dict(self) -> dict:
        return {"rows": [dict(r) for r in self.rows]}

    def load_state_dict(self, state: dict) -> None:
        self.rows = [dict(r) for r in state.get("rows", [])]


def read_results(path: Path) -> list[dict]:
    if not Path(path).is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
