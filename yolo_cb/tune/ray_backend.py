"""`tune(backend="ray")` / `yolo-cb tune backend=ray`: our search space, run by Ray Tune on a local Ray instance.

The settings, the search space (yolo_cb.tune.space), trial 0 (the settings as given) and the tune folder are those of
the Optuna backend (yolo_cb.tune.tuner.Tuner reads them). The space becomes Ray's sampling objects (`space_to_ray`),
Ray's BasicVariantGenerator samples it (seeded by seed=), and a scheduler stops unpromising trials on the fitness each
validated epoch reports (the raytune integration, yolo_cb/integrations/raytune.py): ASHA by default (`pruner=` not
given, or pruner=hyperband: Ray's ASHAScheduler is its asynchronous Hyperband), Ray's MedianStoppingRule with
pruner=median, none with pruner=none. Each trial is an ordinary training through our trainer in
`<tune folder>/trials/trial_<n>`, one CPU each (and one GPU each when the machine has them and device= is not cpu).

Ray starts here (`ray.init`: this machine's CPUs, on 127.0.0.1, no dashboard, no usage report, its session files in a
temporary folder removed afterwards) and is shut down at the end; a Ray already started in this process (or RAY_ADDRESS)
is used and left running. Ray Tune's own results (experiment state, each trial's result.json and progress.csv) are in
`<tune folder>/ray/`; trials.csv, best_hyperparameters.yaml and the plots are written as the Optuna backend writes them
(yolo_cb.tune.report), from Ray's results. Optuna-only settings are refused in one line: storage=, resume=, sampler=.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pickle
import shutil
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

from yolo_cb.checkpoints.checkpoint import load_checkpoint
from yolo_cb.errors import ConfigError
from yolo_cb.integrations.mlflow import local_store, quiet_mlflow
from yolo_cb.tune import report
from yolo_cb.tune.pruning import MONITOR
from yolo_cb.tune.space import Param
from yolo_cb.tune.tuner import DEFAULT_STUDY, OptionalDependencyError, Tuner
from yolo_cb.utils.log import LOGGER

RAY_DIR = "ray"  # Ray Tune's own results, inside the tune folder
HINT = "pip install 'yolo-cb[raytune]'"
TIME_ATTR = "epoch"  # the scheduler's clock: the 1-based epoch of each reported row
OPTUNA_ONLY = {
    "storage": "storage= is an Optuna storage; backend=ray keeps its results in <tune folder>/ray (drop storage=, or use backend=optuna)",
    "resume": "resume= continues an Optuna study; a backend=ray tune cannot be resumed (start a new one, or use backend=optuna)",
    "sampler": "sampler= is an Optuna sampler; backend=ray samples with Ray Tune's BasicVariantGenerator, seeded by seed= "
               "(drop sampler=, or use backend=optuna)",
}


def require_ray():
    try:
        import ray
        from ray import tune
    except ImportError:
        raise OptionalDependencyError(f"tune backend=ray needs Ray Tune, an optional extra: {HINT}") from None
    return ray, tune


def tune(model, /, **kwargs) -> dict:
    """Run a Ray Tune search for `model` (a YOLO facade) with our search space; returns the best trial's summary."""
    refuse_optuna_only(kwargs)
    ray, ray_tune = require_ray()
    scheduler = kwargs.pop("pruner") if "pruner" in kwargs and not isinstance(kwargs["pruner"], str) else None
    if scheduler is not None and not isinstance(scheduler, ray_tune.schedulers.TrialScheduler):
        raise ConfigError(f"pruner={scheduler!r}: backend=ray takes a Ray Tune scheduler (ray.tune.schedulers.*) or median | hyperband | none")
    given_pruner = kwargs.get("pruner")
    settings = Tuner(model, kwargs, None)  # settings, space, trial 0 and the tune folder, as the Optuna backend reads them
    return RayTune(settings, ray, ray_tune, scheduler, given_pruner).run()


