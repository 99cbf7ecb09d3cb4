"""MLflow for a tune (mlflow=True): one parent run for the study, one nested child run per trial.

The parent run goes where a training's run would (MLFLOW_TRACKING_URI, else the server-less store
`<tune folder>/mlruns/mlflow.db`); each trial opens a nested run, and the trainer's MLflow integration logs into it
because it is the active run (settings, per-epoch metrics, files). The parent gets the tune's settings as params and,
after each trial, `best_fitness` (step = trial number); each child is tagged with its Optuna trial number and state.
Like every integration, a failure warns once and switches MLflow off for the rest of the tune; trials go on.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from pathlib import Path

from yolo_cb.integrations.mlflow import check_reachable, local_store, public_uri, quiet_mlflow, safe_key
from yolo_cb.utils.log import LOGGER

END_STATUS = {"COMPLETE": "FINISHED", "PRUNED": "FINISHED", "FAIL": "FAILED"}


class TuneTracker:
    """Opens the parent run on `start`, a nested run per trial (`trial`), and ends them; all no-ops when MLflow is off."""

    def __init__(self, enabled: bool, tune_dir: Path, run_name: str):
        self.enabled = bool(enabled) and importlib.util.find_spec("mlflow") is not None
        if enabled and not self.enabled:
            LOGGER.warning("WARNING integration 'mlflow' is off for this tune: the mlflow package is not installed")
        self.tune_dir, self.run_name = Path(tune_dir), run_name
        self.parent_id: str | None = None
        self.experiment_id: str | None = None
        self.owns_parent = False
        self.previous_uri: str | None = None

    def _guard(self, what: str, fn, *args):
        if not self.enabled:
            return None

        try:
            with quiet_mlflow():
                return fn(*args)
        except Exception as error:
            self.enabled = False
            LOGGER.warning(f"WARNING MLflow ({what}): {type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}; "
                           f"MLflow logging is off for the rest of this tune (trials go on)")
            return None

    def start(self, params: dict) -> None:
        self._guard("parent run", self._start, params)

    def _start(self, params: dict) -> None:
        import mlflow

        active = mlflow.active_run()
        if active is None:
            uri, artifacts = (os.environ["MLFLOW_TRACKING_URI"], None) if os.environ.get("MLFLOW_TRACKING_URI") else local_store(str(self.tune_dir))
            check_reachable(uri)
            self.previous_uri = mlflow.get_tracking_uri()
            mlflow.set_tracking_uri(uri)
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "yolo-cb tune"
            experiment = mlflow.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else mlflow.create_experiment(name, artifact_location=artifacts)
            active = mlflow.start_run(experiment_id=experiment_id, run_name=os.environ.get("MLFLOW_RUN") or self.run_name)
            self.owns_parent = True
        self.parent_id, self.experiment_id = active.info.run_id, active.info.experiment_id
        mlflow.set_tag("yolo_cb.tune", "parent")
        mlflow.log_params({safe_key(k): str(v)[:6000] for k, v in params.items()})
        LOGGER.info(f"MLflow: tune parent run '{active.info.run_name}' at {public_uri(mlflow.get_tracking_uri())} (each trial a nested run)")

    @contextlib.contextmanager
    def trial(self, number: int):
        """A nested run for trial `number`, active while it trains; yields a function to call with the trial's final state."""
        states = {}
        run = self._guard("trial run", self._start_child, number)
        try:
            yield states.update
        except BaseException as error:
            if run is not None:
                killed = isinstance(error, (KeyboardInterrupt, SystemExit))
                self._guard("trial run", self._end_child, "KILLED" if killed else "FAILED", "FAIL")
            raise
        if run is not None:
            self._guard("trial run", self._end_child, END_STATUS.get(states.get("state", "COMPLETE"), "FINISHED"), states.get("state", "COMPLETE"))

    def _start_child(self, number: int):
        import mlflow

        if self.parent_id is None:
            return None
        run = mlflow.start_run(experiment_id=self.experiment_id, run_name=f"trial_{number}", nested=True, tags={"optuna.trial": str(number)})
        return run

    def _end_child(self, status: str, state: str) -> None:
        import mlflow

        if mlflow.active_run() is not None and mlflow.active_run().info.run_id != self.parent_id:
            mlflow.set_tag("optuna.state", state)
            mlflow.end_run(status)

    def log_best(self, number: int, value: float | None) -> None:
        if value is not None and self.parent_id is not None:
            self._guard("parent run", lambda: __import__("mlflow").log_metric("best_fitness", float(value), step=int(number)))

    def end(self, interrupted: bool) -> None:
        if self.parent_id is None:
            return
        parent_id, self.parent_id = self.parent_id, None
        if self.owns_parent:
            self._guard("parent run", self._end_parent, parent_id, "KILLED" if interrupted else "FINISHED")

    def _end_parent(self, parent_id: str, status: str) -> None:
        import mlflow

        while mlflow.active_run() is not None:  # a child left open by an interrupt, then the parent
            run_id = mlflow.active_run().info.run_id
            mlflow.end_run(status)
            if run_id == parent_id:
                break
        if self.previous_uri is not None:
            mlflow.set_tracking_uri(self.previous_uri)
