"""The chaos run: a weekly run on the real scheduler, triggerer and PostgreSQL with faults at stated rates.

Faults, all at once in one week of 70 cases:

* infrastructure crashes, preemptions (GPU phases: the process ends by SIGTERM, as a spot reclaim
  ends it), hangs without heartbeat (found by the lease within seconds) and scenario failures,
  drawn per attempt by the fake simulator at the rates of :data:`RATES`, plus one forced fault per
  kind on the first standard cases (budgets used up, the fallback to on-demand nodes, bad input);
* late reports from abandoned attempts and duplicate reports, injected at the ledger boundary
  while the run goes by :class:`tests.support.chaos.ZombieReporter`: a thread that calls
  ``Ledger.commit`` for superseded attempts and for already committed outcomes, which is exactly
  the call a zombie worker's report (or a report delivered twice) makes.

Afterwards :func:`tests.support.chaos_audit.audit_week` checks, from the ledger and the metadata
database: every case in a terminal state with the class the injected faults give (the fake
simulator's draws are seeded, so the class of every phase is known in advance), no phase committed
twice, no result lost, no scenario failure retried, every retry within its class budget, every
zombie or duplicate report refused. The figures are printed (``pytest -s`` shows them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from tests.support.airflow_run import trigger, wait_for_run
from tests.support.chaos import ChaosRates, ZombieReporter, chaos_manifest
from tests.support.chaos_audit import audit_week
from tests.support.stacks import weekly_stack
from tests.support.verdicts import check_states_match_the_ledger

from avsim.artifacts import RunLayout, run_key_for
from avsim.devstack.stack import LocalStack

# Long: a week under kills of every component, about 2.5 minutes on 2 cores.
pytestmark = [pytest.mark.integration, pytest.mark.long]

CASES = 70
RATES = ChaosRates(crash=0.08, preempt=0.12, hang=0.03, scenario_fail=0.08)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with weekly_stack(
        tmp_path_factory.mktemp("chaos"),
        shard_size=25,
        max_active_shards=3,
        gpus=8,
        cpus=8,
        # The deadline tracker ends with the week; let it look every 5 s, not every 5 minutes.
        extra_env={"AIRFLOW__AVSIM__DEADLINE_INTERVAL_SECONDS": "5"},
    ) as s:
        yield s


def test_a_week_under_chaos_keeps_every_promise(stack: LocalStack) -> None:
    # A 30-minute simulate runs 0.9 s; a hang is found when its 8 s lease expires.
    doc = chaos_manifest(CASES, RATES, seed=4242, time_scale=0.0005, heartbeat_seconds=1, lease_seconds=8)
    path = stack.home / "chaos.json"
    path.write_text(json.dumps(doc))
    run_id = "it__chaos"
    layout = RunLayout(f"file://{stack.home / 'artifacts'}", run_key_for("avsim_weekly", run_id))
    reporter = ZombieReporter(layout, interval=0.5).start()
    started = time.monotonic()
    try:
        trigger(stack, "avsim_weekly", run_id, {"manifest": str(path)})
        state = wait_for_run(stack, "avsim_weekly", run_id, timeout=1200)
    finally:
        reporter.stop()
    seconds = time.monotonic() - started
    # Cases that exhausted their budgets need attention: their shard runs and the week end failed.
    assert state in ("success", "failed")
    verdict = check_states_match_the_ledger(stack, run_id, layout)
    assert verdict["attention"] > 0 and state == "failed", verdict

    audit = audit_week(stack, run_id, layout, doc, reporter, seconds=seconds, rates=RATES)
    print("\n" + "\n".join(audit.lines()))
    assert audit.ok, audit.problems()
    f = audit.figures
    # The week really was chaotic: every kind of fault happened, every class was reached.
    assert {
        "infra_failed/crash",
        "infra_failed/lease_expired",
        "preempted/terminated",
        "scenario_failed",
    } <= set(f["attempt_classes"]), f["attempt_classes"]
    assert {"passed", "scenario_failed", "infra_failed", "preempted", "bad_input"} <= set(f["case_classes"])
    assert f["fallbacks"] >= 2 and f["retries"] >= 20
    assert f["late"] >= 20 and f["late_before_commit"] >= 1 and f["duplicates"] >= f["phases"] // 2
