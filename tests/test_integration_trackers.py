"""Comet, ClearML and DVC Live: one tiny 2-epoch training with all three on (offline, inside a Git + DVC repository)
read back from each tool's own files; DVC Live outside a repository; a tracker that raises mid-run; missing packages."""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from conftest import TINY

from yolo_cb import YOLO
from yolo_cb.settings.config import ConfigError

comet_ml = pytest.importorskip("comet_ml")
clearml = pytest.importorskip("clearml")
dvclive = pytest.importorskip("dvclive")

TRACKERS = {"comet": "comet_ml", "clearml": "clearml", "dvc": "dvclive"}  # setting -> the module it needs
COMPARED = ("train/iou_loss", "train/obj_loss", "metrics/mAP50(B)", "metrics/mAP50-95(B)", "val/iou_loss", "fitness", "lr/pg0")

CSV_REL = 5e-6  # results.csv writes 6 significant digits ('%.6g'): off by at most half a unit, 5e-6 of the value


def isolate(mp: pytest.MonkeyPatch, root: Path, cwd: Path) -> None:
    """The tools' own home folders under `root`, offline modes on, `cwd` the working directory."""
    home = root / "home"
    home.mkdir(exist_ok=True)
    for var, sub in (("HOME", ""), ("XDG_CONFIG_HOME", ".config"), ("XDG_CACHE_HOME", ".cache"), ("XDG_DATA_HOME", ".local")):
        mp.setenv(var, str(home / sub))
    for var in ("COMET_OFFLINE_DIRECTORY", "COMET_PROJECT_NAME", "CLEARML_CACHE_DIR", "CLEARML_PROJECT", "CLEARML_TASK", "DVC_ROOT"):
        mp.delenv(var, raising=False)
    mp.setenv("COMET_MODE", "offline")
    mp.setenv("CLEARML_OFFLINE_MODE", "1")
    mp.chdir(cwd)


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True, capture_output=True)


def results(run_dir: Path) -> list[dict]:
    with open(run_dir / "results.csv", newline="") as f:
        return [{k.strip(): float(v) for k, v in row.items()} for row in csv.DictReader(f)]


@pytest.fixture(scope="module")
def tracked(tmp_path_factory, shapes_small_yaml):
    """One training, comet + clearml + dvc on, plots on, run inside a Git repository with a commit and `dvc init`."""
    from dvc.repo import Repo

    root = tmp_path_factory.mktemp("trackers")
    repo = root / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    Repo.init(str(repo))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "init")
    git(repo, "config", "user.name", "t")
    git(repo, "config", "user.email", "t@t")  # DVC Live saves the run as an experiment commit
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, root, repo)
        YOLO("yolox-nano.yaml").train(**{**TINY, "data": str(shapes_small_yaml), "project": str(repo / "runs"), "name": "exp",
                                         "epochs": 2, "plots": True, "comet": True, "clearml": True, "dvc": True})
    return repo / "runs" / "exp", repo


def comet_messages(run_dir: Path) -> tuple[zipfile.ZipFile, list[dict]]:
    archives = list((run_dir / "comet").glob("*.zip"))
    assert len(archives) == 1, archives
    archive = zipfile.ZipFile(archives[0])
    return archive, [json.loads(line) for line in archive.read("messages.json").decode().splitlines()]


def test_comet_offline_archive_holds_params_epochs_batches_images_matrix_and_model(tracked):
    run_dir, _ = tracked
    archive, messages = comet_messages(run_dir)
    assert json.loads(archive.read("experiment.json"))["project_name"] == "runs"
    params = {m["payload"]["param"]["paramName"]: m["payload"]["param"]["paramValue"] for m in messages if m["type"] == "parameter_msg"}
    assert params["imgsz"] == 64 and params["epochs"] == 2 and params["comet"] is True
    metrics = [m["payload"]["metric"] for m in messages if m["type"] == "metric_msg"]
    for row in results(run_dir):  # one point per epoch per key, equal to results.csv
        for key in COMPARED:
            points = [m for m in metrics if m["metricName"] == key and m["epoch"] == row["epoch"] - 1]
            assert len(points) == 1 and points[0]["metricValue"] == pytest.approx(row[key], rel=CSV_REL, abs=1e-9), key
    assert len([m for m in metrics if m["metricName"] == "batch/iou_loss"]) == 2  # batch 0 of each of the 2 epochs
    uploads = [m["payload"] for m in messages if m["type"] == "file_upload"]
    preds = [u["additional_params"]["step"] for u in uploads if u["additional_params"].get("figName") == "val_batch0_pred"]
    assert preds == [0, 1]  # the visualisation image of each epoch
    matrix = next(u for u in uploads if u["upload_type"] == "confusion-matrix")
    labels = json.loads(archive.read(matrix["file_path"]))["labels"]
    assert labels == ["circle", "rectangle", "triangle", "cross", "background"]
    model = next(u for u in uploads if u["upload_type"] == "model-element")
    assert model["additional_params"]["fileName"] == "best.pt"
    assert archive.read(model["file_path"]) == (run_dir / "weights" / "best.pt").read_bytes()


