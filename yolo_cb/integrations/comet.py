"""Comet (comet=True, off by default; `pip install 'yolo-cb[comet]'`).

Logged (main process only): every setting as a parameter; every LOG_EVERY training batches the batch losses
(`batch/iou_loss` ..., step = the global batch index); each epoch the record results.csv writes its row from (mean train
losses, learning rates, phase times and, for epochs that validated, the metrics; step = the global batch index at the
epoch's end, epoch = the 0-based epoch); the visualisation JPEGs as images; at the end best.pt's confusion matrix (the
final validation, classes + background) and best.pt as the model "yolo-cb" (COMET_MODEL_NAME renames it).

Mode: COMET_MODE=offline writes an offline archive (a zip of JSON messages) into `<run>/comet/` (COMET_OFFLINE_DIRECTORY
moves it); upload it later with `comet upload <run>/comet/<id>.zip`. COMET_MODE=online (Comet's default, and when
COMET_MODE is unset) logs to the server named by Comet's own settings (COMET_API_KEY, COMET_WORKSPACE, ~/.comet.config).
Project: COMET_PROJECT_NAME, else the basename of `project`, else "yolo-cb"; experiment name: the run dir name.
Any Comet failure warns once and switches this integration off; training goes on (integrations/tracking.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from yolo_cb.callbacks.registry import integration
from yolo_cb.integrations.tracking import Tracker, best_weights, final_confusion, project_name, refuse_unread
from yolo_cb.utils.log import LOGGER

MODES = ("online", "offline")  # the values of COMET_MODE (Ultralytics' variable; Comet itself does not read it)
# Comet's automatic logging is off: everything it would capture (argv, stdout, git, code, environment) is either
# logged by us on purpose or not the run's business, and its framework hooks would double the metrics.
QUIET = dict(auto_metric_logging=False, auto_param_logging=False, auto_output_logging=False, log_code=False, log_graph=False,
             log_git_metadata=False, log_git_patch=False, log_env_details=False, log_env_gpu=False, log_env_host=False,
             log_env_cpu=False, auto_histogram_weight_logging=False, display_summary_level=0)
# Ultralytics' Comet variables yolo-cb does not read, and what does their job here
UNREAD = (("COMET_EVAL_BATCH_LOGGING_INTERVAL", "the visualisation images are logged as plots= and plot_period= make them"),
          ("COMET_EVAL_LOG_IMAGE_PREDICTIONS", "plots=false logs no images"),
          ("COMET_MAX_IMAGE_PREDICTIONS", "the visualisation grid holds up to 16 images"),
          ("COMET_EVAL_LOG_CONFUSION_MATRIX", "best.pt's confusion matrix is always logged at the end"),
          ("COMET_DEFAULT_CHECKPOINT_FILENAME", "best.pt is the model logged"))


def comet_mode() -> str:
    """COMET_MODE, checked: online (the default) or offline."""
    mode = (os.environ.get("COMET_MODE") or "online").strip().lower()
    if mode not in MODES:
        raise ValueError(f"COMET_MODE={os.environ['COMET_MODE']!r} is not one of {', '.join(MODES)}")
    return mode


def import_comet():
    """comet_ml, imported with its automatic logging off unless the user turned it on (COMET_DISABLE_AUTO_LOGGING=0): on
    import it patches mlflow, torch, tensorboard and others to log them on its own, for the rest of the process, and a
    patched mlflow opens Comet experiments in the working directory (.cometml-runs/) whenever MLflow logs. This
    integration logs what it logs explicitly."""
    os.environ.setdefault("COMET_DISABLE_AUTO_LOGGING", "1")
    import comet_ml

    return comet_ml


@integration("comet", enabled=lambda args: bool(args.comet), requires={"comet_ml": "pip install 'yolo-cb[comet]'"})
class Comet(Tracker):
    """Logs a training to Comet; see the module docstring."""

    title = "Comet"

    def start(self, trainer):
        comet_ml = import_comet()
        refuse_unread(UNREAD, self.title)
        save_dir = Path(trainer.save_dir)
        mode, project = comet_mode(), project_name(trainer, "COMET_PROJECT_NAME")
        if mode == "offline":
            folder = os.environ.get("COMET_OFFLINE_DIRECTORY") or str(save_dir / "comet")
            experiment = comet_ml.OfflineExperiment(project_name=project, offline_directory=folder, **QUIET)
            where = f"offline archive in {folder} (upload: comet upload {folder}/<id>.zip)"
        else:
            experiment = comet_ml.Experiment(project_name=project, **QUIET)
            where = experiment.url
        experiment.set_name(save_dir.name)
        experiment.log_parameters(trainer.args.as_dict())
        LOGGER.info(f"Comet: experiment '{save_dir.name}' of project '{project}', {where}")
        return experiment

    def log_batch(self, trainer, step, losses):
        self.session.log_metrics(losses, step=step, epoch=trainer.epoch)

    def log_epoch(self, trainer, record, images):
        step = (trainer.epoch + 1) * trainer.num_batches - 1
        self.session.log_metrics(record.scalars(), step=step, epoch=trainer.epoch)
        for path, tag, epoch in images:
            self.session.log_image(str(path), name=tag, step=epoch)

    def log_end(self, trainer):
        step = (trainer.epoch + 1) * trainer.num_batches - 1
        confusion = final_confusion(trainer)
        if confusion is not None:
            counts, labels = confusion
            # Comet's rows are the true class and its columns the predicted one: ours transposed
            self.session.log_confusion_matrix(matrix=counts.T.tolist(), labels=labels, title="confusion matrix (best.pt)",
                                              row_label="true", column_label="predicted", step=step, epoch=trainer.epoch,
                                              file_name="confusion-matrix.json")
        best = best_weights(trainer)
        if best is not None:
            self.session.log_model(os.environ.get("COMET_MODEL_NAME") or "yolo-cb", str(best), file_name="best.pt")

    def close(self, failed):
        self.session.end()
