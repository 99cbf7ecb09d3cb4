"""Ray Tune: `tune(backend="ray")` on a local Ray (2 trials x 2 epochs, ASHA), read back from Ray's own files (each trial's
result.json and progress.csv) against each trial's results.csv, trials.csv and best_hyperparameters.yaml; the raytune
integration switched on by itself (raytune=auto) in a trial of the user's own Ray Tuner, with a report that fails
mid-run; a missing Ray; the settings refused or checked in one line.

Ray's start costs seconds: the file starts one local Ray, through the backend's own `local_ray` (what `yolo-cb tune
backend=ray` starts: it must shut Ray down and remove its session folder afterwards), and both searches use it (the
backend leaves a Ray it did not start running); everything else runs without Ray.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from yolo_cb import YOLO
from yolo_cb.errors import ConfigError
from yolo_cb.tune.pruning import MONITOR

TRIAL = dict(model="yolox-nano.yaml", imgsz=32, batch=8, epochs=2, workers=0, tensorboard=False, onnx_check=False, plots=False,
             mlflow=False, optimizer="AdamW", mosaic=0.0, no_aug_epochs=0, warmup_epochs=0.0, fraction=0.25)  # one batch per epoch
SPACE = {"lr0": [1.0e-4, 1.0e-2, "log"], "fliplr": {"choices": [0.0, 0.5]}, "degrees": {"low": 0.0, "high": 10.0, "step": 5.0}}


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def ray_rows(trial_dir: Path) -> list[dict]:
    """What Ray recorded of a trial: its result.json, one JSON object per reported result."""
    return [json.loads(line) for line in (trial_dir / "result.json").read_text().splitlines() if line.strip()]


def assert_rows_equal(reported: list[dict], results_csv: Path) -> None:
    """Each reported row holds every column of its results.csv row with the same value (results.csv writes 6 digits)."""
    rows = read_csv(results_csv)
    assert len(reported) == len(rows), (len(reported), len(rows))
    for got, row in zip(reported, rows, strict=True):
        assert MONITOR in got
        assert {k: f"{got[k]:.6g}" if isinstance(got[k], float) else str(got[k]) for k in row} == row


def ray_temp_dirs() -> set[str]:
    return {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("yolo-cb-ray-")}


@pytest.fixture(scope="module")
def local_ray():
    """The file's one local Ray, started and stopped by the backend's own local_ray."""
    import ray

    from yolo_cb.tune.ray_backend import local_ray

    assert not ray.is_initialized()
    before = ray_temp_dirs()
    with local_ray(ray):
        assert ray.is_initialized() and len(ray_temp_dirs() - before) == 1  # its session files in one temporary folder
        yield ray
    assert not ray.is_initialized() and ray_temp_dirs() == before  # shut down, the folder removed


@pytest.fixture(scope="module")
def ray_tune(local_ray, tmp_path_factory, shapes_small_yaml):
    """tune(backend="ray") in this process: 2 trials of 2 epochs, ASHA."""
    tmp = tmp_path_factory.mktemp("ray_tune")
    summary = YOLO("yolox-nano.yaml").tune(**{**TRIAL, "data": str(shapes_small_yaml), "backend": "ray", "iterations": 2, "space": SPACE,
                                              "project": str(tmp / "tunes"), "name": "ray"})
    assert local_ray.is_initialized()  # a Ray the tune did not start is left running
    return tmp / "tunes" / "ray", summary


def test_each_trial_reported_every_validated_epoch_to_ray_equal_to_its_results_csv(ray_tune):
    folder, _ = ray_tune
    assert sorted(p.name for p in (folder / "ray").iterdir() if p.is_dir()) == ["trial_0", "trial_1"]
    for number in (0, 1):
        run = folder / "trials" / f"trial_{number}"
        reported = ray_rows(folder / "ray" / f"trial_{number}")
        assert_rows_equal(reported, run / "results.csv")
        assert [r["epoch"] for r in reported] == list(range(1, len(reported) + 1))
        assert len(read_csv(folder / "ray" / f"trial_{number}" / "progress.csv")) == len(reported)  # Ray's other record agrees
        assert (run / "weights" / "best.pt").is_file()
        args = yaml.safe_load((run / "args.yaml").read_text())
        config = json.loads((folder / "ray" / f"trial_{number}" / "params.json").read_text())
        assert args["lr0"] == pytest.approx(config["lr0"]) and args["degrees"] in (0.0, 5.0, 10.0)  # trained with what Ray sampled


def test_trials_csv_and_best_hyperparameters_agree_with_rays_results(ray_tune):
    folder, summary = ray_tune
    rows = read_csv(folder / "trials.csv")
    assert [r["number"] for r in rows] == ["0", "1"]
    best_value, best_params = None, None
    for row in rows:
        reported = ray_rows(folder / "ray" / f"trial_{row['number']}")
        fitness = [r[MONITOR] for r in reported]
        config = json.loads((folder / "ray" / f"trial_{row['number']}" / "params.json").read_text())
        assert float(row["lr0"]) == pytest.approx(config["lr0"]) and float(row["fliplr"]) == config["fliplr"]
        if row["state"] == "COMPLETE":  # ran every epoch: its fitness is best.pt's, the best epoch's
            assert len(reported) == 2 and float(row["fitness"]) == pytest.approx(max(fitness))
            if best_value is None or max(fitness) > best_value:
                best_value, best_params = max(fitness), config
        else:  # stopped by ASHA after its first epoch
            assert row["state"] == "PRUNED" and len(reported) == 1 and float(row["fitness"]) == pytest.approx(fitness[-1])
    baseline = json.loads((folder / "ray" / "trial_0" / "params.json").read_text())
    assert baseline == {"lr0": 0.01, "fliplr": 0.5, "degrees": 0.0}  # trial 0: the settings as given
    # Ray's best result, read by Ray from its experiment folder (every reported row of every trial), is the best trial of
    # trials.csv and best_hyperparameters.yaml (tiny trainings may tie: the values are compared)
    from ray.tune import ExperimentAnalysis

    rays_best = ExperimentAnalysis(str(folder / "ray")).get_best_trial(metric=MONITOR, mode="max", scope="all")
    assert best_value == pytest.approx(rays_best.metric_analysis[MONITOR]["max"]) and summary["best_fitness"] == pytest.approx(best_value)
    best = yaml.safe_load((folder / "best_hyperparameters.yaml").read_text())
    assert best["lr0"] == pytest.approx(best_params["lr0"]) and best["optimizer"] == "AdamW" and "backend" not in best
    assert not list(folder.glob("*.png")) and not (folder / "study.db").exists()  # plots=False: no tune plots


def test_raytune_auto_in_the_users_own_tuner_a_failing_report_and_a_trial_the_scheduler_stops(local_ray, tmp_path, shapes_small_yaml):
    """A Ray Tuner of the user's whose trainable trains with the defaults (raytune=auto), two trials:
    in `fails`, epoch 1 reaches Ray and the report of epoch 2 raises: the integration is switched off with one warning and
    the training finishes; `stopped` is stopped by the scheduler after its first report: the training ends there (last.pt
    saved, not finished), results.csv holding the epoch Ray has."""
    from ray import tune

    from yolo_cb.tune.ray_backend import finished

    data, project, log = str(shapes_small_yaml), str(tmp_path / "runs"), str(tmp_path / "worker.log")

    def trainable(config):
        import ray.tune as ray_tune

        from yolo_cb import YOLO

        logging.getLogger("yolo_cb").addHandler(logging.FileHandler(log))
        real, calls = ray_tune.report, []

        def report(metrics, **kwargs):
            calls.append(metrics)
            if config["name"] == "fails" and len(calls) > 1:
                raise RuntimeError("injected report failure")
            return real(metrics, **kwargs)

        ray_tune.report = report
        YOLO("yolox-nano.yaml").train(**{**TRIAL, "data": data, "project": project, "name": config["name"]})

    class StopsTrialStopped(tune.schedulers.FIFOScheduler):
        def on_trial_result(self, tune_controller, trial, result):
            return self.STOP if trial.config["name"] == "stopped" else self.CONTINUE

    grid = tune.Tuner(trainable, param_space={"name": tune.grid_search(["fails", "stopped"])},
                      tune_config=tune.TuneConfig(scheduler=StopsTrialStopped()),
                      run_config=tune.RunConfig(storage_path=str(tmp_path / "ray"), name="own", verbose=0)).fit()
    assert not grid.errors
    results = {r.config["name"]: r for r in grid}
    fails, stopped = tmp_path / "runs" / "fails", tmp_path / "runs" / "stopped"
    assert len(read_csv(fails / "results.csv")) == 2 and (fails / "weights" / "best.pt").is_file() and finished(fails)
    assert_rows_equal(ray_rows(Path(results["fails"].path)), _first_rows(fails / "results.csv", 1, tmp_path))  # epoch 2's report failed
    warnings = [line for line in Path(log).read_text().splitlines() if line.startswith("WARNING callback 'raytune'")]
    assert len(warnings) == 1 and "injected report failure" in warnings[0] and "training goes on" in warnings[0]
    mine = [r for r in json.loads((fails / "callbacks.json").read_text())["callbacks"] if r["name"] == "raytune"]  # a row per event
    assert sum(r["errors"] for r in mine) == 1 and any("injected report failure" in e for r in mine for e in r["first_errors"])
    assert_rows_equal(ray_rows(Path(results["stopped"].path)), stopped / "results.csv")  # one epoch, in both
    assert len(read_csv(stopped / "results.csv")) == 1 and (stopped / "weights" / "best.pt").is_file() and not finished(stopped)


def _first_rows(path: Path, n: int, tmp_path: Path) -> Path:
    """A copy of results.csv with its first `n` rows."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    out = tmp_path / f"results_first_{n}.csv"
    out.write_text("\n".join(lines[: n + 1]) + "\n")
    return out


