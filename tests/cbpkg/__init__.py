"""Callbacks importable by path, for the CLI / YAML declaration tests and the kill/resume tests.

Callbacks that write a file write only to $CBPKG_LOG (a test's tmp_path); without it they refuse,
so no test can write into the checkout.
"""

import json
import os
import signal
from pathlib import Path

from yolo_cb.callbacks import register_callback


def _log_path() -> Path:
    path = os.environ.get("CBPKG_LOG")
    if not path:
        raise RuntimeError("cbpkg callbacks write only to $CBPKG_LOG (set it to a file in the test's tmp_path)")
    return Path(path)


def log_epoch(trainer):
    with open(_log_path(), "a") as f:
        f.write(json.dumps({"event": "on_fit_epoch_end", "epoch": trainer.epoch}) + "\n")


class Marker:
    """An object callback with state."""

    def __init__(self, tag="marker"):
        self.tag = tag
        self.count = 0

    def on_train_epoch_end(self, trainer):
        self.count += 1

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


@register_callback("test_marker")
def make_marker(tag="registered"):
    return Marker(tag)


def log_batch(trainer):
    with open(_log_path(), "a") as f:
        f.write(f"{trainer.epoch},{trainer.batch_i}\n")


def stop_now(trainer):
    """on_fit_epoch_end: end the run after this epoch (trainer.stop)."""
    trainer.stop = True


def kill_before_best(trainer):
    """on_pretrain_routine_start: SIGKILL this process at epoch $CBPKG_KILL_AT_EPOCH, after last.pt is written and
    before best.pt is (its next save_checkpoint or atomic_link call); a no-op without the variable."""
    if "CBPKG_KILL_AT_EPOCH" not in os.environ:
        return
    from yolo_cb.recipe import saver as builtin  # the saver writes the checkpoint files

    at, original, original_link = int(os.environ["CBPKG_KILL_AT_EPOCH"]), builtin.save_checkpoint, builtin.atomic_link

    def kill_at_best(path):
        if Path(path).name == "best.pt" and trainer.epoch == at and (Path(path).parent / "last.pt").is_file():
            os.kill(os.getpid(), signal.SIGKILL)

    def save(ckpt, path):
        kill_at_best(path)
        return original(ckpt, path)

    def link(source, path, data):  # best.pt of an epoch is a hard link of its last.pt
        kill_at_best(path)
        return original_link(source, path, data)

    builtin.save_checkpoint, builtin.atomic_link = save, link


def log_best_epoch(trainer):
    """on_train_start: log the epoch best.pt holds (or 'missing') to $CBPKG_LOG."""
    import torch

    best = trainer.wdir / "best.pt"
    epoch = torch.load(best, map_location="cpu", weights_only=True)["epoch"] if best.is_file() else "missing"
    with open(_log_path(), "a") as f:
        f.write(f"best.pt at start: {epoch}\n")


_val_starts = [0]


def signal_in_final_validation(validator):
    """on_val_start: send $CBPKG_SIGNAL (e.g. SIGTERM) to this process at the 2nd validation (the final one of a 1-epoch run)."""
    _val_starts[0] += 1
    if _val_starts[0] == 2:
        os.kill(os.getpid(), getattr(signal, os.environ["CBPKG_SIGNAL"]))


def signal_in_train_end(trainer):
    """on_train_end: send $CBPKG_SIGNAL to this process."""
    os.kill(os.getpid(), getattr(signal, os.environ["CBPKG_SIGNAL"]))


def half_every_two_epochs(epoch):
    """An LR schedule function (lr_scheduler=cbpkg:half_every_two_epochs): epoch -> multiplier of lr0."""
    return 0.5 ** (epoch // 2)


class FixedLR:
    """A callback class that replaces the LR schedule (lr_scheduler=cbpkg:FixedLR): every group at `lr` from the start."""

    def __init__(self, lr=0.0042):
        self.lr = lr

    def on_pretrain_routine_end(self, trainer):
        for group in trainer.optimizer.param_groups:
            group["lr"] = self.lr


class FaultProbe:
    """For the fault-tolerance tests; logs to $CBPKG_LOG one line per event:
    'start <node> <rank> <world> <start_epoch> <restart>' (on_train_start, node from $CBPKG_NODE, restart from torchrun),
    'batch <rank> <epoch>,<batch>' (after every batch) and 'end <rank>' (on_train_end).
    With $CBPKG_KILL_AT='epoch,batch' it sends its own process $CBPKG_KILL_SIGNAL (default SIGKILL) after that batch, on
    rank $CBPKG_KILL_RANK (default: any), and only in a first start (never after a torchrun restart)."""

    def _log(self, line: str) -> None:
        with open(_log_path(), "a") as f:
            f.write(line + "\n")

    def on_train_start(self, trainer):
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "-")
        self._log(f"start {os.environ.get('CBPKG_NODE', '-')} {trainer.rank} {trainer.world_size} {trainer.start_epoch} {restart}")

    def on_train_batch_end(self, trainer):
        self._log(f"batch {trainer.rank} {trainer.epoch},{trainer.batch_i}")
        kill_at, kill_rank = os.environ.get("CBPKG_KILL_AT"), os.environ.get("CBPKG_KILL_RANK")
        first_start = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if kill_at == f"{trainer.epoch},{trainer.batch_i}" and first_start and kill_rank in (None, str(trainer.rank)):
            os.kill(os.getpid(), getattr(signal, os.environ.get("CBPKG_KILL_SIGNAL", "SIGKILL")))

    def on_train_end(self, trainer):
        self._log(f"end {trainer.rank}")


def _order(label):
    def callback(trainer):
        with open(_log_path(), "a") as f:
            f.write(json.dumps({"label": label}) + "\n")

    callback.__name__ = f"order_{label}"
    return callback


order_a, order_b, order_c = _order("a"), _order("b"), _order("c")  # the CLI order test: fired in the order written
