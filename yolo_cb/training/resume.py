"""Resume, decided before training starts: which checkpoint, which of its settings, which run folder, and every refusal.

Which of a checkpoint's settings a resume takes (never code, never a place to write) is yolo_cb.settings.resume; what the
trainer restores from the checkpoint once the run is built is yolo_cb.training.resume_state.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

from yolo_cb.checkpoints.checkpoint import Checkpoint, load_checkpoint
from yolo_cb.data.resolve import check_data
from yolo_cb.data.verify import list_image_files
from yolo_cb.errors import ConfigError
from yolo_cb.evaluation.val_metrics import DetectionMetrics
from yolo_cb.nn.build import load_model_cfg
from yolo_cb.settings.config import Config, coerce, get_config, load_cfg_file
from yolo_cb.settings.resume import RESUME_MUTABLE, resume_settings
from yolo_cb.utils.dist import rank
from yolo_cb.utils.files import default_project, run_dir
from yolo_cb.utils.log import LOGGER, printable, setup_logging
from yolo_cb.utils.paths import find_dataset_cfg

# The form of dataset_fingerprint: 2 counts the images of every validation set; 1, a fingerprint without "version" (yolo-cb
# up to 4f22c48), counted only the first set of a `val:` mapping. A checkpoint is compared in the form it recorded.
FINGERPRINT_VERSION = 2


class ResumeError(ConfigError):
    """A resume that would not continue the same run (another model or dataset, a finished run extended)."""


class FinishedRun(NamedTuple):
    """resume= of a run that ended: nothing to train and nothing written (finished_run says so)."""

    metrics: DetectionMetrics  # the metrics it saved
    weights: Path  # the weights to use from now on: best.pt, else the checkpoint


class Planned(NamedTuple):
    """What resume.plan decided: the overrides to train with, the resume (None: a fresh run), and the cfg= file's settings
    when resume=auto read them to find its folder (None: not read here; the settings' resolution reads the file)."""

    overrides: dict[str, Any]
    resume: ResumePlan | None
    cfg_values: dict[str, Any] | None


class ResumePlan(NamedTuple):
    """A resume decided: the settings to train with, the checkpoint and its (absolute) path, and, when its run ended and
    nothing extends it, what it finished with."""

    args: Config
    ckpt: Checkpoint
    path: Path
    finished: FinishedRun | None


def _not_set(value: Any) -> bool:
    return value in (None, False, "False", "false")


# --- the plan ---------------------------------------------------------------------------------------------------------
def plan(overrides: dict[str, Any], model: str | None = None) -> Planned:
    """The overrides to train with and the resume (None: a fresh run) of train(**overrides). `model` is a model the user
    named (None: not named). resume=auto picks the run folder's last.pt or a fresh run there; a torchrun restart without
    resume= is warned about, since it starts over."""
    auto = str(overrides.get("resume")).lower() == "auto"
    cfg_values = load_cfg_file(overrides["cfg"]) if auto and overrides.get("cfg") else None  # read once, here
    if auto:
        overrides = _auto_overrides(overrides, cfg_values or {})
    elif int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) and _not_set(overrides.get("resume")) and rank() in (-1, 0):
        LOGGER.warning(f"WARNING torchrun restarted the workers (restart {os.environ['TORCHELASTIC_RESTART_COUNT']}) and resume= "
                       f"is not set: training starts over. Pass resume=auto (and a fixed name=) so that a restart continues")
    if _not_set(overrides.get("resume")):
        return Planned(overrides, None, cfg_values)
    try:
        prepared = prepare_resume(overrides, model=model, cfg_values=cfg_values)
    except ConfigError as error:
        if not auto:
            raise
        get_config({**overrides, "resume": False, "mode": "train"}, cfg_values=cfg_values)  # an error in the user's own settings is raised as it is
        raise type(error)(f"resume=auto: {overrides['resume']} is not a run of these settings, so it is neither continued nor "
                          f"overwritten: {error}. Use another name= for a new run, or the settings it was started with") from None
    if auto and prepared.finished is None:
        _say(f"resume=auto: continuing the run in {Path(overrides['resume']).parent.parent} from {overrides['resume']}")
    return Planned(overrides, prepared, cfg_values)


def _say(message: str) -> None:
    """Log on rank 0 (under torchrun every rank plans)."""
    if rank() in (-1, 0):
        LOGGER.info(message)


