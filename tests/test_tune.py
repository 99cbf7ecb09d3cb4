"""Hyperparameter tuning on Optuna: real studies of tiny trainings (imgsz 64, 1-2 epochs, 32 images).

A CLI tune end to end (trial folders, trials.csv, best_hyperparameters.yaml, plots, progress lines, a failing trial,
MLflow parent/child runs read back from the local store), best_hyperparameters.yaml used as cfg=, a trial pruned by an
Optuna pruner through trainer.stop, two real processes on one SQLite study, Ctrl-C (SIGINT to a real process) and
resume, the search-space checks, and the install hint without Optuna.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from yolo_cb import YOLO
from yolo_cb.errors import ConfigError
from yolo_cb.tune import report
from yolo_cb.tune.space import parse_space

ROOT = Path(__file__).resolve().parents[1]
TRIAL = dict(model="yolox-nano.yaml", imgsz=64, batch=8, epochs=1, workers=0, tensorboard=False, onnx_check=False, plots=False,
             optimizer="AdamW", mosaic=0.0, no_aug_epochs=0, warmup_epochs=0.0, fraction=0.25)  # one batch of 8 images per epoch
SPACE = {"lr0": [1.0e-4, 1.0e-2, "log"], "box": [1.0, 10.0], "fliplr": {"choices": [0.0, 0.5]}}


def cli_args(settings: dict) -> list[str]:
    def text(v):
        return yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip() if isinstance(v, (dict, list)) else str(v)

    return [f"{k}={text(v)}" for k, v in settings.items()]


def cli_env(tmp_path: Path, **extra: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]), "CBPKG_LOG": str(tmp_path / "cbpkg.log"), **extra}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def tune_cli(tmp_path: Path, settings: dict, **extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "yolo_cb", "tune", *cli_args(settings)], cwd=tmp_path, env=cli_env(tmp_path, **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# --- a whole tune through the CLI --------------------------------------------------------------------

@pytest.fixture(scope="module")
def cli_tune(tmp_path_factory, shapes_small_yaml):
    """`yolo-cb tune` with 4 iterations: trial 1 fails in a user callback, the others complete; MLflow on (local store)."""
    tmp = tmp_path_factory.mktemp("tune_cli")
    settings = {**TRIAL, "data": str(shapes_small_yaml), "iterations": 4, "pruner": "none", "space": SPACE, "mlflow": True,
                "project": str(tmp / "tunes"), "name": "cli", "callbacks": "on_train_start=cbpkg.tune_helpers:mark_and_fail_trial_1"}
    proc = tune_cli(tmp, settings)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    return tmp / "tunes" / "cli", out, tmp


@pytest.mark.slow
def test_cli_tune_end_to_end(cli_tune):
    import optuna

    folder, out, tmp = cli_tune
    rows = read_csv(folder / "trials.csv")
    assert [(r["number"], r["state"]) for r in rows] == [("0", "COMPLETE"), ("1", "FAIL"), ("2", "COMPLETE"), ("3", "COMPLETE")]
    assert "planned failure in trial_1" in rows[1]["error"]  # the failed trial's error is recorded; the study went on
    baseline = rows[0]
    assert float(baseline["lr0"]) == pytest.approx(0.01) and float(baseline["box"]) == pytest.approx(5.0)  # trial 0: the settings as given
    assert float(baseline["fliplr"]) == 0.5
    for row in rows:
        assert set(row) >= {"lr0", "box", "fliplr", "fitness", "epochs", "run_dir"}
        assert Path(row["run_dir"]).parent == folder / "trials"
    for row in (rows[0], rows[2], rows[3]):
        run = Path(row["run_dir"])
        assert (run / "weights" / "best.pt").is_file() and (run / "results.csv").is_file()
        args = yaml.safe_load((run / "args.yaml").read_text())  # the trial trained with its sampled settings
        assert args["lr0"] == pytest.approx(float(row["lr0"])) and args["box"] == pytest.approx(float(row["box"]))
        assert row["epochs"] == "1" and 0.0 <= float(row["fitness"]) <= 1.0
    # the user's callbacks (callbacks=) ran in every trial
    assert (tmp / "cbpkg.log").read_text().split() == ["trial_0", "trial_1", "trial_2", "trial_3"]
    for row in rows:  # and each trial's callbacks.json shows it (the failed trial's too, with its error)
        record = json.loads((Path(row["run_dir"]) / "callbacks.json").read_text())
        mine = next(r for r in record["callbacks"] if r["name"] == "mark_and_fail_trial_1")
        assert (mine["origin"], mine["calls"], mine["errors"]) == ("yaml", 1, 1 if row["number"] == "1" else 0), (row["run_dir"], mine)

    best = yaml.safe_load((folder / "best_hyperparameters.yaml").read_text())
    complete = [r for r in rows if r["state"] == "COMPLETE"]
    top = max(complete, key=lambda r: float(r["fitness"]))
    assert best["lr0"] == pytest.approx(float(top["lr0"])) and best["box"] == pytest.approx(float(top["box"]))
    assert best["optimizer"] == "AdamW" and best["mosaic"] == 0.0  # the fixed recipe every trial shared comes along
    assert "data" not in best and "epochs" not in best and "project" not in best
    assert not list(folder.glob("*.png"))  # plots=False: no tune plots, and no trial drew its own either
    study = optuna.load_study(study_name="cli", storage=f"sqlite:///{folder / 'study.db'}")
    drawn = report.write_plots(study, tmp / "plots", parse_space(SPACE))  # what plots=True draws, for this study
    assert [p.name for p in drawn] == list(report.PLOTS) and all(p.stat().st_size > 1000 for p in drawn)
    record = yaml.safe_load((folder / "tune.yaml").read_text())
    assert record["study_name"] == "cli" and record["storage"].startswith("sqlite:///") and (folder / "study.db").is_file()
    progress = [line for line in out.splitlines() if line.startswith("tune ") and ": trial " in line]
    assert len(progress) == 4 and progress[-1].startswith("tune 4/4: trial 3 COMPLETE"), progress
    assert "tune 2/4: trial 1 FAIL" in progress[1] and "planned failure" in progress[1]


@pytest.mark.slow
def test_mlflow_parent_and_trial_runs(cli_tune):
    from mlflow.tracking import MlflowClient

    folder, _, _ = cli_tune
    client = MlflowClient(f"sqlite:///{folder / 'mlruns' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("yolo-cb tune")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("yolo_cb.tune") == "parent"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0]
    assert parent.data.params["iterations"] == "4" and "lr0" in parent.data.params["space"]
    assert [m.step for m in client.get_metric_history(parent.info.run_id, "best_fitness")] == [0, 1, 2, 3]
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert sorted(children) == ["trial_0", "trial_1", "trial_2", "trial_3"]
    rows = {f"trial_{r['number']}": r for r in read_csv(folder / "trials.csv")}
    for name, run in children.items():
        assert run.data.params["lr0"] == str(float(rows[name]["lr0"]))  # the trainer's integration logged into the nested run
        assert run.data.tags["optuna.state"] == rows[name]["state"]
    assert children["trial_1"].info.status == "FAILED" and children["trial_0"].info.status == "FINISHED"
    assert "metrics/mAP50-95B" in children["trial_0"].data.metrics


@pytest.mark.slow
def test_best_hyperparameters_train_via_cfg(cli_tune, shapes_small_yaml, tmp_path):
    folder, _, _ = cli_tune
    best_file = folder / "best_hyperparameters.yaml"
    best = yaml.safe_load(best_file.read_text())
    YOLO("yolox-nano.yaml").train(cfg=str(best_file), data=str(shapes_small_yaml), imgsz=64, batch=8, epochs=1, workers=0, mlflow=False,
                                  tensorboard=False, onnx_check=False, plots=False, fraction=0.25, project=str(tmp_path), name="best")
    args = yaml.safe_load((tmp_path / "best" / "args.yaml").read_text())
    for key, value in best.items():
        assert args[key] == pytest.approx(value) if isinstance(value, float) else args[key] == value, key


# --- pruning, sharing, interrupting -----------------------------------------------------------------------

@pytest.mark.slow
def test_trial_pruned_through_trainer_stop(tmp_path, shapes_small_yaml):
    import optuna

    result = YOLO("yolox-nano.yaml").tune(**{**TRIAL, "epochs": 2}, data=str(shapes_small_yaml), iterations=1, space={"lr0": [1e-4, 1e-2, "log"]},
                                          pruner=optuna.pruners.ThresholdPruner(lower=2.0), mlflow=False, project=str(tmp_path), name="prune")
    assert result["trials"] == {"COMPLETE": 0, "PRUNED": 1, "FAIL": 0}
    study = optuna.load_study(study_name="prune", storage=f"sqlite:///{tmp_path / 'prune' / 'study.db'}")
    trial = study.trials[0]
    assert trial.state == optuna.trial.TrialState.PRUNED
    assert trial.user_attrs["stop_reason"].startswith("pruned by Optuna's ThresholdPruner after epoch 1/2")
    assert trial.user_attrs["epochs"] == 1 < trial.user_attrs["epochs_planned"] == 2
    assert list(trial.intermediate_values) == [0]
    assert len(read_csv(tmp_path / "prune" / "trials" / "trial_0" / "results.csv")) == 1  # one epoch trained, not two
    assert not (tmp_path / "prune" / "best_hyperparameters.yaml").exists()  # no complete trial, so no best


@pytest.mark.slow
@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_two_processes_share_one_study(tmp_path, shapes_small_yaml, database, request):
    """Two workers on one study (one SQLite file on this machine; a real PostgreSQL server, as for several machines): every
    trial is trained once, and the workers together train exactly `iterations` (none starts a trial the study no longer needs)."""
    import optuna

    storage = f"sqlite:///{tmp_path / 'shared.db'}" if database == "sqlite" else request.getfixturevalue("postgres").database("shared")
    settings = {**TRIAL, "data": str(shapes_small_yaml), "iterations": 3, "pruner": "none", "space": SPACE, "mlflow": False,
                "storage": storage, "name": "shared", "callbacks": "on_train_start=cbpkg.tune_helpers:wait_for_peer"}
    procs = [tune_cli(tmp_path, {**settings, "project": str(tmp_path / f"worker{i}"), "seed": i}, TUNE_PEER_STORAGE=storage,
                      TUNE_PEER_STUDY="shared") for i in (1, 2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    study = optuna.load_study(study_name="shared", storage=storage)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(study.trials) == len(done) == 3 and len({t.number for t in done}) == 3, [(t.number, t.state.name) for t in study.trials]
    assert len({Path(t.user_attrs["run_dir"]) for t in done}) == 3
    workers = {Path(t.user_attrs["run_dir"]).parents[2].name for t in done}  # <project>/shared/trials/trial_<n>
    assert workers == {"worker1", "worker2"}, [t.user_attrs["run_dir"] for t in done]
    for t in done:
        assert (Path(t.user_attrs["run_dir"]) / "weights" / "best.pt").is_file()
    assert "joined" in outs[0] + outs[1]  # one created the study, the other joined it


@pytest.mark.slow
def test_ctrl_c_saves_then_resume_continues_the_study(tmp_path, shapes_small_yaml):
    import optuna

    folder = tmp_path / "tunes" / "stop"
    settings = {**TRIAL, "data": str(shapes_small_yaml), "iterations": 2, "pruner": "none", "space": SPACE, "mlflow": False,
                "plots": True, "project": str(tmp_path / "tunes"), "name": "stop"}
    proc = tune_cli(tmp_path, settings)
    deadline = time.monotonic() + 300
    while not (folder / "trials" / "trial_1").is_dir() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)  # Ctrl-C while trial 1 trains
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, out[-3000:]
    assert "tune interrupted: 1 trials finished and saved" in out
    rows = read_csv(folder / "trials.csv")
    assert [(r["number"], r["state"]) for r in rows] == [("0", "COMPLETE"), ("1", "FAIL")]
    assert (folder / "best_hyperparameters.yaml").is_file() and (folder / "tune_history.png").is_file()
    interrupted_lr0 = rows[1]["lr0"]

    result = YOLO("yolox-nano.yaml").tune(resume=str(folder), tune_keep=1)  # and keep only the best trial's run folder
    assert result["save_dir"] == str(folder) and result["trials"]["COMPLETE"] == 2
    study = optuna.load_study(study_name="stop", storage=f"sqlite:///{folder / 'study.db'}")
    assert [t.state.name for t in study.trials] == ["COMPLETE", "FAIL", "COMPLETE"]
    retried = study.trials[2]
    assert retried.user_attrs["retry_of"] == 1 and str(retried.params["lr0"]) == interrupted_lr0  # the interrupted point runs again
    assert retried.user_attrs["epochs"] == 1 and len(read_csv(folder / "trials.csv")) == 3
    kept = sorted(p.name for p in (folder / "trials").iterdir())
    assert kept == [f"trial_{result['best_trial']}"] and (folder / "trials" / kept[0] / "weights" / "best.pt").is_file()
    with pytest.raises(ConfigError, match="cannot change imgsz"):
        YOLO("yolox-nano.yaml").tune(resume=str(folder), imgsz=96)


# --- checks before any work ------------------------------------------------------------------------------

def test_bad_space_and_settings_fail_before_any_work(tmp_path, shapes_small_yaml):
    model = YOLO("yolox-nano.yaml")
    base = {**TRIAL, "data": str(shapes_small_yaml), "project": str(tmp_path), "mlflow": False}
    with pytest.raises(ConfigError, match=r"'lr00' is not a yolo-cb setting. Did you mean 'lr0'"):
        model.tune(**base, space={"lr00": [1e-4, 1e-2]})
    with pytest.raises(ConfigError, match="'data' cannot be tuned"):
        model.tune(**base, space={"data": {"choices": ["a.yaml"]}})
    with pytest.raises(ConfigError, match="'mosaic'.*a fraction in"):
        model.tune(**base, space={"mosaic": [0.0, 2.0]})
    with pytest.raises(ConfigError, match="log scale, which needs low > 0"):
        model.tune(**base, space={"weight_decay": [0.0, 0.01, "log"]})
    with pytest.raises(ConfigError, match="unknown key 'hihg'. Did you mean 'high'"):
        model.tune(**base, space={"box": {"low": 1, "hihg": 5}})
    with pytest.raises(ConfigError, match="lr0=0.002: both given as a setting and in the search space"):
        model.tune(**base, lr0=0.002, space={"lr0": [1e-4, 1e-2]})
    with pytest.raises(ConfigError, match=r"no_aug_epochs=0 \(another name for close_mosaic\): both given"):
        model.tune(**base, space={"close_mosaic": [0, 2]})
    with pytest.raises(ConfigError, match="tune runs each trial in one process"):
        model.tune(**base, nproc=2)
    assert not any(tmp_path.iterdir())  # nothing was made


def test_default_space_tunes_box_only_for_a_model_whose_loss_takes_it(tmp_path, shapes_small_yaml):
    from yolo_cb.tune.tuner import Tuner, require_optuna

    settings = {k: v for k, v in TRIAL.items() if k != "model"} | {"data": str(shapes_small_yaml), "mlflow": False, "epochs": 2}
    for model, takes_box in (("yolocb-n.yaml", False), ("yolox-nano.yaml", True)):
        tuner = Tuner(YOLO(model), {**settings, "project": str(tmp_path / model)}, require_optuna())
        names = {p.name for p in tuner.params}
        assert {"lr0", "lrf", "fliplr"} <= names and ("box" in names) == takes_box, (model, sorted(names))
        assert not names & {"mosaic", "warmup_epochs", "close_mosaic", "no_aug_epochs"}  # given as settings (no_aug_epochs: close_mosaic)


def test_cli_refuses_unknown_keys_and_bad_space(tmp_path):
    for args, expected in (
        (["iteratons=3"], "'iteratons' is not a valid yolo-cb argument. Did you mean 'iterations'"),
        (["space={lr_0: [0.001, 0.1]}"], "'lr_0' is not a yolo-cb setting. Did you mean 'lr0'"),
        (["pruner=random"], "invalid value for 'pruner'"),
    ):
        proc = subprocess.run([sys.executable, "-m", "yolo_cb", "tune", "data=shapes.yaml", *args], cwd=tmp_path, env=cli_env(tmp_path),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and expected in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def bad_storages(tmp_path: Path) -> list[tuple[str, str]]:
    """(storage= value, what the one-line error says): each a value that cannot hold a study."""
    (tmp_path / "a_folder").mkdir(exist_ok=True)
    (tmp_path / "notes.txt").write_text("not a database\n" * 20)
    return [("nonsense", "not a database URL; give an Optuna storage URL"),
            ("sqlite://", "an in-memory SQLite database keeps nothing"),
            (f"sqlite:///{tmp_path}/missing/study.db", f"the folder {tmp_path}/missing does not exist"),
            (f"sqlite:///{tmp_path}/a_folder", f"{tmp_path}/a_folder is a folder; name a database file in it"),
            (f"sqlite:///{tmp_path}/notes.txt", "cannot open the database: file is not a database"),
            ("postgresql://127.0.0.1:1/optuna", "(the Python driver for postgresql|cannot open the database)"),  # a closed port
            ("mysql://user:secret@127.0.0.1:1/optuna", "(the Python driver for mysql|cannot open the database)"),
            ("http://127.0.0.1:1/optuna", "'http' is no database SQLAlchemy knows")]


def test_bad_storage_is_one_error_before_the_tune_folder(tmp_path, shapes_small_yaml):
    import re

    base = {**TRIAL, "data": str(shapes_small_yaml), "space": SPACE, "mlflow": False, "project": str(tmp_path / "tunes")}
    bad = bad_storages(tmp_path)
    for value, expected in bad:
        with pytest.raises(ConfigError, match=f"^storage='{re.escape(value.replace('user:secret@', ''))}': {expected}"):
            YOLO("yolox-nano.yaml").tune(**base, storage=value)
    for value, expected in (bad[0], bad[1], bad[6]):  # and on the command line: exit 2, one line
        proc = subprocess.run([sys.executable, "-m", "yolo_cb", "tune", *cli_args({**base, "storage": value})], cwd=tmp_path,
                              env=cli_env(tmp_path), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, (value, proc.stderr)
        assert re.search(expected, proc.stderr) and "secret" not in proc.stderr, proc.stderr
    assert not (tmp_path / "tunes").exists()  # no tune folder was made


def test_without_optuna_tune_says_how_to_install(tmp_path, monkeypatch):
    hide = "import sys; sys.modules['optuna'] = None; from yolo_cb.cli import entrypoint; entrypoint(sys.argv[1:])"
    proc = subprocess.run([sys.executable, "-c", hide, "tune", "data=shapes.yaml", "iterations=2"], cwd=tmp_path, env=cli_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "yolo-cb: error: tune needs Optuna, an optional extra: pip install 'yolo-cb[tune]'"
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(ImportError, match=r"pip install 'yolo-cb\[tune\]'"):
        YOLO("yolox-nano.yaml").tune(data="shapes.yaml", iterations=2)
    assert not (tmp_path / "runs").exists()
