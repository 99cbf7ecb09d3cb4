"""The callback engine: events, dispatcher, registry; and Ultralytics' get_default_callbacks()."""

from yolo_cb.callbacks.dispatch import CallbackError, Callbacks, multi_process_safe, rank_zero_only
from yolo_cb.callbacks.events import EVENTS
from yolo_cb.callbacks.registry import register_callback


def get_default_callbacks() -> Callbacks:
    """Ultralytics' `get_default_callbacks()`: a fresh dict of every event -> its list of callbacks (a Callbacks: the lists
    are live, `callbacks["on_train_end"].append(fn)` registers fn), to fill and hand to an engine, e.g.
    `DetectionTrainer(overrides=..., _callbacks=callbacks)`. Ultralytics' lists hold its do-nothing placeholder functions;
    these are empty, for the same effect. The built-in callbacks a yolo-cb trainer runs (progress, checkpoints, ...) depend
    on its settings and are added by the trainer itself; `yolo_cb.assembly.assemble.get_default_callbacks(args)` lists them
    (this layer cannot build them: they sit above it, docs/ultralytics.md)."""
    return Callbacks()


__all__ = ["EVENTS", "CallbackError", "Callbacks", "get_default_callbacks", "multi_process_safe", "rank_zero_only", "register_callback"]
