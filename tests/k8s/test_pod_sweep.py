"""A shard run's ``summarize`` deletes the phase pods its cases left behind (issue 31's leak: a task marked
failed or success while deferred, before a triggerer took its trigger, keeps its pod until
``activeDeadlineSeconds``), against the loopback Kubernetes API through the real ``kubernetes`` client and
the provider's ``KubernetesHook``. Mocked: nothing (the pods are real processes of the API's kubelet)."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config
from tests.support.kube_api import FakeKubeAPI
from tests.support.kube_api.phases import phase_kube_api
from tests.support.kube_phase_start import SLEEP, pod_body

from avsim.kube import pods
from avsim.kube.pod_sweep import sweep_leftover_pods
from avsim.settings import KubernetesSettings

NAMESPACE = "sims"
RUN = "avsim_weekly/scheduled__2026-12-07"


@pytest.fixture
def kube(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKubeAPI]:
    with phase_kube_api(tmp_path, monkeypatch, NAMESPACE) as api:
        yield api


def _pod(
    v1: client.CoreV1Api, leases: client.CoordinationV1Api, run_key: str, case_id: str, attempt: int
) -> str:
    name = pods.pod_name(run_key, case_id, "simulate", attempt)
    labels = pods.attempt_labels(run_key, case_id, "simulate", attempt, "gpu-spot")
    v1.create_namespaced_pod(NAMESPACE, pod_body(name, SLEEP, labels=labels))
    leases.create_namespaced_lease(NAMESPACE, pods.lease_body(name, NAMESPACE, labels, 30))
    return name


def test_the_sweep_deletes_the_shards_leftover_pods_and_leases_and_nothing_else(
    kube: FakeKubeAPI, tmp_path: Path
) -> None:
    api = config.new_client_from_config(config_file=str(kube.write_kubeconfig(tmp_path / "own-kubeconfig")))
    v1, leases = client.CoreV1Api(api), client.CoordinationV1Api(api)
    left = [_pod(v1, leases, RUN, "c1", 1), _pod(v1, leases, RUN, "c2", 3)]
    kept = [
        _pod(v1, leases, RUN, "c9", 1),  # another shard's case
        _pod(v1, leases, "avsim_weekly/scheduled__2026-11-30", "c1", 1),  # another week's
    ]
    time.sleep(2.2)  # the API stamps whole seconds
    summarize_began = dt.datetime.now(dt.UTC)
    time.sleep(1.2)
    kept.append(_pod(v1, leases, RUN, "c1", 2))  # a try an engineer started since: not a leftover

    swept = sweep_leftover_pods(
        KubernetesSettings(conn_id="avsim_kube", namespace=NAMESPACE),
        RUN,
        ["c1", "c2", "c3"],
        summarize_began,
    )

    assert sorted(swept) == sorted(left)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(kube.pod(n, NAMESPACE) for n in left):
        time.sleep(0.2)
    assert [n for n in left if kube.pod(n, NAMESPACE)] == []
    assert sorted(p.metadata.name for p in v1.list_namespaced_pod(NAMESPACE).items) == sorted(kept)
    assert sorted(x.metadata.name for x in leases.list_namespaced_lease(NAMESPACE).items) == sorted(kept)
    # A second sweep finds nothing more (and a pod gone meanwhile is no error).
    assert (
        sweep_leftover_pods(
            KubernetesSettings(conn_id="avsim_kube", namespace=NAMESPACE), RUN, ["c1", "c2"], summarize_began
        )
        == []
    )


def test_leftover_pods_selects_by_case_and_creation_time() -> None:
    began = dt.datetime(2026, 12, 7, 12, 0, 10, tzinfo=dt.UTC)

    def pod(name: str, case_id: str, created: str | None) -> dict[str, object]:
        labels = pods.attempt_labels(RUN, case_id, "render", 1, "gpu-spot")
        return {"metadata": {"name": name, "labels": labels, "creationTimestamp": created}}

    listed = [
        pod("old", "c1", "2026-12-07T12:00:05Z"),
        pod("same-second-before", "c1", "2026-12-07T12:00:09Z"),  # may be newer than `began`: kept
        pod("new", "c1", "2026-12-07T12:00:11Z"),
        pod("other-case", "c7", "2026-12-07T12:00:01Z"),
        pod("no-stamp", "c1", None),
        pod("long-id", "c" * 80, "2026-12-07T12:00:01Z"),  # label values are cut and hashed
    ]
    assert pods.leftover_pods(listed, ["c1", "c" * 80], began) == ["old", "long-id"]


def test_a_phase_marked_failed_while_deferred_leaves_no_pod_once_its_shard_summarizes(
    tmp_path: Path, kube: FakeKubeAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real operator defers (its pod and Lease created); no triggerer ever runs its trigger (the
    user marked the task failed first: Airflow dropped the trigger). The shard's ``summarize`` on the
    Kubernetes backend deletes both; the summary is written all the same."""
    from tests.support.kube_phase_start import start_phase

    from avsim.contracts import RunDescriptor
    from avsim.dagbuild import tasks
    from avsim.dagbuild.factory import load_plan
    from avsim.dagbuild.prepare import prepare_week
    from avsim.ledger.store import Ledger
    from avsim.manifest.sample import sample_manifest
    from avsim.settings import AvsimSettings

    settings = AvsimSettings(shard_size=4, artifact_root=f"file://{tmp_path / 'artifacts'}")
    plan = load_plan(Path(__file__).resolve().parents[2] / "dags" / "avsim_graphs.yaml", settings)
    manifest = tmp_path / "week.json"
    manifest.write_text(json.dumps(sample_manifest(2, time_scale=1.0, scenario_fail_rate=0.0)))
    prepared = prepare_week(
        source=str(manifest), plan=plan, settings=settings, dag_id="avsim_weekly", run_id="w1"
    )
    conf = prepared["shards"][0]["conf"]
    case = tasks.load_shard(conf, plan)["cases_standard"][0]
    start_phase(prepared["run"], case, 1)
    [pod] = kube.pods(NAMESPACE)
    name = pod["metadata"]["name"]
    time.sleep(2.2)  # whole-second stamps: the pod is older than the summarize by more than its margin

    for key, value in {
        "BACKEND": "kubernetes",
        "KUBERNETES_CONN_ID": "avsim_kube",
        "KUBERNETES_NAMESPACE": NAMESPACE,
        "ARTIFACT_ROOT": settings.artifact_root,
    }.items():
        monkeypatch.setenv(f"AIRFLOW__AVSIM__{key}", value)
    with pytest.raises(Exception, match="need"):  # the shard needs attention: its phases never ended
        tasks.summarize(conf, plan)

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and kube.pod(name, NAMESPACE):
        time.sleep(0.2)
    assert kube.pod(name, NAMESPACE) is None
    api = config.new_client_from_config(config_file=str(kube.write_kubeconfig(tmp_path / "own-kubeconfig")))
    assert client.CoordinationV1Api(api).list_namespaced_lease(NAMESPACE).items == []
    run = prepared["run"]
    assert [s.shard for s in Ledger(RunDescriptor.model_validate(run).layout).shard_summaries()] == [1]
