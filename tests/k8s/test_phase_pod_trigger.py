"""The phase pod trigger and its shared namespace watch, against the loopback Kubernetes API.

The real ``kubernetes`` client creates the pods (processes on this machine, see
tests/support/kube_api) and the real ``kubernetes_asyncio`` client, through Airflow's
``AsyncKubernetesHook``, watches them. Triggers run in one event loop, as in a triggerer.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.kube_api import FakeKubeAPI

from avsim.kube.pods import attempt_labels, pod_name
from avsim.triggers.phase_pod import PhasePodTrigger
from avsim.triggers.pod_watch import NamespaceWatch

NS = "avsim"


@pytest.fixture
def kube(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeKubeAPI, Any]]:
    from kubernetes import client, config

    with FakeKubeAPI(workdir=tmp_path / "pods") as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", namespace=NS)
        for k, v in api.airflow_conn_env("kube_fake", kubeconfig, namespace=NS).items():
            monkeypatch.setenv(k, v)
        config.load_kube_config(config_file=str(kubeconfig))
        yield api, client.CoreV1Api()


def make_pod(
    core: Any, case: str, code: str, attempt: int = 1, *, node_class: str = "gpu-spot", lease: bool = False
) -> str:
    from kubernetes import client

    name = pod_name("rk", case, "simulate", attempt)
    core.create_namespaced_pod(
        NS,
        client.V1Pod(
            metadata=client.V1ObjectMeta(
                name=name, labels=attempt_labels("rk", case, "simulate", attempt, node_class)
            ),
            spec=client.V1PodSpec(
                restart_policy="Never",
                containers=[
                    client.V1Container(
                        name="base", image="reg/sim@sha256:" + "0" * 64, command=[sys.executable, "-c", code]
                    )
                ],
            ),
        ),
    )
    if lease:
        client.CoordinationV1Api().create_namespaced_lease(
            NS,
            client.V1Lease(
                metadata=client.V1ObjectMeta(
                    name=name, labels=attempt_labels("rk", case, "simulate", attempt, node_class)
                ),
                spec=client.V1LeaseSpec(lease_duration_seconds=2),
            ),
        )
    return name


def trigger_for(name: str, **kw: Any) -> PhasePodTrigger:
    args: dict[str, Any] = dict(
        pod_name=name,
        namespace=NS,
        attempt=1,
        node_class="gpu-spot",
        kubernetes_conn_id="kube_fake",
        check_interval=0.2,
        min_wait_seconds=0.0,
        started_at=dt.datetime.now(dt.UTC).isoformat(),
    )
    args.update(kw)
    return PhasePodTrigger(**args)


async def first_event(trigger: PhasePodTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return dict(event.payload)
    raise AssertionError("no event")


def run_all(*triggers: PhasePodTrigger, timeout: float = 60) -> list[dict[str, Any]]:
    async def main() -> list[dict[str, Any]]:
        try:
            return list(await asyncio.wait_for(asyncio.gather(*(first_event(t) for t in triggers)), timeout))
        finally:
            for w in list(NamespaceWatch._shared.values()):
                await w.close()
            NamespaceWatch._shared.clear()

    return asyncio.run(main())


def test_serialize_round_trip() -> None:
    t = trigger_for("avsim-c1-simulate-a2-0123456789", attempt=2, lease_seconds=90.0, config_dict={"a": 1})
    classpath, kwargs = t.serialize()
    assert classpath == "avsim.triggers.phase_pod.PhasePodTrigger"
    from airflow.sdk.module_loading import import_string

    again = import_string(classpath)(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    import json

    assert json.loads(json.dumps(kwargs)) == kwargs  # JSON-friendly


def test_ends_of_pods_become_events(kube: tuple[FakeKubeAPI, Any]) -> None:
    api, core = kube
    api.add_fault("oom", match={"name": "avsim-oom-*"}, after_seconds=0.3)
    names = {
        "ok": make_pod(core, "ok", "import time; time.sleep(0.5)"),
        "sf": make_pod(core, "sf", "import sys; sys.exit(3)"),
        "crash": make_pod(core, "crash", "import sys; sys.exit(1)"),
        "oom": make_pod(core, "oom", "import time; time.sleep(30)"),
    }
    events = run_all(*(trigger_for(n) for n in names.values()))
    got = {e["pod"]: (e["status"], e["outcome"], e.get("exit_code"), e["detail"]) for e in events}
    assert got[names["ok"]] == ("ended", "passed", 0, "")
    assert got[names["sf"]] == ("ended", "scenario_failed", 3, "")
    assert got[names["crash"]] == ("ended", "infra_failed", 1, "crash")
    assert got[names["oom"]][:2] == ("ended", "infra_failed") and got[names["oom"]][3] == "oom"


def test_preemption_eviction_vanishing_and_bad_images(kube: tuple[FakeKubeAPI, Any]) -> None:
    api, core = kube
    api.add_fault("preempt", match={"name": "avsim-pre-*"}, after_seconds=0.3, grace_seconds=0.2)
    api.add_fault("evict", match={"name": "avsim-evi-*"}, after_seconds=0.3)
    api.add_fault("node_loss", match={"name": "avsim-lost-*"}, after_seconds=0.3)
    api.add_fault("image_pull_error", match={"name": "avsim-img-*"})
    long = "import time; time.sleep(30)"
    api.add_fault("node_loss", match={"name": "avsim-gone-*"}, after_seconds=0.3)
    names = [make_pod(core, c, long) for c in ("pre", "evi", "lost", "img")]
    ondemand = make_pod(core, "gone", long, node_class="gpu-on-demand")
    events = run_all(*(trigger_for(n) for n in names), trigger_for(ondemand, node_class="gpu-on-demand"))
    got = {e["pod"]: (e["outcome"], e["detail"]) for e in events}
    assert got[names[0]] == ("preempted", "node_shutdown")
    assert got[names[1]] == ("preempted", "evicted")
    assert got[names[2]] == ("preempted", "vanished")
    assert got[names[3]] == ("bad_build", "image_pull") and "ErrImagePull" in events[3]["reason"]
    assert got[ondemand] == ("infra_failed", "vanished")


def test_a_pod_stuck_terminating_on_a_lost_node_ends_without_a_lease(
    kube: tuple[FakeKubeAPI, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hang of issue 13: the kubelet is gone, the pod stays Terminating for ever, no lease.
    The trigger ends it at deletionTimestamp + the bound, classed by the node class."""
    import time

    from avsim.kube import pods

    api, core = kube
    monkeypatch.setattr(pods, "TERMINATING_BOUND_SECONDS", 2.0)
    api.add_fault(
        "node_lost_stuck", match={"name": "avsim-stk*"}, after_seconds=0.3, times=2, grace_seconds=1
    )
    long = "import time; time.sleep(60)"
    spot = make_pod(core, "stks", long)
    cpu = make_pod(core, "stkc", long, node_class="cpu")
    began = time.monotonic()
    events = run_all(trigger_for(spot), trigger_for(cpu, node_class="cpu"), timeout=30)
    took = time.monotonic() - began
    got = {e["pod"]: (e["outcome"], e["detail"]) for e in events}
    assert got == {spot: ("preempted", "node_lost"), cpu: ("infra_failed", "node_lost")}
    assert all("Terminating" in e["reason"] for e in events)
    # start + fault (0.3 s) + grace (1 s) + bound (2 s), checked every 0.2 s: a few seconds.
    assert took < 15, took
    assert {p["metadata"]["name"] for p in api.pods(NS)} >= {spot, cpu}, "still stuck in the API"


