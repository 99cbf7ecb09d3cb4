"""`model.tune()` / `yolo-cb tune`: an Optuna study whose trials are ordinary trainings.

Each trial samples the search space (yolo_cb.tune.space), trains through the normal trainer (every default callback,
integration and user callback runs) in `<tune folder>/trials/trial_<n>`, reports its fitness at every validated epoch
(yolo_cb.tune.pruning) and is stopped through `trainer.stop` when the pruner says so. Trial 0 of a new study runs the
settings as given (the baseline). The study lives in `<tune folder>/study.db` (SQLite) unless `storage=` names another
Optuna storage, which several processes or machines may share; `resume=` continues a study. After every trial the
folder gets trials.csv and best_hyperparameters.yaml; at the end (or on Ctrl-C) the plots too unless plots=False
(yolo_cb.tune.report).
"""

from __future__ import annotations

import math
import signal
from datetime import datetime, timezone
from pathlib import Path

import yaml

from yolo_cb.assembly.catalog import check_callback_names
from yolo_cb.data.resolve import check_data
from yolo_cb.errors import ConfigError, UserError
from yolo_cb.integrations.mlflow import public_uri
from yolo_cb.recipe.optim import resolve_optimizer
from yolo_cb.settings.config import ALIASES, coerce, get_config, load_defaults
from yolo_cb.settings.resume import CODE_SETTINGS, resumable_settings
from yolo_cb.settings.schema import RULES
from yolo_cb.training.plan import world_size_for
from yolo_cb.training.resume import dataset_fingerprint
from yolo_cb.tune import report
from yolo_cb.tune.claim import TrialClaim
from yolo_cb.tune.interrupted import continue_trial, epochs_in, fail_stale_trials, last_checkpoint, record_process, requeue_interrupted
from yolo_cb.tune.pruning import MONITOR, TrialReporter
from yolo_cb.tune.space import default_space, parse_space, tunable_settings
from yolo_cb.tune.storage import open_storage
from yolo_cb.tune.tracking import TuneTracker
from yolo_cb.utils.files import atomic_write_text, default_project, run_dir
from yolo_cb.utils.log import LOGGER, setup_logging
from yolo_cb.utils.yaml_safe import load_yaml

RECORD = "tune.yaml"  # the study's name, storage, settings and space: what resume= reads back
STUDY_DB = "study.db"
DEFAULT_STUDY = "yolo-cb-tune"
TUNE_ONLY = {"iterations", "space", "storage", "pruner", "tune_keep", "resume", "project", "name", "exist_ok", "mode"}
# settings that may differ when resuming a tune: they change how trials run or are kept, not what they learn
RESUME_MUTABLE = frozenset(key for key, rule in RULES.items() if rule.tune_resume)  # tune_resume in yolo_cb/settings/schema.py


class OptionalDependencyError(UserError, ImportError):
    """An optional extra the feature needs is not installed (one line, CLI exit 2)."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM during a tune: handled like Ctrl-C (results saved), then the process exits with `code`."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def require_optuna():
    try:
        import optuna
    except ImportError:
        raise OptionalDependencyError("tune needs Optuna, an optional extra: pip install 'yolo-cb[tune]'") from None
    return optuna


def tune(model, /, **kwargs) -> dict:
    """Run (or resume, or join) a study for `model` (a YOLO facade); returns the best trial's summary."""
    optuna = require_optuna()
    pruner = kwargs.pop("pruner") if "pruner" in kwargs and not isinstance(kwargs["pruner"], str) else None
    sampler = kwargs.pop("sampler", None)
    return Tuner(model, kwargs, optuna, pruner=pruner, sampler=sampler).run()


