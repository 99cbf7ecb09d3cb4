"""ClearML (clearml=True, off by default; `pip install 'yolo-cb[clearml]'`).

Logged (main process only) into a ClearML task of type "training": every setting as hyperparameters (section
"settings"); every LOG_EVERY training batches the batch losses (scalar title "batch", iteration = the global batch
index); each epoch the record results.csv writes its row from as scalars (title = the key's prefix: `metrics`, `train`,
`val`, `lr`, `time`; series = the rest, e.g. `mAP50-95(B)`; iteration = the 0-based epoch); the visualisation JPEGs as
debug images (title "images", series = the file name without its epoch); at the end best.pt's confusion matrix as a
plot and best.pt as the artifact "best.pt".

Mode: CLEARML_OFFLINE_MODE=1 (or `Task.set_offline(True)` before training) logs without a server: the offline session
(task.json, metrics.jsonl, the images and artifacts, and a zip of it all) goes into `<run>/clearml/offline/<task id>/`
(CLEARML_CACHE_DIR moves it); import it later with `clearml-task --import-offline-session <zip>` or
`Task.import_offline_session(zip)`. Otherwise the server of ClearML's own settings (clearml.conf, CLEARML_API_HOST /
CLEARML_API_ACCESS_KEY / CLEARML_API_SECRET_KEY); without one ClearML raises and this integration warns once and is off.
Project: CLEARML_PROJECT, else the basename of `project`, else "yolo-cb"; task name: CLEARML_TASK, else the run dir name.

ClearML's automatic capture (frameworks, argparse, stdout, resource monitoring, repository) is off: what it would add is
logged here on purpose or is not the run's. Task.init's process hooks (signal handlers, sys.excepthook) are put back as
they were, so the trainer's own Ctrl-C / SIGTERM handling stays in charge; its reports are written by a thread, not by a
forked process (measured: a forked reporter makes every close wait 10 s).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

from yolo_cb.callbacks.registry import integration
from yolo_cb.integrations.tracking import Tracker, best_weights, final_confusion, project_name
from yolo_cb.utils.log import LOGGER

TRUE_TEXT = ("1", "true", "yes", "on")
FRAMEWORKS = ("matplotlib", "tensorflow", "tensorboard", "pytorch", "xgboost", "scikit", "fastai", "lightgbm", "hydra",
              "detect_repository", "tfdefines", "joblib", "megengine", "catboost", "gradio")  # Task.init's automatic capture
HOOKED = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGQUIT", "SIGABRT") if hasattr(signal, name))


def offline_asked() -> bool:
    return (os.environ.get("CLEARML_OFFLINE_MODE") or "").strip().lower() in TRUE_TEXT


@contextlib.contextmanager
def process_hooks_kept():
    """Signal handlers and sys.excepthook as they are now, restored after the block (Task.init replaces them)."""
    handlers = {sig: signal.getsignal(sig) for sig in HOOKED}
    excepthook = sys.excepthook
    try:
        yield
    finally:
        for sig, handler in handlers.items():
            with contextlib.suppress(ValueError, TypeError, OSError):  # not the main thread: nothing was replaced
                signal.signal(sig, handler)
        sys.excepthook = excepthook


@contextlib.contextmanager
def cache_dir(folder: Path):
    """CLEARML_CACHE_DIR = folder during the block unless the user set it (ClearML fixes the offline folder at init)."""
    if os.environ.get("CLEARML_CACHE_DIR"):
        yield
        return
    os.environ["CLEARML_CACHE_DIR"] = str(folder)
    try:
        yield
    finally:
        os.environ.pop("CLEARML_CACHE_DIR", None)


def series_of(key: str) -> tuple[str, str]:
    """A record key as (title, series): metrics/mAP50(B) -> ('metrics', 'mAP50(B)'); fitness -> ('fitness', 'fitness')."""
    title, _, series = key.partition("/")
    return (title, series) if series else (key, key)


@integration("clearml", enabled=lambda args: bool(args.clearml), requires={"clearml": "pip install 'yolo-cb[clearml]'"})
class ClearML(Tracker):
    """Logs a training to ClearML; see the module docstring."""

    title = "ClearML"
    prior: tuple = (False, None, True)  # (offline mode, CLEARML_OFFLINE_MODE, forked reporter) before start, restored at close

    def start(self, trainer):
        from clearml import Task

        save_dir = Path(trainer.save_dir)
        self.prior = (Task.is_offline(), os.environ.get("CLEARML_OFFLINE_MODE"), Task._report_subprocess_enabled)
        if offline_asked():
            Task.set_offline(True)
        Task._report_subprocess_enabled = False  # reports from a thread (the module docstring says why)
        project, name = project_name(trainer, "CLEARML_PROJECT"), os.environ.get("CLEARML_TASK") or save_dir.name
        with process_hooks_kept(), cache_dir(save_dir.resolve() / "clearml"):
            task = Task.init(project_name=project, task_name=name, task_type=Task.TaskTypes.training, reuse_last_task_id=False,
                             auto_connect_frameworks=dict.fromkeys(FRAMEWORKS, False), auto_connect_arg_parser=False,
                             auto_resource_monitoring=False, auto_connect_streams=False)
            folder = task.get_offline_mode_folder() if Task.is_offline() else None
        task.connect(trainer.args.as_dict(), name="settings")
        where = f"offline session in {folder}" if folder else "the ClearML server"
        LOGGER.info(f"ClearML: task '{name}' ({task.id}) of project '{project}', {where}")
        return task

    def log_batch(self, trainer, step, losses):
        logger = self.session.get_logger()
        for key, value in losses.items():
            logger.report_scalar("batch", key.partition("/")[2], float(value), iteration=step)

    def log_epoch(self, trainer, record, images):
        logger = self.session.get_logger()
        for key, value in record.scalars().items():
            logger.report_scalar(*series_of(key), float(value), iteration=trainer.epoch)
        for path, tag, epoch in images:
            logger.report_image("images", tag, iteration=epoch, local_path=str(path))
        logger.flush()

    def log_end(self, trainer):
        confusion = final_confusion(trainer)
        if confusion is not None:
            counts, labels = confusion
            # ClearML draws matrix[y][x]: ours is rows predicted, columns true
            self.session.get_logger().report_confusion_matrix("confusion matrix (best.pt)", "val", counts.tolist(),
                                                              iteration=trainer.epoch, xlabels=labels, ylabels=labels,
                                                              xaxis="true", yaxis="predicted")
        best = best_weights(trainer)
        if best is not None:
            self.session.upload_artifact("best.pt", artifact_object=str(best), wait_on_upload=True)

    def close(self, failed):
        from clearml import Task

        try:
            self.session.close()  # (mark_failed first would go through the server API's request checks: minutes offline)
        finally:  # the process as it was: offline mode, its variable, the reporter kind
            offline, variable, subprocess_reports = self.prior
            with contextlib.suppress(Exception):  # going online again contacts the server (none, offline): the flags are set first
                Task.set_offline(offline)
            if variable is None:
                os.environ.pop("CLEARML_OFFLINE_MODE", None)
            else:
                os.environ["CLEARML_OFFLINE_MODE"] = variable
            Task._report_subprocess_enabled = subprocess_reports
