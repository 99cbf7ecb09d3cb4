"""The callback engine: events, dispatcher, registry."""

from yolo_cb.callbacks.dispatch import CallbackError, Callbacks, multi_process_safe, rank_zero_only
from yolo_cb.callbacks.events import EVENTS
from yolo_cb.callbacks.registry import register_callback

__all__ = ["EVENTS", "CallbackError", "Callbacks", "multi_process_safe", "rank_zero_only", "register_callback"]
