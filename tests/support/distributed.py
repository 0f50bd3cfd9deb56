"""The production topology of docker-compose.yml as real processes on loopback: the distributed stack.

Services: PostgreSQL (the tests' private server, :mod:`tests.support.postgres`), Debian's
``redis-server`` (the Celery broker), the S3 API (moto's server: the artifact store and the remote
task-log store, through the ``aws`` connection ``avsim_s3``). Airflow: ``docker/airflow-init.sh`` (the
compose stack's own init: migrate, admin user, avsim's service account and role, pools, bucket),
then the api-server with the FAB auth manager, the scheduler (CeleryExecutor), the dag-processor,
the triggerer and two Celery workers:

* ``gpu-worker``, a GPU machine's worker: only the GPU phase queue (``[avsim] gpu_queue``);
* ``worker``, compose's worker: every queue its command names (default, CPU and GPU phases).

Settings come from docker-compose.yml only (:mod:`tests.support.compose`): its ``x-airflow-env`` with
loopback addresses, plus the stack's own additions, each listed in :data:`TEST_SETTINGS` or
:meth:`DistributedStack.component_env` with its reason. ``tests/unit/test_distributed_settings.py``
fails when they disagree with compose.

Nothing on disk is shared: each component has its own scratch directory as ``AIRFLOW_HOME``,
``HOME`` and ``TMPDIR`` (logs, heartbeat files, caches), as each container has its own filesystem;
they share only the read-only checkout (the image and the ``dags``/``plugins`` mounts). Workers
serve no logs (``--skip-serve-logs``), so a task log the API server shows came from S3. Each
component names itself by its container's name (``[core] hostname_callable``), so a task instance's
``hostname`` says which worker ran it.

A watcher process (:mod:`avsim.devstack.procwatch`) ends every process of the stack, phases
included, if the test process dies without stopping it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import compose
from tests.support.postgres import postgres_cluster

from avsim.devstack.procwatch import Watcher
from avsim.devstack.stack import free_port

ROOT = compose.ROOT
BIN = Path(sys.executable).parent
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
#: The stack's workers: name -> queues (None: the compose worker's own, read from its command).
WORKERS: dict[str, tuple[str, ...] | None] = {"gpu-worker": ("avsim_gpu",), "worker": None}
ADMIN = ("admin", "admin-" + secrets.token_hex(8))
VIEWER = ("viewer", "viewer-" + secrets.token_hex(8))
ENGINEER = ("engineer", "engineer-" + secrets.token_hex(8))
STACK_MARK = "AVSIM_DISTRIBUTED_STACK"

#: Settings compose leaves at Airflow's or avsim's defaults that the stack changes, and why: each
#: makes a test wait less, none changes what runs where or how it is stored.
TEST_SETTINGS: dict[str, tuple[str, str]] = {
    "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": (
        "False",
        "only triggered runs: unpausing avsim_weekly must not also start this week's scheduled run",
    ),
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": (
        "30",
        "a lost worker's task instances fail after 30 s (300 s by default), then retry elsewhere",
    ),
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": (
        "5",
        "looked for every 5 s (10 s by default)",
    ),
    "AIRFLOW__AVSIM__DEADLINE_INTERVAL_SECONDS": (
        "5",
        "the deadline tracker ends with the week at its next pass: every 5 s, not every 5 minutes",
    ),
    "AIRFLOW__API__WORKERS": ("1", "one API server process on 2 cores (4 by default)"),
    "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": (
        "180",
        "a worker parses the shard DAG's file per task; on 2 loaded cores that passes the default 30 s",
    ),
}
#: Compose settings a stack may set otherwise for one test, and why (see the fixtures' arguments).
TEST_OPTIONAL = {
    "AIRFLOW__AVSIM__DEADLINE_MAX_GPU_SLOTS": "lets the deadline tracker raise the GPU spot pool, "
    "which compose leaves off (0) until the GPU workers or nodes can grow",
    "AIRFLOW__AVSIM__CASES_IN_FLIGHT": "fixes admission's target, so a week keeps the shard runs of "
    "[avsim] shard_size that a test's checks count instead of shard runs sized from its small pools",
}


def deployment_variables(api_port: int) -> dict[str, str]:
    """What ``docker/new-env.sh`` writes to ``.env``, made for this stack (and the API's address)."""

    def token() -> str:
        return secrets.token_urlsafe(24)

    return {
        "POSTGRES_PASSWORD": token(),
        "AIRFLOW_FERNET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
        "AIRFLOW_JWT_SECRET": token(),
        "AIRFLOW_API_SECRET_KEY": token(),
        "AVSIM_S3_ACCESS_KEY": "avsim",
        "AVSIM_S3_SECRET_KEY": token(),
        "AVSIM_ADMIN_USER": ADMIN[0],
        "AVSIM_ADMIN_PASSWORD": ADMIN[1],
        "AVSIM_SERVICE_USER": "avsim-service",
        "AVSIM_SERVICE_PASSWORD": token(),
        "AIRFLOW_API_BASE_URL": f"http://127.0.0.1:{api_port}",
    }


def _wait_for(what: str, check: Any, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with contextlib.suppress(OSError, urllib.error.URLError):
            if check():
                return
        time.sleep(0.3)
    raise TimeoutError(f"{what}: not ready within {timeout:.0f}s")


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return bool(resp.status < 500)


def _port_open(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        return True


@dataclass
class DistributedStack:
    base: Path
    database_url: str
    #: pools: spot GPUs, on-demand GPUs, CPU phase slots (a capacity file, as airflow-init syncs one);
    #: None: compose's own capacity file, where compose mounts it for airflow-init
    capacity: tuple[int, int, int] | None = (4, 2, 6)
    #: Compose settings changed for one test (only keys of :data:`TEST_OPTIONAL`).
    options: Mapping[str, str] = field(default_factory=dict)
    #: The Celery workers: name -> queues (None: compose's worker's).
    workers: Mapping[str, tuple[str, ...] | None] = field(default_factory=lambda: dict(WORKERS))
    api_port: int = field(default_factory=free_port)
    redis_port: int = field(default_factory=free_port)
    s3_port: int = field(default_factory=free_port)
    #: What ``.env`` holds (``docker/new-env.sh``'s output); None: made for this stack.
    env_file: Mapping[str, str] | None = None
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    watcher: Watcher | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        unknown = set(self.options) - set(TEST_OPTIONAL)
        if unknown:
            raise ValueError(f"{sorted(unknown)}: not settings a test may change (TEST_OPTIONAL)")
        self.base = Path(self.base).resolve()
        (self.base / "logs").mkdir(parents=True, exist_ok=True)
        self.variables = deployment_variables(self.api_port)
        if self.env_file is not None:
            self.variables = {**self.env_file, "AIRFLOW_API_BASE_URL": self.variables["AIRFLOW_API_BASE_URL"]}
        self.compose = compose.load(self.variables)
        self.loopback = compose.Loopback(
            database_url=self.database_url,
            redis=f"127.0.0.1:{self.redis_port}",
            s3=f"127.0.0.1:{self.s3_port}",
            api=f"127.0.0.1:{self.api_port}",
        )
        self.ports = {name: free_port() for name in ("scheduler-health", "triggerer-logs")}

    # -- what the helpers of tests.support.airflow_run use -----------------------------------------
    @property
    def home(self) -> Path:
        return self.base

    @property
    def port(self) -> int:
        return self.api_port

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def conn(self) -> str:
        """The metadata database, for the tests' own read-only queries."""
        return self.database_url

    # -- settings ------------------------------------------------------------------------------------
    @property
    def production_env(self) -> dict[str, str]:
        """docker-compose.yml's ``x-airflow-env`` with loopback addresses: every component has it."""
        return compose.localize(compose.shared_env(self.compose), self.loopback)

    @property
    def artifact_root(self) -> str:
        return self.production_env["AIRFLOW__AVSIM__ARTIFACT_ROOT"]

    @property
    def bucket(self) -> str:
        return self.artifact_root.split("@", 1)[1].split("/", 1)[0]

    @property
    def s3_endpoint(self) -> str:
        return f"http://{self.loopback.s3}"

    def worker_queues(self, name: str) -> tuple[str, ...]:
        return self.workers[name] or compose.worker_queues(self.compose)

    def scratch(self, name: str) -> Path:
        path = self.base / name
        (path / "tmp").mkdir(parents=True, exist_ok=True)
        return path

    def component_env(self, name: str) -> dict[str, str]:
        """The environment of one component: compose's settings (localized), the stack's additions,
        the component's own scratch directory and name."""
        scratch = self.scratch(name)
        mounts = compose.mounts(self.compose, "airflow-scheduler")
        inherited = {
            k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "AWS_", "AVSIM_", "PYTHON"))
        }
        return {
            **inherited,
            **self.production_env,
            **{k: v for k, (v, _why) in TEST_SETTINGS.items()},
            **self.options,
            # Paths: the component's own scratch directory; the image's code and the mounted folders.
            "AIRFLOW_HOME": str(scratch),
            "HOME": str(scratch),
            "TMPDIR": str(scratch / "tmp"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(mounts["/opt/airflow/dags"]),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(mounts["/opt/airflow/plugins"]),
            "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            # Addresses: where a container listens on its own address, a process here listens on a port
            # of its own; and it names itself as its container would be named.
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.api_port),
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": str(self.ports["scheduler-health"]),
            "AIRFLOW__LOGGING__TRIGGERER_LOG_SERVER_PORT": str(self.ports["triggerer-logs"]),
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": "tests.support.hostname.component",
            "AVSIM_COMPONENT_HOSTNAME": name,
            STACK_MARK: str(self.base),
        }

    def init_env(self) -> dict[str, str]:
        """airflow-init's environment: compose's (its service adds the admin and service accounts)."""
        own = compose.localize(compose.service_env(self.compose, "airflow-init"), self.loopback)
        if self.capacity is None:
            capacity = compose.mounts(self.compose, "airflow-init")[own["AVSIM_CAPACITY_FILE"]]
        else:
            capacity = self.scratch("airflow-init") / "capacity.yaml"
            spot, on_demand, cpu = self.capacity
            capacity.write_text(
                "apiVersion: avsim/v1\nkind: Capacity\n"
                f"gpu_spot: {{gpus: {spot}}}\ngpu_on_demand: {{gpus: {on_demand}}}\ncpu: {{slots: {cpu}}}\n"
            )
        return {**self.component_env("airflow-init"), **own, "AVSIM_CAPACITY_FILE": str(capacity)}

    def client_env(self) -> dict[str, str]:
        """What the test process needs to read the artifact store as the components do."""
        env = self.production_env
        return {k: env[k] for k in env if k.startswith(("AIRFLOW_CONN_", "AWS_"))}

    @property
    def service_login(self) -> tuple[str, str]:
        return self.variables["AVSIM_SERVICE_USER"], self.variables["AVSIM_SERVICE_PASSWORD"]

    # -- processes -----------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        assert self.watcher is not None
        log = open(self.base / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
        proc = subprocess.Popen(
            argv, env=dict(env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.watcher.session(proc.pid)
        self.procs[name] = proc
        return proc

    def airflow(
        self, *args: str, component: str = "scheduler", check: bool = True, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        """One ``airflow`` CLI command with a component's environment (as ``docker compose exec``)."""
        done = subprocess.run(
            [str(BIN / "airflow"), *args],
            env=self.component_env(component),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and done.returncode:
            raise RuntimeError(f"airflow {' '.join(args)}: {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done

    def python(self, code: str, *, component: str = "airflow-init", timeout: float = 600) -> str:
        """Run Python code with a component's environment; its output."""
        done = subprocess.run(
            [sys.executable, "-c", code],
            env=self.component_env(component),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode:
            raise RuntimeError(f"python ({component}): {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def wait_for_worker(self, name: str, timeout: float = 240) -> None:
        """Until the worker answers the broker: compose's worker healthcheck, ``celery inspect ping``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"{name} exited with {self.procs[name].returncode}; see {self.base}/logs")
            with contextlib.suppress(RuntimeError):
                self.celery("inspect", "ping", "-d", f"{name}@avsim", "--timeout", "5")
                return
        raise TimeoutError(f"{name} did not answer the broker within {timeout:.0f}s")

    def celery(self, *args: str, timeout: float = 120) -> str:
        """A ``celery`` command against the stack's broker, as compose's worker healthcheck runs one."""
        app = "airflow.providers.celery.executors.celery_executor.app"
        done = subprocess.run(
            [str(BIN / "celery"), "--app", app, *args],
            env=self.component_env("worker"),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode:
            raise RuntimeError(f"celery {' '.join(args)}: {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def start_services(self) -> None:
        self.watcher = Watcher()
        self.watcher.mark(f"{STACK_MARK}={self.base}")
        redis = shutil.which("redis-server")
        if redis is None:
            raise RuntimeError("redis-server not found; install Debian's redis-server package (.ci/run does)")
        data = self.scratch("redis")
        # Like compose's redis: a broker only (no snapshots, no append-only file), on loopback.
        options = ["--bind", "127.0.0.1", "--port", str(self.redis_port), "--dir", str(data)]
        options += ["--save", "", "--appendonly", "no", "--daemonize", "no"]
        self._spawn(
            "redis",
            [redis, *options],
            {"PATH": os.environ.get("PATH", "")},
        )
        s3 = self._spawn(
            "s3",
            [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(self.s3_port)],
            self.component_env("s3"),
        )
        _wait_for("redis-server", lambda: _port_open(self.redis_port), 30, self.procs["redis"])
        _wait_for("the S3 server", lambda: _http_ok(f"{self.s3_endpoint}/"), 60, s3)

    def init(self) -> None:
        """docker/airflow-init.sh, as the compose stack's airflow-init runs it; then the test's users."""
        done = subprocess.run(
            ["bash", str(ROOT / "docker" / "airflow-init.sh")],
            env=self.init_env(),
            capture_output=True,
            text=True,
            timeout=900,
        )
        (self.base / "logs" / "airflow-init.log").write_text(done.stdout + done.stderr)
        if done.returncode:
            raise RuntimeError(
                f"airflow-init failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
            )
        for (user, password), role in ((VIEWER, "Viewer"), (ENGINEER, "User")):
            self.airflow(
                "users", "create", "--username", user, "--password", password, "--role", role,
                "--firstname", user, "--lastname", "test", "--email", f"{user}@example.com",
                component="airflow-init",
            )  # fmt: skip

    def start_component(self, name: str) -> None:
        if name in self.workers:
            argv = [str(BIN / "airflow"), "celery", "worker", "--queues", ",".join(self.worker_queues(name))]
            argv += ["--celery-hostname", f"{name}@avsim", "--skip-serve-logs"]
        else:
            argv = [str(BIN / "airflow"), name]
        self._spawn(name, argv, self.component_env(name))

    def start(self, workers: Iterable[str] | None = None) -> None:
        """Services, init, the components, then ``workers`` (default: all of :attr:`workers`)."""
        self.start_services()
        self.init()
        for name in COMPONENTS:
            self.start_component(name)
        _wait_for(
            "the API server",
            lambda: _http_ok(f"{self.api_url}/api/v2/monitor/health"),
            180,
            self.procs["api-server"],
        )
        started = list(self.workers if workers is None else workers)
        for name in started:
            self.start_component(name)
        for name in started:
            self.wait_for_worker(name)

    def kill_tree(self, name: str) -> list[int]:
        """SIGKILL a component and every process under it at once, as when its machine is lost."""
        import psutil

        proc = self.procs[name]
        try:
            procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            procs = []
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGKILL)
        psutil.wait_procs(procs, timeout=15)
        proc.wait(timeout=30)
        return [p.pid for p in procs]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if self.watcher is not None:
            self.watcher.close()
            self.watcher = None

    # -- artifacts -------------------------------------------------------------------------------------
    def s3(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.s3_endpoint,
            aws_access_key_id=self.variables["AVSIM_S3_ACCESS_KEY"],
            aws_secret_access_key=self.variables["AVSIM_S3_SECRET_KEY"],
            region_name="us-east-1",
        )

    def upload(self, key: str, doc: Any) -> str:
        """Put a JSON document in the bucket; its ObjectStoragePath URI (through ``avsim_s3``)."""
        self.s3().put_object(Bucket=self.bucket, Key=key, Body=json.dumps(doc).encode())
        return f"s3://avsim_s3@{self.bucket}/{key}"


@contextlib.contextmanager
def distributed_stack(
    base: Path, start_workers: Iterable[str] | None = None, **options: Any
) -> Iterator[DistributedStack]:
    """Start the whole stack on a fresh database (``start_workers``: which workers, default all);
    stop every process after."""
    with postgres_cluster() as url:
        stack = DistributedStack(base=base, database_url=url, **options)
        try:
            stack.start(start_workers)
            yield stack
        finally:
            stack.stop()


@contextlib.contextmanager
def client_environment(stack: DistributedStack) -> Iterator[None]:
    """The test process reads the artifact store through the stack's own connection."""
    import pytest

    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if k.startswith("AWS_")]:
            mp.delenv(key)
        for key, value in stack.client_env().items():
            mp.setenv(key, value)
        yield


def main() -> None:
    """Run the stack by hand until Ctrl-C: ``python -m tests.support.distributed [FOLDER]``."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description="docker-compose.yml's topology as processes on loopback")
    parser.add_argument("folder", nargs="?", help="scratch folder (default: a new temporary one)")
    folder = Path(parser.parse_args().folder or tempfile.mkdtemp(prefix="avsim-distributed-"))
    os.environ.setdefault("AIRFLOW_HOME", str(folder / "client"))
    with distributed_stack(folder) as stack:
        print(
            f"UI and REST API: {stack.api_url}  (admin {ADMIN[1]}, viewer {VIEWER[1]}, engineer {ENGINEER[1]})"
        )
        print(
            f"S3: {stack.s3_endpoint} bucket {stack.bucket}; broker: redis://127.0.0.1:{stack.redis_port}/0"
        )
        print(f"component logs: {folder}/logs; Ctrl-C stops everything")
        with contextlib.suppress(KeyboardInterrupt):
            while all(p.poll() is None for p in stack.procs.values()):
                time.sleep(1)
        stopped = [n for n, p in stack.procs.items() if p.poll() is not None]
        if stopped:
            print(f"stopped by itself: {stopped}; stopping the rest")


if __name__ == "__main__":
    main()
