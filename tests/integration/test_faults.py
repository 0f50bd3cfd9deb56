"""The week rides through the partial faults of a real cluster (long tier, production topology).

One week on :class:`tests.support.faults.FaultStack` (CeleryExecutor, Redis, S3 through a proxy that
can answer errors, PostgreSQL, two triggerers, the Kubernetes backend on the loopback Kubernetes API)
gets every fault of :data:`tests.support.faults.FAULTS` once, as ``bench/faults.py --quick`` does: a
Celery worker killed -9, a triggerer frozen until its triggers move, the object store answering 503
for 60 s, PostgreSQL stopped for 30 s, the API server frozen for 120 s, and 5 % of GPU attempts
hanging until their lease expires. The week ends success with every case passed or scenario_failed,
no result lost or committed twice, no verdict on the build, and no pod deleted under a live attempt.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.support.faults import FAULTS, FaultStack, fault_stack, run_week, summary_line

pytestmark = [pytest.mark.integration, pytest.mark.distributed, pytest.mark.long, pytest.mark.timeout(3000)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultStack]:
    with fault_stack(tmp_path_factory.mktemp("faults")) as s:
        yield s


def test_a_week_rides_through_every_partial_fault(stack: FaultStack) -> None:
    week = run_week(stack, "it__faults", FAULTS)
    print("\n" + summary_line([week]))
    for entry in week.injected:
        print(f"{entry.fault}: {entry.note}")
    assert {i.fault for i in week.injected} == set(FAULTS), week.injected
    assert week.problems == [], week.problems
    assert week.state == "success", week.case_classes
    assert set(week.case_classes) <= {"passed", "scenario_failed"}, week.case_classes
    assert (week.lost, week.duplicated, week.false_bad_build, week.live_pods_deleted) == (0, 0, 0, 0)
    assert week.survived
    # The faults happened: the hung GPU attempts were found when their lease expired, and retried.
    print(f"attempts: {week.attempt_classes}")
    assert week.attempt_classes.get("infra_failed/lease_expired", 0) >= 1, week.attempt_classes
