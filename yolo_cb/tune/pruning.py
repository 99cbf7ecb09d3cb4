"""The callback that ties one training to one Optuna trial: it reports the monitored metric at every validated epoch
and, when the study's pruner says the trial is not promising, stops the training with `trainer.request_stop(StopCause.PRUNED, ...)`."""

from __future__ import annotations

from yolo_cb.recipe.stop import StopCause

MONITOR = "fitness"  # the metric each trial maximises: best.pt's own criterion (0.1 mAP50 + 0.9 mAP50-95)


class TrialReporter:
    """Callbacks for one trial's trainer (and its validator); `pruned_epoch` is the 0-based epoch it was pruned at, or None."""

    def __init__(self, trial, monitor: str = MONITOR):
        self.trial = trial
        self.monitor = monitor
        self.validated = False
        self.pruned_epoch: int | None = None
        self.reason = ""

    def on_train_epoch_start(self, trainer):
        self.validated = False

    def on_val_end(self, validator):
        self.validated = True

    def on_fit_epoch_end(self, trainer):
        if not self.validated:  # epochs that did not validate have no new value to report
            return
        value = float(trainer.metrics[self.monitor])
        self.trial.report(value, step=int(trainer.epoch))
        if self.pruned_epoch is None and not trainer.stop and self.trial.should_prune():
            pruner = type(self.trial.study.pruner).__name__
            self.pruned_epoch = int(trainer.epoch)
            self.reason = f"pruned by Optuna's {pruner} after epoch {trainer.epoch + 1}/{trainer.epochs} ({self.monitor} {value:.4g})"
            trainer.request_stop(StopCause.PRUNED, self.reason)
