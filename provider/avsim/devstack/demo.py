"""``avsim demo``: a whole weekly run on this machine, on the real Airflow components.

Prepares its own Airflow home (SQLite, LocalExecutor), writes a sample manifest, starts the scheduler,
dag-processor, triggerer and api-server, triggers the weekly run, shows a progress bar of cases and
phases, and prints where the report and the UI are. Ctrl-C, SIGTERM and SIGHUP stop the stack in order;
if the demo dies without stopping it, the stack's watcher ends it (:mod:`avsim.devstack.stack`). A
stack still running on the home is stopped before this one starts.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from avsim.artifacts import shard_dag_id
from avsim.devstack import procwatch
from avsim.devstack.stack import LocalStack, StackRunning, owner_still_holds
from avsim.errors import AvsimError
from avsim.plan.model import ON_DEMAND_SUFFIX

PARENT_DAG = "avsim_weekly"
# Signals that end the demo as Ctrl-C does: a closed terminal, `timeout`, a supervisor, CI.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
TAKE_OVER_SECONDS = 90
SHARD_DAG = shard_dag_id(PARENT_DAG)
FINISHED = ("success", "failed", "upstream_failed", "skipped", "removed")


def checkout_folder(name: str) -> Path:
    """``dags/`` or ``plugins/`` of the checkout this package is installed from (editable install)."""
    import avsim

    folder = Path(avsim.__file__).resolve().parents[2] / name
    if not folder.is_dir():
        raise AvsimError(f"no {name}/ folder next to {folder.parent}; run the demo from a checkout of avsim")
    return folder


@dataclass
class Progress:
    parent_state: str | None
    cases_done: int
    phases_done: int
    failed: int
    shards_done: int
    shards_total: int


def demo_pools(gpus: int, cpus: int) -> dict[str, tuple[int, str]]:
    from avsim.plan.build import pools_for
    from avsim.settings import AvsimSettings

    slots = {"gpu-spot": gpus, "gpu-on-demand": max(1, gpus // 4), "cpu": cpus}
    return {p.name: (slots[p.node_class], p.description) for p in pools_for(AvsimSettings())}


class RunWatcher:
    """Reads a weekly run's progress from the metadata database (read-only queries)."""

    def __init__(self, conn: str, run_id: str, last_phases: dict[str, str]) -> None:
        import sqlalchemy

        self.engine = sqlalchemy.create_engine(conn)
        self.run_id = run_id
        self.last_phases = last_phases  # family group id -> its last phase's task id

    def poll(self) -> Progress:
        from sqlalchemy import text

        with self.engine.connect() as c:
            parent = c.execute(
                text("SELECT state FROM dag_run WHERE dag_id = :d AND run_id = :r"),
                {"d": PARENT_DAG, "r": self.run_id},
            ).scalar()
            rows = c.execute(
                text(
                    "SELECT task_id, state, count(*) FROM task_instance WHERE dag_id = :d AND run_id LIKE :p "
                    "AND map_index >= 0 GROUP BY task_id, state"
                ),
                {"d": SHARD_DAG, "p": f"{self.run_id}__%"},
            ).all()
            shards = c.execute(
                text(
                    "SELECT state, count(*) FROM dag_run WHERE dag_id = :d AND run_id LIKE :p GROUP BY state"
                ),
                {"d": SHARD_DAG, "p": f"{self.run_id}__%"},
            ).all()
        # A GPU phase that moved to on-demand nodes ends skipped on its spot task and done on its twin.
        phases_done = sum(
            n
            for task, state, n in rows
            if (
                state in ("success", "failed")
                if task.endswith(ON_DEMAND_SUFFIX)
                else state in FINISHED and state != "skipped"
            )
        )
        failed = sum(n for _, state, n in rows if state == "failed")
        last = set(self.last_phases.values())
        cases_done = sum(n for task, state, n in rows if task in last and state in FINISHED)
        shards_done = sum(n for state, n in shards if state in ("success", "failed"))
        return Progress(parent, cases_done, phases_done, failed, shards_done, sum(n for _, n in shards))


def demo_env(shard_size: int, max_active_shards: int) -> dict[str, str]:
    """The ``[avsim]`` settings of the demo's stack."""
    return {
        "AIRFLOW__AVSIM__SHARD_SIZE": str(shard_size),
        "AIRFLOW__AVSIM__MAX_ACTIVE_SHARDS": str(max_active_shards),
        "AIRFLOW__AVSIM__SHARD_POLL_SECONDS": "2",
    }


def demo_parallelism(pools: dict[str, tuple[int, str]]) -> int:
    """``[core] parallelism`` for the demo's pools: every slot of every pool. With fewer, a full CPU pool
    fills the executor too and the GPUs idle beside it (docs/performance.md, "The demo's GPUs")."""
    return sum(slots for slots, _ in pools.values())


