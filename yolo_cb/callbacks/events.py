"""Every event yolo-cb fires, declared once, each with when it fires.

The order of each group is the order in which the events fire in one run.
"""

from __future__ import annotations

TRAINER_EVENTS: dict[str, str] = {
    "on_pretrain_routine_start": "training starts: run dir made, before the model, data and optimizer are built",
    "on_pretrain_routine_end": "model, data, loss and optimizer are built (and a resume loaded), before the first epoch",
    "on_train_start": "just before the first epoch of this run (trainer.start_epoch is set)",
    "on_train_epoch_start": "at the start of each epoch, before its loader iterator is created",
    "on_train_batch_start": "before each batch's forward pass (trainer.batch holds the batch)",
    "on_train_batch_loss_end": "after the loss of a batch is computed, before backward (trainer.loss_items)",
    "on_after_backward": "after backward of a batch, before any optimizer step",
    "optimizer_step": "after the optimizer stepped (every accumulation boundary; grads still present)",
    "on_before_zero_grad": "after an optimizer step, right before gradients are zeroed",
    "on_train_batch_end": "after each batch; trainer.stop set here ends the epoch after this batch",
    "on_train_epoch_end": "after the last batch of an epoch (or a stop), before validation",
    "on_model_save": "after last.pt (and best.pt if improved) were written this epoch",
    "on_fit_epoch_end": "after validation and saving of an epoch: trainer.metrics holds this epoch's metrics",
    "on_params_update": "after the learning rate of every parameter group was updated for the next epoch",
    "on_train_end": "after the final validation of best.pt, before teardown",
    "on_exception": "an exception ended training; trainer.exception holds it (last.pt already saved)",
    "teardown": "always last: after success, error, stop or Ctrl-C",
}

VALIDATOR_EVENTS: dict[str, str] = {
    "on_val_start": "validation starts (validator.dataloader and model are ready)",
    "on_val_batch_start": "before each validation batch's forward pass",
    "on_val_batch_end": "after each validation batch is matched against its labels",
    "on_val_end": "validation finished: validator.metrics holds the metrics",
}

PREDICTOR_EVENTS: dict[str, str] = {
    "on_predict_start": "prediction starts (the source and model are loaded)",
    "on_predict_batch_start": "before each batch of images is preprocessed",
    "on_predict_postprocess_end": "after NMS of a batch: predictor.results holds this batch's results",
    "on_predict_batch_end": "after a batch's results were saved / yielded",
    "on_predict_end": "the source is exhausted",
}

EXPORTER_EVENTS: dict[str, str] = {
    "on_export_start": "export starts (model loaded, not yet exported)",
    "on_export_end": "the file was written and verified: exporter.file holds its path",
}

EVENTS: dict[str, str] = {**TRAINER_EVENTS, **VALIDATOR_EVENTS, **PREDICTOR_EVENTS, **EXPORTER_EVENTS}