def checkpoint_to_resume(value: Any, model: str | None, project: str | None) -> Path:
    """The checkpoint resume=`value` names: a path; or for resume=True the model the user named when it is a checkpoint
    file (Ultralytics' `YOLO("runs/detect/x/weights/last.pt").train(resume=True)`), else the newest last.pt under project."""
    if value not in (True, "True", "true"):
        return Path(str(value)).expanduser()
    if model is not None and str(model).endswith((".pt", ".pth")) and Path(str(model)).expanduser().is_file():
        return Path(str(model)).expanduser()
    return find_last_checkpoint(project)


def find_last_checkpoint(project: str | None) -> Path:
    root = Path(project) if project else default_project()
    candidates = sorted(root.glob("*/weights/last.pt"), key=lambda p: p.stat().st_mtime)
    if not candidates:
        raise FileNotFoundError(f"resume=True: no last.pt found under {root}/*/weights/; pass resume=path/to/last.pt")
    return candidates[-1]


def _auto_folder(overrides: dict[str, Any], cfg_values: dict[str, Any]) -> Path:
    """The run folder project/name of resume=auto, from the call or its cfg= file's settings (`cfg_values`): only these two
    settings are read here, since the run's settings are resolved once, by prepare_resume or by the fresh run."""
    given = {**cfg_values, **overrides}
    project, name = coerce("project", given.get("project")), coerce("name", given.get("name"))
    return (Path(project) if project else default_project()) / (name or "train")


def _auto_overrides(overrides: dict[str, Any], cfg_values: dict[str, Any]) -> dict[str, Any]:
    """resume=auto: the overrides with resume= the last.pt of the run folder project/name when it holds one (a run of the
    same settings: any other is refused by prepare_resume, naming what differs); else resume=False and exist_ok=True, so
    a fresh run starts in exactly that folder and the next start of the same command finds it. Says which in the log."""
    folder = _auto_folder(overrides, cfg_values)
    last = folder / "weights" / "last.pt"
    if not last.is_file():
        _say(f"resume=auto: no {last} yet; starting a fresh run in {folder}")
        return {**overrides, "resume": False, "exist_ok": True}
    return {**overrides, "resume": str(last)}


def prepare_resume(overrides: dict[str, Any], model: str | None = None, cfg_values: dict[str, Any] | None = None) -> ResumePlan:
    """A resume: the checkpoint's settings, with only RESUME_MUTABLE overrides allowed.

    `model` is a model the user named (None: not named); one other than the checkpoint's is refused, and so is a
    dataset other than the one the checkpoint was trained on. A finished run's checkpoint is returned unchecked:
    nothing will be trained (finished_run says so)."""
    path = checkpoint_to_resume(overrides["resume"], model, overrides.get("project"))
    record = load_checkpoint(path)
    path = path.resolve()
    given = {k: v for k, v in overrides.items() if k != "resume"}
    finished = record.ended_for(coerce("epochs", overrides["epochs"]) if "epochs" in overrides else None)
    saved, requested = resume_settings(record.train_args, given, path, trains=not finished, cfg_values=cfg_values)
    requested.resume = str(path)
    if "epochs" in overrides:
        check_resume_epochs(record, requested, path)
    if finished:
        return ResumePlan(requested, record, path, finished_run(requested, record, path))
    if "data" in overrides and "data" in saved and _same_data_yaml(requested.data, saved["data"]):
        requested.data = saved["data"]  # the same YAML named another way (relative, bundled name)
    changed = sorted(k for k in overrides if k not in RESUME_MUTABLE and k in saved and getattr(requested, k) != saved[k])
    if changed:
        raise ConfigError(f"cannot change {', '.join(f'{k}={overrides[k]!r} (was {saved[k]!r})' for k in changed)} when resuming {path}: "
                          f"that would change what is being trained. Settings that may change on resume: {', '.join(sorted(RESUME_MUTABLE - {'resume', 'mode'}))}")
    check_resume_model(model, record, path)
    check_resume_data(requested, record, path)
    requested.exist_ok = True
    return ResumePlan(requested, record, path, None)


