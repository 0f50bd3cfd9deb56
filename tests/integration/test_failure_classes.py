"""Failure economics end to end on the local backend, on the real scheduler, triggerer and PostgreSQL.

One week with a fault forced into each of its cases (the fake simulator's ``parameters.fakesim``):
preemptions that move a GPU phase to on-demand nodes and resume from its checkpoint, a crash that
uses up the infrastructure budget, a failed scenario, bad input, a hang that stops the heartbeat,
preemptions beyond every budget; then a build that crashes everywhere, stopped by the canary gate.
Nothing is mocked: the phases are real processes; the checks read the ledger and the metadata DB.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pytest
from tests.support.airflow_run import query, trigger, wait_for_run
from tests.support.stacks import read_json, weekly_stack
from tests.support.verdicts import check_states_match_the_ledger

from avsim.artifacts import RunLayout, breaker_uri, run_key_for
from avsim.devstack.stack import LocalStack
from avsim.ledger.records import OutcomeRecord
from avsim.ledger.store import Ledger
from avsim.manifest.sample import sample_manifest
from avsim.phases.contract import Outcome

pytestmark = [pytest.mark.integration, pytest.mark.long]

FAULTS = {
    # case index -> (phase, forced behaviour), and the class the case must end in
    1: ("simulate", "preempt_before:3", "passed"),  # 2 preemptions on spot, attempt 3 on on-demand
    2: ("evaluate", "crash", "infra_failed"),  # 3 crashes: the infrastructure budget (2 retries)
    3: ("simulate", "scenario_failed", "scenario_failed"),  # a result, never retried
    4: ("prepare", "bad_input", "bad_input"),  # fail fast
    5: ("simulate", "hang_once", "passed"),  # the heartbeat stops: lease expired, retried
    6: ("simulate", "preempt_before:9", "preempted"),  # 2 on spot + 2 on on-demand: preemption budget used up
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with weekly_stack(tmp_path_factory.mktemp("failures"), shard_size=6, max_active_shards=2) as s:
        yield s


def _standard_cases(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in doc["cases"] if c["graph"] == "standard"]


def _week(stack: LocalStack, name: str, doc: dict[str, Any]) -> tuple[str, RunLayout]:
    path = stack.home / f"{name}.json"
    path.write_text(json.dumps(doc))
    run_id = f"it__{name}"
    trigger(stack, "avsim_weekly", run_id, {"manifest": str(path)})
    return run_id, RunLayout(f"file://{stack.home / 'artifacts'}", run_key_for("avsim_weekly", run_id))


# About 7 minutes on 2 cores; CI covers the classes through test_chaos.
def test_each_failure_class_is_handled_by_its_own_rules(stack: LocalStack) -> None:
    doc = sample_manifest(
        12,
        time_scale=0.002,
        scenario_fail_rate=0.0,
        canary={"share": 0.2, "min_cases": 2, "max_failure_rate": 1.0},
    )
    sim = doc["graphs"]["standard"]["phases"]["simulate"]
    sim.update(heartbeat_seconds=0.5, lease_seconds=4)  # a hung simulate is found within seconds
    cases = _standard_cases(doc)
    assert len(cases) >= 7, "the sample's seed gives enough standard cases"
    for i, (phase, forced, _) in FAULTS.items():
        cases[i]["parameters"]["fakesim"] = {phase: forced}
    run_id, layout = _week(stack, "failures", doc)
    # Cases that exhausted a budget or hit bad input need attention: the week ends failed.
    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=900) == "failed"
    assert check_states_match_the_ledger(stack, run_id, layout)["state"] == "needs_attention"
    ledger = Ledger(layout)

    def attempts(case: dict[str, Any], phase: str) -> list[tuple[str, str, str]]:
        return [
            (a.outcome.value if a.outcome else "", a.node_class, a.detail)
            for a in ledger.attempts(case["id"], phase)
        ]

    # 1. Preempted twice on spot, then on on-demand nodes (the twin task, in the on-demand pool), resuming.
    a = cases[1]
    assert attempts(a, "simulate") == [
        ("preempted", "gpu-spot", "terminated"),
        ("preempted", "gpu-spot", "terminated"),
        ("passed", "gpu-on-demand", ""),
    ]
    tis = dict(
        (t, (s, p))
        for t, s, p in query(
            stack,
            "SELECT task_id, state, pool FROM task_instance WHERE dag_id = 'avsim_weekly_shard' AND run_id LIKE :r "
            "AND rendered_map_index = :c",
            r=f"{run_id}__%",
            c=a["id"],
        )
    )
    assert tis["standard.simulate"] == ("skipped", "avsim_gpu_spot")
    assert tis["standard.simulate_on_demand"] == ("success", "avsim_gpu_on_demand")
    assert tis["standard.evaluate"][0] == "success"
    final = read_json(f"{ledger.outcome(a['id'], 'simulate').output_uri}/result.json")  # type: ignore[union-attr]
    assert final["resumed_from"] > 0, "the on-demand attempt resumed from the spot attempts' checkpoint"
    assert final["work_seconds"] < final["total_work_seconds"], (
        "the resumed attempt did less work than a restart"
    )

    # 2. Three crashes: infrastructure budget used up, committed, downstream not run, no more tries.
    b = cases[2]
    assert attempts(b, "evaluate") == [("infra_failed", "cpu", "crash")] * 3
    assert ledger.outcome(b["id"], "evaluate").outcome is Outcome.INFRA_FAILED  # type: ignore[union-attr]
    # A task that never ran has no rendered map index: find the case's map index from one that ran.
    [(b_run, b_index)] = query(
        stack,
        "SELECT run_id, map_index FROM task_instance WHERE dag_id = 'avsim_weekly_shard' AND run_id LIKE :r "
        "AND task_id = 'standard.prepare' AND rendered_map_index = :c",
        r=f"{run_id}__%",
        c=b["id"],
    )
    states = dict(
        query(
            stack,
            "SELECT task_id, state FROM task_instance WHERE dag_id = 'avsim_weekly_shard' AND run_id = :r "
            "AND map_index = :m",
            r=b_run,
            m=b_index,
        )
    )
    assert states["standard.evaluate"] == "failed" and states["standard.report"] == "upstream_failed"

    # 3. A failed scenario is a result: one attempt, downstream phases ran.
    c = cases[3]
    assert attempts(c, "simulate") == [("scenario_failed", "gpu-spot", "")]
    assert ledger.outcome(c["id"], "report").outcome is Outcome.PASSED  # type: ignore[union-attr]

    # 4. Bad input: one attempt, no retry.
    d = cases[4]
    assert attempts(d, "prepare") == [("bad_input", "cpu", "")]

    # 5. A hang: the heartbeat stopped, the lease expired, the process was killed and retried.
    e = cases[5]
    assert attempts(e, "simulate") == [
        ("infra_failed", "gpu-spot", "lease_expired"),
        ("passed", "gpu-spot", ""),
    ]

    # 6. Preemptions beyond both budgets: 2 on spot, then 2 on on-demand (budget 3 retries): committed.
    f = cases[6]
    assert [x[:2] for x in attempts(f, "simulate")] == [
        ("preempted", "gpu-spot"),
        ("preempted", "gpu-spot"),
        ("preempted", "gpu-on-demand"),
        ("preempted", "gpu-on-demand"),
    ]

    # Every case in its class in the report; untouched cases passed, each phase once.
    report = read_json(f"{layout.report_dir}/report.json")
    by_case = {row["case_id"]: row for row in report.get("cases") or _cases_from_summaries(ledger)}
    for i, (_, _, expected) in FAULTS.items():
        assert by_case[cases[i]["id"]]["outcome"] == expected, cases[i]["id"]
    faulty = {cases[i]["id"] for i in FAULTS}
    for case in doc["cases"]:
        if case["id"] not in faulty:
            assert by_case[case["id"]]["outcome"] == "passed", case["id"]

    # Stale and duplicate completions, injected into the real run's ledger: nothing changes.
    committed = ledger.outcome(a["id"], "simulate")
    assert committed is not None and committed.attempt == 3
    late = OutcomeRecord(layout.run_key, a["id"], "simulate", 1, Outcome.PASSED, "file:///elsewhere", "now")
    assert ledger.commit(late) is False
    assert ledger.commit(committed) is False
    assert ledger.outcome(a["id"], "simulate") == committed


def _cases_from_summaries(ledger: Ledger) -> list[dict[str, Any]]:
    return [case.to_json() for summary in ledger.shard_summaries() for case in summary.cases]


def test_a_build_that_crashes_is_stopped_by_the_canary(stack: LocalStack) -> None:
    doc = sample_manifest(
        30,
        seed=11,  # another build digest: its own breaker
        time_scale=0.001,
        scenario_fail_rate=0.0,
        canary={"share": 0.1, "min_cases": 4, "max_failure_rate": 0.25},
    )
    for graph in doc["graphs"].values():  # the build crashes in every first phase
        graph["phases"]["prepare"]["args"] += ["--crash-rate", "1"]
    run_id, layout = _week(stack, "badbuild", doc)
    wait_for_run(stack, "avsim_weekly", run_id, timeout=600)
    states = dict(
        query(
            stack,
            "SELECT task_id, state FROM task_instance WHERE dag_id = 'avsim_weekly' AND run_id = :r AND map_index < 1",
            r=run_id,
        )
    )
    # The weekly run tells the truth: failed, naming the build; the summary ran over a stopped week.
    assert states["canary_gate"] == "failed" and states["report"] == "failed"
    assert states["run_phases.weekly_summary"] == "success" and states["close_week"] == "success"
    report_log = next(
        (stack.home / "logs").glob(f"dag_id=avsim_weekly/run_id={run_id}/task_id=report/**/attempt=1.log")
    ).read_text()
    never = len(doc["cases"]) - read_json(layout.canary_gate)["cases"]  # every case but the canary's
    assert (
        f"(build {doc['run']['build']['build_id']}): the week was stopped: {never} cases never started"
        in report_log
    )
    report = read_json(f"{layout.report_dir}/report.json")
    assert report["verdict"]["state"] == "stopped" and report["totals"]["not_started"] == never
    assert "canary gate" in report["verdict"]["stopped_because"]
    # The rest of the week never started: only the canary's shard run exists.
    runs = query(
        stack,
        "SELECT run_id FROM dag_run WHERE dag_id = 'avsim_weekly_shard' AND run_id LIKE :p",
        p=f"{run_id}__%",
    )
    assert [r[0] for r in runs] == [f"{run_id}__canary"]
    gate = read_json(layout.canary_gate)
    assert gate["state"] == "failed" and gate["cases"] == 4 and gate["failed_cases"] > 1
    assert "sim-" in gate["message"] and "crash" in gate["message"]
    log = next(
        (stack.home / "logs").glob(f"dag_id=avsim_weekly/run_id={run_id}/task_id=canary_gate/**/*.log")
    ).read_text()
    assert "canary gate FAILED" in log and doc["run"]["build"]["build_id"] in log
    # No GPU phase of the week ever launched: every case failed before its first GPU phase.
    ledger = Ledger(layout)
    assert not any(a.gpus for c in doc["cases"] for a in ledger.attempts(c["id"], "simulate"))
    # The build's breaker saw the crashes too.
    breaker = read_json(breaker_uri(layout.root, doc["run"]["build"]["image"].rsplit("@", 1)[-1]))
    assert breaker["failures"] >= 4 and breaker["state"] == "open"
    # After the gate decided, no attempt of the build launched: the gate opened the breaker, so the
    # canary's retries failed fast as bad_build/breaker_open.
    decided = dt.datetime.fromisoformat(gate["updated_at"])
    late = [
        (c["id"], a.attempt, a.detail)
        for c in doc["cases"]
        for a in ledger.attempts(c["id"], "prepare")
        if dt.datetime.fromisoformat(a.started_at) > decided and a.detail != "breaker_open"
    ]
    assert late == []


def test_rerun_failed_recomputes_only_what_failed(stack: LocalStack) -> None:
    import subprocess
    import sys

    marker = stack.home / "node-pool-fixed"
    doc = sample_manifest(4, seed=21, time_scale=0.001, scenario_fail_rate=0.0, canary={"enabled": False})
    broken = _standard_cases(doc)[0]
    # evaluate crashes on every attempt until the node pool is fixed (the marker exists)
    broken["parameters"]["fakesim"] = {"evaluate": f"crash_until:file://{marker}"}
    run_id, layout = _week(stack, "rerunsrc", doc)
    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=600) == "failed"
    ledger = Ledger(layout)
    assert ledger.outcome(broken["id"], "evaluate").outcome is Outcome.INFRA_FAILED  # type: ignore[union-attr]

    marker.touch()  # someone fixes the node pool
    done = subprocess.run(
        [sys.executable, "-m", "avsim.cli", "rerun-failed", run_id],
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert f"1 failed cases of {layout.run_key}: {broken['id']}" in done.stdout
    assert "same pins" in done.stdout
    rerun_id = next(w for w in done.stdout.split() if w.startswith("rerun__"))
    assert wait_for_run(stack, "avsim_weekly", rerun_id, timeout=600) == "success"

    again = Ledger(RunLayout(layout.root, run_key_for("avsim_weekly", rerun_id)))
    phases = ("prepare", "simulate", "evaluate", "report")
    attempts = {p: again.attempts(broken["id"], p) for p in phases}
    launched = [p for p in phases for a in attempts[p] if a.detail != "reused"]
    reused = [p for p in phases for a in attempts[p] if a.detail == "reused"]
    # prepare and simulate had committed results with the same cache key: reused, not launched.
    assert reused == ["prepare", "simulate"] and launched == ["evaluate", "report"]
    assert (
        again.outcome(broken["id"], "simulate").output_uri
        == ledger.outcome(broken["id"], "simulate").output_uri
    )  # type: ignore[union-attr]
    assert again.outcome(broken["id"], "report").outcome is Outcome.PASSED  # type: ignore[union-attr]
    head = read_json(again.layout.head_uri)
    assert head["run"]["rerun_of"] == layout.run_key and head["run"]["build"] == doc["run"]["build"]
    assert read_json(f"{again.layout.report_dir}/report.json")["totals"]["cases"] == 1
