"""However a stack's owner ends, no process of its Airflow home (or its PostgreSQL server) is left.

The demo on a real stack is stopped by a second demo on the same home (which sends it SIGTERM), and
the second one is then killed with -9; a test process holding PostgreSQL and a stack is killed with
-9. Leftovers are looked for the way an engineer would: every process in ``/proc`` whose
environment names the home, or whose command line names the server's folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from avsim.devstack.demo import stops_like_ctrl_c

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
AVSIM = str(Path(sys.executable).with_name("avsim"))
UP_TIMEOUT = 420  # a demo's migrate, start and first parse on 2 loaded cores
WATCHER_LIMIT = 30
TASK_TITLE = re.compile(
    r"airflow worker -- [0-9a-f]{8}-"
)  # the bound: every process gone this long after its owner died


def _pids() -> Iterator[int]:
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def home_pids(home: Path) -> set[int]:
    """Running processes started with ``AIRFLOW_HOME=home``."""
    entry = f"AIRFLOW_HOME={home}".encode()
    return {pid for pid in _pids() if entry in _environ(pid) and _running(pid)}


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (state first); empty when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return stat[stat.rfind(")") + 2 :].split()


def _session(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[3]) if fields else None


def identity(pid: int) -> tuple[int, str] | None:
    """(pid, start time): names one process even after its pid is reused."""
    fields = _stat(pid)
    return (pid, fields[19]) if fields and fields[0] not in "ZX" else None


def api_port(home: Path) -> int:
    return int(json.loads((home / "stack.lock").read_text())["api_url"].rsplit(":", 1)[1])


def stack_leaders(home: Path, *, api: bool = True) -> set[int]:
    """The stack's components: the session leaders started with its ``AIRFLOW_HOME``, and the
    api-server, which retitles itself ("airflow api_server -- host:... port:N") and so hides its
    environment."""
    roots = home_pids(home)
    if api:
        port = f"port:{api_port(home)}"
        roots |= {p for p in _pids() if port in _cmdline(p) and _running(p)}
    return {p for p in roots if _session(p) == p}


def stack_processes(home: Path, *, api: bool = True) -> set[tuple[int, str]]:
    """Every running process of the stack on ``home``: its components, everything in their sessions
    (LocalExecutor workers and task processes retitle themselves too), and whatever else was
    started with its ``AIRFLOW_HOME``."""
    sessions = stack_leaders(home, api=api)
    pids = home_pids(home) | {p for p in _pids() if _session(p) in sessions}
    return {i for p in pids if (i := identity(p)) is not None}


def task_processes(home: Path) -> set[int]:
    """Task processes of the stack (retitled "airflow worker -- <task instance id>", each in a
    process group of its own under a LocalExecutor worker)."""
    return {pid for pid, _ in stack_processes(home) if TASK_TITLE.search(_cmdline(pid))}


def still_running(processes: set[tuple[int, str]]) -> set[tuple[int, str]]:
    return {(pid, start) for pid, start in processes if identity(pid) == (pid, start)}


def server_pids(folder: str) -> set[int]:
    """A PostgreSQL server started with ``folder`` on its command line, and its backends."""
    postmasters = {p for p in _pids() if folder in _cmdline(p) and _running(p)}
    return {p for p in _pids() if _session(p) in postmasters and _running(p)}


def wait_for(what: str, predicate: Callable[[], object], timeout: float, interval: float = 0.2) -> float:
    """Seconds until ``predicate`` held."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s")
        time.sleep(interval)
    return time.monotonic() - started


def lock_is_free(home: Path) -> bool:
    import fcntl

    with open(home / "stack.lock") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


class Demo:
    """``avsim demo --cases 5`` on ``home`` in a session of its own, its output in a file."""

    def __init__(self, home: Path, out: Path) -> None:
        self.out = out
        env = {**os.environ, "COLUMNS": "400"}  # rich wraps at 80 columns when not on a terminal
        env.pop("AIRFLOW_HOME", None)
        self.proc = subprocess.Popen(
            [AVSIM, "demo", "--cases", "5", "--home", str(home), "--shard-size", "5"],
            stdout=out.open("wb"),
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )

    @property
    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_until(self, predicate: Callable[[], object], what: str) -> None:
        def reached() -> object:
            if self.proc.poll() is not None:
                raise AssertionError(f"the demo exited with {self.proc.returncode}:\n{self.output[-3000:]}")
            with contextlib.suppress(OSError, ValueError, KeyError):  # no lock file written yet
                return predicate()
            return False

        wait_for(what, reached, UP_TIMEOUT, interval=1)

    def wait_until_triggered(self) -> None:
        self.wait_until(lambda: "triggered avsim_weekly run" in self.output, "the demo's week triggered")

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)


@pytest.fixture
def demos(tmp_path: Path) -> Iterator[Callable[[Path], Demo]]:
    started: list[Demo] = []

    def start(home: Path) -> Demo:
        started.append(Demo(home, tmp_path / f"demo{len(started)}.out"))
        return started[-1]

    try:
        yield start
    finally:
        for demo in started:
            demo.end()


def test_sighup_and_sigterm_stop_the_demo_as_ctrl_c_does() -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with pytest.raises(KeyboardInterrupt), stops_like_ctrl_c():
            os.kill(os.getpid(), sig)
            time.sleep(5)  # the handler runs at the next bytecode; never reached
    # Outside, the signals are back to what they were.
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    # Under nohup (SIGHUP ignored) a closed terminal does not stop the demo.
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stops_like_ctrl_c():
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.1)
    finally:
        signal.signal(signal.SIGHUP, previous)


