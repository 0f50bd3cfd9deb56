"""A weekly run on the Kubernetes backend: the real scheduler, triggerer and PostgreSQL, the real
``KubernetesPodOperator`` subclass and ``kubernetes``/``kubernetes_asyncio`` clients, against the
loopback Kubernetes API of tests/support/kube_api (its pods are processes on this machine: the honest
boundary, since no cluster can run here). One fault of each kind is scripted; every case must end
in its class, and the triggerer must have waited through one shared watch, not per-pod polling.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.airflow_run import trigger, wait_for_run
from tests.support.kube_api import FakeKubeAPI
from tests.support.stacks import kubernetes_stack, read_json
from tests.support.verdicts import check_states_match_the_ledger

from avsim.artifacts import RunLayout, run_key_for
from avsim.devstack.stack import LocalStack
from avsim.ledger.store import Ledger
from avsim.manifest.sample import sample_manifest

pytestmark = [pytest.mark.integration, pytest.mark.long]

NS = "avsim"
# case index (among standard cases) -> (fault kind, phase it hits on attempt 1, params, expected case class)
FAULTS: dict[int, tuple[str, str, dict[str, Any], str]] = {
    0: ("evict", "simulate", {}, "passed"),
    1: ("node_loss", "simulate", {}, "passed"),
    2: ("oom", "evaluate", {}, "passed"),
    3: ("image_pull_error", "simulate", {}, "bad_build"),
    4: ("hang", "simulate", {}, "passed"),
    5: ("slow_start", "prepare", {}, "passed"),
    6: ("preempt", "simulate", {"grace_seconds": 0.5}, "passed"),
    # The kubelet dies with the node: the pod stays Terminating for ever. A spot phase's lost node is
    # a preemption (node_lost, kube/pods.py), ended TERMINATING_BOUND_SECONDS past its deletion
    # time; the retry passes.
    7: ("node_lost_stuck", "simulate", {"grace_seconds": 1}, "passed"),
}
#: The case whose simulate is preempted twice, so that its on-demand twin runs the third attempt.
PREEMPTED = 6


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeKubeAPI, LocalStack]]:
    with kubernetes_stack(
        tmp_path_factory.mktemp("k8s"), NS, shard_size=12, max_active_shards=1, gpus=6, cpus=8
    ) as (kube, stack):
        yield kube, stack


def test_a_week_on_kubernetes_ends_every_case_in_its_class(cluster: tuple[FakeKubeAPI, LocalStack]) -> None:
    kube, stack = cluster
    doc = sample_manifest(10, time_scale=0.002, scenario_fail_rate=0.0, canary={"enabled": False})
    for graph in doc["graphs"].values():
        for phase in graph["phases"].values():
            phase.update(heartbeat_seconds=0.5, lease_seconds=5)
    standard = [c for c in doc["cases"] if c["graph"] == "standard"]
    assert len(standard) >= len(FAULTS)
    for i, (kind, phase, params, _) in FAULTS.items():
        after = 0.5 if kind not in ("slow_start",) else 3.0
        kube.add_fault(
            kind,
            match={"env": {"CASE_ID": standard[i]["id"], "PHASE": phase, "ATTEMPT": "1"}},
            after_seconds=after,
            **params,
        )
    # The preempted case's spot pod is reclaimed again on its retry: after on_demand_after_preemptions (2)
    # its third attempt is the on-demand twin's, which defers and resumes like any phase.
    kube.add_fault(
        "preempt",
        match={"env": {"CASE_ID": standard[PREEMPTED]["id"], "PHASE": "simulate", "ATTEMPT": "2"}},
        after_seconds=0.5,
        grace_seconds=0.5,
    )
    other = next(c for c in doc["cases"] if c["id"] not in {standard[i]["id"] for i in FAULTS})
    other["parameters"]["fakesim"] = (
        {"simulate": "scenario_failed"} if other["graph"] != "perception" else {"perceive": "scenario_failed"}
    )
    path = stack.home / "k8s-week.json"
    path.write_text(json.dumps(doc))
    run_id = "it__k8s"
    kube.reset_calls()
    trigger(stack, "avsim_weekly", run_id, {"manifest": str(path)})
    # The image that does not pull is a bad build: that case needs attention, so the week ends failed.
    assert wait_for_run(stack, "avsim_weekly", run_id, timeout=1200) == "failed"

    layout = RunLayout(f"file://{stack.home / 'artifacts'}", run_key_for("avsim_weekly", run_id))
    assert check_states_match_the_ledger(stack, run_id, layout)["shards"] != {}
    ledger = Ledger(layout)
    summaries = ledger.shard_summaries()
    by_case = {c.case_id: c.to_json() for s in summaries for c in s.cases}
    assert len(by_case) == 10
    for i, (kind, phase, _, expected) in FAULTS.items():
        case = standard[i]
        assert by_case[case["id"]]["outcome"] == expected, (kind, by_case[case["id"]])
        first = ledger.attempts(case["id"], phase)[0]
        assert first.runner.startswith("avsim-"), "the attempt names its pod"
    details = {
        kind: ledger.attempts(standard[i]["id"], phase)[0].detail for i, (kind, phase, _, _) in FAULTS.items()
    }
    assert details == {
        "evict": "evicted",
        "node_loss": "vanished",
        "oom": "oom",
        "image_pull_error": "image_pull",
        "hang": "lease_expired",
        "slow_start": "",
        "preempt": "node_shutdown",
        "node_lost_stuck": "node_lost",
    }
    twice = ledger.attempts(standard[PREEMPTED]["id"], "simulate")
    assert [(a.attempt, a.outcome.value if a.outcome else None, a.node_class, a.task_id) for a in twice] == [
        (1, "preempted", "gpu-spot", "standard.simulate"),
        (2, "preempted", "gpu-spot", "standard.simulate"),
        (3, "passed", "gpu-on-demand", "standard.simulate_on_demand"),
    ]
    assert by_case[other["id"]]["outcome"] == "scenario_failed"
    # Every other case passed, and every pod and Lease is gone.
    for case in doc["cases"]:
        if case["id"] not in {standard[i]["id"] for i in FAULTS} | {other["id"]}:
            assert by_case[case["id"]]["outcome"] == "passed"
    assert kube.pods(NS) == [] and kube.leases(NS) == []
    # Phases waited deferred in the triggerer, through the shared watch: no per-pod polling.
    # Every pod attempt waited in the triggerer: one trigger log per attempt, each ending with the
    # PhasePodTrigger's event: a passed attempt ended there (committed, TaskSuccessEvent), any other
    # end resumed the phase in a worker.
    trigger_logs = list((stack.home / "logs" / "dag_id=avsim_weekly_shard").glob("**/*.log.trigger.*"))
    assert len(trigger_logs) >= 40
    ends = [_trigger_end(p.read_text(), stack.home / "logs" / "triggerer.log") for p in trigger_logs]
    assert all(passed != resumed for passed, resumed in ends), ends
    assert sum(passed for passed, _ in ends) >= 30  # the attempts that passed
    assert sum(resumed for _, resumed in ends) >= 8  # one per fault at least
    calls = kube.calls()
    reads = sum(n for c, n in calls.items() if c.verb == "get" and c.resource == "pods" and not c.subresource)
    pods_created = sum(n for c, n in calls.items() if c.verb == "create" and c.resource == "pods")
    watches = sum(n for c, n in calls.items() if c.watch)
    assert pods_created >= 40
    assert reads <= pods_created // 4, calls  # the stock trigger reads each pod every 2 seconds
    assert watches <= 20, calls
    report = read_json(f"{layout.report_dir}/report.json")
    assert report["totals"]["cases"] == 10 and report["totals"].get("bad_build", 0) == 1


def _trigger_end(log: str, triggerer_log: Path) -> tuple[bool, bool]:
    """(passed in the trigger, resumed in a worker) from one trigger's log. Airflow's triggerer writes a
    trigger's "Trigger fired event" line to the trigger's own log file, and now and then (seen once in
    45 attempts, a trigger that ran a minute) to the triggerer's log instead: look there by the
    trigger's id when its own log has no event."""
    import re

    found = ("TriggerEvent<'success'>" in log, "'status': 'ended'" in log)
    started = re.search(r"\(ID (\d+)\) starting", log)
    if any(found) or started is None:
        return found
    mark = f"(ID {started.group(1)})"
    fired = [
        line
        for line in triggerer_log.read_text().splitlines()
        if "Trigger fired event" in line and mark in line
    ]
    return (
        any("TriggerEvent<'success'>" in line for line in fired),
        any("\\'status\\': \\'ended\\'" in line or "'status': 'ended'" in line for line in fired),
    )
