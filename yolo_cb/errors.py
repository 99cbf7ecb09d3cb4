"""Errors the user can fix: each message names the file, key or value at fault and says what would be right.

The CLI prints any ``UserError`` as one line (``yolo-cb: error: ...``) and exits with status 2; every other
exception is a bug in yolo-cb (or in a user's callback) and keeps its traceback. Each class also derives
from the builtin that code outside may already catch (ValueError, OSError).
"""

from __future__ import annotations

from yolo_cb.utils.yaml_safe import yaml_loads


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


def yaml_error_message(path, error: Exception, what: str = "YAML file") -> str:
    """One line for a YAML that cannot be loaded safely: the file, the line and column, and what to change."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = " ".join(str(getattr(error, "problem", None) or error).split())
    if type(error).__name__ == "YAMLLimitError":
        return f"{path}: {where}refused: {problem}; yolo-cb does not expand such a {what}: write the values out"
    if "could not determine a constructor for the tag" in problem:
        tag = problem.split("tag", 1)[1].strip(" '\"").replace("tag:yaml.org,2002:", "!!")
        return (f"{path}: {where}the tag '{tag}' is not allowed in a {what}; yolo-cb loads YAML safely (mappings, lists, "
                f"strings, numbers, booleans only): replace the tagged value with a plain one")
    return f"{path}: {where}not valid YAML ({problem}); fix the {what} so that it parses"


def load_yaml(path, error_type: type[UserError] = ConfigError, what: str = "YAML file"):
    """A text file parsed by yolo_cb.utils.yaml_safe (safe tags, bounded aliases); any failure (I/O, not text, not YAML,
    an unsafe tag, an alias bomb) raises ``error_type`` with one line naming the file and the place."""
    from pathlib import Path

    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise error_type(f"{path}: not a text file, so not a {what}") from None
    except OSError as e:
        raise error_type(f"{path}: cannot read the {what} ({os_reason(e)})") from None
    try:
        return yaml_loads(text)
    except yaml.YAMLError as e:
        raise error_type(yaml_error_message(path, e, what)) from None
