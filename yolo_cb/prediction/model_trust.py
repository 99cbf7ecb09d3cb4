"""Which model files that carry code yolo-cb loads: the ones it wrote for this user, and those the user trusts (trust=True).

A TorchScript file is a program, and PyTorch has no safe mode for torch.jit.load: a crafted file's `__setstate__` ran
while loading and overwrote a file outside its folder, past every content check (a tab in `def __setstate__`, a code
entry held twice in the zip, a script class or a forward pre-hook no check walked). So the decision to load is not
taken from the file's contents. An export records its bytes as ours: their HMAC-SHA256 under a random 32-byte key of
this user (KEY_NAME in the user's config folder, yolo_cb/settings/user.py; mode 0600, created by the first export that
needs it) names an entry of the folder RECORDS beside it. A loader reads the file once, and hands torch those same bytes
only when their digest is recorded there, or when the user said trust=True. Without the key nothing is ours: someone
else's export, or a file edited after export, is refused in one line naming the file, why, and trust=True.

    record_export(data, target)                  # at export, before the file is verified or renamed into place
    data = loadable_bytes(path, "TorchScript", trust=False)   # the bytes to deserialise, or CheckpointError
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path

from yolo_cb.errors import CheckpointError, ConfigError, WriteError, os_reason
from yolo_cb.settings.user import settings_path
from yolo_cb.utils.files import atomic_write_text, create_temp

KEY_NAME = "model.key"  # the user's random key, in the config folder
KEY_BYTES = 32
RECORDS = "written_models"  # one file per export: named by its keyed digest, holding where and when it was written


def config_folder() -> Path:
    """The user's config folder (YOLO_CB_CONFIG_DIR, else $XDG_CONFIG_HOME/yolo-cb, else ~/.config/yolo-cb)."""
    return settings_path().parent


def digest(key: bytes, data: bytes) -> str:
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def read_key(path: Path) -> bytes | None:
    """The key at `path`, or None when there is none; ConfigError for one that others may read or that is damaged."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ConfigError(f"cannot read yolo-cb's model key {path}: {os_reason(error)}") from None
    with os.fdopen(fd, "rb") as f:
        mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
        key = f.read(KEY_BYTES + 1)
    if os.name == "posix" and mode & 0o077:
        raise ConfigError(f"yolo-cb's model key {path} has mode {mode:04o}: other users may read it, and with it make files yolo-cb "
                          f"runs as its own; `chmod 600 {path}`, or delete it (your exports then need exporting again)")
    if len(key) != KEY_BYTES:
        raise ConfigError(f"yolo-cb's model key {path} is damaged ({len(key)} bytes, not {KEY_BYTES}); delete it (your exports "
                          f"then need exporting again)")
    return key


def user_key() -> bytes:
    """This user's key, created on first use: 32 random bytes, mode 0600, appearing whole (linked into place) and never
    over a key another process created first."""
    path = config_folder() / KEY_NAME
    key = read_key(path)
    if key is not None:
        return key
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, temp = create_temp(path.parent, f".{KEY_NAME}.", ".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(secrets.token_bytes(KEY_BYTES))
            f.flush()
            os.fsync(f.fileno())
        _link_new(temp, path)
    finally:
        temp.unlink(missing_ok=True)
    return read_key(path)


def _link_new(temp: Path, path: Path) -> None:
    """`temp` given the name `path` unless a file has it already (another process's key: that one is kept)."""
    try:
        os.link(temp, path)
    except FileExistsError:
        pass
    except OSError:  # a filesystem without hard links: rename, unless a key appeared meanwhile
        if not path.exists():
            os.rename(temp, path)


def record_export(data: bytes, target: Path) -> Path:
    """Record `data`, a TorchScript file yolo-cb is writing to `target`, as its own for this user; the record's path.
    WriteError (one line) when the config folder cannot be written: the export would be refused by predict and val."""
    try:
        folder = config_folder() / RECORDS
        record = folder / digest(user_key(), data)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write_text(record, json.dumps({"file": str(target), "date": datetime.datetime.now().isoformat(timespec="seconds")}) + "\n")
    except OSError as error:
        raise WriteError(f"cannot record the export {target} as yolo-cb's own in {config_folder()}: {os_reason(error)}; predict "
                         f"and val would refuse it. Set YOLO_CB_CONFIG_DIR to a folder this user may write", error.errno,
                         str(config_folder())) from None
    return record


def is_recorded(data: bytes) -> bool:
    """Whether yolo-cb recorded `data` as one of its exports for this user (False without a key)."""
    key = read_key(config_folder() / KEY_NAME)
    return key is not None and (config_folder() / RECORDS / digest(key, data)).is_file()


def loadable_bytes(path: Path, kind: str, trust: bool) -> bytes:
    """The bytes of `path` to deserialise (read once: what is checked is what loads), when yolo-cb wrote them for this
    user or `trust`; else the one-line refusal. `kind`: the format, for the message ("TorchScript")."""
    data = path.read_bytes()
    if trust or is_recorded(data):
        return data
    raise CheckpointError(f"refused to load '{path}': yolo-cb did not write this {kind} file for this user (its digest is not among "
                          f"the exports recorded in {config_folder()}), and a {kind} file is a program that runs when loaded. "
                          f"If you trust where it came from, pass trust=True (docs/security.md)")