def demo_stack(
    home: Path,
    shard_size: int,
    max_active_shards: int,
    pools: dict[str, tuple[int, str]],
    extra_env: dict[str, str] | None = None,
) -> LocalStack:
    """The demo's stack on ``home`` (SQLite, LocalExecutor with :func:`demo_parallelism` of ``pools``);
    ``extra_env`` adds settings."""
    return LocalStack(
        home=home,
        dags_folder=checkout_folder("dags"),
        plugins_folder=checkout_folder("plugins"),
        parallelism=demo_parallelism(pools),
        extra_env={**demo_env(shard_size, max_active_shards), **(extra_env or {})},
    )


def run_demo(
    *,
    cases: int,
    home: Path,
    shard_size: int,
    max_active_shards: int,
    crash_rate: float,
    exit_when_done: bool,
    gpus: int = 8,
    cpus: int = 16,
    timeout_seconds: float = 3 * 3600,
) -> int:
    from rich.console import Console

    from avsim.settings import AvsimSettings

    console = Console()
    home = home.resolve()
    pools = demo_pools(gpus, cpus)
    stack = demo_stack(home, shard_size, max_active_shards, pools)
    with stops_like_ctrl_c():
        try:
            claim_home(stack, console.print)
            return _run_week(
                console,
                stack,
                settings=AvsimSettings(shard_size=shard_size, max_active_shards=max_active_shards),
                cases=cases,
                crash_rate=crash_rate,
                exit_when_done=exit_when_done,
                pools=pools,
                timeout_seconds=timeout_seconds,
            )
        finally:
            ignore_stop_signals()
            started = bool(stack.procs)
            stack.stop()
            if started:
                with contextlib.suppress(OSError):  # the terminal may be gone (SIGHUP)
                    console.print(f"stopped Airflow on {home}")