def refuse_optuna_only(kwargs: dict) -> None:
    for key, why in OPTUNA_ONLY.items():
        if kwargs.get(key) not in (None, "", False, "False", "false"):
            raise ConfigError(f"{key}={kwargs[key]!r} with backend=ray: {why}")
    if kwargs.get("raytune") in (False, "False", "false"):
        raise ConfigError("raytune=False with backend=ray: each trial reports its epochs to Ray Tune's scheduler through the raytune "
                          "integration (drop raytune=False)")


def space_to_ray(params: list[Param], ray_tune) -> dict[str, Any]:
    """Our search space as Ray Tune's sampling objects, with the same values: integers include both ends, a step counts
    from `low` (Ray's quantised samplers round to multiples of q instead, so a stepped range is a choice of its grid)."""
    space: dict[str, Any] = {}
    for p in params:
        if p.choices is not None:
            space[p.name] = ray_tune.choice(list(p.choices))
        elif p.step is not None:
            count = int(round((p.high - p.low) / p.step + 1e-9)) + 1
            grid = [p.low + i * p.step for i in range(count)]
            space[p.name] = ray_tune.choice([int(v) for v in grid] if p.is_int else [float(v) for v in grid])
        elif p.is_int:
            space[p.name] = (ray_tune.lograndint if p.log else ray_tune.randint)(int(p.low), int(p.high) + 1)  # Ray's upper end is excluded
        else:
            space[p.name] = (ray_tune.loguniform if p.log else ray_tune.uniform)(float(p.low), float(p.high))
    return space


def plain(value: Any) -> Any:
    """A sampled value as a plain Python number (Ray hands numpy scalars)."""
    return value.item() if hasattr(value, "item") else value


def train_trial(config: dict, *, plan: dict) -> None:
    """One trial, in a Ray worker process: an ordinary training in `<tune folder>/trials/trial_<n>` with the sampled settings."""
    from ray import tune

    os.chdir(plan["cwd"])  # Ray starts a trial in a folder of its own: relative paths (data=, model=) are the user's
    name = tune.get_context().get_trial_name()  # trial_<n>, named on the driver
    model = plan["facade"](plan["source"]) if plan["source"] else plan["facade"]()
    model.callbacks = plan["callbacks"].copy()  # the user's callbacks run in every trial
    params = {k: plain(v) for k, v in config.items()}
    model.train(**{**plan["base"], **params, "project": plan["trials_dir"], "name": name, "exist_ok": True, "raytune": True})


@contextlib.contextmanager
def environ(**values: str):
    """These environment variables set during the block (Ray reads them when it starts, and when a search starts)."""
    previous = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def local_ray(ray):
    """A local Ray for the block (started here, shut down after it), or the one already running in this process."""
    if ray.is_initialized():
        yield
        return
    temp = tempfile.mkdtemp(prefix="yolo-cb-ray-")  # Ray's session files (sockets: a short path), removed afterwards
    try:
        with environ(RAY_USAGE_STATS_ENABLED="0"):  # Ray would report usage over the network
            if os.environ.get("RAY_ADDRESS"):
                ray.init(include_dashboard=False)  # the cluster RAY_ADDRESS names
            else:
                ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, _temp_dir=temp, _node_ip_address="127.0.0.1")
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


