"""What a tune leaves in its folder: trials.csv, best_hyperparameters.yaml, three plots, and one progress line per trial.

Everything is rewritten from the study itself (so a resumed or shared study reports all its trials), atomically. The
writers read an Optuna study and its trials; a backend without one (Ray Tune, yolo_cb/tune/ray_backend.py) hands them
`Trials`, its finished trials as `TrialRow`s with the same fields.
"""

from __future__ import annotations

import csv
import io
import math
import shutil
import warnings
from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from yolo_cb.utils.files import atomic_write_text
from yolo_cb.utils.log import LOGGER
from yolo_cb.utils.plotting import _figure, _save

CSV_NAME = "trials.csv"
BEST_NAME = "best_hyperparameters.yaml"
PLOTS = ("tune_history.png", "tune_importance.png", "tune_parallel.png")
DONE_STATES = ("COMPLETE", "PRUNED", "FAIL")
METRIC_COLUMNS = ("metrics/mAP50(B)", "metrics/mAP50-95(B)")  # best.pt's validation at the trial's end, beside its fitness


class RowState(Enum):
    """The states of DONE_STATES, named as Optuna's TrialState names them (`trial.state.name`)."""

    COMPLETE = "COMPLETE"
    PRUNED = "PRUNED"
    FAIL = "FAIL"


@dataclass
class TrialRow:
    """One finished trial of a backend without an Optuna study, with the fields of Optuna's FrozenTrial the writers read."""

    number: int
    state: RowState
    value: float | None  # its fitness: best.pt's (complete), the last reported (pruned), None (failed)
    params: dict[str, Any]
    user_attrs: dict[str, Any] = field(default_factory=dict)  # run_dir, epochs, epochs_planned, metrics, error
    duration: timedelta | None = None


class Trials:
    """A backend's finished trials, read by the writers of this module as an Optuna study is."""

    def __init__(self, study_name: str, trials: list[TrialRow]):
        self.study_name, self.trials = study_name, sorted(trials, key=lambda t: t.number)
        self.user_attrs: dict[str, Any] = {}

    def get_trials(self, deepcopy: bool = False, states=None) -> list[TrialRow]:
        return list(self.trials)


def state(trial) -> str:
    return trial.state.name


def counts_as_done(trial) -> bool:
    """A finished trial that counts towards `iterations`: complete, pruned, or failed by its own error (not interrupted)."""
    return state(trial) in DONE_STATES and not trial.user_attrs.get("interrupted")


def completed(study) -> list:
    return [t for t in study.get_trials(deepcopy=False) if state(t) == "COMPLETE" and t.value is not None]


def best_trial(study):
    trials = completed(study)
    return max(trials, key=lambda t: t.value) if trials else None


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def progress_line(study, trial, iterations: int) -> str:
    done = sum(counts_as_done(t) for t in study.get_trials(deepcopy=False))
    value = "" if trial.value is None else f" fitness {trial.value:.4g}"
    epochs = trial.user_attrs.get("epochs")
    of = f", {epochs}/{trial.user_attrs.get('epochs_planned')} epochs" if epochs is not None else ""
    seconds = trial.duration.total_seconds() if trial.duration else 0.0
    why = f" ({trial.user_attrs['error']})" if trial.user_attrs.get("error") else ""
    best = best_trial(study)
    best_text = f" | best {best.value:.4g} (trial {best.number})" if best is not None else ""
    params = " ".join(f"{k}={_short(v)}" for k, v in trial.params.items())
    return f"tune {done}/{iterations}: trial {trial.number} {state(trial)}{value} in {seconds:.1f}s{of}{why}{best_text} | {params}"


def write_csv(study, path: Path) -> Path:
    trials = study.get_trials(deepcopy=False)
    names = sorted({k for t in trials for k in t.params})
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["number", "state", "fitness", *(k.split("/")[-1] for k in METRIC_COLUMNS), "epochs", "duration_s", *names, "run_dir", "error"])
    for t in trials:
        seconds = round(t.duration.total_seconds(), 2) if t.duration else ""
        metrics = t.user_attrs.get("metrics") or {}
        writer.writerow([t.number, state(t), "" if t.value is None else t.value, *(metrics.get(k, "") for k in METRIC_COLUMNS),
                         t.user_attrs.get("epochs", ""), seconds,
                         *[t.params.get(k, "") for k in names], t.user_attrs.get("run_dir", ""), t.user_attrs.get("error", "")])
    atomic_write_text(path, out.getvalue())
    return path