def test_a_wait_nothing_reports_on_ends_at_the_deadline(kube: tuple[FakeKubeAPI, Any]) -> None:
    """Every wait is bounded: a pod whose node went silent and was never deleted (no lease, no
    taint manager) ends as an infrastructure failure at the trigger's deadline."""
    api, core = kube
    api.add_fault("hang", match={"name": "avsim-silent-*"}, after_seconds=0.2)
    name = make_pod(core, "silent", "import time; time.sleep(60)", node_class="cpu")
    (event,) = run_all(trigger_for(name, node_class="cpu", deadline_seconds=2.0), timeout=30)
    assert (event["outcome"], event["detail"]) == ("infra_failed", "timeout")
    assert "did not end within 2s" in event["reason"]


def test_a_phase_that_stops_renewing_its_lease_expires(kube: tuple[FakeKubeAPI, Any]) -> None:
    _, core = kube
    from kubernetes import client

    # The healthy phase renews its Lease through avsim's heartbeat (stdlib HTTP, as in a container).
    renew = (
        "import os, time\n"
        "os.environ.update(AVSIM_LEASE_NAME=os.environ['POD_NAME'], AVSIM_LEASE_NAMESPACE='avsim', AVSIM_HEARTBEAT_SECONDS='0.2')\n"
        "from avsim.phases.heartbeat import Heartbeat\n"
        "hb = Heartbeat.from_environ()\n"
        "for _ in range(50):\n    hb.beat(); time.sleep(0.1)\n"
    )
    healthy = make_pod(core, "beats", renew, lease=True)
    hung = make_pod(core, "hangs", "import time; time.sleep(60)", lease=True)
    # A lease of 3 s: long enough for a loaded machine to start the healthy phase's interpreter.
    events = run_all(trigger_for(healthy, lease_seconds=3.0), trigger_for(hung, lease_seconds=3.0))
    got = {e["pod"]: (e["outcome"], e["detail"]) for e in events}
    assert got[healthy] == ("passed", "")
    assert got[hung] == ("infra_failed", "lease_expired")
    renewed = client.CoordinationV1Api().read_namespaced_lease(healthy, NS).spec.renew_time
    assert renewed is not None, "the healthy phase renewed its Lease"


