"""A private PostgreSQL server for the tests: initdb in a temporary folder, a free loopback port, a
fresh database per stack copied from a template migrated once.

Finds Debian's server binaries (/usr/lib/postgresql/<v>/bin). As root the server runs as the
``postgres`` user (PostgreSQL refuses to run as root). A watcher (:mod:`avsim.devstack.procwatch`) stops the
server and removes its folder if the test process dies without doing it (pytest-timeout, CI).
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from avsim.devstack.procwatch import Watcher
from avsim.devstack.stack import free_port


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]
    path = shutil.which(name)
    if not path:
        raise RuntimeError(f"PostgreSQL's {name} not found; install the 'postgresql' package (.ci/run does)")
    return path


def _as_owner(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


class _Server:
    """One PostgreSQL server per test process, started on first use and stopped at exit.

    Its template database ``airflow_migrated`` holds Airflow's migrated schema, made once by
    ``airflow db migrate``; every test database is a copy of it (``CREATE DATABASE ... TEMPLATE``,
    a file copy taking a fraction of a second instead of a migration of a minute on 2 cores).
    """

    TEMPLATE = "airflow_migrated"

    def __init__(self) -> None:
        self.top = Path(tempfile.mkdtemp(prefix="avsim-pg-"))
        self.watcher = Watcher()
        self.watcher.remove(self.top)
        self.data = self.top / "pgdata"
        self.data.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.top, "postgres")
            shutil.chown(self.data, "postgres")
        self.port = free_port()
        subprocess.run(
            _as_owner([_bin("initdb"), "-D", str(self.data), "--auth=trust", "-U", "postgres", "-E", "UTF8"]),
            check=True,
            capture_output=True,
        )
        self.start()
        atexit.register(self.stop)
        self.databases = 0
        self.migrated = False

    def start(self) -> None:
        opts = (
            f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off"
        )
        pg_ctl = [_bin("pg_ctl"), "-D", str(self.data), "-o", opts, "-l", str(self.data / "server.log")]
        subprocess.run(_as_owner([*pg_ctl, "-w", "start"]), check=True, capture_output=True)
        # pg_ctl starts the server in a session of its own: SIGQUIT to its group is an immediate shutdown.
        self.watcher.session(int((self.data / "postmaster.pid").read_text().split()[0]), "SIGQUIT")

    def stop_for(self, seconds: float) -> None:
        """Stop the server (a fast shutdown: every connection dropped), and start it ``seconds`` later,
        as a database failover or restart looks to its clients."""
        subprocess.run(
            _as_owner([_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]),
            check=True,
            capture_output=True,
        )
        time.sleep(seconds)
        self.start()

    def url(self, database: str) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{database}"

    def sql(self, statement: str) -> None:
        for _ in range(50):
            done = subprocess.run(
                [_bin("psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-c", statement],
                capture_output=True,
                text=True,
            )
            if done.returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError(f"{statement}: {done.stderr}")

    def migrate_template(self) -> None:
        if self.migrated:
            return
        self.sql(f"CREATE DATABASE {self.TEMPLATE}")
        home = Path(tempfile.mkdtemp(prefix="avsim-migrate-"))
        env = {
            **os.environ,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.url(self.TEMPLATE),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        }
        subprocess.run(
            [str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
            env=env,
            check=True,
            capture_output=True,
            timeout=900,
        )
        shutil.rmtree(home, ignore_errors=True)
        self.migrated = True

    def stop(self) -> None:
        subprocess.run(
            _as_owner([_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"]), capture_output=True
        )
        shutil.rmtree(self.top, ignore_errors=True)
        self.watcher.close()


_server: _Server | None = None


def stop_server_for(seconds: float) -> None:
    """Stop the tests' PostgreSQL server for ``seconds`` (see :meth:`_Server.stop_for`)."""
    if _server is None:
        raise RuntimeError("no PostgreSQL server is running")
    _server.stop_for(seconds)


@contextlib.contextmanager
def postgres_cluster(base: Path | None = None, *, migrated: bool = True) -> Iterator[str]:
    """Yield a SQLAlchemy URL (psycopg2) of a fresh database of its own; drop it after.

    ``migrated``: the database already holds Airflow's schema (a copy of the migrated template),
    so ``airflow db migrate`` has nothing left to do; otherwise it is empty. ``base`` is not used
    (the ``postgres`` user must be able to reach the data folder, which pytest's root-only
    temporary folders do not allow).
    """
    global _server
    if _server is None:
        _server = _Server()
    server = _server
    if migrated:
        server.migrate_template()
    server.databases += 1
    name = f"airflow_{os.getpid()}_{server.databases}"
    server.sql(f"CREATE DATABASE {name}" + (f" TEMPLATE {server.TEMPLATE}" if migrated else ""))
    try:
        yield server.url(name)
    finally:
        server.sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
