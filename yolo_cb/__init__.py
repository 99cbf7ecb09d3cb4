"""yolo-cb: a YOLO-style object detection trainer driven by string-keyed callbacks."""

from yolo_cb.version import __version__

__all__ = ["YOLO", "__version__"]


def __getattr__(name):
    # YOLO is imported on first use so that `import yolo_cb` stays light and side-effect free.
    if name == "YOLO":
        from yolo_cb.model import YOLO

        return YOLO
    raise AttributeError(f"module 'yolo_cb' has no attribute '{name}'")