class Tuner:
    def __init__(self, model, kwargs: dict, optuna, pruner=None, sampler=None):
        self.optuna, self.facade = optuna, model
        self.new_facade = type(model)  # makes each trial's facade (and the model read for its loss settings), as YOLO(...) does
        self.pruner_object, self.sampler_object = pruner, sampler
        kwargs = dict(kwargs)
        named = kwargs.pop("model", None)  # tune(model=...) names the model as YOLO(...) does
        if named is not None and model.model_named and str(named) != model.source:
            raise ConfigError(f"YOLO('{model.source}') already names the model, and tune(model='{named}') names another: give one")
        resume = kwargs.get("resume") not in (None, False, "False", "false")
        record = self._read_record(kwargs) if resume else None
        self.source = str(named) if named is not None else model.source
        if record is not None:
            kwargs = self._resumed_kwargs(record, kwargs)
            self.source = self._resumed_model(record, model, named)
        self.args = get_config({**kwargs, "mode": "tune", **({"model": self.source} if self.source else {})})
        check_callback_names(self.args.callbacks)  # every trial would fail on it: one line before the study starts
        setup_logging(self.args.verbose)
        self._check_args()
        given = {k: getattr(self.args, k) for k in kwargs if k not in TUNE_ONLY}
        self.base = {k: (list(v) if isinstance(v, tuple) else v) for k, v in given.items()}
        self.params, baseline = self._space(record)
        self.baseline = baseline
        self.fixed = self._fixed_hyperparameters()
        given_storage = self.args.storage or recorded_storage(record)
        self.storage = open_storage(optuna, given_storage) if given_storage else None  # a bad storage= fails before the folder is made
        self.tune_dir = Path(record["_folder"]) if record is not None else run_dir(self.args, "tune")
        self.trials_dir = self.tune_dir / "trials"
        self.study_name = record["study_name"] if record else (self.args.name or DEFAULT_STUDY)
        self.storage_url = given_storage or f"sqlite:///{(self.tune_dir / STUDY_DB).resolve()}"
        self.resumed = record is not None

    # --- settings -----------------------------------------------------------------------------
    def _check_args(self) -> None:
        if world_size_for(self.args) > 1:
            raise ConfigError(f"tune runs each trial in one process (nproc={self.args.nproc}, device={self.args.device}): to use more "
                              f"processes or machines, start several `yolo-cb tune` on one storage= (docs/tune.md)")
        if not self.args.val:
            raise ConfigError("tune needs val=True: each trial is scored by validating it")

    def _space(self, record: dict | None):
        """(params, baseline values): the checked search space, and trial 0's values (the settings as given, clipped).

        A given space is checked before the dataset, the dataset before any trial (a bad one would fail every trial)."""
        args = self.args
        space = record["space"] if record else (args.space if args.space not in (None, "", {}) else None)
        params = self._checked(parse_space(space)) if space is not None else None
        iterations = self._iterations_per_trial()
        optimizer, lr0, momentum = args.optimizer, args.lr0, args.momentum
        if optimizer == "auto" and (params is None or any(p.name in ("lr0", "momentum") for p in params)):
            # auto ignores lr0 and momentum: resolve it as the trainer would
            optimizer, lr0, momentum = resolve_optimizer("auto", lr0, momentum, iterations)
        if params is None:  # the default space, less what the user fixed
            loss_settings = getattr(getattr(self.new_facade(self.source).model, "criterion", None), "reads_settings", ())
            space = default_space(args.epochs, optimizer, loss_settings)
            fixed = sorted(k for k in space if self._given(k))
            if fixed:
                LOGGER.info(f"tune: {', '.join(fixed)} given as settings: fixed for every trial, left out of the default search space")
            params = parse_space({k: v for k, v in space.items() if k not in fixed})
        if optimizer != args.optimizer and all(p.name != "optimizer" for p in params):
            self.base["optimizer"] = optimizer
            LOGGER.info(f"tune: optimizer=auto would ignore the sampled lr0/momentum; every trial uses optimizer={optimizer} "
                        f"(auto's choice for this run length)")
        current = {**vars(args), "lr0": lr0, "momentum": momentum}
        baseline = {p.name: p.clip(current[p.name]) for p in params if current.get(p.name) is not None}
        return params, baseline

    def _given(self, name: str) -> str | None:
        """The setting the user gave for `name`: itself or another name of it (no_aug_epochs for close_mosaic), else None."""
        names = {name, ALIASES.get(name, name), *(alias for alias, canonical in ALIASES.items() if canonical == name)}
        return next((k for k in sorted(names) if k in self.base), None)

    def _checked(self, params: list) -> list:
        """A space the user gave may not also sample a setting the user fixed (under either of its names)."""
        both = [(p.name, self._given(p.name)) for p in params if self._given(p.name)]
        if both:
            given = ", ".join(f"{k}={self.base[k]!r}" + (f" (another name for {name})" if k != name else "") for name, k in both)
            raise ConfigError(f"{given}: both given as a setting and in the search space; "
                              f"drop one (a setting fixes the value for every trial, the space samples it)")
        return params

    def _iterations_per_trial(self) -> int:
        """Iterations of one trial as optimizer=auto counts them (the dataset is checked on the way)."""
        data = check_data(self.args.data or "shapes.yaml", self.args.datasets_dir)
        images = max(1, round(dataset_fingerprint(data)["train_images"] * self.args.fraction))
        return math.ceil(images / max(self.args.batch, self.args.nbs)) * self.args.epochs

    def _fixed_hyperparameters(self) -> dict:
        """Tunable settings every trial shares that differ from the defaults: part of the recipe best_hyperparameters.yaml gives."""
        defaults = get_config({})
        tunable = set(tunable_settings()) | {"optimizer"}
        return {k: v for k, v in self.base.items() if k in tunable and getattr(defaults, k, None) != v}

    # --- resume -------------------------------------------------------------------------------
    def _read_record(self, kwargs: dict) -> dict:
        value = kwargs["resume"]
        if value in (True, "True", "true"):
            root = Path(kwargs["project"]) if kwargs.get("project") else run_dir_root()
            if kwargs.get("name"):
                folder = root / str(kwargs["name"])
            else:
                records = sorted(root.glob(f"*/{RECORD}"), key=lambda p: p.stat().st_mtime)
                if not records:
                    raise FileNotFoundError(f"resume=True: no tune folder ({RECORD}) under {root}/; pass resume=path/to/tune/folder")
                folder = records[-1].parent
        else:
            folder = Path(str(value)).expanduser()
            folder = folder.parent if folder.is_file() else folder
        path = folder / RECORD
        if not path.is_file():
            raise FileNotFoundError(f"resume={value}: {path} not found; resume= takes a tune folder (it holds {RECORD} and {STUDY_DB})")
        record = load_yaml(path, ConfigError, f"tune record ({RECORD})")
        if not isinstance(record, dict) or not {"study_name", "settings", "space"} <= set(record):
            raise ConfigError(f"{path}: not a yolo-cb tune record (needs study_name, settings and space)")
        record["_folder"] = str(folder.resolve())
        return record

    def _resumed_kwargs(self, record: dict, kwargs: dict) -> dict:
        recorded, defaults = dict(record["settings"]), load_defaults()
        # never code (callbacks=, an lr_scheduler naming a module) nor a place from the folder's record: docs/security.md
        saved = resumable_settings(recorded, kwargs, Path(record["_folder"]) / RECORD)
        fixed = {k: v for k, v in kwargs.items() if k not in RESUME_MUTABLE | {"resume"}}
        changed = sorted(k for k, v in fixed.items() if k == "space" or k not in recorded or coerce(k, v, defaults.get(k)) != recorded[k])
        if changed:
            raise ConfigError(f"cannot change {', '.join(changed)} when resuming the tune in {record['_folder']}: its trials would no longer be "
                              f"comparable. Settings that may change on resume: {', '.join(sorted(RESUME_MUTABLE))}")
        merged = {**saved, **{k: v for k, v in kwargs.items() if k in RESUME_MUTABLE or k in CODE_SETTINGS}}
        for key in ("iterations", "pruner", "tune_keep"):
            if key in record and key not in kwargs:
                merged[key] = record[key]
        return merged

    @staticmethod
    def _resumed_model(record: dict, model, named: str | None) -> str | None:
        """The model the tune was started with; another model named now is refused (its trials would not compare)."""
        recorded, wanted = record.get("model"), named or (model.source if model.model_named else None)
        if wanted and recorded and str(wanted) != str(recorded):
            raise ConfigError(f"cannot change the model to {wanted} (was {recorded}) when resuming the tune in {record['_folder']}")
        return recorded or (str(named) if named is not None else model.source)

    def _write_record(self) -> None:
        record = {"study_name": self.study_name, "storage": public_uri(self.storage_url), "model": self.source, "iterations": self.args.iterations,
                  "pruner": self.args.pruner, "tune_keep": self.args.tune_keep, "settings": self.base,
                  "space": {p.name: p.as_yaml() for p in self.params}, "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        atomic_write_text(self.tune_dir / RECORD, yaml.safe_dump(record, sort_keys=False))

    # --- the study ----------------------------------------------------------------------------
    def _pruner(self):
        if self.pruner_object is not None:
            return self.pruner_object
        pruners = self.optuna.pruners
        if self.args.pruner == "median":  # after 3 finished trials, from the 2nd validated epoch on: below the median is stopped
            return pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=1)
        if self.args.pruner == "hyperband":
            return pruners.HyperbandPruner(min_resource=1, max_resource=self.args.epochs)
        return pruners.NopPruner()

    def _open_study(self):
        optuna = self.optuna
        storage = self.storage = self.storage or open_storage(optuna, self.storage_url)
        how = "resumed"
        if self.resumed:
            study = optuna.load_study(study_name=self.study_name, storage=storage, pruner=self._pruner())
        else:
            try:
                study, how = optuna.create_study(study_name=self.study_name, storage=storage, direction="maximize", pruner=self._pruner()), "created"
            except optuna.exceptions.DuplicatedStudyError:
                if not self.args.storage:
                    raise ConfigError(f"{self.tune_dir} already holds the study '{self.study_name}' (exist_ok=True reused the folder): continue "
                                      f"it with resume={self.tune_dir}, or start a new one with another name=") from None
                study, how = optuna.load_study(study_name=self.study_name, storage=storage, pruner=self._pruner()), "joined"  # scale-out
        if study.direction != optuna.study.StudyDirection.MAXIMIZE:
            raise ConfigError(f"study '{self.study_name}' in {self.storage_url} minimises; a yolo-cb tune maximises {MONITOR}")
        fail_stale_trials(optuna, study, storage)
        existing = study.get_trials(deepcopy=False)
        seed = self.args.seed + len(existing)  # a resumed or joined study does not replay the draws it already made
        study.sampler = self.sampler_object or optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(2, min(10, self.args.iterations // 3)))
        if not existing and not study.user_attrs.get("baseline_enqueued"):
            study.set_user_attr("baseline_enqueued", True)
            study.enqueue_trial(self.baseline, user_attrs={"baseline": True})
        requeue_interrupted(study, self.trials_dir)
        LOGGER.info(f"tune: study '{self.study_name}' {how} in {public_storage(self.storage_url)} ({len(existing)} trials there); "
                    f"{self.args.iterations} trials to finish, {self.args.epochs} epochs each, pruner {type(study.pruner).__name__}; "
                    f"results in {self.tune_dir}")
        return study

    def _done(self, study) -> int:
        return sum(report.counts_as_done(t) for t in study.get_trials(deepcopy=False))

    def _budget_left(self, study) -> bool:
        """Whether this process starts another trial: the study's finished trials plus those other processes are running
        now stay under `iterations`, so workers sharing a study never train more than it. A RUNNING trial whose process
        died (kill -9) is marked failed first and queued again, so a live worker picks it up."""
        if fail_stale_trials(self.optuna, study, self.storage):
            requeue_interrupted(study, self.trials_dir)
        running = len(study.get_trials(deepcopy=False, states=(self.optuna.trial.TrialState.RUNNING,)))
        return self._done(study) + running < self.args.iterations

    def run(self) -> dict:
        optuna = self.optuna
        self.tune_dir.mkdir(parents=True, exist_ok=True)
        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # our progress line replaces Optuna's per-trial INFO line
        previous_term = signal.signal(signal.SIGTERM, _sigterm) if _main_thread() else None
        self.tracker = TuneTracker(self.args.mlflow, self.tune_dir, self.study_name)
        interrupted: BaseException | None = None
        study = None
        try:
            study = self._open_study()
            if not self.resumed:
                self._write_record()
            self.tracker.start({"study": self.study_name, "iterations": self.args.iterations, "pruner": type(study.pruner).__name__,
                                "space": {p.name: p.as_yaml() for p in self.params}, **self.base})
            self.claim = TrialClaim(self.storage_url, self.study_name, self.storage.engine)
            while self.claim.hold_if(lambda: self._budget_left(study)):  # released by the new trial's first line (_objective)
                try:
                    study.optimize(self._objective, n_trials=1, catch=(Exception,), callbacks=[self._after_trial])
                finally:
                    self.claim.release()
        except KeyboardInterrupt as error:
            interrupted = error
        finally:
            self.tracker.end(interrupted is not None)
            if study is not None:
                self._finish(study, plots=self.args.plots)  # plots=False: the trials' plots and the tune's
            optuna.logging.set_verbosity(verbosity)
            if previous_term is not None:
                signal.signal(signal.SIGTERM, previous_term)
        if interrupted is not None:
            LOGGER.warning(f"tune interrupted: {self._done(study) if study else 0} trials finished and saved in {self.tune_dir}; "
                           f"continue with: yolo-cb tune resume={self.tune_dir}")
            if isinstance(interrupted, Interrupted):
                raise SystemExit(interrupted.code)
            raise interrupted
        return self._summary(study)

    def _objective(self, trial) -> float:
        self.claim.release()  # the trial is RUNNING in the storage now: other workers count it
        record_process(trial)
        params = {p.name: p.suggest(trial) for p in self.params}
        retry = trial.user_attrs.get("retry_of") is not None
        last = last_checkpoint(trial.study.get_trials(deepcopy=False), self.trials_dir, trial.number) if retry else None
        folder = last.parent.parent if last is not None else self.trials_dir / f"trial_{trial.number}"  # a retry goes on in its folder
        trial.set_user_attr("run_dir", str(folder.resolve()))
        trial.set_user_attr("epochs_planned", self.args.epochs)
        model = self.new_facade(self.source) if self.source else self.new_facade()
        model.callbacks = self.facade.callbacks.copy()  # the user's callbacks run in every trial
        reporter = TrialReporter(trial)
        model.add_callbacks(reporter)
        try:
            with self.tracker.trial(trial.number) as set_state:
                if last is None:
                    metrics = model.train(**{**self.base, **params, "project": str(self.trials_dir), "name": folder.name, "exist_ok": True})
                else:
                    metrics = continue_trial(model, trial, last, self.base)
                if reporter.pruned_epoch is not None:
                    set_state(state="PRUNED")
        except SystemExit as error:  # SIGTERM inside the trainer: save like Ctrl-C, then exit with its code
            trial.set_user_attr("interrupted", True)
            raise Interrupted(error.code if isinstance(error.code, int) else 1) from error
        except KeyboardInterrupt:
            trial.set_user_attr("interrupted", True)
            raise
        except Exception as error:
            trial.set_user_attr("error", f"{type(error).__name__}: {error}".splitlines()[0][:500])
            raise
        finally:
            trainer = model.trainer
            trial.set_user_attr("epochs", trainer.completed_epoch + 1 if trainer is not None else epochs_in(last))
            if trainer is not None and trainer.stop_reason:
                trial.set_user_attr("stop_reason", trainer.stop_reason)
        trial.set_user_attr("metrics", {k: float(v) for k, v in metrics.items() if k.startswith("metrics/")})  # best.pt's validation
        if reporter.pruned_epoch is not None:
            raise self.optuna.TrialPruned(reporter.reason)
        return float(metrics[MONITOR])

    def _after_trial(self, study, trial) -> None:
        LOGGER.info(report.progress_line(study, trial, self.args.iterations))
        best = report.best_trial(study)
        self.tracker.log_best(trial.number, best.value if best else None)
        self._finish(study, plots=False)

    def _finish(self, study, plots: bool) -> None:
        report.write_csv(study, self.tune_dir / report.CSV_NAME)
        report.write_best(study, self.tune_dir / report.BEST_NAME, self.fixed)
        report.keep_best_run_dirs(study, self.trials_dir, self.args.tune_keep)
        if plots:
            report.write_plots(study, self.tune_dir, self.params)

    def _summary(self, study) -> dict:
        return report.summary(study, self.tune_dir, public_storage(self.storage_url), self.fixed)


def recorded_storage(record: dict | None) -> None:
    """A resumed tune without storage= uses study.db in its own folder. A tune.yaml recording another storage is refused
    (it created a database where the file said and connected to the server it named): recorded places are never used."""
    recorded = (record or {}).get("storage")
    if recorded is None or (isinstance(recorded, str) and recorded.startswith("sqlite:///") and recorded.endswith("/" + STUDY_DB)):
        return None  # this folder's own study.db (wherever the folder now is)
    raise ConfigError(f"{Path(record['_folder']) / RECORD} records storage={public_storage(str(recorded))!r}, not the tune folder's "
                      f"{STUDY_DB}: a place recorded in a file is never used; pass storage= with that URL to continue the study there")


def run_dir_root() -> Path:
    """Where tune folders go without project= (the folder yolo_cb.utils.files.run_dir(args, "tune") makes them in)."""
    return default_project()


def public_storage(url: str) -> str:
    return public_uri(url)


def _sigterm(signum, frame):
    raise Interrupted(128 + signum)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