# --- another length: epochs= on resume ----------------------------------------------------------------------------------
def check_resume_epochs(ckpt: Checkpoint, args: Config, path: Path) -> None:
    """epochs= on resume: any value that keeps the epochs already trained (a longer or a shorter run: the LR schedule and
    close_mosaic are computed for the new length, see docs/cli.md); fewer is refused with one line."""
    done = int(ckpt.epoch) + 1 + (1 if ckpt.epoch_batches else 0)  # a mid-epoch checkpoint: its epoch is under way
    if args.epochs < done:
        raise ConfigError(f"invalid value for 'epochs': {args.epochs} on resume of {path}, which has trained {done} epochs"
                          f"{' (the last one partly)' if ckpt.epoch_batches else ''}; give epochs >= {done}")
    total = int(ckpt.epochs) if ckpt.epochs is not None else args.epochs
    trains = not ckpt.finished or args.epochs > int(ckpt.epoch) + 1
    if trains and args.epochs != total and rank() in (-1, 0):
        fresh = "; the optimizer state was dropped when the run finished, so it starts fresh (momentum, Adam moments)" \
            if ckpt.optimizer is None else ""
        LOGGER.info(f"resume: the run of {total} epochs continues as a run of {args.epochs} (recorded in args.yaml and the "
                    f"checkpoints); the LR schedule and close_mosaic follow the new length from epoch {int(ckpt.epoch) + 2}{fresh}")


def finished_run(args: Config, ckpt: Checkpoint, path: Path) -> FinishedRun:
    """resume= of a run that ended, without a larger epochs= (which trains it further: Checkpoint.ended_for): nothing to
    train and nothing written; says how to train further."""
    setup_logging(args.verbose)
    done, total = int(ckpt.epoch) + 1, int(ckpt.epochs or 0)
    how = f"all {total} epochs trained" if done >= total else f"stopped early after epoch {done} of {total}"
    best = path.parent / "best.pt"
    weights = best if best.is_file() else path
    hint = (f"resume it with a larger epochs= (yolo-cb train resume={path} epochs={total + max(total, 1)}), or start a new run from "
            f"its weights: yolo-cb train model={weights} data={args.data} epochs=N (YOLO('{weights}').train(data=..., epochs=N))")
    LOGGER.info(f"{path} is from a finished run ({how}); there is nothing to resume and nothing was changed. "
                f"To train further (fine-tune), {hint}")
    return FinishedRun(DetectionMetrics({k: float(v) for k, v in (ckpt.metrics or {}).items()}, names=ckpt.names), weights)


# --- refusals: the same model, the same dataset -----------------------------------------------------------------------
def _same_data_yaml(a: Any, b: Any) -> bool:
    try:
        return find_dataset_cfg(str(a)).resolve() == find_dataset_cfg(str(b)).resolve()
    except (FileNotFoundError, OSError):
        return False


def check_resume_model(model: str | None, ckpt: Checkpoint, path: Path) -> None:
    """Refuse a model= on resume that is not the checkpoint's: the same architecture YAML, the checkpoint itself, or the
    weights the run started from are fine; anything else would be silently ignored, so it is an error."""
    if model is None:
        return
    recorded = (ckpt.train_args or {}).get("model")
    was = recorded or f"the architecture {ckpt.model_cfg}"
    refuse = ResumeError(f"cannot change model={model} (was {was}) when resuming {path}: resume continues the checkpoint's own "
                         f"model and weights. Resume without model=, or start a new run: yolo-cb train model={model} data=...")
    if str(model).endswith(".pt"):
        own = {path} | ({Path(str(recorded)).expanduser().resolve()} if recorded and str(recorded).endswith(".pt") else set())
        if Path(str(model)).expanduser().resolve() not in own:
            raise refuse
        return

    arch, _ = load_model_cfg(str(model))
    stored = ckpt.model_cfg or {}
    shared = (set(arch) & set(stored)) - {"nc"}  # the whole record (nc is the dataset's); keys an older file lacks are skipped
    if any(arch[k] != stored[k] for k in shared) or arch.get("family", "yolox") != stored.get("family", "yolox"):
        raise refuse


def check_resume_data(args, ckpt: Checkpoint, path: Path) -> None:
    """Refuse to resume on a dataset other than the checkpoint's (its data YAML, image counts and names), naming both."""

    check_same_dataset(ckpt, check_data(args.data or "shapes.yaml", args.datasets_dir), path)


