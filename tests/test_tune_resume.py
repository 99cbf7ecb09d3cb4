"""A tune process killed in the middle of a trial (SIGKILL, SIGTERM), then `yolo-cb tune resume=`: real processes.

The first process trains the baseline trial of 2 epochs and is held at the start of epoch 2 (tests/cbpkg/tune_helpers.py:
hold_second_epoch), when the trial's last.pt holds epoch 1; there it is killed. The resumed study must re-run that
trial from its last.pt (in its own folder, the 2nd epoch only), score it, and leave no trial RUNNING.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from test_tune import SPACE, TRIAL, cli_env, read_csv, tune_cli


def held_settings(tmp_path: Path, data: Path, **more) -> dict:
    return {**TRIAL, "epochs": 2, "data": str(data), "iterations": 1, "pruner": "none", "space": SPACE, "mlflow": False,
            "project": str(tmp_path / "tunes"), "name": "t", "callbacks": "on_train_epoch_start=cbpkg.tune_helpers:hold_second_epoch", **more}


def start_and_hold(tmp_path: Path, data: Path, **more) -> tuple[subprocess.Popen, Path, Path]:
    """A tune (1 trial of 2 epochs) held at the start of its trial's 2nd epoch: (process, tune folder, trial 0's last.pt)."""
    folder, hold = tmp_path / "tunes" / "t", tmp_path / "held"
    proc = tune_cli(tmp_path, held_settings(tmp_path, data, **more), TUNE_HOLD=str(hold))
    deadline = time.monotonic() + 300
    while not hold.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    last = folder / "trials" / "trial_0" / "weights" / "last.pt"
    assert proc.poll() is None and hold.exists() and last.is_file(), proc.communicate(timeout=60)[0][-3000:] if proc.poll() is not None else ""
    return proc, folder, last


def resume(tmp_path: Path, folder: Path) -> str:
    # callbacks= given again (empty: the hold is not wanted now): a tune folder's record never supplies code
    proc = subprocess.run([sys.executable, "-m", "yolo_cb", "tune", f"resume={folder}", "callbacks="], cwd=tmp_path, env=cli_env(tmp_path),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout + proc.stderr


def check_continued(folder: Path, out: str, storage: str | None = None, records: Path | None = None) -> None:
    """The interrupted baseline trial 0 (in `folder`) ran again as trial 1, from its last.pt, and was scored; nothing is
    left RUNNING. `records`: the tune folder of the process that continued it (its trials.csv), if not `folder`."""
    import optuna

    study = optuna.load_study(study_name="t", storage=storage or f"sqlite:///{folder / 'study.db'}")
    states = [(t.number, t.state.name) for t in study.trials]
    assert states == [(0, "FAIL"), (1, "COMPLETE")], states
    first, again = study.trials
    assert first.user_attrs.get("interrupted") is True and first.user_attrs.get("baseline") is True
    assert again.user_attrs["retry_of"] == 0 and again.user_attrs.get("baseline") is True and again.params == first.params
    assert again.value is not None and 0.0 <= again.value <= 1.0  # the baseline is scored
    trial_dir = folder / "trials" / "trial_0"
    assert again.user_attrs["run_dir"] == str(trial_dir.resolve()) and not (folder / "trials" / "trial_1").exists()
    assert f"trial 1 continues trial 0 from {trial_dir.resolve() / 'weights' / 'last.pt'}" in out, out[-3000:]
    assert [int(r["epoch"]) for r in read_csv(trial_dir / "results.csv")] == [1, 2]  # epoch 1 from the first process, 2 resumed
    assert again.user_attrs["epochs"] == 2 and sorted(again.intermediate_values) == [0, 1]
    rows = read_csv((records or folder) / "trials.csv")
    assert [(r["number"], r["state"]) for r in rows] == [("0", "FAIL"), ("1", "COMPLETE")] and rows[1]["fitness"] != ""


@pytest.mark.slow
def test_kill_9_during_a_trial_then_resume_continues_it_from_last_pt(tmp_path, shapes_small_yaml):
    proc, folder, _ = start_and_hold(tmp_path, shapes_small_yaml)
    proc.kill()  # SIGKILL: nothing is saved, the trial stays RUNNING in the study
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    out = resume(tmp_path, folder)
    assert "trial 0 was cut short (its process is gone)" in out, out[-3000:]
    check_continued(folder, out)


@pytest.mark.slow
def test_kill_9_of_a_worker_on_a_postgresql_study_then_a_live_worker_continues_its_trial(tmp_path, shapes_small_yaml, postgres):
    """Scale-out: workers share one study on a real PostgreSQL server. One is killed (-9) in the middle of a trial; the
    next worker to join marks that trial failed and interrupted, and trains it again from its last.pt, in its folder."""
    storage = postgres.database("killed")
    proc, folder, _ = start_and_hold(tmp_path, shapes_small_yaml, storage=storage)
    proc.kill()
    proc.communicate(timeout=60)
    worker = tune_cli(tmp_path, held_settings(tmp_path, shapes_small_yaml, storage=storage, project=str(tmp_path / "worker2")))
    out, _ = worker.communicate(timeout=600)
    assert worker.returncode == 0, out[-4000:]
    assert "joined" in out and "trial 0 was cut short (its process is gone)" in out, out[-3000:]
    check_continued(folder, out, storage=storage, records=tmp_path / "worker2" / "t")


@pytest.mark.slow
def test_sigterm_during_a_trial_then_resume_continues_it_from_last_pt(tmp_path, shapes_small_yaml):
    proc, folder, _ = start_and_hold(tmp_path, shapes_small_yaml)
    proc.send_signal(signal.SIGTERM)  # the trainer saves last.pt, the tune marks the trial interrupted and exits 143
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 143, out[-3000:]
    check_continued(folder, resume(tmp_path, folder))


def test_a_tune_folder_never_supplies_code(tmp_path, shapes_small_yaml):
    """tune.yaml is a file in a folder anyone may hand over: its callbacks= are not imported on resume unless given again."""
    from yolo_cb import YOLO
    from yolo_cb.settings.config import ConfigError

    folder = tmp_path / "tunes" / "t"
    folder.mkdir(parents=True)
    planted = tmp_path / "planted"
    (tmp_path / "evil_cb.py").write_text(f"open({str(planted)!r}, 'w').write('ran')\ndef hook(trainer):\n    pass\n")
    settings = {**TRIAL, "epochs": 1, "data": str(shapes_small_yaml), "mlflow": False, "callbacks": "on_fit_epoch_end=evil_cb:hook"}
    (folder / "tune.yaml").write_text(yaml.safe_dump({"study_name": "t", "storage": f"sqlite:///{folder / 'study.db'}", "model": "yolox-nano.yaml",
                                                      "iterations": 1, "pruner": "none", "settings": settings, "space": {}}))
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(ConfigError, match=r"records callbacks=.*give callbacks= again"):
            YOLO("yolox-nano.yaml").tune(resume=str(folder))
    finally:
        sys.path.remove(str(tmp_path))
    assert not planted.exists() and "evil_cb" not in sys.modules
