"""A local phase killed as Airflow kills its task (issue 31, item 4), fast: no scheduler.

The real ``LocalPhaseOperator`` runs a real prepared run's ``prepare`` phase in a child Python process
(the task process), whose SIGTERM handler calls the operator's ``on_kill``, as Airflow 3.3.2's task
runner installs it (``task_runner.run``'s ``_on_term``). The test sends that SIGTERM, as Airflow's
supervisor does when its heartbeat learns that a user marked the task failed or success, or cleared
it. The phase is ``sh`` starting a child ``sleep`` and exec'ing the fake simulator: a process group of
two. The boundary: Airflow's task instance is a stand-in (try number, max tries, XComs). The same kill
through the real scheduler and REST API is ``tests/integration/test_user_kill.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil

from avsim.dagbuild import tasks
from avsim.dagbuild.factory import load_plan
from avsim.dagbuild.prepare import prepare_week
from avsim.ledger.store import Ledger
from avsim.manifest.sample import sample_manifest
from avsim.settings import AvsimSettings

ROOT = Path(__file__).resolve().parents[3]
FAKESIM = str(Path(sys.executable).parent / "avsim-fakesim")

TASK_PROCESS = textwrap.dedent(
    """
    import json, signal, sys
    from avsim.operators.phase import LocalPhaseOperator

    class TI:
        task_id, try_number, max_tries, map_index = "standard.prepare", 1, 2, 0
        dag_id, run_id = "avsim_weekly_shard", "w1__shard_0001"
        def xcom_push(self, key, value): pass
        def xcom_pull(self, *a, **k): return None

    run, case = json.load(open(sys.argv[1]))
    op = LocalPhaseOperator(task_id="standard.prepare", phase="prepare", case=case, run=run, retries=2)
    def on_term(signum, frame):  # Airflow's task runner: _on_term -> ti.task.on_kill()
        op.on_kill()
    signal.signal(signal.SIGTERM, on_term)
    try:
        print("RESULT", json.dumps(op.execute({"ti": TI()})), flush=True)
    except BaseException as exc:
        print("RAISED", type(exc).__name__, exc, flush=True)
    """
)


def week(tmp_path: Path, script: str) -> tuple[dict[str, Any], Ledger, Path]:
    """A prepared week whose prepare phase is ``sh -c script``: (its case, its ledger, the task's args file)."""
    settings = AvsimSettings(shard_size=4, artifact_root=f"file://{tmp_path / 'artifacts'}")
    plan = load_plan(ROOT / "dags" / "avsim_graphs.yaml", settings)
    doc = sample_manifest(1, scenario_fail_rate=0.0, canary={"enabled": False})
    prepare = doc["graphs"]["standard"]["phases"]["prepare"]
    prepare["command"], prepare["args"] = ["sh", "-c", script, "sh"], ["prepare"]
    path = tmp_path / "week.json"
    path.write_text(json.dumps(doc))
    prepared = prepare_week(
        source=str(path), plan=plan, settings=settings, dag_id="avsim_weekly", run_id="w1"
    )
    case = tasks.load_shard(prepared["shards"][0]["conf"], plan)["cases_standard"][0]
    args = tmp_path / "task.json"
    args.write_text(json.dumps([prepared["run"], case]))
    from avsim.contracts import RunDescriptor

    return case, Ledger(RunDescriptor.model_validate(prepared["run"]).layout), args


def processes_with(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if marker in cmd and cmd[:1] != ["sh"]:
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except psutil.NoSuchProcess:
                pass
    return found


def wait_for(predicate: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    return predicate()


def start_task(args: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.Popen(
        [sys.executable, "-c", TASK_PROCESS, str(args)], env=env, stdout=subprocess.PIPE, text=True
    )


def test_a_killed_phase_ends_its_process_group_and_records_nothing(tmp_path: Path) -> None:
    """SIGTERM to the task process: the phase's whole group is gone within a second, the task ends
    with PhaseKilled, and the ledger keeps the attempt ``started`` with no outcome (not an
    ``infra_failed``/crash of the build, which would feed its breaker)."""
    case, ledger, args = week(tmp_path, f'sleep 7781 & exec {FAKESIM} "$@" --duration 7782')
    task = start_task(args)
    try:
        both = wait_for(lambda: len(processes_with("7781") + processes_with("7782")) == 2, 60)
        assert both, "the phase's two processes never ran"
        task.send_signal(signal.SIGTERM)
        killed = time.monotonic()
        gone = wait_for(lambda: not processes_with("7781") and not processes_with("7782"), 10)
        took = time.monotonic() - killed
        out, _ = task.communicate(timeout=60)
    finally:
        task.kill()
        for proc in processes_with("7781") + processes_with("7782"):
            proc.kill()
    assert gone and took < 2, took
    assert "RAISED PhaseKilled" in out, out
    assert ledger.outcome(case["case_id"], "prepare") is None
    [attempt] = ledger.attempts(case["case_id"], "prepare")
    assert (attempt.attempt, attempt.state, attempt.outcome) == (1, "started", None), attempt


def test_what_a_phase_left_running_in_its_group_ends_with_it(tmp_path: Path) -> None:
    """A phase that exits while a process it started still runs: that process is ended with it (as a
    pod's processes end with the pod), and the task does not wait for the output pipe it holds."""
    case, ledger, args = week(tmp_path, "sleep 7783 & echo started; exit 1")
    task = start_task(args)
    began = time.monotonic()
    try:
        out, _ = task.communicate(timeout=120)
        took = time.monotonic() - began
        left = processes_with("7783")
    finally:
        task.kill()
        for proc in processes_with("7783"):
            proc.kill()
    assert left == [], left
    assert "RAISED" in out and "crash" in out, out  # exit 1: an infrastructure failure, retried
    assert took < 20, took  # not the 30 s the task would wait for the pipe the child holds
    [attempt] = ledger.attempts(case["case_id"], "prepare")
    assert (attempt.state, attempt.outcome.value if attempt.outcome else None, attempt.detail) == (
        "ended",
        "infra_failed",
        "crash",
    )
