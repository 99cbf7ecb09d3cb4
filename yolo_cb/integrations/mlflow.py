"""MLflow (mlflow=True): the resolved settings, per-epoch losses/learning rates/metrics and the run's files.

Where it logs (first match):
1. an MLflow run already active in this process (`mlflow.start_run()` before `train()`): reused, and left open;
2. MLFLOW_TRACKING_URI (also set by `mlflow.set_tracking_uri()`), e.g. http://127.0.0.1:5000;
3. a local store with no server: `<project or runs/detect>/mlruns/mlflow.db` (SQLite) with artifacts in
   `<project or runs/detect>/mlruns/artifacts` — view it with `mlflow ui --backend-store-uri sqlite:///<that path>`.
Experiment: MLFLOW_EXPERIMENT_NAME, else the basename of `project`, else "yolo-cb". Run name: MLFLOW_RUN, else the
run dir name. A resumed training continues its MLflow run (the run id is stored in the checkpoint).
MLFLOW_KEEP_RUN_ACTIVE (Ultralytics') is refused with one warning: start the run yourself (case 1) to keep it open.
Logged: every setting as a param (on_pretrain_routine_end); each epoch (on_fit_epoch_end, step = 0-based epoch) the
train losses, learning rates and — for epochs that validated — the metrics, with keys made MLflow-safe
(`metrics/mAP50-95(B)` -> `metrics/mAP50-95B`); visualisation JPEGs as they appear; at on_train_end best.pt, last.pt
(under weights/), results.csv, args.yaml, plots (png/jpg) and any .onnx. The run ends FINISHED after training, FAILED on
an error, KILLED on Ctrl-C / SIGTERM. An unreachable server or any MLflow failure gives one warning and switches
MLflow off for the rest of the run; training goes on.

The MLflow calls (its import, the store's setup, the run, every metric and file) run on one background thread, in
order, so that the training does not wait for them: each event hands over a copy of what it logs. The training waits
for that thread only at the end of the first epoch until the run exists (at most START_WAIT_S; so that the first
checkpoint names the run a resume continues) and at on_train_end until everything is logged (at most FLUSH_TIMEOUT_S,
then one warning says what may be missing). A local SQLite store that cannot be written (a read-only mount or
folder) is refused in one warning line before MLflow sees it: MLflow itself retries for ~100 s before failing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import sys
import time
import warnings
from pathlib import Path
from urllib.parse import urlparse

from yolo_cb.callbacks.registry import integration
from yolo_cb.integrations.tracking import Worker, refuse_unread
from yolo_cb.utils.files import create_temp, default_project
from yolo_cb.utils.log import LOGGER

# Applied only around our own MLflow calls, and only when the user has not set them: fail in seconds, not minutes.
HTTP_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
CONNECT_TIMEOUT_S = 3.0  # the up-front reachability check of an http(s) tracking server
QUIET_LOGGERS = ("mlflow", "alembic")  # their INFO lines (database creation, migrations) are muted during our calls
# each of its warnings/errors precedes an exception we report in one line (or a retry that then works)
SILENT_LOGGERS = ("mlflow.store.db.utils",)
START_WAIT_S = 60.0  # end of the first epoch: the longest wait for the run to exist
FLUSH_TIMEOUT_S = 120.0  # on_train_end: the longest wait for the queued metrics and files
CLOSE_TIMEOUT_S = 10.0  # after an error or an interrupt: the longest wait to mark the run FAILED / KILLED
MAX_PARAM_CHARS = 6000  # MLflow's limit for a param value
BATCH = 100  # params per log_batch request (MLflow's limit)
ROOT_FILES = ("results.csv", "args.yaml", "export_check.csv", "*.png", "*.jpg", "*.onnx")
WEIGHT_FILES = ("best.pt", "last.pt", "*.onnx")
# Ultralytics' MLflow variables yolo-cb does not read, and what does their job here
UNREAD = (("MLFLOW_KEEP_RUN_ACTIVE", "start the run yourself with mlflow.start_run(): yolo-cb logs into it and leaves it open"),)


class MLflowUnavailable(RuntimeError):
    """The tracking server cannot be reached."""


def safe_key(key: str) -> str:
    """An MLflow-valid metric/param name: brackets dropped, other characters outside [/\\w.\\- ] become '_'."""
    return re.sub(r"[^/\w.\- ]", "_", re.sub(r"[()\[\]{}]", "", str(key)))


def local_store(project: str | None) -> tuple[str, str]:
    """(tracking URI, artifact root URI) of the server-less store under `project` (default runs/detect)."""

    root = (Path(project) if project else default_project()).resolve() / "mlruns"
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'mlflow.db'}", (root / "artifacts").as_uri()


def create_local_db(db: Path) -> bool:
    """Create the local store's SQLite database `db` (MLflow's migrations, ~60 synced transactions: 3-6 s on 2 cores) on a
    temp file beside it with SQLite's syncing off, sync it once and link it into place unless another process made one
    meanwhile (os.link fails then): a kill leaves no half-made store. True when this call created it; on any failure
    (e.g. another MLflow version's internals) MLflow creates it itself."""
    if db.exists():
        return False
    import sqlalchemy
    from mlflow.store.db.utils import _initialize_tables

    fd, tmp = create_temp(db.parent, f".{db.name}.", ".tmp")
    os.close(fd)
    try:
        engine = sqlalchemy.create_engine(f"sqlite:///{tmp}", poolclass=sqlalchemy.pool.NullPool)
        sqlalchemy.event.listen(engine, "connect", _unsynced)
        try:
            _initialize_tables(engine)
        finally:
            engine.dispose()
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.link(tmp, db)
        return True
    except FileExistsError:  # another process created it meanwhile: use theirs
        return False
    except Exception as error:
        LOGGER.debug(f"MLflow: the store was not prepared ahead ({type(error).__name__}: {error}); MLflow creates it")
        return False
    finally:
        Path(tmp).unlink(missing_ok=True)


def _unsynced(connection, _record) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA synchronous=OFF")
    cursor.execute("PRAGMA journal_mode=MEMORY")
    cursor.close()


def check_writable(uri: str) -> None:
    """Raise MLflowUnavailable when `uri` is a SQLite store this process cannot write (its folder or its file on a
    read-only mount, or without write permission): MLflow would retry creating its engine for ~100 s."""
    name = uri.removeprefix("sqlite:///").split("?")[0]
    if not uri.startswith("sqlite:///") or name in ("", ":memory:"):
        return
    db = folder = Path(name).absolute()
    while not folder.is_dir() and folder != folder.parent:  # MLflow makes missing folders: the first one there must take them
        folder = folder.parent
    try:
        fd, tmp = create_temp(folder, ".mlflow-write-check.", ".tmp")  # SQLite writes its journal beside the file
        os.close(fd)
        os.unlink(tmp)
        if db.exists():
            open(db, "r+b").close()
    except OSError as error:
        raise MLflowUnavailable(f"the store {db} cannot be written ({error.strerror or type(error).__name__}: "
                                f"{error.filename or db}); point MLFLOW_TRACKING_URI or project= at a writable place") from error


def public_uri(uri: str) -> str:
    """The URI without any user:password@ part (for logs and checkpoints)."""
    parsed = urlparse(uri)
    if parsed.username is None and parsed.password is None:
        return uri
    return parsed._replace(netloc=parsed.netloc.rsplit("@", 1)[-1]).geturl()


def check_reachable(uri: str) -> None:
    """Raise MLflowUnavailable when an http(s) tracking URI does not accept a TCP connection within a few seconds."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("http", "https"):
        return
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as error:
        raise MLflowUnavailable(f"tracking server {public_uri(uri)} is unreachable ({type(error).__name__}: {error})") from error


@contextlib.contextmanager
def quiet_mlflow():
    """Short HTTP retries/timeouts (unless set by the user), MLflow/alembic INFO lines and warnings muted; all restored after."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import mlflow  # noqa: F401  (its import configures its loggers: do that before we adjust their levels)
    added = [k for k in HTTP_ENV if k not in os.environ]
    for key in added:
        os.environ[key] = HTTP_ENV[key]
    loggers = [(logging.getLogger(name), logging.getLogger(name).level) for name in QUIET_LOGGERS]
    for logger, _ in loggers:
        logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in loggers:
            logger.setLevel(level)
        for key in added:
            os.environ.pop(key, None)


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text[:300]}" if not isinstance(error, MLflowUnavailable) else text