def test_many_waiting_phases_share_one_watch(kube: tuple[FakeKubeAPI, Any]) -> None:
    api, core = kube
    names = [make_pod(core, f"c{i}", "import time; time.sleep(2)") for i in range(40)]
    api.reset_calls()
    events = run_all(*(trigger_for(n) for n in names), timeout=120)
    assert {e["outcome"] for e in events} == {"passed"} and len(events) == 40
    calls = api.calls()
    total = sum(calls.values())
    # One list and one watch of pods and of leases (plus a resumed watch at most), not a poll per pod.
    assert total <= 8, calls


class _OutageWatch:
    """A shared watch (the boundary the trigger reads) that is healthy, then fails for ``outage``
    seconds from ``outage_at``, then shows the pod ``after``: the pod runs throughout."""

    def __init__(self, name: str, *, outage_at: float, outage: float, after: dict[str, Any]) -> None:
        import contextlib
        import time

        self._t0, self._name, self._at, self._outage, self._after = (
            time.monotonic(),
            name,
            outage_at,
            outage,
            after,
        )
        self._time = time.monotonic
        self.synced = True
        self.pods = self.leases = type("Store", (), {"items": {}, "deleted": set()})()
        self.pods.items[name] = {"metadata": {"name": name}, "status": {"phase": "Running"}}

        class Sub:
            async def wait(self, seconds: float) -> None:
                await asyncio.sleep(seconds)

        @contextlib.asynccontextmanager
        async def subscribe(*_: Any) -> Any:
            yield Sub()

        self.subscribe = subscribe

    @property
    def failing(self) -> str:
        since = self._time() - self._t0
        if since >= self._at + self._outage:
            self.pods.items[self._name] = self._after
        return "connection refused" if self._at <= since < self._at + self._outage else ""


_SUCCEEDED = {
    "status": {
        "phase": "Succeeded",
        "containerStatuses": [
            {"name": "base", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
        ],
    }
}


def test_an_api_outage_shorter_than_the_bound_does_not_end_a_long_wait() -> None:
    """The trigger gave up on the first failing check once it had waited 10 check intervals in all,
    so a 120 s API freeze ended every long phase's wait at once, and a worker that then read the pod
    still Running deleted it (test_faults: a live pod deleted under its attempt, ended watch_error).
    The bound is on how long the watch has been failing."""
    name = "avsim-c1-simulate-a1-0123456789"
    trigger = trigger_for(name, check_interval=0.02)  # the bound: 10 x 0.02 s of failing watch
    after = {"metadata": {"name": name}, **_SUCCEEDED}
    trigger.watch = lambda: _OutageWatch(name, outage_at=0.5, outage=0.12, after=after)  # type: ignore[method-assign]
    event = asyncio.run(first_event(trigger))
    assert (event["status"], event["outcome"]) == ("ended", "passed"), event


def test_a_longer_api_outage_ends_the_wait_with_an_error_after_the_bound() -> None:
    import time

    name = "avsim-c2-simulate-a1-0123456789"
    trigger = trigger_for(name, check_interval=0.02)
    trigger.watch = lambda: _OutageWatch(name, outage_at=0.3, outage=30, after={})  # type: ignore[method-assign]
    began = time.monotonic()
    event = asyncio.run(first_event(trigger))
    assert event["status"] == "error" and "keeps failing" in event["message"], event
    assert 0.3 + 0.2 <= time.monotonic() - began < 5
