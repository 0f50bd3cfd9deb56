"""What the tests on the distributed stack check, shared by the short week and the long one.

* :func:`kill_worker_holding_phases`: ``kill -9`` of a Celery worker's whole process tree (its
  machine is lost) at a moment it runs phases; nothing it started may survive.
* :func:`check_retried_elsewhere`: every try it held failed there and the task ran again on the
  other worker.
* :func:`check_routing`: every task instance of the week ran on a worker that takes its queue, and
  its queue is its pool's class (GPU phases on the GPU queue, CPU phases on the CPU queue, the rest
  on the default queue).
* :func:`check_task_logs`: each ended try's log, read through the REST API as the viewer, comes
  from the S3 store (workers serve no logs), including the killed worker's.
* :func:`check_pages_for_the_viewer`: the avsim page, a phase's extra link and case tab open for the viewer
  and are refused without a login.
* :func:`service_calls`: the REST calls Airflow's audit log saw from avsim's service account.
* :func:`week_stack`: the stack both weeks run on, its avsim DAGs parsed and unpaused.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from tests.support.airflow_run import query, token
from tests.support.distributed import ADMIN, VIEWER, DistributedStack, client_environment, distributed_stack

SHARD_DAG = "avsim_weekly_shard"
GPU_POOLS = ("avsim_gpu_spot", "avsim_gpu_on_demand")


@dataclass(frozen=True)
class Try:
    """One try of one task instance."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int

    @property
    def params(self) -> dict[str, Any]:
        """Bind parameters of a query on this try's task instance: :d, :r, :t, :m and :n (the try)."""
        return {
            "d": self.dag_id,
            "r": self.run_id,
            "t": self.task_id,
            "m": self.map_index,
            "n": self.try_number,
        }


