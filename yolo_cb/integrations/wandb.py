"""Weights & Biases (wandb=True, off by default; `pip install 'yolo-cb[wandb]'`).

Logged (main process only): every setting as the run config; every LOG_EVERY training batches the batch losses
(step = the global batch index); each epoch the mean train losses, learning rates and — for epochs that validated —
the metrics (step = the global batch index at the epoch's end, x-axis "epoch" logged alongside); the visualisation
JPEGs as they appear; at on_train_end best.pt as a model artifact.

The W&B run files go into the run dir (`<run>/wandb/`), nowhere else. Project: WANDB_PROJECT, else the basename of
`project`, else "yolo-cb"; run name: the run dir name. A resumed training continues its W&B run (the id is stored in
the checkpoint). WANDB_MODE=offline logs without a network (sync later with `wandb sync <run>/wandb/offline-run-*`).
Any W&B failure warns once and switches this integration off (policy "disable"); training goes on.

This file is the whole integration: it declares its setting, policy and dependency where it registers, and
cfg/default.yaml holds the setting's one line. Nothing else in yolo-cb names it.
"""

from __future__ import annotations

import os
from pathlib import Path

from yolo_cb.callbacks.registry import integration
from yolo_cb.integrations.visualize import image_tag
from yolo_cb.utils.log import LOGGER

LOG_EVERY = 10  # training batches between two logged batch losses


@integration("wandb", enabled=lambda args: bool(args.wandb), requires={"wandb": "pip install 'yolo-cb[wandb]'"})
class WandB:
    """Logs a training to Weights & Biases; see the module docstring."""

    rank_zero_only = True

    def __init__(self, log_every: int = LOG_EVERY):
        self.log_every = int(log_every)
        self.run = None
        self.run_id: str | None = None  # restored on resume: the same W&B run continues

    def state_dict(self) -> dict:
        return {"run_id": self.run_id}

    def load_state_dict(self, state: dict) -> None:
        self.run_id = (state or {}).get("run_id")

    def on_pretrain_routine_end(self, trainer):
        import wandb

        save_dir = Path(trainer.save_dir)
        project = os.environ.get("WANDB_PROJECT") or (Path(trainer.args.project).name if trainer.args.project else "yolo-cb")
        self.run = wandb.init(project=project, name=save_dir.name, dir=str(save_dir), config=trainer.args.as_dict(),
                              id=self.run_id, resume="allow" if self.run_id else None, reinit="create_new")
        self.run_id = self.run.id
        LOGGER.info(f"W&B: run {self.run.id} in project '{project}' (files in {save_dir / 'wandb'})")


    def on_train_batch_end(self, trainer):
        if self.run is None or trainer.loss_items is None or trainer.batch_i % self.log_every:
            return
        step = trainer.epoch * trainer.num_batches + trainer.batch_i
        self.run.log({**trainer.label_loss_items(trainer.loss_items, prefix="batch"), "epoch": trainer.epoch}, step=step)

    def on_fit_epoch_end(self, trainer):
        if self.run is None:
            return
        import wandb

        record = trainer.epoch_record
        values = {**record.scalars(), "epoch": trainer.epoch}
        for path in trainer.new_images:
            values[image_tag(path, trainer.epoch)[0]] = wandb.Image(str(path))
        self.run.log(values, step=(trainer.epoch + 1) * trainer.num_batches - 1)

    def on_train_end(self, trainer):
        if self.run is None:
            return
        import wandb

        best = Path(trainer.wdir) / "best.pt" if trainer.wdir else None
        if best is not None and best.is_file():
            artifact = wandb.Artifact(f"model-{self.run.id}", type="model", metadata={"epoch": trainer.epoch})
            artifact.add_file(str(best))
            self.run.log_artifact(artifact, aliases=["best", "latest"])
        self._finish(0)

    def on_exception(self, trainer):
        self._finish(1)

    def teardown(self, trainer):
        self._finish(0)

    def _finish(self, exit_code: int) -> None:
        if self.run is not None:
            run, self.run = self.run, None
            run.finish(exit_code=exit_code)
