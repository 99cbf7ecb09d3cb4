"""Callbacks for the tune tests, declared with callbacks=... in real `yolo-cb tune` subprocesses (see tests/test_tune.py)."""

import os
import time

from cbpkg import _log_path

_waited = False


def mark_and_fail_trial_1(trainer):
    """on_train_start: record the trial's folder in $CBPKG_LOG; the trial in trial_1/ raises (a failing trial)."""
    with open(_log_path(), "a") as f:
        f.write(trainer.save_dir.name + "\n")
    if trainer.save_dir.name == "trial_1":
        raise RuntimeError("planned failure in trial_1")


def wait_for_peer(trainer):
    """on_train_start, once per process: wait until two trials of the study in $TUNE_PEER_STORAGE are running at the same time,
    so that both tune processes work on the shared study concurrently (gives up after 120 s; the test then fails)."""
    global _waited
    if _waited:
        return
    _waited = True
    import optuna

    study = optuna.load_study(study_name=os.environ["TUNE_PEER_STUDY"], storage=os.environ["TUNE_PEER_STORAGE"])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))) >= 2:
            return
        time.sleep(0.5)


def hold_second_epoch(trainer):
    """on_train_epoch_start, when $TUNE_HOLD names a file: at epoch 2 (last.pt of epoch 1 is saved by then) create that
    file and wait until trainer.stop is set (a SIGTERM sets it) or 120 s pass, so a test can kill the trial there."""
    marker = os.environ.get("TUNE_HOLD")
    if not marker or trainer.epoch != 1:
        return
    open(marker, "w").close()
    deadline = time.monotonic() + 120
    while not trainer.stop and time.monotonic() < deadline:
        time.sleep(0.05)
