"""A private PostgreSQL cluster for the tests: initdb in a temporary folder, a free loopback port.

Finds Debian's server binaries (/usr/lib/postgresql/<v>/bin). As root the server runs as the
``postgres`` user (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from avsim.stack import free_port


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


@contextlib.contextmanager
def postgres_cluster(base: Path | None = None) -> Iterator[str]:
    """Yield a SQLAlchemy URL (psycopg2) of a fresh database; stop and remove the cluster after.

    The cluster lives in its own temporary folder (the ``postgres`` user must be able to reach
    it, which pytest's root-only temporary folders do not allow); ``base`` is not used for data.
    """
    top = Path(tempfile.mkdtemp(prefix="avsim-pg-"))
    data = top / "pgdata"
    data.mkdir()
    if os.geteuid() == 0:
        shutil.chown(top, "postgres")
        shutil.chown(data, "postgres")
    port = free_port()
    subprocess.run(
        _as_owner([_bin("initdb"), "-D", str(data), "--auth=trust", "-U", "postgres", "-E", "UTF8"]),
        check=True,
        capture_output=True,
    )
    opts = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off"
    subprocess.run(
        _as_owner(
            [_bin("pg_ctl"), "-D", str(data), "-o", opts, "-l", str(data / "server.log"), "-w", "start"]
        ),
        check=True,
        capture_output=True,
    )
    try:
        for _ in range(50):
            done = subprocess.run(
                [
                    _bin("psql"),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "-U",
                    "postgres",
                    "-c",
                    "CREATE DATABASE airflow",
                ],
                capture_output=True,
                text=True,
            )
            if done.returncode == 0:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"could not create the test database: {done.stderr}")
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/airflow"
    finally:
        subprocess.run(
            _as_owner([_bin("pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]), capture_output=True
        )