class RayTune:
    """One Ray Tune search over the settings `tuner` read; see the module docstring."""

    def __init__(self, tuner: Tuner, ray, ray_tune, scheduler=None, given_pruner: str | None = None):
        self.t, self.ray, self.ray_tune = tuner, ray, ray_tune
        self.scheduler_object, self.given_pruner = scheduler, given_pruner
        self.tune_dir = Path(tuner.tune_dir).resolve()
        self.trials_dir = self.tune_dir / "trials"
        self.study_name = tuner.args.name or DEFAULT_STUDY

    def _scheduler(self):
        schedulers, epochs = self.ray_tune.schedulers, self.t.args.epochs
        if self.scheduler_object is not None:
            return self.scheduler_object
        if self.given_pruner == "median":  # as Optuna's MedianPruner here: after 3 trials, from the 2nd validated epoch on
            return schedulers.MedianStoppingRule(time_attr=TIME_ATTR, grace_period=1, min_samples_required=3)
        if self.given_pruner == "none":
            return schedulers.FIFOScheduler()
        return schedulers.ASHAScheduler(time_attr=TIME_ATTR, max_t=epochs, grace_period=1)  # Ray's reduction factor (4)

    def _resources(self) -> dict[str, float]:
        gpus = self.ray.cluster_resources().get("GPU", 0)
        return {"cpu": 1, "gpu": 1} if gpus and str(self.t.args.device).lower() != "cpu" else {"cpu": 1}

    def _plan(self, gpu: bool) -> dict:
        base = {**self.t.base, **({"device": "0"} if gpu else {})}  # Ray gives each trial its own GPU as cuda:0
        return {"cwd": os.getcwd(), "facade": self.t.new_facade, "source": self.t.source, "callbacks": self.t.facade.callbacks,
                "base": base, "trials_dir": str(self.trials_dir)}

    def run(self) -> dict:
        self.tune_dir.mkdir(parents=True, exist_ok=True)
        self._prepare_mlflow()
        with local_ray(self.ray):
            resources = self._resources()
            grid = self._fit(resources)
        trials = report.Trials(self.study_name, [self._row(result) for result in grid])
        self._write(trials)
        return self._summary(trials)

    def _prepare_mlflow(self) -> None:
        """mlflow=True: the trials' store and experiment, made here before they start together (two trial processes making one
        new SQLite store or experiment at once both failed, and each switched MLflow off)."""
        if not self.t.args.mlflow or importlib.util.find_spec("mlflow") is None:
            return
        try:
            from mlflow.tracking import MlflowClient

            uri, artifacts = (os.environ["MLFLOW_TRACKING_URI"], None) if os.environ.get("MLFLOW_TRACKING_URI") else local_store(str(self.trials_dir))
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or self.trials_dir.name  # the experiment each trial's run joins
            with quiet_mlflow():
                client = MlflowClient(uri)
                if client.get_experiment_by_name(name) is None:
                    client.create_experiment(name, artifact_location=artifacts)
        except Exception as error:  # each trial's MLflow integration tries again and warns for itself
            LOGGER.warning(f"WARNING tune: could not prepare the trials' MLflow store: {type(error).__name__}: {str(error)[:200]}")

    def _fit(self, resources: dict):
        rt, args = self.ray_tune, self.t.args
        numbers = iter(range(1_000_000))

        def trial_name(trial) -> str:  # trial_<n> in the order Ray creates them: trial 0 is the settings as given
            if not getattr(trial, "custom_trial_name", None):
                trial.custom_trial_name = f"trial_{next(numbers)}"
            return trial.custom_trial_name

        scheduler = self._scheduler()
        searcher = rt.search.BasicVariantGenerator(points_to_evaluate=[dict(self.t.baseline)], random_state=args.seed)
        try:
            trainable = rt.with_resources(rt.with_parameters(train_trial, plan=self._plan("gpu" in resources)), resources)
        except (TypeError, AttributeError, pickle.PicklingError) as error:  # sent to Ray's trial processes
            raise ConfigError(f"backend=ray sends the settings and your callbacks to Ray's trial processes, and one cannot be pickled: "
                              f"{type(error).__name__}: {str(error)[:300]}") from None
        LOGGER.info(f"tune: Ray Tune, {args.iterations} trials of {args.epochs} epochs, scheduler {type(scheduler).__name__}, "
                    f"{len(self.t.params)} settings sampled; results in {self.tune_dir} (Ray's in {self.tune_dir / RAY_DIR})")
        tuner = rt.Tuner(
            trainable, param_space=space_to_ray(self.t.params, rt),
            tune_config=rt.TuneConfig(metric=MONITOR, mode="max", num_samples=args.iterations, scheduler=scheduler, search_alg=searcher,
                                      reuse_actors=False, trial_name_creator=trial_name, trial_dirname_creator=trial_name),
            run_config=rt.RunConfig(storage_path=str(self.tune_dir), name=RAY_DIR, verbose=1 if args.verbose else 0,
                                    callbacks=[rt.logger.CSVLoggerCallback(), rt.logger.JsonLoggerCallback()]))
        # progress.csv, result.json and params.json; not Ray's TensorBoard logger (tensorboardX imports comet_ml when it is
        # installed, whose import patches other libraries for the rest of the process)
        with environ(TUNE_DISABLE_AUTO_CALLBACK_LOGGERS="1"):
            return tuner.fit()

    # --- results ---------------------------------------------------------------------------------
    def _row(self, result) -> report.TrialRow:
        """A trial as trials.csv reports it, from Ray's result and the trial's run folder."""
        number = int(Path(result.path).name.removeprefix("trial_"))
        folder = self.trials_dir / f"trial_{number}"
        frame = result.metrics_dataframe
        rows = frame.to_dict("records") if frame is not None and MONITOR in frame else []
        values = [float(r[MONITOR]) for r in rows]
        best = max(range(len(values)), key=values.__getitem__) if values else None
        attrs: dict[str, Any] = {"run_dir": str(folder), "epochs_planned": self.t.args.epochs,
                                 "epochs": int(rows[-1][TIME_ATTR]) if rows else 0}
        if best is not None:  # best.pt's epoch: its metrics, as the Optuna backend records best.pt's validation
            attrs["metrics"] = {k: float(v) for k, v in rows[best].items() if str(k).startswith("metrics/")}
        if result.error is not None:
            attrs["error"] = (str(result.error).strip().splitlines() or [type(result.error).__name__])[-1][:500]
            state, value = report.RowState.FAIL, None
        elif finished(folder):
            state, value = report.RowState.COMPLETE, values[best] if best is not None else None
        else:  # stopped by the scheduler before its last epoch
            state, value = report.RowState.PRUNED, values[-1] if values else None
        seconds = rows[-1].get("time_total_s") if rows else None
        params = {k: plain(v) for k, v in (result.config or {}).items()}
        return report.TrialRow(number, state, value, params, attrs, timedelta(seconds=float(seconds)) if seconds else None)

    def _write(self, trials: report.Trials) -> None:
        report.write_csv(trials, self.tune_dir / report.CSV_NAME)
        report.write_best(trials, self.tune_dir / report.BEST_NAME, self.t.fixed)
        report.keep_best_run_dirs(trials, self.trials_dir, self.t.args.tune_keep)
        if self.t.args.plots:  # plots=False: none, as with the Optuna backend
            report.write_plots(trials, self.tune_dir, self.t.params, names=("tune_history.png", "tune_parallel.png"))
        done = trials.get_trials()
        for i, trial in enumerate(done):  # one line per trial, in trial order, as the Optuna backend logs them
            LOGGER.info(report.progress_line(report.Trials(trials.study_name, done[: i + 1]), trial, self.t.args.iterations))

    def _summary(self, trials: report.Trials) -> dict:
        return report.summary(trials, self.tune_dir, str(self.tune_dir / RAY_DIR), self.t.fixed, backend="ray")


def finished(folder: Path) -> bool:
    """Whether the trial's training ended by itself (its last.pt says so), rather than being stopped by the scheduler."""
    last = folder / "weights" / "last.pt"
    try:
        return last.is_file() and load_checkpoint(last).finished
    except Exception:  # an unreadable last.pt: the run did not end cleanly
        return False
