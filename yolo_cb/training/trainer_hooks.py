"""Ultralytics' trainer methods that a subclass overrides, and what does their job here.

Ultralytics' custom-trainer guides subclass its trainer and override these methods. The yolo-cb loop never calls
them (their jobs are done by callbacks or settings), so a subclass defining one would train as if it did not: `refuse_unread_hooks`
refuses such a class at train() with one line naming each method and the yolo-cb way to do its job. Methods the loop
does call at their place (`build_optimizer`, `validate`, `save_metrics`, `save_model`, `plot_metrics`,
`label_loss_items`, `checkpoint_dict`, ...) are the Trainer's
own and may be overridden.
"""

from __future__ import annotations

from yolo_cb.errors import ConfigError

# Ultralytics trainer method -> what does its job in yolo-cb (the loop never calls a method of this name).
ULTRALYTICS_HOOKS: dict[str, str] = {
    "optimizer_step": "an on_before_optimizer_step callback (unscaled gradients, before clipping) or grad_clip=",
    "get_model": "model= (a model YAML or a checkpoint)",
    "get_dataloader": "the settings data=, batch=, workers=",
    "build_dataset": "the settings data=, imgsz= and the augmentation settings",
    "get_validator": "a callback on the validator's events (on_val_start ... on_val_end)",
    "preprocess_batch": "an on_train_batch_start callback that edits trainer.batch",
    "plot_training_samples": "plots=True (train_batch*.jpg) or an on_train_batch_end callback",
    "plot_training_labels": "plots=True",
    "final_eval": "an on_train_end callback (trainer.metrics: best.pt's final validation)",
    "progress_string": "an on_train_batch_end callback (the progress line is the built-in callback's)",
    "set_model_attributes": "an on_pretrain_routine_end callback (trainer.model is built there)",
    "setup_model": "an on_pretrain_routine_end callback (trainer.model is built there)",
    "resume_training": "resume= (the checkpoint's state is restored before on_pretrain_routine_end)",
}


def unread_hooks(trainer_class: type, base: type) -> list[str]:
    """The Ultralytics method names `trainer_class` defines that `base`, the yolo-cb Trainer, neither has nor calls."""
    return [name for name in ULTRALYTICS_HOOKS if not hasattr(base, name)
            and any(name in vars(klass) for klass in trainer_class.__mro__ if klass not in base.__mro__)]


def refuse_unread_hooks(trainer_class: type, base: type) -> None:
    """ConfigError, one line, when `trainer_class` overrides an Ultralytics trainer method the yolo-cb loop never calls."""
    names = unread_hooks(trainer_class, base)
    if names:
        ways = "; ".join(f"{name}() -> {ULTRALYTICS_HOOKS[name]}" for name in names)
        raise ConfigError(f"trainer={trainer_class.__name__} defines {', '.join(f'{n}()' for n in names)}, which the yolo-cb "
                          f"loop never calls (an Ultralytics trainer method), so it would silently not run. Here: {ways}")
