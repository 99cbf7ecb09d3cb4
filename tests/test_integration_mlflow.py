"""MLflow: a real `mlflow server` on loopback (one per module, on a real PostgreSQL), tiny trainings against it, read back with MlflowClient;
the server-less local store; and a closed port (training completes with exactly one warning)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from yolo_cb import YOLO
from yolo_cb.integrations.mlflow import create_local_db, public_uri, safe_key
from yolo_cb.launch import free_port

EPOCH_KEYS = ("train/iou_loss", "train/obj_loss", "train/cls_loss", "train/l1_loss", "lr/pg0", "lr/pg1", "lr/pg2",
              "metrics/precisionB", "metrics/recallB", "metrics/mAP50B", "metrics/mAP50-95B", "fitness", "val/iou_loss", "val/l1_loss")


@pytest.fixture(scope="module")
def server(tmp_path_factory, postgres):
    """A real MLflow tracking server as a team runs one: a PostgreSQL backend store (a real server on loopback,
    tests/pg_server.py), artifacts proxied by the server into a folder in tmp; its URI."""
    root = tmp_path_factory.mktemp("mlflow_server")
    port = free_port()
    cmd = [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
           "--backend-store-uri", postgres.database("mlflow"), "--artifacts-destination", str(root / "artifacts"),
           "--workers", "1"]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no background job workers: 2 CPU cores
    env.pop("MLFLOW_TRACKING_URI", None)
    log = open(root / "server.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=root, env=env, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if urllib.request.urlopen(f"{uri}/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its uvicorn worker (its own process group)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.fixture
def env(monkeypatch, server, request):
    """MLFLOW_TRACKING_URI -> the server, and an experiment of this test's own."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", request.node.name.replace("[", "-").replace("]", ""))
    monkeypatch.delenv("MLFLOW_RUN", raising=False)
    return server


def only_run(client, experiment_name: str):
    experiment = client.get_experiment_by_name(experiment_name)
    assert experiment is not None, f"experiment {experiment_name} not created"
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return runs[0]


def mlflow_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "mlflow" in r.getMessage().lower()]


def test_safe_key():
    assert safe_key("metrics/mAP50-95(B)") == "metrics/mAP50-95B"
    assert safe_key("lr/pg0") == "lr/pg0"
    assert safe_key("a:b*c") == "a_b_c"
    assert public_uri("https://user:secret@mlflow.example:5000") == "https://mlflow.example:5000"  # never in logs / checkpoints


@pytest.mark.slow
def test_run_logged_to_server(env, tiny, monkeypatch, caplog):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_RUN", "tiny-run")
    YOLO("yolox-nano.yaml").train(**{**tiny, "epochs": 2, "mlflow": True, "plots": True, "fraction": 0.25})  # 1 train batch
    client = MlflowClient(env)
    run = only_run(client, os.environ["MLFLOW_EXPERIMENT_NAME"])
    assert run.info.run_name == "tiny-run"
    assert run.info.status == "FINISHED"

    params = run.data.params
    assert params["epochs"] == "2" and params["imgsz"] == "64" and params["batch"] == "8" and params["mlflow"] == "True"
    assert len(params) > 50  # every setting

    for key in EPOCH_KEYS:
        history = client.get_metric_history(run.info.run_id, key)
        assert sorted(m.step for m in history) == [0, 1], (key, history)  # exactly one point per epoch
    assert all("(" not in k for k in run.data.metrics)
    for phase in ("data", "forward", "backward", "optimizer", "callbacks", "val", "epoch"):  # phase timings, one point per epoch
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, f"time/{phase}_ms")) == [0, 1], phase

    top = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"results.csv", "args.yaml", "results.png", "train_batch0.jpg", "val_batch0_labels.jpg",
            "val_batch0_pred_epoch1.jpg", "val_batch0_pred_epoch2.jpg", "weights"} <= top, top
    weights = {a.path for a in client.list_artifacts(run.info.run_id, "weights")}
    assert {"weights/best.pt", "weights/last.pt"} <= weights
    assert not mlflow_warnings(caplog)


@pytest.mark.slow
def test_resume_continues_the_run(env, tiny):
    from mlflow.tracking import MlflowClient

    def stop_after_first_epoch(trainer):
        trainer.stop = True

    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_fit_epoch_end", stop_after_first_epoch)
    model.train(**{**tiny, "epochs": 2, "mlflow": True, "fraction": 0.25})
    client = MlflowClient(env)
    run = only_run(client, os.environ["MLFLOW_EXPERIMENT_NAME"])
    assert run.info.status == "FINISHED"
    last = Path(tiny["project"]) / tiny["name"] / "weights" / "last.pt"
    YOLO(str(last)).train(resume=str(last))
    resumed = only_run(client, os.environ["MLFLOW_EXPERIMENT_NAME"])  # the same run, not a second one
    assert resumed.info.run_id == run.info.run_id and resumed.info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/iou_loss")) == [0, 1]


@pytest.mark.slow
def test_active_run_is_reused_and_left_open(env, tiny):
    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_experiment(os.environ["MLFLOW_EXPERIMENT_NAME"])
    with mlflow.start_run(run_name="outer") as outer:
        YOLO("yolox-nano.yaml").train(**{**tiny, "mlflow": True})
        assert mlflow.active_run().info.run_id == outer.info.run_id
        client = MlflowClient(env)
        assert client.get_run(outer.info.run_id).info.status == "RUNNING"  # not ended by the trainer
        assert len(client.get_metric_history(outer.info.run_id, "metrics/mAP50-95B")) == 1
        assert client.get_run(outer.info.run_id).data.params["epochs"] == "1"
    assert client.get_run(outer.info.run_id).info.status == "FINISHED"


