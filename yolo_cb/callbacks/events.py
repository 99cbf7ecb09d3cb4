"""Every event yolo-cb fires, declared once, each with when it fires.

The order of each group is the order in which the events fire in one run.
"""

from __future__ import annotations

from yolo_cb.utils.suggest import did_you_mean

TRAINER_EVENTS: dict[str, str] = {
    "on_pretrain_routine_start": "training starts: run dir made, before the model, data and optimizer are built",
    "on_pretrain_routine_end": "model, data, loss and optimizer are built (and a resume loaded), before the first epoch",
    "on_train_start": "just before the first epoch of this run (trainer.start_epoch is set)",
    "on_train_epoch_start": "at the start of each epoch, before its loader iterator is created",
    "on_train_batch_start": "before each batch's forward pass (trainer.batch holds the batch)",
    "on_train_batch_loss_end": "after the loss of a batch is computed, before backward (trainer.loss_items)",
    "on_after_backward": "after backward of a batch, before any optimizer step",
    "on_before_optimizer_step": "at each accumulation boundary: gradients accumulated and unscaled (AMP), before clipping and the step",
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
    "on_export_start": "export starts (model loaded, not yet exported): exporter.file is the source .pt, exporter.output the file to write",
    "on_export_end": "the file was written and verified: exporter.output holds its path (exporter.file: the source .pt)",
}

EVENTS: dict[str, str] = {**TRAINER_EVENTS, **VALIDATOR_EVENTS, **PREDICTOR_EVENTS, **EXPORTER_EVENTS}