PARENT_DIES = textwrap.dedent(
    """
    import time
    from avsim.devstack.demo import stops_like_ctrl_c
    try:
        with stops_like_ctrl_c():
            print("ready", flush=True)
            time.sleep(60)
    except KeyboardInterrupt:
        print("stopped as on Ctrl-C", flush=True)
    """
)


def test_the_demo_stops_when_its_parent_is_killed(tmp_path: Path) -> None:
    """``make demo`` with make killed alone: the demo hangs up as if its terminal had closed."""
    out = tmp_path / "out"
    parent = subprocess.Popen(
        ["sh", "-c", f'"{sys.executable}" -c "$0" > "{out}" & wait', PARENT_DIES], start_new_session=True
    )
    wait_for("the child ready", lambda: out.exists() and "ready" in out.read_text(), 60)
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=10)
    wait_for("the child stopped", lambda: "stopped as on Ctrl-C" in out.read_text(), 10)


# Two demos on a real stack, several minutes on 2 cores: the long tier keeps make test under 35
# minutes; CI still kills a test process holding a stack and PostgreSQL (below).
@pytest.mark.long
def test_a_second_demo_stops_the_first_and_a_killed_demo_leaves_nothing(
    tmp_path: Path, demos: Callable[[Path], Demo]
) -> None:
    home = tmp_path / "home"
    first = demos(home)
    # Take over once the first demo's components run (its week need not have started).
    first.wait_until(lambda: len(stack_leaders(home)) == 4, "the first demo's components up")
    first_leaders = stack_leaders(home)
    assert len(first_leaders) == 4, _cmdlines(
        first_leaders
    )  # scheduler, dag-processor, triggerer, api-server
    first_processes = stack_processes(home)

    # Never two stacks on the home's database: sample the components while the second demo takes over.
    mixed: list[set[int]] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            with contextlib.suppress(OSError, ValueError, KeyError):  # the lock file is rewritten
                leaders = stack_leaders(home)
                if leaders & first_leaders and leaders - first_leaders:
                    mixed.append(leaders)
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    second = demos(home)
    try:
        # The first demo gets SIGTERM from the second and stops as on Ctrl-C: its message, and exit 130
        # (a week already reported waits for Ctrl-C and then exits with the week's outcome).
        code = first.proc.wait(timeout=120)
        assert f"stopped Airflow on {home}" in first.output, first.output[-3000:]
        assert code == (130 if "report:" not in first.output else code) and code in (0, 1, 130)
        assert "is running on" in second.output and "stopping it first" in second.output
        second.wait_until_triggered()
    finally:
        sampling.set()
        sampler.join()
    assert not mixed, f"components of both demos ran at once: {mixed}"
    assert not first_processes & stack_processes(home), "the first demo's processes outlived it"
    second_leaders = stack_leaders(home)
    assert len(second_leaders) == 4, _cmdlines(second_leaders)

    # Let LocalExecutor workers and task processes start, then kill the demo with -9.
    wait_for("a task process under the second stack", lambda: task_processes(home), 180)
    before = stack_processes(home)
    print("\n".join(_cmdlines({pid for pid, _ in before})))
    second.proc.send_signal(signal.SIGKILL)
    second.proc.wait(timeout=10)

    def all_gone() -> bool:
        return not home_pids(home) and not still_running(before)

    gone_after = wait_for("every process of the home gone", all_gone, 60)
    print(f"{len(before)} processes of the stack; the last one gone {gone_after:.1f}s after kill -9")
    assert gone_after <= WATCHER_LIMIT
    wait_for("the home's lock released", lambda: lock_is_free(home), 10)


def _cmdlines(pids: set[int]) -> list[str]:
    return [_cmdline(p) for p in sorted(pids)]


TEST_PROCESS = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {root!r})
    from pathlib import Path
    import tests.support.postgres as pg
    from tests.support.postgres import postgres_cluster
    from avsim.devstack.stack import LocalStack

    with postgres_cluster() as url:
        stack = LocalStack(home=Path({home!r}), dags_folder=Path({root!r}) / "dags", sql_alchemy_conn=url)
        stack.start(["scheduler", "triggerer"])
        print(pg._server.top, flush=True)
        time.sleep(600)
    """
)


def test_a_killed_test_process_leaves_no_airflow_or_postgres(tmp_path: Path) -> None:
    home = tmp_path / "airflow"
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-c", TEST_PROCESS.format(root=str(ROOT), home=str(home))],
        stdout=out.open("wb"),
        stderr=subprocess.STDOUT,
        env={k: v for k, v in os.environ.items() if k != "AIRFLOW_HOME"},
    )
    try:
        wait_for(
            "the stack on PostgreSQL up", lambda: out.read_text().strip() or proc.poll() is not None, 600
        )
        assert proc.poll() is None, out.read_text()[-3000:]
        server_folder = out.read_text().strip().splitlines()[-1]
        wait_for("scheduler and triggerer up", lambda: len(stack_leaders(home, api=False)) == 2, 120)
        # The scheduler's LocalExecutor workers and log server, the triggerer's trigger runner.
        wait_for("the components' children up", lambda: len(stack_processes(home, api=False)) > 4, 120)
        before = stack_processes(home, api=False)
        before |= {i for p in server_pids(server_folder) if (i := identity(p))}
    finally:
        proc.send_signal(signal.SIGKILL)  # as pytest-timeout's thread method or a CI runner would end it
        proc.wait(timeout=10)

    def all_gone() -> bool:
        return not home_pids(home) and not server_pids(server_folder) and not still_running(before)

    gone_after = wait_for("the stack and the server gone", all_gone, 60)
    print(f"{len(before)} processes; the stack and PostgreSQL gone {gone_after:.1f}s after kill -9")
    assert gone_after <= WATCHER_LIMIT
    wait_for("the server's folder removed", lambda: not Path(server_folder).exists(), 10)
