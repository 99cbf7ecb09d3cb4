"""DVC Live (dvc=True, off by default; `pip install 'yolo-cb[dvc]'`).

Everything goes into the run dir: `<run>/dvclive/` holds `params.yaml` (every setting), `metrics.json` (the last
epoch's values), `plots/metrics/<key>.tsv` (one row per epoch: step = the 0-based epoch; the record results.csv writes
its row from: train losses, learning rates, phase times and, for epochs that validated, the metrics),
`plots/images/` (the visualisation JPEGs), `plots/custom/batch_losses.json` (the batch losses every LOG_EVERY batches,
x = the global batch index) and `plots/sklearn/confusion_matrix.json` (best.pt's final validation, classes +
background); `<run>/dvc.yaml` lists them for `dvc metrics show`, `dvc plots show` and `dvc exp show`.

Inside a DVC repository (found from the working directory, `dvc init`): best.pt is added to DVC (`dvc add`, so
`weights/best.pt.dvc` and a `.gitignore` beside it) and registered in `<run>/dvc.yaml` as the artifact `best` of type
`model` (DVC's model registry: `dvc artifacts get`, Studio). In a Git repository with a commit, the run is also saved
as a DVC experiment (`dvc exp show`), as DVC Live does by default; under `dvc exp run` / `dvc repro` DVC owns that.
Outside a DVC repository the files above are written all the same, and one line says best.pt is not registered (DVC's
registry needs a repository); DVC Live's own habit of running `dvc init` in the Git repository around the working
directory is not let happen (a run writes only inside its run folder: `dvc init` yourself). Any DVC failure warns once and switches this integration off; training goes on.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from yolo_cb.callbacks.registry import integration
from yolo_cb.integrations.tracking import LOG_EVERY, Tracker, best_weights, final_confusion
from yolo_cb.utils.log import LOGGER


def dvc_root() -> str | None:
    """The root of the DVC repository around the working directory, or None."""
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo

    try:
        return Repo.find_root()
    except NotDvcRepoError:
        return None


@contextlib.contextmanager
def swapped(owner, name: str, value):
    """owner.name = value during the block, the old value after it."""
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


def confusion_pairs(counts, labels: list[str]) -> tuple[list[str], list[str]]:
    """(true labels, predicted labels), one pair per count of a (predicted rows x true columns) matrix: DVC Live builds
    its confusion plot from such pairs."""
    true, predicted = [], []
    for row, name_pred in enumerate(labels):
        for column, name_true in enumerate(labels):
            n = int(counts[row][column])
            true += [name_true] * n
            predicted += [name_pred] * n
    return true, predicted


@integration("dvc", enabled=lambda args: bool(args.dvc), requires={"dvclive": "pip install 'yolo-cb[dvc]'"})
class DVCLive(Tracker):
    """Logs a training with DVC Live; see the module docstring."""

    title = "DVC Live"

    def __init__(self, log_every: int = LOG_EVERY):
        super().__init__(log_every)
        self.batch_rows: list[dict] = []  # the batch losses logged so far, written as one custom plot
        self.in_repo = False  # the working directory is inside a DVC repository (best.pt is registered)

    def start(self, trainer):
        import dvclive.live

        save_dir = Path(trainer.save_dir)
        root = dvc_root()
        self.in_repo = root is not None
        # Outside a DVC repository DVC Live would `dvc init` the Git repository around the working directory; a run
        # writes only inside its run folder, so it is given no repository instead.
        with contextlib.ExitStack() as stack:
            if root is None:
                stack.enter_context(swapped(dvclive.live, "get_dvc_repo", lambda: None))
            # a resumed training continues the files (DVC Live's step goes on from metrics.json's) instead of clearing them
            live = dvclive.live.Live(dir=str(save_dir / "dvclive"), dvcyaml=str(save_dir / "dvc.yaml"), save_dvc_exp=True,
                                     resume=bool(trainer.start_epoch))
        live.log_params(trainer.args.as_dict())
        where = f"in the DVC repository {root}" if root is not None else "outside a DVC repository"
        LOGGER.info(f"DVC Live: logging to {save_dir / 'dvclive'} ({where})")
        return live

    def log_batch(self, trainer, step, losses):
        self.batch_rows.append({"batch": step, **{k.partition("/")[2]: v for k, v in losses.items()}})

    def log_epoch(self, trainer, record, images):
        live = self.session
        for key, value in record.scalars().items():
            live.log_metric(key, float(value))
        for path, tag, _ in images:
            live.log_image(f"{tag}.jpg", str(path))  # DVC Live keeps the latest of each name
        if self.batch_rows:
            losses = [k for k in self.batch_rows[0] if k != "batch"]
            live.log_plot("batch_losses", self.batch_rows, x="batch", y=losses, title="batch losses", x_label="batch")
        live.next_step()

    def log_end(self, trainer):
        live = self.session
        confusion = final_confusion(trainer)
        if confusion is not None:
            true, predicted = confusion_pairs(*confusion)
            if true:
                live.log_sklearn_plot("confusion_matrix", true, predicted, name="confusion_matrix.json",
                                      title="confusion matrix (best.pt)")
        best = best_weights(trainer)
        if best is not None and self.in_repo:
            live.log_artifact(str(best), type="model", name="best", desc=f"yolo-cb run {Path(trainer.save_dir).name}: best.pt",
                              meta={"epoch": int(trainer.best_epoch or 0) + 1})
        elif best is not None:
            LOGGER.info(f"DVC Live: {best} is not registered as a model artifact: that needs a DVC repository (git init && dvc init)")

    def close(self, failed):
        self.session.end()
