"""The trainer's run state, typed: where the run is, its losses, its latest metrics, its best epoch, whether it stops.

The trainer holds one RunState, privately (`_state`): the loop reads and writes its fields. The names callbacks read
(Ultralytics' `trainer.epoch`, `trainer.metrics`, `trainer.stop`, ...) are typed descriptors over these fields
(`state_field`); only the controls (CONTROLS, the one list of them) may be written. `trainer.state` is a read-only view.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, is_dataclass
from typing import Any, Generic, NamedTuple, TypeVar, overload

import torch

from yolo_cb.recipe.stop import StopCause
from yolo_cb.settings.controls import CONTROLS_HINT


@dataclass
class Progress:
    """Where the run is: epochs (0-based), batches of the current epoch, optimizer steps."""

    setup_done: bool = False  # model, loaders and optimizer are built: a checkpoint can be written
    epochs: int = 0  # epochs to train in all
    start_epoch: int = 0  # the first epoch this process trains (after a resume: the one after the checkpoint's)
    epoch: int = 0  # the current epoch
    completed_epoch: int = -1  # last epoch whose batches all ran (what a checkpoint's `epoch` means)
    batch_i: int = 0  # index of the current batch in its epoch
    batches_done: int = 0  # batches of the current epoch trained so far (a mid-epoch checkpoint's position)
    optimizer_steps: int = 0  # optimizer steps since the run began (save_steps counts these)
    stepped: bool = False  # an optimizer step since the last completed epoch: weights are no longer that epoch's
    save_step_due: bool = False  # the batch just ended with a save_steps multiple: the saver writes last.pt
    loop_done: bool = False  # every epoch ran: last.pt is final, an error or signal after this must not overwrite it
    validate_every_epoch: bool = False  # trainer.validate_each_epoch() was called: every epoch from then on validates
    mid_epoch: Any = None  # on a mid-epoch resume: where the first epoch continues (resume_state.MidEpoch)


@dataclass
class Losses:
    """The training losses: the last batch's items and the epoch's running mean (both detached, on the CPU)."""

    loss_items: torch.Tensor | None = None
    tloss: torch.Tensor | None = None


@dataclass
class Metrics:
    """The latest validated metrics and what follows from them."""

    values: dict[str, float] = field(default_factory=dict)  # trainer.metrics (NaN placeholders until the first validation)
    epoch: int | None = None  # the 0-based epoch they belong to (None: nothing validated yet)
    fitness: float | None = None
    monitor_value: float | None = None  # the monitored metric's latest validated value
    lr: dict[str, float] = field(default_factory=dict)  # lr/pg<i> at the end of the last epoch


@dataclass
class Best:
    """The best monitored value so far and the epoch whose weights best.pt holds."""

    fitness: float | None = None
    epoch: int | None = None
    improved: bool = False  # the epoch just validated improved on it (best.pt is written)


@dataclass
class Stop:
    """Whether the run ends at the next batch or epoch boundary, and why."""

    flag: bool = False
    cause: StopCause | None = None
    reason: str = ""
    restore_best: bool = True  # after early stopping the run ends on best.pt's weights (restore_best=, or a callback's choice)


@dataclass
class RunState:
    progress: Progress = field(default_factory=Progress)
    losses: Losses = field(default_factory=Losses)
    metrics: Metrics = field(default_factory=Metrics)
    best: Best = field(default_factory=Best)
    stop: Stop = field(default_factory=Stop)


# the run state's fields a control steers: a write through trainer.state names it
STEERED_BY = {"epochs": "trainer.end_after(epochs)", "flag": "trainer.stop = True or trainer.request_stop(cause, reason)",
              "cause": "trainer.request_stop(cause, reason) or trainer.withdraw_stop(cause)", "reason": "trainer.stop_reason",
              "validate_every_epoch": "trainer.validate_each_epoch()", "restore_best": "trainer.restore_best"}

T = TypeVar("T")


class TrainerName(Generic[T]):
    """A name callbacks read on the trainer, kept at `path` below it (_state.progress.epoch, _parts.model, ...). Only a
    control (`control=True`) may be written through it; a write of any other is an AttributeError naming the controls.
    Generic in the value's type: `epoch: TrainerName[int] = state_field(...)` reads as an int to a type checker."""

    def __init__(self, path: str, doc: str = "", control: bool = False):
        self.path, self.control, self.__doc__ = path.split("."), control, doc or f"trainer.{path}"
        self.name = self.path[-1]

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def _holder(self, obj: Any) -> Any:
        for step in self.path[:-1]:
            obj = getattr(obj, step)
        return obj

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> TrainerName[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...
    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(self._holder(obj), self.path[-1])

    def __set__(self, obj: Any, value: T) -> None:
        if not self.control:
            raise AttributeError(f"trainer.{self.name} is read-only (the run's {'.'.join(self.path).lstrip('_')}); {CONTROLS_HINT}")
        setattr(self._holder(obj), self.path[-1], value)


def state_field(group: str, name: str, doc: str = "", control: bool = False) -> TrainerName[Any]:
    """The run state's `<group>.<name>` (the trainer's private `_state`) under a trainer name."""
    return TrainerName(f"_state.{group}.{name}", doc, control)


def delegate(holder: str, name: str, doc: str = "", control: bool = False) -> TrainerName[Any]:
    """A collaborator's attribute under its usual name: the trainer's private `_<holder>.<name>` (a dotted holder:
    recipe.early_stop)."""
    return TrainerName(f"_{holder}.{name}", doc, control)


class ReadOnlyView:
    """`trainer.state`: the run state, readable; a write raises an AttributeError naming the control that steers it."""

    __slots__ = ("_of", "_path")

    def __init__(self, of: Any, path: str):
        object.__setattr__(self, "_of", of)
        object.__setattr__(self, "_path", path)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._of, name)
        return ReadOnlyView(value, f"{self._path}.{name}") if is_dataclass(value) else value

    def __setattr__(self, name: str, value: Any) -> None:
        steer = f"use {STEERED_BY[name]}" if name in STEERED_BY else CONTROLS_HINT
        raise AttributeError(f"trainer.{self._path}.{name} is read-only (the loop owns the run state; a write would skip "
                             f"the checks the controls make): {steer}")

    def __repr__(self) -> str:
        return f"ReadOnlyView({self._of!r})"