@pytest.mark.slow
@pytest.mark.parametrize("error, status", [(RuntimeError, "FAILED"), (KeyboardInterrupt, "KILLED")])
def test_run_status_on_error_and_interrupt(env, tiny, error, status):
    from mlflow.tracking import MlflowClient

    def fail(trainer):
        raise error("stop here")

    model = YOLO("yolox-nano.yaml")
    model.add_callback("on_train_epoch_start", fail)
    with pytest.raises(Exception if error is RuntimeError else KeyboardInterrupt):
        model.train(**{**tiny, "mlflow": True})
    run = only_run(MlflowClient(env), os.environ["MLFLOW_EXPERIMENT_NAME"])
    assert run.info.status == status
    assert run.data.params["epochs"] == "1"


@pytest.mark.slow
def test_unreachable_server_one_warning_and_training_completes(tiny, monkeypatch, caplog):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    model = YOLO("yolox-nano.yaml")
    metrics = model.train(**{**tiny, "mlflow": True})
    assert "fitness" in metrics
    found = mlflow_warnings(caplog)
    assert len(found) == 1, found
    assert "unreachable" in found[0] and "training goes on" in found[0]
    # the up-front TCP check caught it ("unreachable"), so MLflow's retrying HTTP client was never used,
    # and the integration stayed off for every later event
    owner = next(e.owner for e in model.trainer.callbacks.entries() if e.name == "mlflow")
    assert owner.off is True


@pytest.mark.slow
def test_local_store_without_a_server(tiny, monkeypatch):
    from mlflow.tracking import MlflowClient

    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN"):
        monkeypatch.delenv(key, raising=False)
    YOLO("yolox-nano.yaml").train(**{**tiny, "mlflow": True})
    db = Path(tiny["project"]) / "mlruns" / "mlflow.db"
    assert db.is_file()
    client = MlflowClient(f"sqlite:///{db}")
    run = only_run(client, Path(tiny["project"]).name)  # experiment = basename of project
    assert run.info.run_name == "exp" and run.info.status == "FINISHED"
    assert len(client.get_metric_history(run.info.run_id, "train/iou_loss")) == 1
    assert {"weights/best.pt", "weights/last.pt"} <= {a.path for a in client.list_artifacts(run.info.run_id, "weights")}
    artifacts = Path(tiny["project"]) / "mlruns" / "artifacts"
    assert list(artifacts.rglob("best.pt"))  # artifacts beside the database, not in the cwd


def test_local_database_is_made_complete_ahead_of_mlflow(tmp_path):
    """The local store's database is made by yolo-cb (MLflow's migrations, unsynced, on a temp file linked into place):
    MLflow finds every table at its installed schema, creates nothing, and works in it; no temp file is left."""
    import sqlalchemy
    from mlflow.store.db.utils import _all_tables_exist, _verify_schema
    from mlflow.tracking import MlflowClient

    db = tmp_path / "mlruns" / "mlflow.db"
    db.parent.mkdir()
    assert create_local_db(db) is True
    assert create_local_db(db) is False  # already there: left as it is
    assert [p.name for p in db.parent.iterdir()] == ["mlflow.db"]
    engine = sqlalchemy.create_engine(f"sqlite:///{db}")
    try:
        assert _all_tables_exist(engine)
        _verify_schema(engine)  # raises when the schema is not the installed MLflow's head revision
    finally:
        engine.dispose()
    client = MlflowClient(f"sqlite:///{db}")
    run = client.create_run(client.create_experiment("x", artifact_location=(tmp_path / "artifacts").as_uri())).info.run_id
    client.log_metric(run, "fitness", 0.5, step=0)
    assert [m.value for m in client.get_metric_history(run, "fitness")] == [0.5]


@pytest.mark.slow
def test_a_tune_on_postgresql_prunes_and_logs_every_trial_to_the_server(env, tiny, postgres):
    """Scale-out as a team runs it: the study in PostgreSQL, tracking on the MLflow server (PostgreSQL behind it too).
    The pruner stops each trial after the first of its two epochs: PRUNED in the study, with one reported value; the
    tune's parent run and one nested run per trial, with the trainer's metrics and weights, are read back from the server."""
    import optuna
    from mlflow.tracking import MlflowClient

    storage = postgres.database("tune_pruned")
    result = YOLO("yolox-nano.yaml").tune(**{**tiny, "epochs": 2, "fraction": 0.25, "mlflow": True, "name": "pg"}, iterations=2,
                                          space={"momentum": [0.6, 0.98]}, pruner=optuna.pruners.ThresholdPruner(lower=2.0), storage=storage)
    assert result["trials"] == {"COMPLETE": 0, "PRUNED": 2, "FAIL": 0}
    study = optuna.load_study(study_name="pg", storage=storage)
    assert [t.state.name for t in study.trials] == ["PRUNED", "PRUNED"]
    assert all(list(t.intermediate_values) == [0] and t.user_attrs["epochs"] == 1 for t in study.trials)

    client = MlflowClient(env)
    experiment = client.get_experiment_by_name(os.environ["MLFLOW_EXPERIMENT_NAME"])
    runs = client.search_runs([experiment.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("yolo_cb.tune") == "parent"]
    assert parent.info.status == "FINISHED" and parent.data.params["iterations"] == "2"
    assert client.get_metric_history(parent.info.run_id, "best_fitness") == []  # no trial completed: no best yet
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert sorted(children) == ["trial_0", "trial_1"]
    for name, child in children.items():
        assert child.data.tags["optuna.state"] == "PRUNED" and child.info.status == "FINISHED", name
        assert [m.step for m in client.get_metric_history(child.info.run_id, "metrics/mAP50-95B")] == [0], name  # one epoch
        assert "weights/best.pt" in {a.path for a in client.list_artifacts(child.info.run_id, "weights")}, name
