"""A real Airflow deployment on this machine: the processes the demo, the tests and the benches start.

:class:`LocalStack` configures an Airflow home through ``AIRFLOW__*`` variables, migrates its database
and runs the scheduler, dag-processor, triggerer and api-server, each in a session of its own, stopped
by :meth:`LocalStack.stop`. :meth:`LocalStack.claim` first locks the home (``stack.lock``) and starts a
watcher (:mod:`avsim.devstack.procwatch`) that ends every process of the stack if its owner dies.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from avsim.devstack.procwatch import Watcher, alive, stat_fields

COMPONENTS = ("scheduler", "dag-processor", "triggerer", "api-server")
LOCK_FILE = "stack.lock"
# In the environment of every process of a stack (and everything they start): the watcher's mark.
STACK_MARK = "AVSIM_STACK"


class StackRunning(RuntimeError):
    """Another stack holds this home; ``holder`` is what it wrote in the lock file (may be empty)."""

    def __init__(self, home: Path, holder: Mapping[str, Any]) -> None:
        self.home = home
        self.holder = dict(holder)
        who = f"process {holder['owner']}" if holder.get("owner") else "another process"
        super().__init__(f"an Airflow stack started by {who} is running on {home}")


def read_holder(lock_path: Path) -> dict[str, Any]:
    """What the stack holding ``lock_path`` wrote there: owner and watcher pids, api url."""
    try:
        holder = json.loads(lock_path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def owner_still_holds(holder: Mapping[str, Any]) -> bool:
    """True when the owner named in ``holder`` is alive and still the parent of its watcher.

    (A dead owner's pid may be reused; its watcher, re-parented, does not name it.)
    """
    owner, watcher = holder.get("owner"), holder.get("watcher")
    if not isinstance(owner, int) or not isinstance(watcher, int):
        return False
    fields = stat_fields(watcher)
    return alive(owner) and fields is not None and fields[1] == owner


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _airflow_bin() -> str:
    candidate = Path(sys.executable).with_name("airflow")
    return str(candidate) if candidate.exists() else "airflow"


@dataclass
class LocalStack:
    home: Path
    dags_folder: Path
    plugins_folder: Path | None = None
    sql_alchemy_conn: str | None = None
    port: int = 0
    parallelism: int = 16
    extra_env: Mapping[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    watcher: Watcher | None = field(default=None, repr=False)
    _lock: IO[str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.home = Path(self.home).resolve()
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "logs").mkdir(exist_ok=True)
        if not self.port:
            self.port = free_port()

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def conn(self) -> str:
        return self.sql_alchemy_conn or f"sqlite:///{self.home / 'airflow.db'}"

    def _secret(self, name: str) -> str:
        # Stable per home, so restarted components agree on keys without writing them anywhere.
        return hashlib.sha256(f"{self.home}:{name}".encode()).hexdigest()

    @property
    def env(self) -> dict[str, str]:
        fernet = base64.urlsafe_b64encode(bytes.fromhex(self._secret("fernet"))).decode()
        env = {
            **os.environ,
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(self.parallelism),
            "AIRFLOW__CORE__FERNET_KEY": fernet,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.api_url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.conn,
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__BASE_URL": self.api_url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": self._secret("jwt"),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "60",
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
            # Every ready task instance considered per loop: one pool's backlog never starves another's.
            "AIRFLOW__SCHEDULER__MAX_TIS_PER_QUERY": "0",
            # A worker parses the DAG file of each task; with the Kubernetes backend that imports the
            # kubernetes clients (several CPU-seconds), more than Airflow's 30 s on a loaded laptop.
            "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "180",
            # Only triggered runs: a stack started now must not also start this week's scheduled run.
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.home / "logs"),
            "AIRFLOW__AVSIM__ARTIFACT_ROOT": f"file://{self.home / 'artifacts'}",
            # The REST API a cleared shards task repairs its shard run through (no login: the
            # simple auth manager's all-admins mode; a stack with real users overrides it).
            "AIRFLOW_CONN_AVSIM_AIRFLOW_API": json.dumps(
                {"conn_type": "avsim_airflow_api", "host": "127.0.0.1", "port": self.port}
            ),
            "PYTHONUNBUFFERED": "1",
            STACK_MARK: self.mark_value,
        }
        if self.plugins_folder:
            env["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(self.plugins_folder)
        env.update(self.extra_env)
        return env

    @property
    def lock_path(self) -> Path:
        return self.home / LOCK_FILE

    @property
    def mark_value(self) -> str:
        return f"{self.home}:{os.getpid()}"

    def claim(self) -> None:
        """Lock the home for this stack and start its watcher; raise :class:`StackRunning` if taken.

        Idempotent. The lock's descriptor is shared with the watcher, so the home stays locked until
        the watcher has ended the stack's last process, even when this process died first.
        """
        if self.watcher is not None:
            return
        lock = open(self.lock_path, "a+")  # noqa: SIM115 - held for the stack's life
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise StackRunning(self.home, read_holder(self.lock_path)) from None
        self.watcher = Watcher(pass_fds=(lock.fileno(),))
        self.watcher.mark(f"{STACK_MARK}={self.mark_value}")
        lock.truncate(0)
        lock.write(json.dumps({"owner": os.getpid(), "watcher": self.watcher.pid, "api_url": self.api_url}))
        lock.flush()
        self._lock = lock

    def release(self) -> None:
        """End whatever of the stack is left (the watcher does it) and unlock the home."""
        if self.watcher is not None:
            self.watcher.close()
            self.watcher = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def airflow(
        self, *args: str, check: bool = True, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        """Run one ``airflow`` CLI command against this stack."""
        return subprocess.run(
            [_airflow_bin(), *args],
            env=self.env,
            check=check,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def migrate(self) -> None:
        self.claim()
        self.airflow("db", "migrate")

    def set_pools(self, pools: Mapping[str, tuple[int, str]], *, include_deferred: bool = True) -> None:
        """Create or update pools: name -> (slots, description); deferred tasks count by default."""
        path = self.home / "pools.json"
        path.write_text(
            json.dumps(
                {
                    n: {"slots": s, "description": d, "include_deferred": include_deferred}
                    for n, (s, d) in pools.items()
                }
            )
        )
        self.airflow("pools", "import", str(path))

    def start(self, components: Iterable[str] = COMPONENTS) -> None:
        self.claim()
        assert self.watcher is not None
        for name in components:
            if name in self.procs and self.procs[name].poll() is None:
                continue
            log = open(self.home / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
            self.procs[name] = subprocess.Popen(
                [_airflow_bin(), name],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.watcher.session(self.procs[name].pid)
        if "api-server" in self.procs:
            self.wait_for_api()

    def wait_for_api(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.procs.get("api-server")
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(
                    f"api-server exited with {proc.returncode}; see {self.home}/logs/api-server.log"
                )
            try:
                with urllib.request.urlopen(f"{self.api_url}/api/v2/monitor/health", timeout=2):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        raise TimeoutError(f"api-server did not answer at {self.api_url} within {timeout:.0f}s")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.get(name)
        if proc and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            proc.wait(timeout=30)

    def stop(self) -> None:
        """Stop every component in order (SIGTERM, then SIGKILL after 20 s), then whatever they left."""
        for name in list(self.procs):
            proc = self.procs[name]
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for name in list(self.procs):
            proc = self.procs.pop(name)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self.release()

    def __enter__(self) -> LocalStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