# -- REST --------------------------------------------------------------------------------------------
def request(
    stack: DistributedStack,
    method: str,
    path: str,
    *,
    login: tuple[str, str] | None = None,
    body: Any = None,
    accept: str = "application/json",
) -> tuple[int, bytes, dict[str, str]]:
    """(status, body, headers) of one call, as ``login`` or with no credentials at all; never raises
    on an HTTP error status, and follows no redirect (a login page is an answer too)."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    headers = {"Accept": accept, "Content-Type": "application/json"}
    if login is not None:
        headers["Authorization"] = f"Bearer {token(stack, login)}"  # type: ignore[arg-type]
    req = urllib.request.Request(
        f"{stack.api_url}{path}",
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers=headers,
    )
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(req, timeout=120) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers or {})


def call(stack: DistributedStack, method: str, path: str, login: tuple[str, str], body: Any = None) -> Any:
    status, raw, _ = request(stack, method, path, login=login, body=body)
    assert status < 400, f"{method} {path} as {login[0]}: HTTP {status} {raw[:300]!r}"
    return json.loads(raw or b"null")


# -- the lost worker ---------------------------------------------------------------------------------
def running_tries(stack: DistributedStack, hostname: str, run_prefix: str) -> list[Try]:
    rows = query(
        stack,
        "SELECT dag_id, run_id, task_id, map_index, try_number FROM task_instance WHERE state = 'running' "
        "AND hostname = :h AND dag_id = :d AND position(:p in run_id) = 1 AND map_index >= 0",
        h=hostname,
        d=SHARD_DAG,
        p=run_prefix,
    )
    return [Try(*row) for row in rows]


def ended_tries(stack: DistributedStack, hostname: str, run_prefix: str) -> list[Try]:
    """The phase tries of the week ``hostname`` ran to their end, past tries included."""
    columns = "dag_id, run_id, task_id, map_index, try_number"
    where = (
        "state IN ('success', 'failed', 'up_for_retry') AND hostname = :h AND dag_id = :d "
        "AND position(:p in run_id) = 1 AND map_index >= 0"
    )
    rows = query(
        stack,
        f"SELECT {columns} FROM task_instance WHERE {where} UNION "
        f"SELECT {columns} FROM task_instance_history WHERE {where}",
        h=hostname,
        d=SHARD_DAG,
        p=run_prefix,
    )
    return [Try(*row) for row in rows]


def log_in_s3(stack: DistributedStack, t: Try) -> bool:
    """Whether the try's task log has reached the remote log folder (a worker uploads it when the try
    has ended)."""
    bucket, _, root = stack.production_env["AIRFLOW__LOGGING__REMOTE_BASE_LOG_FOLDER"][5:].partition("/")
    prefix = f"{root}/dag_id={t.dag_id}/run_id={t.run_id}/task_id={t.task_id}/map_index={t.map_index}/"
    listed = stack.s3().list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return any(o["Key"].rsplit("/", 1)[-1].startswith(f"attempt={t.try_number}.") for o in listed)


def week_state(stack: DistributedStack, run_prefix: str) -> str:
    """What a failed wait reports: the week's runs and their task instances, counted by task, state and
    host (a wait that times out then says whether the week was stuck, ended or ran elsewhere)."""
    runs = query(
        stack,
        "SELECT dag_id, run_id, state FROM dag_run WHERE position(:p in run_id) = 1 ORDER BY id",
        p=run_prefix,
    )
    tis = query(
        stack,
        "SELECT task_id, coalesce(state, 'none'), coalesce(hostname, ''), count(*) FROM task_instance "
        "WHERE position(:p in run_id) = 1 GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
        p=run_prefix,
    )
    return "; ".join(
        [*(f"{d}/{r}: {s}" for d, r, s in runs), *(f"{t} {s}@{h or '-'} x{n}" for t, s, h, n in tis)]
    )


@dataclass(frozen=True)
class LostWorker:
    """What a killed worker took with it."""

    #: the tries it was running: they fail when their heartbeat stops, and their logs are never uploaded
    tries: list[Try]
    #: tries it had ended but whose logs it had not uploaded yet: those logs are lost too
    unlogged: list[Try]


def processes_of(name: str) -> list[psutil.Process]:
    """Every process with the component's name in its environment: its phases (Airflow's own processes
    retitle themselves with setproctitle, which overwrites what /proc shows of their environment)."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if (
                proc.environ().get("AVSIM_COMPONENT_HOSTNAME") == name
                and proc.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(proc)
    return found


def kill_worker_holding_phases(
    stack: DistributedStack, name: str, run_prefix: str, *, at_least: int = 2, timeout: float = 600
) -> LostWorker:
    """Wait until worker ``name`` has ended a phase try of the week and uploaded its log (a log that
    must outlive it), and runs ``at_least`` others, with their phase processes started, then SIGKILL
    its whole process tree at once. Returns the tries it held (those it had just begun included), and
    the ended tries whose logs it took with it.

    The ``at_least`` tries waited for have their simulator processes (a try claims its ledger attempt
    before it launches), so each has an attempt the repair must find lost; a try the worker began in
    the last moment may have none yet."""
    deadline = time.monotonic() + timeout
    held: list[Try] = []
    while time.monotonic() < deadline:
        held = running_tries(stack, name, run_prefix)
        phases = [p for p in processes_of(name) if "avsim-fakesim" in " ".join(_cmdline(p))]
        if (
            len(held) >= at_least
            and len(phases) >= len(held)
            and any(log_in_s3(stack, t) for t in ended_tries(stack, name, run_prefix))
        ):
            break
        time.sleep(0.2)
    else:
        raise TimeoutError(
            f"{name} never ran {at_least} phases at once (last: {held}, phase processes {len(phases)}); "
            f"the week then: {week_state(stack, run_prefix)}"
        )
    tree = stack.kill_tree(name)
    # A try the worker began after the last look (its state set running, its hostname this worker) is
    # lost too: after the kill nothing of this worker changes a task instance, so look once more.
    time.sleep(1)
    held = list(dict.fromkeys([*held, *running_tries(stack, name, run_prefix)]))
    unlogged = [t for t in ended_tries(stack, name, run_prefix) if not log_in_s3(stack, t)]
    # Nothing it ran survives: no process of its tree, no phase it started (phases run in sessions of
    # their own; their environments name the worker, unlike Airflow's retitled processes').
    survivors = [p for p in psutil.process_iter() if p.pid in tree and _alive(p)] + processes_of(name)
    assert not survivors, f"processes of the lost worker still run: {[_cmdline(p) for p in survivors]}"
    return LostWorker(held, unlogged)


