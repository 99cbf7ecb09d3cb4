"""Early stopping: the run ends when the monitored metric has not improved for `patience` epochs (0: never).

It reads the run's one best epoch (the epoch best.pt holds, `trainer.best_epoch`), so nothing keeps a second "best".
The loop asks it after each epoch's validation, before the checkpoint is written (training/trainer.py).
"""

from __future__ import annotations

LEGACY_STATE = "early_stopping"  # the callback that kept a best of its own before 0.1: its state in older checkpoints


class EarlyStop:
    """The patience rule; `patience` may be set by a control (trainer.patience) before the first epoch."""

    def __init__(self, patience: int):
        self.patience = patience

    @property
    def patience(self) -> int:
        return self._patience

    @patience.setter
    def patience(self, epochs: int) -> None:
        self._patience = check_patience(epochs)

    def reason(self, epoch: int, best_epoch: int | None, key: str, best: float | None) -> str | None:
        """Why the run stops after `epoch` (0-based), or None: no improvement of `key` since `best_epoch` for patience epochs."""
        if not self.patience or best_epoch is None or epoch - best_epoch < self.patience:
            return None
        shown = "none" if best is None else f"{best:.4f}"
        return f"early stopping: no improvement of {key} in {self.patience} epochs (best {shown} at epoch {best_epoch + 1})"


def check_patience(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"patience={value!r}: expected an integer >= 0 (epochs without improvement; 0 = never stop early)")
    return value


def legacy_best_epoch(callback_states: dict) -> int | None:
    """The best epoch an older checkpoint kept in its early_stopping callback's state (None: none recorded)."""
    state = (callback_states or {}).get(LEGACY_STATE) or {}
    return None if state.get("best_epoch") is None else int(state["best_epoch"])
