"""The default callbacks every trainer has: progress, results.csv/png, checkpoints; early stopping's declared parameters.

Each is a registered callback object; the training loop itself only fires events.
"""

from __future__ import annotations

import copy
import csv
import io
import sys
import time
from pathlib import Path

import torch

from yolo_cb.callbacks.registry import register_callback
from yolo_cb.checkpoints.checkpoint import save_checkpoint, serialize_checkpoint
from yolo_cb.utils.files import atomic_link, atomic_write_text
from yolo_cb.utils.log import LOGGER
from yolo_cb.utils.results_plot import plot_results


@register_callback("progress")
class Progress:
    """A tqdm bar per epoch on a terminal; one plain line per epoch otherwise. Main process only."""

    rank_zero_only = True  # acts on rank 0 only (describe() says so; each method checks trainer.is_main)

    def __init__(self, stream=None):
        self.stream = stream
        self.bar = None
        self.epoch_start = 0.0

    def _enabled(self, trainer) -> bool:
        return trainer.is_main

    def on_train_epoch_start(self, trainer):
        if not self._enabled(trainer):
            return
        self.epoch_start = time.perf_counter()
        stream = self.stream or sys.stdout
        if stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=trainer.num_batches, file=stream, bar_format="{l_bar}{bar:10}{r_bar}", leave=True)
        if trainer.epoch == trainer.start_epoch:
            LOGGER.info(self.header(trainer))

    def header(self, trainer) -> str:
        names = ["Epoch", *trainer.loss_names, "Instances", "Size"]
        return "".join(f"{n:>11}" for n in names)

    def line(self, trainer) -> str:
        losses = "".join(f"{v:>11.4g}" for v in trainer.tloss)
        return f"{f'{trainer.epoch + 1}/{trainer.epochs}':>11}{losses}{trainer.batch_instances:>11}{trainer.batch_size_px:>11}"

    def on_train_batch_end(self, trainer):
        if self.bar is not None:
            self.bar.set_description(self.line(trainer))
            self.bar.update(1)

    def on_train_epoch_end(self, trainer):
        if not self._enabled(trainer):
            return
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        else:
            seconds = time.perf_counter() - self.epoch_start
            LOGGER.info(f"{self.line(trainer)}   {trainer.batch_i + 1}/{trainer.num_batches} batches, {seconds:.1f}s")

    def teardown(self, trainer):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


@register_callback("results_csv")
class ResultsCSV:
    """results.csv: one row per epoch (epoch, time, train losses, metrics, val losses, lrs); results.png at the end.

    The rows are this callback's checkpoint state: each epoch's row is made in on_model_save, before the checkpoint
    callback stores it in last.pt, so a run killed right after last.pt still has the row, and a resume rewrites
    results.csv from the checkpoint's rows.
    """

    rank_zero_only = True

    def __init__(self):
        self.rows: list[dict[str, str]] = []

    def on_model_save(self, trainer):
        if not trainer.is_main or not trainer.args.save:
            return
        row = trainer.epoch_record.row()
        self.rows = [r for r in self.rows if int(float(r["epoch"])) < row["epoch"]]  # a resumed run rewrites epochs it repeats
        self.rows.append({k: f"{v:.6g}" if isinstance(v, float) else str(v) for k, v in row.items()})

    def on_pretrain_routine_end(self, trainer):
        """On resume: results.csv from the checkpoint's rows (a kill may have cut the file short; a new run folder has none)."""
        if not trainer.is_main or not trainer.args.save or trainer.start_epoch == 0:
            return
        if not self.rows:  # a checkpoint from before rows were stored: keep what the file has
            self.rows = read_results(Path(trainer.save_dir) / "results.csv")
        self.rows = [r for r in self.rows if int(float(r["epoch"])) <= trainer.start_epoch]
        if self.rows:
            self._write(trainer)

    def on_fit_epoch_end(self, trainer):
        if not trainer.is_main or not trainer.args.save:
            return
        self._write(trainer)

    def _write(self, trainer):
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(self.rows[-1].keys()), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(self.rows)
        atomic_write_text(Path(trainer.save_dir) / "results.csv", buffer.getvalue())

    def on_train_end(self, trainer):
        if trainer.is_main and trainer.args.plots and trainer.args.save:
            plot_results(Path(trainer.save_dir) / "results.csv")

    def state_dict(self):
        return {"rows": [dict(r) for r in self.rows]}

    def load_state_dict(self, state):
        self.rows = [dict(r) for r in state.get("rows", [])]


def read_results(path: Path) -> list[dict]:
    if not Path(path).is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@register_callback("checkpoint")