def _alive(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return proc.status() != psutil.STATUS_ZOMBIE
    return False


def _cmdline(proc: psutil.Process) -> list[str]:
    with contextlib.suppress(psutil.Error):
        return list(proc.cmdline())
    return []


@contextlib.contextmanager
def week_stack(base: Path, capacity: tuple[int, int, int], max_gpu_slots: int) -> Iterator[DistributedStack]:
    """The distributed stack with pools of ``capacity`` (spot GPUs, on-demand GPUs, CPU slots), the
    tracker allowed to raise the spot pool to ``max_gpu_slots``, and the weekly DAGs parsed and
    unpaused by an admin (compose creates DAGs paused, as in production)."""
    from avsim.devstack.demo import wait_for_dag

    options = {
        "AIRFLOW__AVSIM__DEADLINE_MAX_GPU_SLOTS": str(max_gpu_slots),
        # compose's shard_size of 250 stays the week's (one shard run of the test's cases): admission
        # with a target of 3 x 250 cuts shard runs of 250, as the checks expect.
        "AIRFLOW__AVSIM__CASES_IN_FLIGHT": "750",
    }
    with distributed_stack(base, capacity=capacity, options=options) as stack, client_environment(stack):
        for dag_id in ("avsim_weekly", SHARD_DAG):
            wait_for_dag(stack, dag_id)  # type: ignore[arg-type]
            call(stack, "PATCH", f"/api/v2/dags/{dag_id}", ADMIN, {"is_paused": False})
        yield stack


def attempt_keys(stack: DistributedStack, tries: Iterable[Try]) -> frozenset[tuple[str, str, int]]:
    """(case id, task id, try number) of each try, as its ledger attempts name it: a phase task's
    rendered map index is its case's id."""
    keys = set()
    for t in tries:
        [(case_id,)] = query(
            stack,
            "SELECT rendered_map_index FROM task_instance WHERE dag_id = :d AND run_id = :r "
            "AND task_id = :t AND map_index = :m",
            **t.params,
        )
        keys.add((str(case_id), t.task_id, t.try_number))
    return frozenset(keys)


def check_retried_elsewhere(stack: DistributedStack, lost: Iterable[Try], worker: str, other: str) -> None:
    """Each lost try failed on the lost worker (its heartbeat stopped) and the task ran again, to its
    end, on the other worker."""
    for t in lost:
        [(state, hostname)] = query(
            stack,
            "SELECT state, hostname FROM task_instance_history WHERE dag_id = :d AND run_id = :r "
            "AND task_id = :t AND map_index = :m AND try_number = :n",
            **t.params,
        )
        assert (state, hostname) == ("failed", worker), (t, state, hostname)
        [(now_try, now_state, now_host)] = query(
            stack,
            "SELECT try_number, state, hostname FROM task_instance WHERE dag_id = :d AND run_id = :r "
            "AND task_id = :t AND map_index = :m",
            **t.params,
        )
        assert now_try > t.try_number and now_state in ("success", "failed", "skipped"), (
            t,
            now_try,
            now_state,
        )
        later = query(
            stack,
            "SELECT hostname FROM task_instance_history WHERE dag_id = :d AND run_id = :r AND task_id = :t "
            "AND map_index = :m AND try_number > :n",
            **t.params,
        )
        hosts = {h for (h,) in later} | ({now_host} if now_host else set())
        assert hosts == {other}, (t, hosts)


# -- queues ------------------------------------------------------------------------------------------
def all_tries(stack: DistributedStack, run_prefix: str) -> list[tuple[Any, ...]]:
    """(dag_id, run_id, task_id, map_index, try_number, state, hostname, queue, pool) of every try of the
    week (its weekly run and shard runs), past tries included."""
    columns = "dag_id, run_id, task_id, map_index, try_number, state, hostname, queue, pool"
    where = "position(:p in run_id) = 1"
    return query(
        stack,
        f"SELECT {columns} FROM task_instance WHERE {where} UNION ALL "
        f"SELECT {columns} FROM task_instance_history WHERE {where}",
        p=run_prefix,
    )


def check_routing(stack: DistributedStack, run_prefix: str) -> dict[str, int]:
    """Every try ran on a worker that takes its queue, and its queue is its pool's class. Returns how
    many tries ran on each (worker, queue)."""
    env = stack.production_env
    gpu, cpu = env["AIRFLOW__AVSIM__GPU_QUEUE"], env["AIRFLOW__AVSIM__CPU_QUEUE"]
    takes = {name: set(stack.worker_queues(name)) for name in ("gpu-worker", "worker")}
    counts: dict[str, int] = {}
    for dag_id, _run, task_id, _m, _n, _state, hostname, queue, pool in all_tries(stack, run_prefix):
        wanted = gpu if pool in GPU_POOLS else cpu if pool == "avsim_cpu" else "default"
        assert queue == wanted, (dag_id, task_id, pool, queue)
        if hostname:  # it ran (a try that never started has none)
            assert queue in takes[hostname], (task_id, queue, hostname)
            key = f"{hostname}/{queue}"
            counts[key] = counts.get(key, 0) + 1
    return counts


# -- logs --------------------------------------------------------------------------------------------
def read_log(stack: DistributedStack, t: Try, login: tuple[str, str] = VIEWER) -> str:
    path = (
        f"/api/v2/dags/{t.dag_id}/dagRuns/{urllib.parse.quote(t.run_id, safe='')}/taskInstances/"
        f"{urllib.parse.quote(t.task_id, safe='')}/logs/{t.try_number}?map_index={t.map_index}&full_content=true"
    )
    status, raw, _ = request(stack, "GET", path, login=login)
    assert status == 200, (t, status, raw[:300])
    return raw.decode()


def save_task_logs(stack: DistributedStack, run_prefix: str, folder: Path) -> int:
    """Every ended phase try's log of the week, read from S3 through the REST API into ``folder``
    (one file a try), so a failed test leaves them behind when the S3 server stops. Returns how many."""
    folder.mkdir(parents=True, exist_ok=True)
    saved = 0
    for dag_id, run_id, task_id, m, n, state, hostname, _q, _pool in all_tries(stack, run_prefix):
        if dag_id != SHARD_DAG or m < 0 or not hostname or state not in ("success", "failed", "up_for_retry"):
            continue
        with contextlib.suppress(AssertionError):
            text = read_log(stack, Try(dag_id, run_id, task_id, m, n), login=ADMIN)
            (folder / f"{run_id}.{task_id}.{m}.{n}.{state}.log").write_text(text)
            saved += 1
    return saved


def check_task_logs(
    stack: DistributedStack, run_prefix: str, *, skip: Iterable[Try] = (), written_by: str = ""
) -> dict[str, int]:
    """Every ended phase try's log (the killed tries excepted: their worker died before it could upload
    them) read through the REST API as the viewer: from S3, and holding what the phase operator wrote.
    Returns how many were read, and how many of them ``written_by`` wrote."""
    skipped = set(skip)
    root = stack.production_env["AIRFLOW__LOGGING__REMOTE_BASE_LOG_FOLDER"]
    read = by_worker = 0
    for dag_id, run_id, task_id, m, n, state, hostname, _q, _pool in all_tries(stack, run_prefix):
        t = Try(dag_id, run_id, task_id, m, n)
        if dag_id != SHARD_DAG or m < 0 or t in skipped or state not in ("success", "failed", "up_for_retry"):
            continue
        if not hostname:
            continue
        text = read_log(stack, t)
        assert root in text, f"{t}: the log does not come from {root}: {text[:500]}"
        assert "attempt" in text, f"{t}: not the phase's log: {text[:500]}"
        read += 1
        by_worker += hostname == written_by
    return {"read": read, "by_worker": by_worker}


# -- pages -------------------------------------------------------------------------------------------
def check_pages_for_the_viewer(stack: DistributedStack, week_run_id: str) -> list[str]:
    """The avsim page of the week, a passed phase's extra link (its artifacts) and its "avsim case" tab:
    open for the viewer, refused without a login. Returns the URLs."""
    [row] = query(
        stack,
        "SELECT dag_id, run_id, task_id, map_index, try_number FROM task_instance WHERE dag_id = :d "
        "AND position(:p in run_id) = 1 AND task_id LIKE '%.simulate' AND state = 'success' "
        "ORDER BY run_id, map_index LIMIT 1",
        d=SHARD_DAG,
        p=week_run_id,
    )
    phase = Try(*row)
    page = f"/avsim/dags/avsim_weekly/runs/{urllib.parse.quote(week_run_id, safe='')}"
    status, body, _ = request(stack, "GET", page, login=VIEWER, accept="text/html")
    assert status == 200 and b"<html" in body.lower(), (status, body[:300])
    status, _, _ = request(stack, "GET", page, accept="text/html")
    assert status in (401, 403), f"{page} without a login: HTTP {status}"
    links_path = (
        f"/api/v2/dags/{phase.dag_id}/dagRuns/{urllib.parse.quote(phase.run_id, safe='')}/taskInstances/"
        f"{urllib.parse.quote(phase.task_id, safe='')}/links?map_index={phase.map_index}"
    )
    links = call(stack, "GET", links_path, VIEWER)["extra_links"]
    assert list(links) == ["avsim artifacts"] and links["avsim artifacts"], links
    # The task instance's "avsim case" tab (the plugin's view of it) redirects to its case page.
    tab = (
        f"/avsim/dags/{phase.dag_id}/runs/{urllib.parse.quote(phase.run_id, safe='')}/tasks/"
        f"{urllib.parse.quote(phase.task_id, safe='')}/mapped/{phase.map_index}"
    )
    status, body, headers = request(stack, "GET", tab, login=VIEWER, accept="text/html")
    location = {k.lower(): v for k, v in headers.items()}.get("location", "")
    assert status == 307 and "/avsim/runs/" in location and "/cases/" in location, (tab, status, body[:300])
    status, _, _ = request(stack, "GET", tab, accept="text/html")
    assert status in (401, 403), f"{tab} without a login: HTTP {status}"
    urls = [links["avsim artifacts"], location]
    for url in urls:
        path = urllib.parse.urlparse(url).path
        status, body, _ = request(stack, "GET", path, login=VIEWER, accept="text/html")
        assert status == 200, (url, status, body[:300])
        status, _, _ = request(stack, "GET", path, accept="text/html")
        assert status in (401, 403), f"{url} without a login: HTTP {status}"
    status, _, _ = request(stack, "GET", links_path)
    assert status in (401, 403), f"the links without a login: HTTP {status}"
    return urls


# -- the service account -----------------------------------------------------------------------------
def service_calls(stack: DistributedStack) -> dict[str, int]:
    """Airflow's audit log of the REST calls avsim's service account made: event -> count."""
    user = stack.service_login[0]
    return dict(query(stack, "SELECT event, count(*) FROM log WHERE owner = :u GROUP BY event", u=user))
