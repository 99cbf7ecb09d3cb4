"""Trials cut short: by Ctrl-C / SIGTERM (marked `interrupted` on the way out) or by a kill that left them RUNNING.

Each trial records the process training it (host, pid). When a study is opened, a RUNNING trial whose process on this
host is gone is marked failed and interrupted; every interrupted trial is queued once more with its settings (and its
`baseline` mark), and the retry continues from the trial's last.pt when there is one, in the trial's own folder.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime
from pathlib import Path

from yolo_cb.checkpoints.checkpoint import checkpoint_epoch, load_checkpoint
from yolo_cb.errors import ConfigError
from yolo_cb.settings.resume import RESUME_MUTABLE
from yolo_cb.utils.log import LOGGER
from yolo_cb.utils.yaml_safe import load_yaml

UNRECORDED_GRACE_S = 120  # a RUNNING trial with no process recorded this long after its start was cut short


def record_process(trial) -> None:
    """Note on `trial` which process trains it, so that a later process can tell that it died."""
    trial.set_user_attr("host", socket.gethostname())
    trial.set_user_attr("pid", os.getpid())


def _process_gone(trial) -> bool:
    """Whether the process that ran a RUNNING trial is gone: it is this host's and no longer exists, or it recorded none
    within UNRECORDED_GRACE_S of starting (a worker records its process a moment after creating the trial)."""
    pid, host = trial.user_attrs.get("pid"), trial.user_attrs.get("host")
    if pid is None:
        started = trial.datetime_start
        return started is None or (datetime.now() - started).total_seconds() > UNRECORDED_GRACE_S
    if host != socket.gethostname():
        return False  # another machine's trial: it may be running still
    if int(pid) == os.getpid():
        return True  # this process is not running it: the pid was reused
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def fail_stale_trials(optuna, study, storage) -> list[int]:
    """Mark failed and interrupted each RUNNING trial whose process is gone (a kill -9 leaves it RUNNING for good)."""
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    stale = [t.number for t in running if _process_gone(t)]
    study_id = storage.get_study_id_from_name(study.study_name)
    for number in stale:
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
        storage.set_trial_user_attr(trial_id, "interrupted", True)
        storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)
        LOGGER.info(f"tune: trial {number} was cut short (its process is gone); marked failed and interrupted")
    return stale


def first_of_retries(trials, number: int) -> int:
    """The number of the trial a chain of retries began with (a retry goes on in that trial's folder)."""
    by_number, seen = {t.number: t for t in trials}, set()
    while number not in seen:
        seen.add(number)
        origin = by_number[number].user_attrs.get("retry_of") if number in by_number else None
        if isinstance(origin, bool) or not isinstance(origin, int) or origin not in by_number:
            break
        number = origin
    return number


def last_checkpoint(trials, trials_dir: Path, number: int) -> Path | None:
    """The last.pt a retry of trial `number` trains on from: in `trials_dir/trial_<n>` (n: the first of its retries),
    or in the folder the study records for it only when that is a trial folder of the same name in a tune folder of the
    same study (a worker sharing the study on this machine). Any other recorded place is never used: a crafted study.db
    named another run there, and `tune resume=` trained and rewrote it (a 6-epoch run marked finished at 4)."""
    first = first_of_retries(trials, number)
    own = Path(trials_dir) / f"trial_{first}"
    recorded = next((t.user_attrs.get("run_dir") for t in trials if t.number == first), None)
    for folder in (own, *([Path(recorded)] if isinstance(recorded, str) and _a_trial_folder(Path(recorded), own) else [])):
        last = folder / "weights" / "last.pt"
        if last.is_file() and not last.is_symlink():
            return last
    return None


def _a_trial_folder(folder: Path, own: Path) -> bool:
    """`folder` is <tune folder>/trials/trial_<n> as `own` is, and that tune folder's tune.yaml names the same study."""
    if not folder.is_absolute() or folder.name != own.name or folder.parent.name != own.parent.name:
        return False
    record, mine = folder.parent.parent / "tune.yaml", own.parent.parent / "tune.yaml"
    try:
        return record.is_file() and mine.is_file() and _study_name(record) == _study_name(mine)
    except ConfigError:
        return False


def _study_name(record: Path) -> str | None:
    data = load_yaml(record, ConfigError, "tune record")
    return data.get("study_name") if isinstance(data, dict) else None


def requeue_interrupted(study, trials_dir: Path) -> None:
    """Queue each interrupted trial once more with its settings: from its last.pt when it has one, as the baseline if it was."""
    done = set(study.user_attrs.get("requeued", []))
    trials = study.get_trials(deepcopy=False)
    again = [t for t in trials if t.user_attrs.get("interrupted") and t.number not in done]
    for t in again:
        attrs = {"retry_of": t.number, **({"baseline": True} if t.user_attrs.get("baseline") else {})}
        last = last_checkpoint(trials, trials_dir, t.number)
        if last is not None:
            attrs["resume_from"] = str(last)  # for people reading the study; the place is derived again when it runs
        study.enqueue_trial(dict(t.params), user_attrs=attrs)
    if again:
        study.set_user_attr("requeued", sorted(done | {t.number for t in again}))
        LOGGER.info(f"tune: re-running interrupted trial(s) {', '.join(str(t.number) for t in again)} with their settings")


def continue_trial(model, trial, last: Path, settings: dict) -> dict:
    """Train a retry on from the interrupted trial's last.pt (in that trial's folder); its metrics. `settings`: the tune's
    fixed ones, of which those a training resume may change are passed (device, workers, callbacks, ...)."""
    LOGGER.info(f"tune: trial {trial.number} continues trial {trial.user_attrs['retry_of']} from {last}")
    carry_over_reports(trial.study, trial, last)
    done = finished_metrics(last)
    if done is not None:
        return done  # killed in its final validation: nothing is left to train
    return model.train(resume=str(last), **{k: v for k, v in settings.items() if k in RESUME_MUTABLE})


def epochs_in(last: Path | None) -> int:
    """Epochs a trial's last.pt holds (0 without one)."""
    epoch = checkpoint_epoch(last) if last is not None else None
    return epoch + 1 if epoch is not None else 0


def carry_over_reports(study, trial, last: Path) -> None:
    """Report on the retry `trial` what the interrupted trial reported up to the epoch its last.pt holds (pruners see them)."""
    saved = checkpoint_epoch(last)
    original = next(t for t in study.get_trials(deepcopy=False) if t.number == trial.user_attrs["retry_of"])
    for step, value in sorted(original.intermediate_values.items()):
        if saved is not None and step <= saved:
            trial.report(value, step=step)


def finished_metrics(last: Path) -> dict | None:
    """For a last.pt whose run had ended (killed in its final validation): best.pt's saved metrics (last.pt's without one),
    what that final validation reports; None when the run has epochs left to train."""
    ckpt = load_checkpoint(last)
    if not ckpt.finished:
        return None
    best = last.parent / "best.pt"
    return dict((load_checkpoint(best) if best.is_file() else ckpt).metrics or {})