def test_clearml_offline_session_holds_params_scalars_images_plot_and_artifact(tracked):
    run_dir, _ = tracked
    sessions = [p for p in (run_dir / "clearml" / "offline").iterdir() if p.is_dir()]
    assert len(sessions) == 1 and sessions[0].with_suffix(".zip").is_file(), sessions
    task = json.loads((sessions[0] / "task.json").read_text())
    assert task["name"] == "exp" and task["project_name"] == "runs"
    assert task["hyperparams"]["settings"]["imgsz"]["value"] == "64"
    events = [e for line in (sessions[0] / "metrics.jsonl").read_text().splitlines() if line.strip() for e in json.loads(line)]
    scalars = [e for e in events if e["type"] == "training_stats_scalar"]
    for row in results(run_dir):
        for key in COMPARED:
            title, _, series = key.partition("/")
            series = series or key
            points = [e for e in scalars if (e["metric"], e["variant"], e["iter"]) == (title, series, row["epoch"] - 1)]
            assert len(points) == 1 and points[0]["value"] == pytest.approx(row[key], rel=CSV_REL, abs=1e-9), key
    assert len([e for e in scalars if e["metric"] == "batch" and e["variant"] == "iou_loss"]) == 2
    images = [e for e in events if e["type"] == "training_debug_image" and e["variant"] == "val_batch0_pred"]
    assert sorted(e["iter"] for e in images) == [0, 1] and all(Path(e["url"]).is_file() for e in images)
    plots = [e for e in events if e["type"] == "plot"]
    assert [p["metric"] for p in plots] == ["confusion matrix (best.pt)"]
    assert json.loads(plots[0]["plot_str"])["data"][0]["x"][-1] == "background"
    artifact = next(a for a in task["execution"]["artifacts"] if a["key"] == "best.pt")
    assert Path(artifact["uri"]).is_file()
    assert artifact["hash"] == hashlib.sha256((run_dir / "weights" / "best.pt").read_bytes()).hexdigest()


def tsv_values(path: Path) -> list[float]:
    with open(path, newline="") as f:
        return [float(r[path.stem]) for r in csv.DictReader(f, delimiter="\t")]


def test_dvclive_files_plots_experiment_and_model_artifact_inside_a_dvc_repo(tracked):
    import dvc.api
    from dvc.repo import Repo

    run_dir, repo = tracked
    live = run_dir / "dvclive"
    assert yaml.safe_load((live / "params.yaml").read_text())["imgsz"] == 64
    rows = results(run_dir)
    for key in COMPARED:  # plots/metrics/<key>.tsv: one row per epoch
        assert tsv_values(live / "plots" / "metrics" / f"{key}.tsv") == pytest.approx([r[key] for r in rows], rel=CSV_REL, abs=1e-9), key
    assert json.loads((live / "metrics.json").read_text())["metrics"]["mAP50-95(B)"] == pytest.approx(rows[-1]["metrics/mAP50-95(B)"], abs=1e-9)
    assert (live / "plots" / "images" / "val_batch0_pred.jpg").is_file()
    batches = json.loads((live / "plots" / "custom" / "batch_losses.json").read_text())
    assert [b["batch"] for b in batches] == [0, 4]
    assert (live / "plots" / "sklearn" / "confusion_matrix.json").is_file()
    artifacts = Repo(str(repo)).artifacts.read()  # DVC's own reader of the model registry entries
    best = artifacts["runs/exp/dvc.yaml"]["best"]
    assert best.type == "model" and (run_dir / best.path).resolve() == (run_dir / "weights" / "best.pt").resolve()
    assert (run_dir / "weights" / "best.pt.dvc").is_file()  # `dvc add`ed
    experiments = [e for e in dvc.api.exp_show(repo=str(repo)) if e.get("Experiment")]
    assert len(experiments) == 1 and experiments[0]["step"] == 1  # the run saved as a DVC experiment


def test_dvclive_outside_a_dvc_repo_writes_its_files_and_inits_nothing(tiny, tmp_path, caplog):
    git(tmp_path, "init", "-q")  # a Git repository without DVC around the working directory: DVC Live would `dvc init` it
    with pytest.MonkeyPatch.context() as mp, caplog.at_level(logging.INFO, logger="yolo_cb"):
        isolate(mp, tmp_path, tmp_path)
        YOLO("yolox-nano.yaml").train(**{**tiny, "epochs": 2, "dvc": True})
    run_dir = Path(tiny["project"]) / tiny["name"]
    rows = results(run_dir)
    assert tsv_values(run_dir / "dvclive" / "plots" / "metrics" / "metrics" / "mAP50-95(B).tsv") == pytest.approx(
        [r["metrics/mAP50-95(B)"] for r in rows], abs=1e-9)
    assert "artifacts" not in yaml.safe_load((run_dir / "dvc.yaml").read_text())
    assert not (tmp_path / ".dvc").exists() and not (run_dir / "weights" / "best.pt.dvc").exists()
    assert any("is not registered as a model artifact" in r.getMessage() for r in caplog.records)