def write_best(study, path: Path, fixed: dict[str, Any]) -> Path | None:
    """best_hyperparameters.yaml: the best complete trial's settings (sampled ones, and the hyperparameters every trial
    shared that differ from the defaults), as a settings file for `cfg=`."""
    best = best_trial(study)
    if best is None:
        return None
    settings = {**fixed, **best.params}
    header = (f"# best trial {best.number} of study '{study.study_name}': fitness {best.value:.6g} "
              f"after {best.user_attrs.get('epochs', '?')} epochs ({best.user_attrs.get('run_dir', '')})\n"
              f"# train with these settings: yolo-cb train cfg={path} data=... epochs=...\n")
    atomic_write_text(path, header + yaml.safe_dump(settings, sort_keys=False))
    return path


def keep_best_run_dirs(study, trials_dir: Path, keep: int) -> list[Path]:
    """Delete the run folders (under `trials_dir`) of every finished trial but the `keep` best complete ones; 0 keeps all."""
    if keep <= 0:
        return []
    ranked = sorted(completed(study), key=lambda t: t.value, reverse=True)
    trials = study.get_trials(deepcopy=False)
    # a retry trains on in the folder (last.pt) of the interrupted trial it retries: a folder stays while a kept trial, an
    # unfinished one or an interrupted one not yet queued again uses it
    requeued = set(study.user_attrs.get("requeued", []))
    waiting = [t for t in trials if state(t) not in DONE_STATES or (t.user_attrs.get("interrupted") and t.number not in requeued)]
    in_use = {_folder_of(t) for t in [*ranked[:keep], *waiting]}
    removed = []
    root = Path(trials_dir).resolve()
    for t in trials:
        path = _folder_of(t)
        if path is None or path in in_use or path in removed:
            continue
        if path.parent == root and path.is_dir():  # only this tune folder's own trials (a shared study spans machines)
            shutil.rmtree(path)
            removed.append(path)
    if removed:
        LOGGER.info(f"tune_keep={keep}: removed {len(removed)} trial folder(s): {', '.join(p.name for p in removed)}")
    return removed


def _folder_of(trial) -> Path | None:
    """The run folder a trial trains (or will train) in: its run_dir, or for a queued retry the folder of its last.pt."""
    folder = trial.user_attrs.get("run_dir")
    if folder is None and trial.user_attrs.get("resume_from"):
        folder = Path(trial.user_attrs["resume_from"]).parent.parent
    return Path(folder).resolve() if folder else None


def write_plots(study, folder: Path, params: list, names: tuple[str, ...] = PLOTS) -> list[Path]:
    """Optimisation history, parameter importances and parallel coordinates as PNGs (matplotlib on an Agg canvas); `names`:
    those of PLOTS to draw (the importances need an Optuna study)."""
    written = []
    for name, draw in zip(PLOTS, (_history, _importance, _parallel), strict=True):
        if name not in names:
            continue
        try:
            if draw(study, Path(folder) / name, params):
                written.append(Path(folder) / name)
        except Exception as error:  # a plot must not cost the results: say which one and why
            LOGGER.warning(f"WARNING tune: could not draw {name}: {type(error).__name__}: {error}")
    return written


