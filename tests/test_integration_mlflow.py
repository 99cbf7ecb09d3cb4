"""MLflow: a real `mlflow server` on loopback (one per module, on a real PostgreSQL), tiny trainings against it, read back with MlflowClient;
the server-less local store; and a closed port, a read-only store, a server that never answers (training completes with
exactly one warning); a kill -9 mid-run leaves every logged epoch whole."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from yolo_cb import YOLO
from yolo_cb.integrations.mlflow import MLflowUnavailable, check_writable, create_local_db, public_uri, safe_key
from yolo_cb.training.launch import free_port

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


def can_write(folder: Path) -> bool:
    try:
        (folder / ".probe").touch()
    except OSError:
        return False
    (folder / ".probe").unlink()
    return True


@contextlib.contextmanager
def read_only(folder: Path):
    """`folder` made read-only: mode 0555, and for root (whom modes do not stop) also bind-mounted read-only onto itself,
    as a read-only mount is; skipped where neither holds."""
    folder.chmod(0o555)
    mounted = False
    try:
        if can_write(folder):
            mounted = subprocess.run(["mount", "--bind", "-o", "ro", str(folder), str(folder)], capture_output=True).returncode == 0
            if not mounted or can_write(folder):
                pytest.skip("no way to make a read-only folder here (root without mount rights)")
        yield folder
    finally:
        if mounted:
            subprocess.run(["umount", "--lazy", str(folder)], check=True)  # lazy: a file MLflow left open cannot keep it
        folder.chmod(0o755)


@contextlib.contextmanager
def log_records():
    """Every record of yolo-cb's and MLflow's loggers (MLflow's do not reach pytest's caplog), in order."""
    import mlflow  # noqa: F401  (its first import configures its loggers, dropping handlers added before)

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    loggers = [logging.getLogger(name) for name in ("yolo_cb", "mlflow", "alembic")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def our_mlflow_warnings(records) -> list[str]:
    return [r.getMessage() for r in records if r.name.startswith("yolo_cb") and r.levelno >= logging.WARNING and "MLflow" in r.getMessage()]


@pytest.mark.slow
@pytest.mark.parametrize("existing", [False, True], ids=["empty-folder", "existing-store"])
def test_read_only_store_one_warning_before_the_first_epoch(tiny, tmp_path, monkeypatch, existing):
    """Issue 45: ~100 s of MLflow's engine retries (9 notes), or its traceback; now one line before the first epoch."""
    store = tmp_path / "store"
    store.mkdir()
    if existing:
        assert create_local_db(store / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store / 'mlflow.db'}")
    for key in ("MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN"):
        monkeypatch.delenv(key, raising=False)
    said_at_first_epoch = []
    with read_only(store), log_records() as records:
        model = YOLO("yolox-nano.yaml")
        model.add_callback("on_train_epoch_start", lambda trainer: said_at_first_epoch.append(len(our_mlflow_warnings(records))))
        metrics = model.train(**{**tiny, "mlflow": True})
    assert "fitness" in metrics
    assert not [r.getMessage()[:200] for r in records if not r.name.startswith("yolo_cb") and r.levelno >= logging.WARNING]
    (warning,) = our_mlflow_warnings(records)
    assert "cannot be written" in warning and str(store) in warning and "training goes on" in warning
    assert said_at_first_epoch == [1]  # before the first epoch began, not after MLflow's retries
    assert sorted(p.name for p in store.iterdir()) == (["mlflow.db"] if existing else [])


def test_the_write_check_takes_folders_mlflow_will_make_and_refuses_read_only_ones(tmp_path):
    check_writable(f"sqlite:///{tmp_path / 'new' / 'deeper' / 'mlflow.db'}")  # MLflow makes missing folders itself
    assert not (tmp_path / "new").exists()  # the check made none of them
    locked = tmp_path / "locked"
    locked.mkdir()
    with read_only(locked), pytest.raises(MLflowUnavailable, match="cannot be written"):
        check_writable(f"sqlite:///{locked / 'new' / 'mlflow.db'}")


@pytest.mark.slow
def test_a_server_that_never_answers_costs_a_bounded_wait_and_one_warning(tiny, monkeypatch):
    """A server that accepts and never replies: the first epoch's end waits START_WAIT_S at most, one warning, done."""
    from yolo_cb.integrations import mlflow as integration

    monkeypatch.setattr(integration, "START_WAIT_S", 2.0)
    monkeypatch.setattr(integration, "CLOSE_TIMEOUT_S", 1.0)
    with socket.create_server(("127.0.0.1", 0)) as silent, log_records() as records:  # the kernel accepts; nobody reads
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{silent.getsockname()[1]}")
        model = YOLO("yolox-nano.yaml")
        metrics = model.train(**{**tiny, "epochs": 2, "mlflow": True, "fraction": 0.25})
    assert "fitness" in metrics and model.trainer.epoch == 1  # both epochs ran
    (warning,) = our_mlflow_warnings(records)
    assert "not created within 2 s" in warning and "training goes on" in warning


@pytest.mark.slow
def test_a_kill_leaves_every_logged_epoch_whole(tmp_path, shapes_small_yaml):
    """kill -9 while MLflow's thread logs epochs: the store is intact, with every setting and each epoch whole."""
    from mlflow.tracking import MlflowClient

    project = tmp_path / "runs"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    cmd = [sys.executable, "-m", "yolo_cb", "train", f"data={shapes_small_yaml}", "model=yolox-nano.yaml", "imgsz=64", "batch=8",
           "epochs=100", "workers=0", "mosaic=0.0", "tensorboard=False", "onnx_check=False", "plots=True", "warmup_epochs=0",
           "fraction=0.25", f"project={project}", "name=killed"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    db = project / "mlruns" / "mlflow.db"
    try:
        deadline = time.monotonic() + 300  # a bound on waiting for the child, not a timing claim
        while proc.poll() is None and time.monotonic() < deadline:
            if db.is_file() and logged_steps(db) >= 3:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "training ended before it was killed"
        proc.kill()
    finally:
        proc.kill()
        proc.wait()
    with sqlite3.connect(db) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    client = MlflowClient(f"sqlite:///{db}")
    run = only_run(client, project.name)
    assert run.info.status == "RUNNING"  # nobody ended it
    assert run.data.params["epochs"] == "100" and len(run.data.params) > 50
    histories = {key: sorted(m.step for m in client.get_metric_history(run.info.run_id, key)) for key in EPOCH_KEYS}
    steps = histories["train/iou_loss"]
    assert len(steps) >= 3 and steps == list(range(len(steps))) and all(h == steps for h in histories.values()), histories


def logged_steps(db: Path) -> int:
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)) as connection:
            return connection.execute("SELECT COUNT(DISTINCT step) FROM metrics WHERE key = 'train/iou_loss'").fetchone()[0]
    except sqlite3.Error:  # the tables are not there yet
        return 0
