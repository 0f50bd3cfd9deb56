"""One lease-age rule (avsim.phases.heartbeat.lease_age) for the local worker, the trigger and the watchdog."""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path

from kubernetes.client import ApiClient, V1Lease, V1LeaseSpec, V1ObjectMeta

from avsim.kube.pods import pod_lease_age
from avsim.operators.phase import _heartbeat_age
from avsim.phases.heartbeat import lease_age, rfc3339_micro

T0 = 1_800_000_000.0


def test_the_age_runs_from_the_later_of_the_last_renewal_and_the_start() -> None:
    assert lease_age(T0 + 100, renewed=T0 + 70, started=T0) == 30
    assert lease_age(T0 + 100, renewed=None, started=T0) == 100  # before the first beat
    # a renewal older than the start (a Lease left from before a restart) does not age the phase
    assert lease_age(T0 + 100, renewed=T0 - 500, started=T0 + 90) == 10
    assert lease_age(T0 + 100, renewed=T0 + 40, started=None) == 60
    assert lease_age(T0 + 100, renewed=None, started=None) == 0  # nothing known: never expired


def _pod(started: dt.datetime | None) -> dict:
    running = (
        {"running": {"startedAt": started.strftime("%Y-%m-%dT%H:%M:%SZ")}} if started else {"waiting": {}}
    )
    return {"status": {"phase": "Running", "containerStatuses": [{"name": "base", "state": running}]}}


def test_a_pods_lease_age_reads_renew_time_and_the_containers_start() -> None:
    start = dt.datetime.fromtimestamp(T0, dt.UTC)
    renewed = start + dt.timedelta(seconds=42.5)
    lease = {"spec": {"renewTime": rfc3339_micro(renewed)}}
    assert pod_lease_age(_pod(start), lease, T0 + 50) == 7.5
    assert pod_lease_age(_pod(start), None, T0 + 50) == 50
    assert pod_lease_age(_pod(None), None, T0 + 50) == 0
    # the operator's watchdog reads a V1Lease through the client: the same answer once serialized
    v1 = V1Lease(metadata=V1ObjectMeta(name="p"), spec=V1LeaseSpec(renew_time=renewed))
    assert pod_lease_age(_pod(start), ApiClient().sanitize_for_serialization(v1), T0 + 50) == 7.5


def test_the_local_worker_ages_its_heartbeat_file_by_the_same_rule(tmp_path: Path) -> None:
    beat = tmp_path / "hb"
    t0 = time.monotonic()
    started = t0 - 100  # the phase started 100 s ago

    def age_between(expected: float) -> None:
        """The age is ``expected`` plus however long this test has taken so far (no timing bound)."""
        age = _heartbeat_age(beat, started)
        assert expected - 1e-3 <= age <= expected + (time.monotonic() - t0) + 1e-3

    age_between(100)  # no beat yet: since the start
    beat.touch()
    os.utime(beat, (time.time() - 30, time.time() - 30))
    age_between(30)
    os.utime(beat, (time.time() - 500, time.time() - 500))  # older than the start: since the start
    age_between(100)