def _history(study, path: Path, params) -> bool:
    trials = [t for t in study.get_trials(deepcopy=False) if state(t) in ("COMPLETE", "PRUNED") and t.value is not None]
    if not trials:
        return False
    fig = _figure((8, 5))
    ax = fig.add_subplot(111)
    for label, color in (("COMPLETE", "tab:blue"), ("PRUNED", "tab:gray")):
        chosen = [t for t in trials if state(t) == label]
        ax.scatter([t.number for t in chosen], [t.value for t in chosen], color=color, label=label.lower(), zorder=3)
    best, xs, ys = -math.inf, [], []
    for t in sorted(completed(study), key=lambda t: t.number):
        best = max(best, t.value)
        xs.append(t.number)
        ys.append(best)
    if xs:
        ax.step(xs, ys, where="post", color="tab:red", label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel("fitness (pruned: last reported)")
    ax.set_title(f"optimisation history: {study.study_name}")
    ax.legend()
    _save(fig, path)
    return True


def _importance(study, path: Path, params) -> bool:
    from optuna.importance import get_param_importances

    if len(completed(study)) < 2:
        LOGGER.info(f"tune: {path.name} needs at least 2 complete trials; not drawn")
        return False
    with warnings.catch_warnings():  # few trials: Optuna warns that the importances come out equal, as the plot then shows
        warnings.simplefilter("ignore")
        importances = get_param_importances(study)
    if not importances:
        return False
    names = list(importances)[::-1]
    fig = _figure((8, max(3, 0.35 * len(names) + 1)))
    ax = fig.add_subplot(111)
    ax.barh(names, [importances[n] for n in names], color="tab:blue")
    ax.set_xlabel("importance for fitness (Optuna PED-ANOVA)")
    ax.set_title("hyperparameter importances")
    _save(fig, path)
    return True


def _parallel(study, path: Path, params) -> bool:
    import matplotlib
    from matplotlib import cm, colors

    trials = completed(study)
    names = [p.name for p in params if any(p.name in t.params for t in trials)]
    if not trials or not names:
        return False
    by_name = {p.name: p for p in params}
    values = [t.value for t in trials]
    norm = colors.Normalize(min(values), max(values) if max(values) > min(values) else min(values) + 1e-9)
    cmap = matplotlib.colormaps["viridis"]
    fig = _figure((max(8, 0.8 * len(names) + 2), 5))
    ax = fig.add_subplot(111)
    for t in sorted(trials, key=lambda t: t.value):
        ys = [_unit(by_name[n], t.params.get(n)) for n in names]
        ax.plot(range(len(names)), ys, color=cmap(norm(t.value)), alpha=0.8, marker="o", markersize=3)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=45, ha="right")
    ax.set_yticks([0, 1])
    ax.set_yticklabels(["low", "high"])
    ax.set_title("parallel coordinates (each setting scaled to its range; colour = fitness)")
    fig.colorbar(cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="fitness")
    _save(fig, path)
    return True


def _unit(param, value) -> float:
    """`value` of `param` scaled to [0, 1] over its range (log ranges on a log scale; choices by position)."""
    if value is None:
        return math.nan
    if param.choices is not None:
        return param.choices.index(value) / max(1, len(param.choices) - 1) if value in param.choices else math.nan
    low, high, value = float(param.low), float(param.high), float(value)
    if param.log:
        low, high, value = math.log(low), math.log(high), math.log(value)
    return (value - low) / (high - low)


BACKEND_NAMES = {"ray": "Ray Tune"}  # backend= value -> its name in the closing log line


def summary(study, tune_dir: Path, storage: str, fixed: dict, backend: str = "") -> dict:
    """What tune() returns, for an Optuna study or Ray's trials in its shape, with the closing log line (`backend`: the
    name shown in that line and added to the result, e.g. "ray"; empty for Optuna)."""
    best = best_trial(study)
    counts = {s: sum(state(t) == s for t in study.get_trials(deepcopy=False)) for s in DONE_STATES}
    result = {"save_dir": str(tune_dir), "study_name": study.study_name, "storage": storage, **({"backend": backend} if backend else {}),
              "trials": counts, "best_trial": best.number if best else None, "best_fitness": best.value if best else None,
              "best_hyperparameters": {**fixed, **best.params} if best else None}
    if best is None:
        LOGGER.warning(f"tune: no trial completed ({counts['PRUNED']} pruned, {counts['FAIL']} failed); see {tune_dir / CSV_NAME}")
    else:
        shown = f" ({BACKEND_NAMES[backend]})" if backend else ""
        LOGGER.info(f"tune done{shown}: best trial {best.number} fitness {best.value:.4g} "
                    f"({counts['COMPLETE']} complete, {counts['PRUNED']} pruned, {counts['FAIL']} failed); "
                    f"train with: yolo-cb train cfg={tune_dir / BEST_NAME} data=...")
    return result