def test_a_tracker_raising_mid_run_is_switched_off_with_one_warning_and_the_run_finishes(tiny, tmp_path, caplog, monkeypatch):
    broken = {"on": False}

    def failing(original):
        def call(*args, **kwargs):
            if broken["on"]:
                raise RuntimeError("injected tracker failure")
            return original(*args, **kwargs)
        return call

    monkeypatch.setattr(comet_ml.OfflineExperiment, "log_metrics", failing(comet_ml.OfflineExperiment.log_metrics))
    monkeypatch.setattr(clearml.Logger, "report_scalar", failing(clearml.Logger.report_scalar))
    monkeypatch.setattr(dvclive.Live, "log_metric", failing(dvclive.Live.log_metric))
    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_train_epoch_start", lambda trainer: broken.update(on=trainer.epoch >= 1))  # from epoch 2 on
    with pytest.MonkeyPatch.context() as mp, caplog.at_level(logging.WARNING, logger="yolo_cb"):
        isolate(mp, tmp_path, tmp_path)
        model.train(**{**tiny, "epochs": 2, "comet": True, "clearml": True, "dvc": True})
    run_dir = Path(tiny["project"]) / tiny["name"]
    assert len(results(run_dir)) == 2 and (run_dir / "weights" / "best.pt").is_file()
    warnings = [r.getMessage() for r in caplog.records if "injected tracker failure" in r.getMessage()]
    for title in ("Comet", "ClearML", "DVC Live"):
        assert sum(w.startswith(f"WARNING {title}: RuntimeError") and "off for the rest of this run" in w for w in warnings) == 1, warnings
    assert len(warnings) == 3 and not any("switched off" in r.getMessage() for r in caplog.records)  # caught by each tracker
    _, messages = comet_messages(run_dir)  # the session was closed: the archive holds epoch 1 only
    assert {m["payload"]["metric"]["epoch"] for m in messages if m["type"] == "metric_msg" and m["payload"]["metric"]["metricName"] == "fitness"} == {0}
    assert list((run_dir / "clearml" / "offline").glob("*.zip"))
    assert len(tsv_values(run_dir / "dvclive" / "plots" / "metrics" / "fitness.tsv")) == 1


@pytest.mark.parametrize("name", sorted(TRACKERS))
def test_asked_for_without_the_package_is_one_line_before_any_work(tiny, monkeypatch, name):
    """comet=True (clearml=, dvc=) on the command: without its package the run does not start (issue 29's rule)."""
    monkeypatch.setitem(sys.modules, TRACKERS[name], None)  # the standard way to make the import fail
    with pytest.raises(ConfigError, match=rf"^{name}=True needs {TRACKERS[name]}, which is not installed: pip install 'yolo-cb\[{name}\]'"):
        YOLO("yolox-nano.yaml").train(**{**tiny, name: True})
    assert not (Path(tiny["project"]) / tiny["name"]).exists()


def test_switched_on_in_the_user_settings_without_the_package_warns_with_the_hint_and_trains(tiny, tmp_path, monkeypatch, caplog):
    """The same switches from `yolo-cb settings comet=True ...` (not this command): one line each, the run goes on."""
    monkeypatch.setenv("YOLO_CB_CONFIG_DIR", str(tmp_path / "config"))
    from yolo_cb.cli import run

    run(["settings", "comet=True", "clearml=True", "dvc=True"])
    for module in TRACKERS.values():
        monkeypatch.setitem(sys.modules, module, None)
    with caplog.at_level(logging.WARNING, logger="yolo_cb"):
        YOLO("yolox-nano.yaml").train(**tiny)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("WARNING integration")]
    assert sorted(lines) == sorted(f"WARNING integration '{n}' is off: it needs {m} (pip install 'yolo-cb[{n}]')" for n, m in TRACKERS.items())
    assert len(results(Path(tiny["project"]) / tiny["name"])) == 1


def test_comet_is_imported_without_its_automatic_logging(tmp_path):
    """comet_ml's import-time patches (mlflow, torch, tensorboard, ...) would log on their own for the rest of the process:
    a later MLflow run then wrote .cometml-runs/ into the working directory. Our integration imports it with them off."""
    env = {k: v for k, v in os.environ.items() if k != "COMET_DISABLE_AUTO_LOGGING"}
    code = "from yolo_cb.integrations.comet import import_comet; print(hasattr(import_comet(), 'MODULE_FINDER'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert out.split()[-1] == "False"
