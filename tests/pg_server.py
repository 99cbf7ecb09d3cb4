"""A real PostgreSQL server for the tests, started and stopped by them: a fresh data directory, a free loopback port.

`initdb` and `pg_ctl` come from PATH (PostgreSQL 15 from Debian's packages on this project's machines). PostgreSQL refuses
to run as root, so under root the server runs as the `postgres` user, in a folder it owns. Databases are created with
`createdb` over the loopback socket; clients connect with trust authentication, as user `postgres`, on 127.0.0.1 only.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from yolo_cb.training.launch import free_port

USER = "postgres"


def _as_server_user() -> dict:
    """subprocess arguments that run a PostgreSQL tool as a user it accepts (not root)."""
    if os.geteuid() != 0:
        return {}
    entry = pwd.getpwnam(USER)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


class PostgresServer:
    """One server: `start()`, `database(name) -> URL`, `stop()` (fast shutdown, then its folder is removed).

    Its folder is a fresh one directly in the system temp folder: the server's user must be able to reach it, and
    pytest's own temp folders are private to the user running the tests."""

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="yolo-cb-postgres-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.log = self.root / "postgres.log"

    def _run(self, *cmd: str) -> None:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=self.root, **_as_server_user())
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stdout[-1500:]} {proc.stderr[-1500:]}")

    def start(self) -> PostgresServer:
        if not (shutil.which("initdb") and shutil.which("pg_ctl")):
            raise RuntimeError("initdb / pg_ctl are not on PATH: this project's machines have PostgreSQL 15 installed")
        if os.geteuid() == 0:
            entry = pwd.getpwnam(USER)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", USER, "--auth=trust", "--no-sync", "-E", "UTF8")
        options = f"-p {self.port} -h 127.0.0.1 -k {self.root} -c fsync=off -c full_page_writes=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start")
        return self

    def database(self, name: str) -> str:
        """A new, empty database; its SQLAlchemy URL."""
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, name)
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
