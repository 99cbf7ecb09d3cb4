"""Ray Tune reporting (raytune=auto: on by itself inside a Ray Tune trial; true | false; `pip install 'yolo-cb[raytune]'`).

Inside a trial of a Ray Tune run (yolo-cb's own `tune(backend="ray")`, or your own `ray.tune.Tuner` whose trainable
calls `YOLO(...).train(...)`), every validated epoch is reported to the trial's session with `ray.tune.report`: the row
results.csv writes for that epoch (`epoch` 1-based, `time`, `train/*`, `metrics/*`, `val/*`, `fitness` — the value
`yolo-cb tune` maximises —, `lr/pg*`, `time/*`), so a scheduler (ASHA, median stopping, ...) and Ray's own results
(`result.json`, `progress.csv`, the ResultGrid) see the same numbers as results.csv. Main process only.

Each epoch is reported when the next epoch starts, and the last one at teardown, once training has ended (best.pt
validated, every on_train_end done, every file written): Ray's function trainables wait inside `report` for the
scheduler's decision, and a trial the scheduler stops leaves `report` through SystemExit (and its process is ended soon
after). Stopped between two epochs, the training ends as on SIGTERM (last.pt saved, on_exception, teardown); stopped at
the final report, the finished run is left as it is.

raytune=auto says nothing outside a trial and never imports Ray for it (a process running a trial has imported Ray
Tune already). raytune=true outside a trial warns once that there is no session to report to. A missing Ray: with
raytune=true one warning with the install hint, and the run goes on. Any failure of Ray's reporting warns once and
switches this integration off (policy "disable"); training goes on.
"""

from __future__ import annotations

import sys
import warnings

from yolo_cb.callbacks.registry import integration
from yolo_cb.utils.log import LOGGER


def in_trial_session() -> bool:
    """Whether this process runs inside a Ray Tune trial (its session has a trial id); imports nothing new."""
    if sys.modules.get("ray") is None or "ray.tune" not in sys.modules:  # None: an import of Ray blocked
        return False
    from ray import tune

    with warnings.catch_warnings():  # outside a trial Ray warns "meant to only be called inside a function ..."
        warnings.simplefilter("ignore")
        return tune.get_context().get_trial_id() is not None


def switched_on(args) -> bool:
    value = getattr(args, "raytune", "auto")
    return value is True or (value == "auto" and in_trial_session())


@integration("raytune", enabled=switched_on, requires={"ray": "pip install 'yolo-cb[raytune]'"})
class RayTuneReport:
    """Reports each validated epoch to the Ray Tune session; see the module docstring."""

    rank_zero_only = True

    def __init__(self):
        self.active = False  # inside a trial session, on the main process
        self.pending: dict | None = None  # the last validated epoch's row, reported when the next epoch starts or training ends

    def on_pretrain_routine_end(self, trainer):
        if trainer.args.raytune is True:
            import ray.tune  # noqa: F401  (raytune=true: Ray is wanted, so it is imported to look for the session)
        self.active = in_trial_session()
        if not self.active:
            LOGGER.warning("WARNING raytune=True: this training runs outside a Ray Tune trial, so there is no session to report to "
                           "(raytune=auto switches reporting on inside a trial only)")
            return
        from ray import tune

        LOGGER.info(f"Ray Tune: reporting each validated epoch to trial {tune.get_context().get_trial_name()}")

    def on_fit_epoch_end(self, trainer):
        if self.active and trainer.epoch_record.validated:
            self.pending = {k: float(v) if not isinstance(v, int) else v for k, v in trainer.epoch_record.row().items()}

    def on_train_epoch_start(self, trainer):
        self._report(final=False)

    def teardown(self, trainer):
        self._report(final=True)  # after every on_train_end: a trial the scheduler stops now has nothing left but teardown

    def on_exception(self, trainer):
        self._report(final=True)  # the last validated epoch of a failed run is Ray's too

    def _report(self, final: bool) -> None:
        if self.pending is None:
            return
        from ray import tune

        row, self.pending = self.pending, None
        try:
            tune.report(row)
        except SystemExit:  # the scheduler stops this trial
            if not final:
                raise  # between two epochs: the training ends here, as on SIGTERM
            LOGGER.info("Ray Tune: the trial's last epoch is reported and the scheduler ends the trial")