@integration("mlflow", enabled=lambda args: bool(args.mlflow), requires={"mlflow": "pip install mlflow"})
class MLflow:
    """Logs a training to MLflow (main process only) from a background thread; see the module docstring."""

    rank_zero_only = True

    def __init__(self):
        self.client = None
        self.run_id: str | None = None
        self.tracking_uri: str | None = None
        self.owns_run = False  # we created (or reopened) the run, so we end it
        self.off = False  # switched off after a failure (one warning)
        self.uploaded, self.resume_state = set(), {}  # artifacts sent ("<folder>/<name>"); the checkpoint's state
        self.worker = Worker("MLflow", self._fail)
        self.pending = self.started = None  # on_pretrain_routine_end's (where, names, settings); the start job's Event
        self.saved_levels, self.added_env = [], []  # (logger, level) muted while the worker runs; HTTP_ENV keys we set

    # --- checkpoint state: a resumed training continues its run ----------------------------
    def state_dict(self) -> dict:
        return {"run_id": self.run_id, "tracking_uri": public_uri(self.tracking_uri)} if self.run_id and self.owns_run else {}

    def load_state_dict(self, state: dict) -> None:
        self.resume_state = dict(state or {})

    def _fail(self, error: BaseException) -> None:
        """Warn once, switch MLflow off; training goes on (called from the worker thread too)."""
        if not self.off:
            self.off = True
            LOGGER.warning(f"WARNING MLflow: {_short(error)}; MLflow logging is off for the rest of this run (training goes on)")

    def _submit(self, fn, *args):
        return None if self.off else self.worker.submit(fn, *args)

    def _mute_loggers(self) -> None:
        """After MLflow's import (which sets its loggers' levels): its INFO lines off, its store's retry notes off."""
        import mlflow  # noqa: F401

        names = [(name, logging.WARNING) for name in QUIET_LOGGERS] + [(name, logging.CRITICAL) for name in SILENT_LOGGERS]
        self.saved_levels = [(logging.getLogger(name), logging.getLogger(name).level) for name, _ in names]
        for name, level in names:
            logging.getLogger(name).setLevel(level)

    def _restore(self) -> None:
        for logger, level in self.saved_levels:
            logger.setLevel(level)
        for key in self.added_env:
            os.environ.pop(key, None)
        self.saved_levels, self.added_env = [], []

    # --- start -------------------------------------------------------------------------------
    def on_pretrain_routine_end(self, trainer):
        refuse_unread(UNREAD, "MLflow")
        try:
            where = self._where(trainer)
        except Exception as error:  # the store cannot be used: one line now, before any thread or MLflow call
            self._fail(error)
            return
        settings = {safe_key(k): str(v)[:MAX_PARAM_CHARS] for k, v in sorted(trainer.args.as_dict().items())}
        project = trainer.args.project
        names = (os.environ.get("MLFLOW_EXPERIMENT_NAME") or (Path(str(project)).name if project else "") or "yolo-cb",
                 os.environ.get("MLFLOW_RUN") or Path(trainer.save_dir).name)
        self.added_env = [k for k in HTTP_ENV if k not in os.environ]  # short HTTP retries until _restore (main thread:
        for key in self.added_env:  # os.environ is not safe to change from another thread)
            os.environ[key] = HTTP_ENV[key]
        self.pending = (where, names, settings)

    def on_train_start(self, trainer):
        """The thread starts after the other integrations' start-up (ONNX check, graph trace): MLflow's import (~1 s of
        Python) holds the interpreter lock against them; the epoch's tensor maths releases it."""
        pending, self.pending = self.pending, None
        if pending is not None:
            self.started = self._submit(self._start, *pending)

    def _where(self, trainer) -> dict:
        """Where to log, decided in the main thread (MLflow's active run is per thread); a SQLite store is checked here."""
        mlflow = sys.modules.get("mlflow")  # a run the user started means MLflow is imported already
        active = mlflow.active_run() if mlflow is not None else None
        if active is not None:
            return {"uri": mlflow.get_tracking_uri(), "artifact_root": None, "active": active.info.run_id, "local": False}
        if os.environ.get("MLFLOW_TRACKING_URI"):
            uri, artifact_root, local = os.environ["MLFLOW_TRACKING_URI"], None, False
        else:
            uri, artifact_root = local_store(trainer.args.project)
            local = True
        check_writable(uri)
        return {"uri": uri, "artifact_root": artifact_root, "active": None, "local": local}

    def _start(self, where: dict, names: tuple[str, str], settings: dict[str, str]) -> None:
        self._mute_loggers()
        from mlflow.tracking import MlflowClient

        uri = where["uri"]
        if where["local"]:
            create_local_db(Path(uri.removeprefix("sqlite:///")))
        check_reachable(uri)
        client = MlflowClient(uri)
        if where["active"] is not None:
            run_id, how = where["active"], "the active run"
        else:
            run_id, how = self._reopen(client, uri), "resumed run"
            if run_id is None:
                run_id, how = self._create_run(client, names, where["artifact_root"]), "new run"
        self.client, self.tracking_uri, self.owns_run, self.run_id = client, uri, where["active"] is None, run_id
        self._log_params(settings)
        run = client.get_run(run_id)
        experiment = client.get_experiment(run.info.experiment_id)
        shown = public_uri(uri)
        place = f"{shown.rstrip('/')}/#/experiments/{experiment.experiment_id}/runs/{run_id}" if shown.startswith("http") else \
            f"{shown} (view: mlflow ui --backend-store-uri {shown})"
        LOGGER.info(f"MLflow: logging to {how} '{run.info.run_name}' of experiment '{experiment.name}' at {place}")

    def _reopen(self, client, uri: str) -> str | None:
        """The run of the checkpoint being resumed, set RUNNING again, if it is in this store."""
        run_id = self.resume_state.get("run_id")
        if not run_id or self.resume_state.get("tracking_uri") != public_uri(uri):
            return None
        try:
            client.get_run(run_id)
        except Exception:  # deleted, or another store: start a new run
            return None
        client.update_run(run_id, status="RUNNING")
        return run_id

    @staticmethod
    def _create_run(client, names: tuple[str, str], artifact_root: str | None) -> str:
        experiment_name, run_name = names
        experiment = client.get_experiment_by_name(experiment_name)
        if experiment is None:
            experiment_id = client.create_experiment(experiment_name, artifact_location=artifact_root)
        else:
            experiment_id = experiment.experiment_id
            if experiment.lifecycle_stage == "deleted":
                client.restore_experiment(experiment_id)
        return client.create_run(experiment_id, run_name=run_name, tags={"mlflow.source.name": "yolo-cb"}).info.run_id

    def _log_params(self, settings: dict[str, str]) -> None:
        """Every setting as a param; keys the run already has (a resume, a reused run) are left as they are."""
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params
        params = [Param(k, v) for k, v in settings.items() if k not in existing]
        for i in range(0, len(params), BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + BATCH])

    def on_train_epoch_end(self, trainer):
        """The first epoch's checkpoint names the run (a resume continues it): wait for the run to exist, once."""
        started, self.started = self.started, None
        if started is not None and not self.off and not started.wait(START_WAIT_S):
            self._fail(MLflowUnavailable(f"the run was not created within {START_WAIT_S:.0f} s"))

    def on_fit_epoch_end(self, trainer):
        if self.off or self.worker.thread is None:
            return
        stamp = int(time.time() * 1000)
        values = {safe_key(k): float(v) for k, v in trainer.epoch_record.scalars().items()}
        self._submit(self._log_epoch, values, stamp, int(trainer.epoch), [Path(p) for p in trainer.new_images])

    def _log_epoch(self, values: dict[str, float], stamp: int, epoch: int, images: list[Path]) -> None:
        from mlflow.entities import Metric

        self.client.log_batch(self.run_id, metrics=[Metric(k, v, stamp, epoch) for k, v in values.items()])
        for path in images:
            self._upload(path, None)

    def _upload(self, path: Path, artifact_path: str | None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)
        self.uploaded.add(f"{artifact_path or ''}/{path.name}")

    def on_train_end(self, trainer):
        if self.worker.thread is not None:  # a run started (rank 0); a DDP rank > 0 has none to send files to (it did)
            self._submit(self._log_files, Path(trainer.save_dir))
        self._close("FINISHED", FLUSH_TIMEOUT_S)

    def _log_files(self, save_dir: Path) -> None:
        for folder, patterns, artifact_path in ((save_dir, ROOT_FILES, None), (save_dir / "weights", WEIGHT_FILES, "weights")):
            for path in sorted({p for pattern in patterns for p in folder.glob(pattern) if p.is_file()}):
                if path.suffix == ".jpg" and f"{artifact_path or ''}/{path.name}" in self.uploaded:
                    continue  # a visualisation image already sent at its epoch
                self._upload(path, artifact_path)

    def on_exception(self, trainer):
        error = trainer.exception
        status = "KILLED" if isinstance(error, (KeyboardInterrupt, SystemExit)) else "FAILED"
        if status == "FAILED" and self.worker.thread is not None:
            text = f"{type(error).__name__}: {error}"[:5000]
            self._submit(lambda: self.run_id and self.client.set_tag(self.run_id, "yolo_cb.error", text))
        self._close(status, CLOSE_TIMEOUT_S)

    def teardown(self, trainer):
        self._close("FAILED" if trainer.exception is not None else "FINISHED", CLOSE_TIMEOUT_S)

    def _close(self, status: str, timeout: float) -> None:
        """End the run we own (not a reused active run) with `status`, waiting at most `timeout` s for the queued work."""
        if self.worker.thread is not None:
            self.worker.submit(self._end, status, always=True)
            if not self.worker.finish(min(timeout, CLOSE_TIMEOUT_S) if self.off else timeout) and not self.off:
                self.off = True
                LOGGER.warning(f"WARNING MLflow: the metrics and files queued for MLflow were not all sent within {timeout:.0f} s "
                               f"(the store is slow or unreachable); the MLflow run may miss the last of them (training is done)")
            self.worker = Worker("MLflow", self._fail)  # a later event (teardown after on_train_end) starts nothing old
        self._restore()

    def _end(self, status: str) -> None:
        run_id, self.run_id = self.run_id, None
        if not self.owns_run or self.client is None or run_id is None:
            return
        try:
            self.client.set_terminated(run_id, status)
        except Exception as error:
            if not self.off:  # keep it to one warning per run
                LOGGER.warning(f"WARNING MLflow: could not end run {run_id} as {status} ({_short(error)})")
            self.off = True