def dataset_fingerprint(data: dict[str, Any], version: int = FINGERPRINT_VERSION) -> dict[str, Any]:
    """What identifies a dataset for resume: its YAML (absolute), the number of train and val images, the class names;
    in the form `version` (FINGERPRINT_VERSION) counts them, which new fingerprints record."""

    def count(split) -> int:
        try:
            return len(list_image_files(split)) if split else 0
        except FileNotFoundError:
            return 0

    names = data.get("names") or {}
    val_sets = list((data.get("val_sets") or {"val": data.get("val")}).values())  # a list: as when it was one set
    counted = val_sets[:1] if version < 2 and data.get("val_named") else val_sets
    fingerprint = {"yaml": str(data.get("yaml_file", "")), "train_images": count(data.get("train")),
                   "val_images": sum(count(split) for split in counted), "names": [str(names[k]) for k in sorted(names)]}
    return {**fingerprint, "version": version} if version >= 2 else fingerprint


def carried_fingerprint(recorded: dict[str, Any] | None, data: dict[str, Any]) -> dict[str, Any] | None:
    """The dataset fingerprint a resumed run records: the checkpoint's own, which its plan found equal to the dataset
    (check_same_dataset: the images were listed there, once), with the data YAML's path as it is now; None when the
    checkpoint recorded an older form (the images are then counted in today's form at the first save)."""
    if not recorded or int(recorded.get("version", 1)) != FINGERPRINT_VERSION:
        return None
    return {**recorded, "yaml": str(data.get("yaml_file", ""))}


def describe_dataset(fingerprint: dict[str, Any]) -> str:
    names = fingerprint.get("names") or []
    # the names escaped: this message is printed, and the names are a data YAML's
    shown = ", ".join(printable(n) for n in names[:8]) + (f", ... ({len(names)} classes)" if len(names) > 8 else "")
    return f"{fingerprint.get('yaml') or '?'} ({fingerprint.get('train_images')} train / {fingerprint.get('val_images')} val images; names: {shown})"


def check_same_dataset(ckpt: Checkpoint, data: dict[str, Any], path: Any) -> None:
    """Refuse (ResumeError) to resume `ckpt` on a dataset (`data`, check_data's dict) other than the one it was trained
    on, naming both; the images are counted as the checkpoint's fingerprint counted them (its version)."""
    old = ckpt.data_fingerprint
    fingerprint = dataset_fingerprint(data, int(old.get("version", 1)) if old is not None else FINGERPRINT_VERSION)
    if old is None:  # an older checkpoint: only its class names are known
        old_names = [str(v) for _, v in sorted((int(k), v) for k, v in (ckpt.names or {}).items())]
        if old_names and old_names != fingerprint["names"]:
            raise ResumeError(f"cannot resume {path}: it was trained on the classes {old_names}, but the dataset is now "
                              f"{describe_dataset(fingerprint)}. Resume needs the dataset the run was trained on.")
        return
    keys = ("train_images", "val_images", "names")
    if any(old.get(k) != fingerprint.get(k) for k in keys):
        raise ResumeError(f"cannot resume {path}: the dataset changed. The run was trained on {describe_dataset(old)}; "
                          f"now it is {describe_dataset(fingerprint)}. Resume needs the same dataset; to train on another one, "
                          f"start a new run from the weights (model={path} data=...).")


# --- which folder -----------------------------------------------------------------------------------------------------
def run_folder(args: Config, ckpt: Checkpoint) -> Path:
    """The run folder to resume into: the checkpoint's own when it lies in <that folder>/weights/ and the user named no
    other (project=/name=), else a new one from the user's project=/name= or the default layout. Never a folder the
    checkpoint names: its save_dir only tells whether the file still lies in its own run folder."""
    path = Path(str(args.resume)).expanduser().resolve()
    recorded, own = ckpt.save_dir, path.parent.parent
    at_home = bool(recorded) and path.parent == Path(str(recorded)).resolve() / "weights"
    named = (Path(args.project) if args.project else default_project(args)) / (args.name or own.name)
    if at_home and (not (args.project or args.name) or named.resolve() == own):
        return own
    folder = run_dir(Config(**{**args.as_dict(), "exist_ok": False}), "train")
    why = (f"project=/name= name another folder than its own, {own}" if at_home else
           f"{path} does not lie in the weights/ of its run folder {recorded}" if recorded else
           f"{path} records no run folder (written by an older yolo-cb)")
    LOGGER.warning(f"WARNING resuming into a new run folder {folder}: {why}; nothing is written next to {path}")
    return folder
