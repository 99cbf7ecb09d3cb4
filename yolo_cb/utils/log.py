"""The project logger. Handlers are attached by entry points (CLI, YOLO facade), never on import."""

from __future__ import annotations

import logging
import sys

LOGGER = logging.getLogger("yolo_cb")


def setup_logging(verbose: bool = False) -> None:
    """Attach one plain stdout handler to the yolo_cb logger (idempotent)."""
    LOGGER.setLevel(logging.DEBUG if verbose else logging.INFO)
    if not any(getattr(h, "_yolo_cb", False) for h in LOGGER.handlers):
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._yolo_cb = True
        LOGGER.addHandler(handler)


def printable(text: object) -> str:
    """`text` safe to print: control characters (a class name "\\x1b[2J" from a data YAML or a model's metadata clears the
    screen, a newline forges a line) written as their escapes, \\x1b, \\n; other text, non-ASCII letters included, unchanged."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text))
