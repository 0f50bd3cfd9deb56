"""A real Airflow deployment on this machine: the processes the demo, the tests and the benches start.

:class:`LocalStack` prepares an Airflow home (config through ``AIRFLOW__*`` environment
variables, so nothing global is touched), migrates the metadata database and runs the
real components: scheduler, dag-processor, triggerer and api-server. Every process it
starts is in its own process group and is stopped by :meth:`LocalStack.stop`.
"""

from __future__ import annotations

import base64
import contextlib
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

COMPONENTS = ("scheduler", "dag-processor", "triggerer", "api-server")


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
            "PYTHONUNBUFFERED": "1",
        }
        if self.plugins_folder:
            env["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(self.plugins_folder)
        env.update(self.extra_env)
        return env

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

    def __enter__(self) -> LocalStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
