"""Opening a tune's Optuna storage (`storage=`, else study.db in the tune folder) as an RDB storage, checked.

A value that cannot be a study's storage (not a URL, no database SQLAlchemy knows, a missing driver, an in-memory or
unreachable database, a folder or a missing folder for SQLite) is a ConfigError naming `storage=`, the value and what
would do, raised before the tune makes its folder.
"""

from __future__ import annotations

import time
from pathlib import Path

from yolo_cb.errors import ConfigError
from yolo_cb.integrations.mlflow import public_uri

EXAMPLES = "e.g. sqlite:////abs/path/study.db or postgresql://user:pass@host:5432/db, or leave storage= empty for study.db in the tune folder"
# several processes creating one new database's tables at once (SQLite: a lock or a table made by the other; PostgreSQL:
# the other's CREATE TABLE took the type name first): the loser tries again and finds the tables
RACE_SIGNS = ("locked", "already exists", "UNIQUE constraint failed", "duplicate key value violates unique constraint")


def bad_storage(url: str, why: str) -> ConfigError:
    """The one-line error for an unusable storage= value (any password in it hidden)."""

    return ConfigError(f"storage={public_uri(url)!r}: {why}")


def check_url(url: str):
    """The parsed SQLAlchemy URL of `url`; what can be told without connecting is checked (SQLite: a file whose folder exists)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise bad_storage(url, f"not a database URL; give an Optuna storage URL ({EXAMPLES})") from None
    if parsed.get_backend_name() == "sqlite":
        _check_sqlite_file(url, parsed.database)
    return parsed


def _check_sqlite_file(url: str, database: str | None) -> None:
    if database in (None, "", ":memory:"):
        raise bad_storage(url, f"an in-memory SQLite database keeps nothing for resume= or for other processes; name a file ({EXAMPLES})")
    path = Path(database).expanduser()
    if path.is_dir():
        raise bad_storage(url, f"{path} is a folder; name a database file in it (sqlite:///{path / 'study.db'})")
    if not path.parent.is_dir():
        raise bad_storage(url, f"the folder {path.parent} does not exist; create it or name a file in an existing folder ({EXAMPLES})")


def open_storage(optuna, url: str):
    """`url` opened as an Optuna RDBStorage (its tables created); SQLite waits up to 2 minutes for a lock held by another process."""
    from sqlalchemy.exc import NoSuchModuleError, SQLAlchemyError

    parsed = check_url(url)
    sqlite = parsed.get_backend_name() == "sqlite"
    for attempt in range(3):  # several processes on one new database may race to create its tables: the loser tries again
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 120}} if sqlite else {})
        except NoSuchModuleError:
            raise bad_storage(url, f"'{parsed.drivername}' is no database SQLAlchemy knows; give a database URL ({EXAMPLES})") from None
        except ImportError:
            raise bad_storage(url, f"the Python driver for {parsed.get_backend_name()} ({parsed.get_driver_name()}) is not installed; "
                                   f"pip install it, or name an installed driver in the URL ({parsed.get_backend_name()}+<driver>://...)") from None
        except SQLAlchemyError as error:
            reason = str(getattr(error, "orig", None) or error).splitlines()[0][:300]
            if attempt == 2 or not any(sign in reason for sign in RACE_SIGNS):
                raise bad_storage(url, f"cannot open the database: {reason}") from None
            time.sleep(1.0 + attempt)
