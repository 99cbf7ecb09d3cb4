"""Errors the user can fix: each message names the file, key or value at fault and says what would be right.

The CLI prints any ``UserError`` as one line (``yolo-cb: error: ...``) and exits with status 2; every other
exception is a bug in yolo-cb (or in a user's callback) and keeps its traceback. Each class also derives
from the builtin that code outside may already catch (ValueError, OSError).
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input or environment, raised where it is detected, with a message saying what would be right."""


class ConfigError(UserError, ValueError):
    """A setting is unknown, of the wrong type or out of range, or a settings / model YAML cannot be used."""


class DataError(UserError, ValueError):
    """A dataset YAML, a dataset download or an archive that cannot be used."""


class CheckpointError(UserError, ValueError):
    """A file given as a checkpoint that is not a usable yolo-cb checkpoint."""


class WriteError(UserError, OSError):
    """An output that cannot be written: read-only or full filesystem, a file where a folder should be.

    ``errno`` and ``filename`` are those of the underlying OSError; ``str()`` is the one-line message.
    """

    def __init__(self, message: str, errno: int | None = None, filename: str | None = None):
        super().__init__(errno, message)
        self.filename = filename
        self.message = message

    def __str__(self) -> str:
        return self.message


def short_repr(value, limit: int = 80) -> str:
    """``repr(value)`` cut to about ``limit`` characters, without building the whole repr of a huge or deep value."""
    import reprlib

    shortener = reprlib.Repr()
    shortener.maxlevel, shortener.maxstring, shortener.maxother, shortener.maxlong = 3, limit, limit, limit
    text = shortener.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def os_reason(error: OSError) -> str:
    """A short lower-case reason for an OSError: 'no space left on device', 'read-only file system', ..."""
    import errno as errnos
    import os

    special = {errnos.ENOTDIR: "a part of the path is a file, not a folder", errnos.EEXIST: "a file is in the way (not a folder)"}
    if error.errno in special:
        return special[error.errno]
    text = error.strerror or (os.strerror(error.errno) if error.errno else str(error))
    return text[:1].lower() + text[1:]