# Other frameworks' callback names -> ours (the error for an unknown event points here; docs/callbacks.md shows the table).
# Keras (K), Lightning (L), SuperGradients (SG), Hugging Face transformers (HF), before/after hook style (YOLOX, mmengine).
FOREIGN_EVENTS: dict[str, tuple[str, str]] = {
    # Keras
    "on_train_begin": ("on_train_start", "Keras / Hugging Face"),
    "on_epoch_begin": ("on_train_epoch_start", "Keras / Hugging Face"),
    "on_epoch_end": ("on_fit_epoch_end", "Keras / Hugging Face (after validation, with trainer.metrics)"),
    "on_train_batch_begin": ("on_train_batch_start", "Keras"),
    "on_batch_begin": ("on_train_batch_start", "Keras"),
    "on_batch_end": ("on_train_batch_end", "Keras"),
    "on_test_begin": ("on_val_start", "Keras"),
    "on_test_end": ("on_val_end", "Keras / Lightning"),
    "on_test_batch_begin": ("on_val_batch_start", "Keras"),
    "on_test_batch_end": ("on_val_batch_end", "Keras / Lightning"),
    "on_predict_begin": ("on_predict_start", "Keras"),
    "on_predict_batch_begin": ("on_predict_batch_start", "Keras"),
    # Lightning
    "setup": ("on_pretrain_routine_start", "Lightning"),
    "on_fit_start": ("on_pretrain_routine_start", "Lightning"),
    "on_fit_end": ("on_train_end", "Lightning"),
    "on_sanity_check_start": ("on_pretrain_routine_end", "Lightning"),
    "on_validation_start": ("on_val_start", "Lightning"),
    "on_validation_epoch_start": ("on_val_start", "Lightning"),
    "on_validation_batch_start": ("on_val_batch_start", "Lightning / SuperGradients"),
    "on_validation_batch_end": ("on_val_batch_end", "Lightning / SuperGradients"),
    "on_validation_epoch_end": ("on_val_end", "Lightning (or on_fit_epoch_end for the trainer after validation)"),
    "on_validation_end": ("on_val_end", "Lightning"),
    "on_test_start": ("on_val_start", "Lightning"),
    "on_test_batch_start": ("on_val_batch_start", "Lightning"),
    "on_before_backward": ("on_train_batch_loss_end", "Lightning"),
    "on_save_checkpoint": ("on_model_save", "Lightning (state: give the callback state_dict()/load_state_dict())"),
    "on_load_checkpoint": ("on_pretrain_routine_end", "Lightning (state: give the callback load_state_dict(); it is restored on resume)"),
    "on_predict_epoch_start": ("on_predict_start", "Lightning"),
    "on_predict_epoch_end": ("on_predict_end", "Lightning"),
    # SuperGradients (PhaseCallback / Callback methods)
    "on_training_start": ("on_train_start", "SuperGradients"),
    "on_train_loader_start": ("on_train_epoch_start", "SuperGradients"),
    "on_train_batch_backward_end": ("on_after_backward", "SuperGradients"),
    "on_train_batch_gradient_step_start": ("on_before_optimizer_step", "SuperGradients"),
    "on_train_batch_gradient_step_end": ("optimizer_step", "SuperGradients"),
    "on_train_loader_end": ("on_train_epoch_end", "SuperGradients"),
    "on_validation_loader_start": ("on_val_start", "SuperGradients"),
    "on_validation_loader_end": ("on_val_end", "SuperGradients (or on_fit_epoch_end for the trainer after validation)"),
    "on_validation_end_best_epoch": ("on_model_save", "SuperGradients (check trainer.improved)"),
    "on_test_loader_start": ("on_val_start", "SuperGradients"),
    "on_test_loader_end": ("on_val_end", "SuperGradients"),
    "on_average_best_models_eval_end": ("on_train_end", "SuperGradients"),
    "on_training_end": ("on_train_end", "SuperGradients"),
    # Hugging Face transformers TrainerCallback
    "on_init_end": ("on_pretrain_routine_end", "Hugging Face"),
    "on_step_begin": ("on_train_batch_start", "Hugging Face"),
    "on_substep_end": ("on_after_backward", "Hugging Face"),
    "on_pre_optimizer_step": ("on_before_optimizer_step", "Hugging Face"),
    "on_optimizer_step": ("optimizer_step", "Hugging Face"),
    "on_step_end": ("on_train_batch_end", "Hugging Face (or optimizer_step: once per optimizer step, as Hugging Face's step)"),
    "on_evaluate": ("on_val_end", "Hugging Face (or on_fit_epoch_end for the trainer after validation)"),
    "on_save": ("on_model_save", "Hugging Face"),
    "on_log": ("on_fit_epoch_end", "Hugging Face"),
    "on_prediction_step": ("on_val_batch_end", "Hugging Face"),
    "on_predict": ("on_predict_end", "Hugging Face"),
    # before/after hooks (YOLOX, mmengine, wall_e)
    "before_run": ("on_pretrain_routine_start", "before/after hooks"),
    "after_run": ("teardown", "before/after hooks"),
    "before_train": ("on_train_start", "before/after hooks"),
    "after_train": ("on_train_end", "before/after hooks"),
    "before_epoch": ("on_train_epoch_start", "before/after hooks"),
    "after_epoch": ("on_fit_epoch_end", "before/after hooks"),
    "before_train_epoch": ("on_train_epoch_start", "before/after hooks"),
    "after_train_epoch": ("on_train_epoch_end", "before/after hooks"),
    "before_iter": ("on_train_batch_start", "before/after hooks"),
    "after_iter": ("on_train_batch_end", "before/after hooks"),
    "before_train_iter": ("on_train_batch_start", "before/after hooks"),
    "after_train_iter": ("on_train_batch_end", "before/after hooks"),
    "before_val_epoch": ("on_val_start", "before/after hooks"),
    "after_val_epoch": ("on_val_end", "before/after hooks"),
    "before_val": ("on_val_start", "before/after hooks"),
    "after_val": ("on_val_end", "before/after hooks"),
    "before_val_iter": ("on_val_batch_start", "before/after hooks"),
    "after_val_iter": ("on_val_batch_end", "before/after hooks"),
    "before_backward": ("on_train_batch_loss_end", "before/after hooks"),
    "after_backward": ("on_after_backward", "before/after hooks"),
    "before_optimizer_step": ("on_before_optimizer_step", "before/after hooks"),
    "after_optimizer_step": ("optimizer_step", "before/after hooks"),
    "before_save_checkpoint": ("on_model_save", "before/after hooks"),
    "after_load_checkpoint": ("on_pretrain_routine_end", "before/after hooks"),
    # wall_e (its on_register is honoured: an object's on_register(callbacks) runs when it is added)
    "before_fit": ("on_pretrain_routine_start", "wall_e"),
    "after_fit": ("on_train_end", "wall_e (or teardown: always last)"),
    "before_running_epoch": ("on_train_epoch_start", "wall_e (on_val_start for a validation epoch)"),
    "after_running_epoch": ("on_train_epoch_end", "wall_e (on_val_end for a validation epoch)"),
    "before_running_batch": ("on_train_batch_start", "wall_e (on_val_batch_start in validation)"),
    "after_running_batch": ("on_train_batch_end", "wall_e (on_val_batch_end in validation)"),
    "before_valid": ("on_val_start", "wall_e"),
    "after_valid": ("on_val_end", "wall_e (or on_fit_epoch_end for the trainer after validation)"),
    "before_test": ("on_val_start", "wall_e (val with split=test)"),
    "after_test": ("on_val_end", "wall_e (val with split=test)"),
}


def event_hint(name: str) -> str:
    """' 'x' is <framework>'s name: here it is 'y'.' for another framework's event name, else the closest spellings."""
    key = str(name)
    if key.startswith(("on_before_", "on_after_")) and key not in EVENTS and key[3:] in FOREIGN_EVENTS:
        key = key[3:]  # on_before_train_iter -> before_train_iter
    if key in FOREIGN_EVENTS:
        ours, where = FOREIGN_EVENTS[key]
        framework, _, note = where.partition(" (")
        return f" '{name}' is a {framework} name: here it is '{ours}'" + (f" ({note}." if note else ".")
    return did_you_mean(name, EVENTS)
