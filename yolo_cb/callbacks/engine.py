"""yolo_cb.callbacks.engine, kept for one release: the dispatcher (Callbacks, CallbackError, ...) is
yolo_cb.callbacks.dispatch since 2026-12-04 (issue #43). Importing this path warns and gives that module."""

import sys
import warnings

from yolo_cb.callbacks import dispatch

warnings.warn("yolo_cb.callbacks.engine is now yolo_cb.callbacks.dispatch: import it from there (yolo_cb.callbacks.engine goes "
              "in the next release)", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = dispatch
