"""A week that went wrong, repaired from the weekly run by one clear, on the real scheduler.

Each journey breaks something as a new user would on the demo stack (the fake simulator's
``crash_until:URI``: a phase crashes on every attempt until a marker file exists, a broken node pool
that someone then fixes; ``preempt_before:N``: attempts below N are preempted), lets the week end
failed, fixes the cause, makes one REST clear of the weekly run's failed task instances (only
failed, with downstream, as the Airflow UI's *Clear → Only failed* does) and checks the week then
ends ``success`` with every case passed, and the run-level summary and the report agreeing.

Issue 31: a week stopped by the canary gate (item 1, with the summary of the stopped week running
and then refreshed: items 3 and 11; in make test), a case whose on-demand twin an earlier round
skipped (item 2) and a case whose input was missing (the repair matrix's bad-input row), both in the
long tier. The real stack: scheduler, dag-processor, triggerer and API server on PostgreSQL.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from tests.support import airflow_run
from tests.support.airflow_run import query, trigger, wait_for_run
from tests.support.stacks import fast_retries, read_json, weekly_stack

from avsim.artifacts import RUN_LEVEL_CASE, RunLayout, run_key_for
from avsim.devstack.stack import LocalStack
from avsim.ledger.breaker import Breaker, image_digest
from avsim.ledger.store import Ledger
from avsim.manifest.sample import sample_manifest
from avsim.phases.contract import NODE_ON_DEMAND

pytestmark = pytest.mark.integration

SHARD_SIZE = 8
SHARD_DAG = "avsim_weekly_shard"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with weekly_stack(tmp_path_factory.mktemp("journeys"), shard_size=SHARD_SIZE, max_active_shards=3) as s:
        yield s


def _layout(stack: LocalStack, run_id: str) -> RunLayout:
    return RunLayout(f"file://{stack.home / 'artifacts'}", run_key_for("avsim_weekly", run_id))


def _start(stack: LocalStack, run_id: str, doc: dict[str, Any]) -> None:
    manifest = stack.home / f"{run_id}.json"
    manifest.write_text(json.dumps(doc))
    trigger(stack, "avsim_weekly", run_id, {"manifest": str(manifest)})


def _states(stack: LocalStack, dag_id: str, run_id: str) -> dict[tuple[str, int], str]:
    rows = query(
        stack,
        "SELECT task_id, map_index, state FROM task_instance WHERE dag_id = :d AND run_id = :r",
        d=dag_id,
        r=run_id,
    )
    return {(t, m): str(s) for t, m, s in rows}


def _clear_only_failed(stack: LocalStack, run_id: str) -> list[dict[str, Any]]:
    """One clear of the weekly run, as an engineer makes it: only failed, with downstream."""
    done = airflow_run.api(
        stack,
        "POST",
        "/api/v2/dags/avsim_weekly/clearTaskInstances",
        {"dry_run": False, "dag_run_id": run_id, "only_failed": True, "include_downstream": True},
    )
    return list(done["task_instances"])


def _check_repaired(stack: LocalStack, run_id: str, doc: dict[str, Any]) -> dict[str, Any]:
    """Every case passed; the weekly summary's committed result and the report say the same."""
    layout = _layout(stack, run_id)
    report = read_json(f"{layout.report_dir}/report.json")
    assert report["verdict"]["state"] == "passed", report["verdict"]
    totals = report["totals"]
    assert totals["cases"] == len(doc["cases"]) and totals["passed"] == len(doc["cases"]), totals
    summary = Ledger(layout).outcome(RUN_LEVEL_CASE, "weekly_summary")
    assert summary is not None and summary.outcome.value == "passed"
    metrics = summary.result["metrics"]
    assert metrics == {"cases": len(doc["cases"]), "passed": len(doc["cases"])}, metrics
    return report


def test_a_week_stopped_by_the_canary_is_repaired_by_breaker_reset_and_one_clear(stack: LocalStack) -> None:
    """Runbook 1, step 4: a broken node pool made the canary crash; the pool is fixed, the breaker
    reset, the weekly run cleared once. The cleared gate judges the canary's repaired round (it read
    the first round's failures again, failed, and reopened the breaker), the rest of the week runs,
    and the summary that ran over the stopped week is written again over the repaired one."""
    run_id = "canary_stopped"
    doc = sample_manifest(
        24,
        seed=31,  # a build of its own: its own breaker
        time_scale=0.00002,
        scenario_fail_rate=0.0,
        crash_rate=0.0,
        canary={"share": 0.1, "min_cases": 8, "max_failure_rate": 0.2},
    )
    fast_retries(doc)
    marker = stack.home / f"{run_id}.fixed"
    for case in doc["cases"]:
        case["parameters"]["fakesim"] = {"simulate": f"crash_until:file://{marker}"}
    _start(stack, run_id, doc)
    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=900) == "failed"

    states = _states(stack, "avsim_weekly", run_id)
    assert states[("canary_gate", -1)] == "failed" and states[("report", -1)] == "failed"
    # The summary of the stopped week ran (the breaker stops the build's cases, not the summary).
    assert states[("run_phases.weekly_summary", -1)] == "success"
    layout = _layout(stack, run_id)
    stopped = Ledger(layout).outcome(RUN_LEVEL_CASE, "weekly_summary")
    assert stopped is not None and stopped.result["metrics"].get("not_started") == 16
    assert read_json(layout.canary_gate)["state"] == "failed"

    marker.touch()  # the node pool is fixed
    digest = image_digest(doc["run"]["build"]["image"])
    reset = subprocess.run(
        [sys.executable, "-m", "avsim.cli", "breaker", "reset", digest],
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert reset.returncode == 0 and "closed" in reset.stdout, reset.stdout + reset.stderr
    cleared = _clear_only_failed(stack, run_id)
    assert {t["task_id"] for t in cleared} >= {"canary", "canary_gate", "shards", "report"}
    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=900) == "success"

    gate = read_json(layout.canary_gate)
    assert gate["state"] == "passed" and gate["failed_cases"] == 0, gate
    assert gate["round_since"], gate  # it judged the repaired round
    states = _states(stack, "avsim_weekly", run_id)
    assert {m: s for (t, m), s in states.items() if t == "shards"} == {0: "success", 1: "success"}
    _check_repaired(stack, run_id, doc)
    assert not Breaker(layout.root, digest).state().is_open  # the repaired round did not reopen it


