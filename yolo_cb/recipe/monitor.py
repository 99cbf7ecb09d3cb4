"""The monitored metric (`monitor`, `monitor_mode`, `min_delta`): what picks best.pt, the top-k files and early stopping."""

from __future__ import annotations

import math

from yolo_cb.errors import ConfigError


class Monitor:
    """A metric key and the direction in which it improves; `improved(value, best)` is the one comparison every user shares."""

    def __init__(self, key: str = "fitness", mode: str = "auto", min_delta: float = 0.0):
        self.key = str(key)
        self.mode = ("min" if "loss" in self.key else "max") if mode == "auto" else mode  # losses shrink, scores grow
        self.min_delta = float(min_delta)

    @classmethod
    def from_args(cls, args) -> Monitor:
        return cls(args.monitor, args.monitor_mode, args.min_delta)

    def value(self, metrics: dict) -> float:
        if self.key not in metrics:
            raise ConfigError(f"invalid value for 'monitor': {self.key!r} is not a metric of this run; expected one of "
                              f"{', '.join(sorted(metrics))}")
        return float(metrics[self.key])

    def improved(self, value: float | None, best: float | None) -> bool:
        """`value` beats `best` by more than min_delta in the monitor's direction (any real value beats None; NaN never wins)."""
        if value is None or math.isnan(value):
            return False
        if best is None or math.isnan(best):
            return True
        return value > best + self.min_delta if self.mode == "max" else value < best - self.min_delta

    def best_first(self, value: float) -> float:
        """Sort key that puts the best value first."""
        return -value if self.mode == "max" else value

    def __repr__(self) -> str:
        return f"Monitor({self.key!r}, mode={self.mode!r}, min_delta={self.min_delta})"