def test_raytune_true_without_ray_gives_the_install_hint_and_the_run_finishes(tiny, monkeypatch, caplog):
    from yolo_cb.integrations.raytune import switched_on
    from yolo_cb.settings.config import get_config

    monkeypatch.setitem(sys.modules, "ray", None)  # the standard way to make the import fail
    assert not switched_on(get_config({}))  # raytune=auto without Ray: off, and says nothing
    with caplog.at_level(logging.WARNING, logger="yolo_cb"):
        YOLO("yolox-nano.yaml").train(**{**tiny, "raytune": True})
    lines = [r.getMessage() for r in caplog.records if "raytune" in r.getMessage()]
    assert lines == ["WARNING integration 'raytune' is off: it needs ray (pip install 'yolo-cb[raytune]')"]
    assert len(read_csv(Path(tiny["project"]) / tiny["name"] / "results.csv")) == 1


def test_backend_bad_is_one_error_line_optuna_only_settings_and_a_missing_ray_are_refused_with_ray(tmp_path, capsys):
    from yolo_cb.cli import entrypoint

    with pytest.raises(SystemExit) as exit_:
        entrypoint(["tune", "backend=bad", f"project={tmp_path}"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == ["yolo-cb: error: invalid value for 'backend': 'bad' (str); expected one of optuna | ray"]
    for key, value in (("storage", "sqlite:///x.db"), ("resume", "True"), ("raytune", "False")):
        with pytest.raises(ConfigError, match=rf"^{key}=.* with backend=ray: "):
            YOLO("yolox-nano.yaml").tune(backend="ray", project=str(tmp_path), **{key: value})
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "ray", None)  # Ray not installed
        with pytest.raises(ImportError, match=r"^tune backend=ray needs Ray Tune, an optional extra: pip install 'yolo-cb\[raytune\]'$"):
            YOLO("yolox-nano.yaml").tune(backend="ray", project=str(tmp_path))
    assert not any(tmp_path.iterdir())  # refused before any folder was made


def test_our_space_in_rays_samplers_keeps_its_ranges():
    from ray import tune

    from yolo_cb.tune.ray_backend import space_to_ray
    from yolo_cb.tune.space import parse_space

    space = space_to_ray(parse_space({"close_mosaic": [0, 2], "lr0": [1e-4, 1e-2, "log"], "degrees": {"low": 1.0, "high": 11.0, "step": 5.0},
                                      "optimizer": {"choices": ["SGD", "AdamW"]}}), tune)
    samples = {k: {space[k].sample() for _ in range(200)} for k in space}
    assert samples["close_mosaic"] == {0, 1, 2}  # both ends of an integer range, as Optuna samples them
    assert samples["degrees"] == {1.0, 6.0, 11.0}  # a step counts from low
    assert samples["optimizer"] == {"SGD", "AdamW"} and all(1e-4 <= v <= 1e-2 for v in samples["lr0"])