def _run_week(
    console: Any,
    stack: LocalStack,
    *,
    settings: Any,
    cases: int,
    crash_rate: float,
    exit_when_done: bool,
    pools: dict[str, tuple[int, str]],
    timeout_seconds: float,
) -> int:
    """On a claimed home: migrate, start the stack, trigger the week and show its progress to the end."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bar

    from avsim.dagbuild.factory import load_plan
    from avsim.manifest.sample import sample_manifest

    home = stack.home
    plan = load_plan(stack.dags_folder / "avsim_graphs.yaml", settings)
    manifest_path = home / "manifests" / "demo.json"
    manifest_path.parent.mkdir(parents=True, exist_ok=True)
    # The week's time is compressed (a 30-minute simulate runs 1.8 s), its retry delays with it.
    doc = sample_manifest(cases, crash_rate=crash_rate, compress_retry_delays=True)
    manifest_path.write_text(json.dumps(doc))
    total_phases = sum(len(plan.family(c["graph"]).phases) for c in doc["cases"])
    with console.status("preparing the Airflow home and its database"):
        stack.migrate()
        stack.set_pools(pools)
    with console.status("starting scheduler, dag-processor, triggerer and api-server"):
        stack.start()
        wait_for_dag(stack, PARENT_DAG)
    run_id = f"demo__{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}"
    stack.airflow(
        "dags",
        "trigger",
        PARENT_DAG,
        "--run-id",
        run_id,
        "--conf",
        json.dumps({"manifest": str(manifest_path)}),
    )
    console.print(
        f"triggered [bold]{PARENT_DAG}[/] run [bold]{run_id}[/]: {cases} cases, {total_phases} phases"
    )
    console.print(f"Airflow UI: {stack.api_url}/dags/{PARENT_DAG}/runs/{run_id}")
    watcher = RunWatcher(
        stack.conn, run_id, {f.group_id: f"{f.group_id}.{f.phases[-1].name}" for f in plan.families}
    )
    deadline = time.monotonic() + timeout_seconds
    with Bar(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        t_cases = bar.add_task("cases ", total=cases)
        t_phases = bar.add_task("phases", total=total_phases)
        t_shards = bar.add_task("shards", total=None)
        while True:
            p = watcher.poll()
            bar.update(t_cases, completed=p.cases_done)
            bar.update(t_phases, completed=p.phases_done, description=f"phases ({p.failed} failed)")
            bar.update(t_shards, completed=p.shards_done, total=p.shards_total or None)
            if p.parent_state in ("success", "failed"):
                break
            if time.monotonic() > deadline:
                raise AvsimError(
                    f"the demo run did not finish within {timeout_seconds:.0f}s; see {home}/logs"
                )
            time.sleep(1)
    return finish(console, stack, run_id, p, exit_when_done)


@contextlib.contextmanager
def stops_like_ctrl_c() -> Iterator[None]:
    """Within: SIGTERM and SIGHUP raise KeyboardInterrupt, as Ctrl-C does (main thread only).

    A signal ignored on entry stays ignored (``nohup avsim demo`` keeps running without a terminal).
    The demo also gets SIGHUP when its parent dies (``make`` killed alone, say), as when its
    terminal closes (Linux).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(sig, interrupt)
    parent = os.getppid()
    set_parent_death_signal(signal.SIGHUP)
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGHUP)
    try:
        yield
    finally:
        set_parent_death_signal(0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def set_parent_death_signal(sig: int) -> None:
    """The signal Linux sends this process when its parent dies (PR_SET_PDEATHSIG; 0: none)."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, int(sig))


def ignore_stop_signals() -> None:
    """While the stack stops: a second SIGTERM or SIGHUP must not cut the orderly stop short."""
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


def claim_home(stack: LocalStack, say: Callable[[str], object], timeout: float = TAKE_OVER_SECONDS) -> None:
    """Claim the demo's home; a stack still running there is stopped first, never run alongside.

    The earlier demo, if alive, gets SIGTERM and stops its stack in order; a dead one's watcher is
    finishing and is waited for. Processes of the home left by anything else (found through their
    ``AIRFLOW_HOME``) are ended once the home is ours.
    """
    deadline = time.monotonic() + timeout
    told = False
    while True:
        try:
            stack.claim()
            break
        except StackRunning as busy:
            if not told:
                told = True
                say(f"{busy}; stopping it first ({busy.holder.get('api_url', 'no address')})")
                if owner_still_holds(busy.holder):
                    os.kill(int(busy.holder["owner"]), signal.SIGTERM)
            if time.monotonic() > deadline:
                raise AvsimError(f"{busy}, and it did not stop within {timeout:.0f}s") from None
            time.sleep(0.5)
    spare = procwatch.ancestors(os.getpid())  # a shell that exported this AIRFLOW_HOME is not a stray
    strays = stray_targets(stack.home, spare)
    if left := strays.remaining(spare):
        say(f"{len(left)} processes of an earlier Airflow stack still run on {stack.home}; stopping them")
        procwatch.end(strays, exclude=spare)


def wait_for_dag(stack: LocalStack, dag_id: str, timeout: float = 180) -> None:
    import sqlalchemy
    from sqlalchemy import text

    engine = sqlalchemy.create_engine(stack.conn)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with engine.connect() as c:
                if c.execute(text("SELECT 1 FROM serialized_dag WHERE dag_id = :d"), {"d": dag_id}).first():
                    errors = c.execute(text("SELECT filename, stacktrace FROM import_error")).all()
                    if errors:
                        raise AvsimError(f"DAG import errors: {errors}")
                    return
        except sqlalchemy.exc.OperationalError:
            pass
        time.sleep(1)
    raise AvsimError(
        f"{dag_id} was not parsed within {timeout:.0f}s; see {stack.home}/logs/dag-processor.log"
    )


def finish(console: Any, stack: LocalStack, run_id: str, p: Progress, exit_when_done: bool) -> int:
    from avsim.artifacts import RunLayout, run_key_for
    from avsim.storage import read_json

    layout = RunLayout(f"file://{stack.home / 'artifacts'}", run_key_for(PARENT_DAG, run_id))
    report_json = f"{layout.report_dir}/report.json"
    try:
        report = read_json(report_json)
        totals = report.get("totals", {})
        console.print(f"weekly run {p.parent_state}: {json.dumps(totals)}")
    except (FileNotFoundError, OSError, ValueError):
        console.print(f"[red]weekly run {p.parent_state}, but no report at {report_json}[/]")
        return 1
    console.print(f"report: {layout.report_dir.removeprefix('file://')}/report.html")
    console.print(f"Airflow UI: {stack.api_url}/dags/{PARENT_DAG}/runs/{run_id}")
    if not exit_when_done:
        console.print("Airflow keeps running for you to look around; press Ctrl-C to stop it.")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0 if p.parent_state == "success" else 1


def stray_targets(home: Path, spare: set[int]) -> procwatch.Targets:
    """Processes of ``home`` that no watcher answers for: started with its ``AIRFLOW_HOME`` (not in
    ``spare``), with the sessions they lead (a component's workers retitle themselves and their
    environment can no longer be read)."""
    mark = f"AIRFLOW_HOME={home}"
    targets = procwatch.Targets(marks={mark})
    for pid in procwatch.marked_processes([mark], exclude=spare):
        fields = procwatch.stat_fields(pid)
        if fields is not None and fields[3] == pid:
            targets.add(f"session {pid} SIGTERM")
    return targets