# Where an epoch's time goes, each a column of results.csv and a scalar of every logger (time/<phase>_ms). Host time:
# on a GPU, kernels run asynchronously and are counted where the host waits for them (the loss's copy to the CPU).
PHASES = ("data", "forward", "backward", "optimizer", "callbacks", "val")


class Clock:
    """The run's wall-clock time, each epoch's (on_train_epoch_start to on_fit_epoch_end, validation and saving
    included), and the epoch's phases (PHASES: seconds spent in each since the epoch began)."""

    def __init__(self):
        self.start = time.time()
        self.epoch_time: float | None = None  # seconds the last epoch took (set before on_fit_epoch_end)
        self.epoch_time_start: float | None = None
        self.phases: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.epoch_start = time.perf_counter()  # when the current epoch's phases began
        self.mark = self.epoch_start  # the end of the last timed span (the data wait runs from here to the next batch)

    def spent(self, phase: str, since: float) -> float:
        """Add the time from `since` to now to `phase`; returns now."""
        now = time.perf_counter()
        self.phases[phase] += now - since
        return now

    def phase_ms(self) -> dict[str, float]:
        """time/<phase>_ms of the current epoch so far, and time/epoch_ms: its wall time so far."""
        ms = {f"time/{name}_ms": round(1000 * seconds, 3) for name, seconds in self.phases.items()}
        return {**ms, "time/epoch_ms": round(1000 * (time.perf_counter() - self.epoch_start), 3)}

    @property
    def elapsed(self) -> float:
        return time.time() - self.start

    def on_event(self, event: str) -> None:
        if event == "on_train_epoch_start":
            self.epoch_time_start = time.time()
            self.phases = dict.fromkeys(PHASES, 0.0)
            self.epoch_start = time.perf_counter()
        elif event == "on_fit_epoch_end" and self.epoch_time_start is not None:
            self.epoch_time = time.time() - self.epoch_time_start


class RunContents(NamedTuple):
    """What a checkpoint is made of, and what a resume restores into: the run state, its parts (model, EMA, optimizer,
    criterion, data, batches: build.Parts), the step (scaler, last optimizer step), the settings, the recipe's parts
    (recipe/parts.py), the callbacks, the run folder, this rank and the number of ranks. The trainer hands its own over."""

    state: RunState
    parts: Any
    step: Any
    args: Any
    recipe: Any
    callbacks: Any
    save_dir: Any
    rank: int
    world_size: int