class Checkpoint:
    """last.pt every epoch (and every save_steps optimizer steps), best.pt when the monitored metric improves, epoch{N}.pt
    every save_period and after each epoch of save_epochs, top-k best_epoch{N}.pt by the monitored metric, initial.pt
    before the first epoch (save_initial). The epoch's checkpoint is serialized and written (fsync) once, as last.pt;
    best.pt, epoch{N}.pt and best_epoch{N}.pt of that epoch are hard links of it (copies where links are not possible)."""

    # their on_model_save updates what the checkpoint stores: the next epoch's LR, the epoch's results row
    after = ("lr_schedule", "results_csv")
    rank_zero_only = True

    def __init__(self):
        self.topk: list[tuple[float, int]] = []  # (monitored value, epoch) of the kept top-k files

    def on_train_start(self, trainer):
        if trainer.is_main and trainer.args.save and trainer.args.save_initial and trainer.start_epoch == 0:
            save_checkpoint(serialize_checkpoint(trainer.checkpoint_dict(epoch=-1)), trainer.wdir / "initial.pt")  # epoch -1: no epoch trained yet

    def on_model_save(self, trainer):
        if not trainer.is_main or not trainer.args.save:
            return
        ckpt = serialize_checkpoint(trainer.checkpoint_dict())  # once, however many files it goes to
        last = trainer.wdir / "last.pt"
        save_checkpoint(ckpt, last)
        copies = []  # the same bytes under other names: hard links of last.pt (written and synced once)
        if trainer.improved:
            copies.append("best.pt")
        period = trainer.args.save_period
        if (period > 0 and (trainer.epoch + 1) % period == 0) or trainer.epoch + 1 in (trainer.args.save_epochs or ()):
            copies.append(f"epoch{trainer.epoch + 1}.pt")
        if self._keep_topk(trainer):
            copies.append(f"best_epoch{trainer.epoch + 1}.pt")
        for name in copies:
            atomic_link(last, trainer.wdir / name, ckpt)

    def on_train_batch_end(self, trainer):
        """save_steps: a mid-epoch last.pt (atomic), from which a resume continues after this batch."""
        if trainer.save_step_due and trainer.is_main and trainer.args.save:
            save_checkpoint(serialize_checkpoint(trainer.checkpoint_dict()), trainer.wdir / "last.pt")

    def _keep_topk(self, trainer) -> bool:
        """Update the top-k list, deleting the files that left it; whether this epoch's best_epoch{N}.pt is to be written."""
        k = trainer.args.save_topk
        if k <= 0 or trainer.monitor_value is None or trainer.metrics_epoch != trainer.epoch:
            return False
        self.topk.append((float(trainer.monitor_value), trainer.epoch + 1))
        self.topk.sort(key=lambda item: trainer.monitor.best_first(item[0]))
        kept = (float(trainer.monitor_value), trainer.epoch + 1) in self.topk[:k]
        for _, epoch in self.topk[k:]:
            (trainer.wdir / f"best_epoch{epoch}.pt").unlink(missing_ok=True)
        self.topk = self.topk[:k]
        return kept

    def state_dict(self):
        return {"topk": [[f, e] for f, e in self.topk]}

    def load_state_dict(self, state):
        self.topk = [(float(f), int(e)) for f, e in state.get("topk", [])]


@register_callback("early_stopping")
class EarlyStopping:
    """Early stopping's parameters, declared as a callback (`- early_stopping: {patience: 5}`, SuperGradients' and Keras'
    habit): `patience` replaces the setting, `restore_best_weights` (Keras' name) the restore_best setting, through the
    trainer's controls. Early stopping itself is a step of the loop (yolo_cb/recipe/early_stop.py): it needs no callback."""

    def __init__(self, patience: int | None = None, restore_best_weights: bool | None = None):
        if patience is not None and (isinstance(patience, bool) or not isinstance(patience, int) or patience < 0):
            raise ValueError(f"early_stopping: patience={patience!r}, expected an integer >= 0")
        if restore_best_weights is not None and not isinstance(restore_best_weights, bool):
            raise ValueError(f"early_stopping: restore_best_weights={restore_best_weights!r}, expected true or false")
        self.patience = patience
        self.restore = restore_best_weights

    def on_pretrain_routine_start(self, trainer):
        if self.patience is not None:
            trainer.patience = self.patience
        if self.restore is not None:
            trainer.restore_best = self.restore  # YOLO.train() keeps the weights it says


@register_callback("epoch_state")
class EpochState:
    """last.pt holds the callbacks' state as of the end of the epoch: a callback that updates its state in
    on_fit_epoch_end (after the checkpoint was written in on_model_save) has last.pt rewritten with it, so a resume
    does not lose that epoch's update. Runs after every other callback of its events."""

    after = ("*",)
    rank_zero_only = True

    def __init__(self):
        self.saved: dict | None = None  # the callbacks' state as the checkpoint callback stored it this epoch

    def on_model_save(self, trainer):
        self.saved = copy.deepcopy(trainer.callbacks.state_dict()) if trainer.is_main and trainer.args.save else None

    def on_fit_epoch_end(self, trainer):
        if self.saved is None:
            return
        if not same_state(trainer.callbacks.state_dict(), self.saved):
            save_checkpoint(serialize_checkpoint(trainer.checkpoint_dict()), trainer.wdir / "last.pt")
        self.saved = None


def same_state(a, b) -> bool:
    """Equality of two state dicts that may hold tensors."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


# the default callbacks, registered in this order; their own `after` / `before` say what else must hold
DEFAULTS = ("lr_schedule", "progress", "results_csv", "checkpoint", "epoch_state", "callback_record")