@pytest.mark.long
def test_a_case_whose_twin_an_earlier_round_skipped_is_repaired_on_demand(stack: LocalStack) -> None:
    """A case's simulate crashed past its budget (so Airflow skipped its on-demand twin), then, the pool
    fixed, was preempted on spot until it handed over in the repair's round: the twin the first round
    skipped runs the phase on demand, and the case passes."""
    run_id = "twin_skipped"
    doc = sample_manifest(
        8, seed=32, time_scale=0.00002, scenario_fail_rate=0.0, crash_rate=0.0, canary={"enabled": False}
    )
    fast_retries(doc)
    marker = stack.home / f"{run_id}.fixed"
    case = next(c for c in doc["cases"] if c["graph"] == "standard")
    case["parameters"]["fakesim"] = {"simulate": f"crash_until:file://{marker}+preempt_before:7"}
    _start(stack, run_id, doc)
    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=900) == "failed"
    shard_run = f"{run_id}__shard_0001"
    first = _states(stack, SHARD_DAG, shard_run)
    [index] = {
        m
        for (m,) in query(
            stack,
            "SELECT map_index FROM task_instance WHERE dag_id = :d AND run_id = :r AND task_id = "
            "'standard.simulate' AND rendered_map_index = :c",
            d=SHARD_DAG,
            r=shard_run,
            c=case["id"],
        )
    }
    assert first[("standard.simulate", index)] == "failed"
    assert first[("standard.simulate_on_demand", index)] == "skipped"  # what the repair leaves alone

    marker.touch()
    _clear_only_failed(stack, run_id)
    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=900) == "success"
    after = _states(stack, SHARD_DAG, shard_run)
    assert after[("standard.simulate", index)] == "skipped"  # handed over
    assert after[("standard.simulate_on_demand", index)] == "success"
    attempts = Ledger(_layout(stack, run_id)).attempts(case["id"], "simulate")
    assert attempts[-1].outcome is not None and attempts[-1].outcome.value == "passed"
    assert attempts[-1].task_id == "standard.simulate_on_demand" and attempts[-1].node_class == NODE_ON_DEMAND
    _check_repaired(stack, run_id, doc)


# Long tier: the journey of make test is the canary-stopped week above (the one-clear repair of a week
# with infrastructure failures is in make test too: tests/integration/test_distributed.py).
@pytest.mark.long
def test_a_case_whose_input_was_missing_is_repaired_by_one_clear_once_it_is_restored(
    stack: LocalStack,
) -> None:
    """A scenario missing from its store: the case's prepare is rejected as bad input at once (no
    retries spent), its downstream never runs, the week ends failed naming it; the scenario restored,
    one clear reruns just that case and the week ends success."""
    run_id = "input_missing"
    doc = sample_manifest(
        8, seed=33, time_scale=0.00002, scenario_fail_rate=0.0, crash_rate=0.0, canary={"enabled": False}
    )
    fast_retries(doc)
    marker = stack.home / f"{run_id}.restored"
    case = doc["cases"][3]
    case["parameters"]["fakesim"] = {"prepare": f"bad_input_until:file://{marker}"}
    _start(stack, run_id, doc)
    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=900) == "failed"
    layout = _layout(stack, run_id)
    ledger = Ledger(layout)
    assert [a.outcome.value for a in ledger.attempts(case["id"], "prepare") if a.outcome] == ["bad_input"]
    report = read_json(f"{layout.report_dir}/report.json")
    assert report["totals"]["bad_input"] == 1 and report["verdict"]["state"] == "needs_attention"

    marker.touch()  # the scenario is back in its store
    _clear_only_failed(stack, run_id)
    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=900) == "success"
    _check_repaired(stack, run_id, doc)
    assert [a.outcome.value for a in Ledger(layout).attempts(case["id"], "prepare") if a.outcome] == [
        "bad_input",
        "passed",
    ]
