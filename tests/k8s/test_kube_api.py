"""The fake Kubernetes API server, exercised through the real ``kubernetes`` and
``kubernetes_asyncio`` clients over HTTP (and, at the end, the stock KubernetesPodOperator)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config, watch
from tests.support.kube_api import FakeKubeAPI
from tests.support.kube_api.objects import PODS
from tests.support.kube_phase_start import SLEEP, pod_body

PY = sys.executable


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI(workdir=tmp_path / "kube", bookmark_interval=0.3) as api:
        yield api
    assert api.errors == []


@pytest.fixture
def kubeconfig(kube: FakeKubeAPI, tmp_path: Path) -> Path:
    return kube.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def api_client(kubeconfig: Path) -> Iterator[client.ApiClient]:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    with client.ApiClient(cfg) as api:
        yield api


@pytest.fixture
def v1(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


def status_of(exc: client.ApiException) -> dict[str, Any]:
    return json.loads(exc.body)


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (an orphan's zombie may wait for a busy init)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def terminated(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["status"]["containerStatuses"][0]["state"]["terminated"]


def condition(pod: dict[str, Any], ctype: str) -> dict[str, Any]:
    """The pod's condition of that type, or {} when it has none."""
    return next((c for c in pod["status"].get("conditions", []) if c["type"] == ctype), {})


def phase(kube: FakeKubeAPI, name: str) -> str | None:
    pod = kube.pod(name)
    return pod["status"]["phase"] if pod is not None else None


# -- discovery and auth ---------------------------------------------------------------------------


def test_discovery_documents_through_the_client(api_client: client.ApiClient) -> None:
    assert client.VersionApi(api_client).get_code().git_version.startswith("v1.31")
    assert client.CoreApi(api_client).get_api_versions().versions == ["v1"]
    core = {r.name: r for r in client.CoreV1Api(api_client).get_api_resources().resources}
    assert {"pods", "pods/log", "pods/status", "pods/eviction", "events"} <= set(core)
    assert "watch" in core["pods"].verbs and core["pods"].namespaced
    groups = client.ApisApi(api_client).get_api_versions().groups
    assert [g.name for g in groups] == ["coordination.k8s.io"]
    assert client.CoordinationApi(api_client).get_api_group().preferred_version.version == "v1"
    leases = client.CoordinationV1Api(api_client).get_api_resources()
    assert leases.group_version == "coordination.k8s.io/v1"
    assert [r.kind for r in leases.resources] == ["Lease"]


def test_wrong_token_is_401_with_a_status_body(kube: FakeKubeAPI) -> None:
    request = urllib.request.Request(f"{kube.url}/api/v1/namespaces/default/pods")
    request.add_header("Authorization", "Bearer nope")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request)
    assert err.value.code == 401
    assert json.loads(err.value.read())["reason"] == "Unauthorized"


# -- CRUD, selectors, errors ----------------------------------------------------------------------


def test_create_get_list_with_selectors_and_error_bodies(kube: FakeKubeAPI, v1: client.CoreV1Api) -> None:
    for name, labels in [("a", {"app": "sim", "tier": "gpu"}), ("b", {"app": "sim"}), ("c", {"app": "eval"})]:
        created = v1.create_namespaced_pod("default", pod_body(name, SLEEP, labels=labels))
        assert (
            created.metadata.uid and created.metadata.resource_version and created.metadata.creation_timestamp
        )
        assert created.status.phase == "Pending"

    with pytest.raises(client.ApiException) as err:
        v1.create_namespaced_pod("default", pod_body("a"))
    assert err.value.status == 409
    assert status_of(err.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "a" already exists',
        "reason": "AlreadyExists",
        "details": {"name": "a", "kind": "pods"},
        "code": 409,
    }

    def names(**kw: str) -> list[str]:
        return [p.metadata.name for p in v1.list_namespaced_pod("default", **kw).items]

    assert names() == ["a", "b", "c"]
    assert names(label_selector="app=sim") == ["a", "b"]
    assert names(label_selector="app==sim,tier") == ["a"]
    assert names(label_selector="app!=sim") == ["c"]
    assert names(label_selector="tier!=gpu") == ["b", "c"]  # != also selects pods without the label
    assert names(label_selector="app in (eval, other)") == ["c"]
    assert names(label_selector="app notin (eval),!tier") == ["b"]
    assert names(field_selector="metadata.name=b") == ["b"]
    assert [p.metadata.name for p in v1.list_pod_for_all_namespaces(label_selector="app=eval").items] == ["c"]
    kube.wait_for_pod("c", phase="Running")
    assert "c" in names(field_selector="status.phase=Running")

    with pytest.raises(client.ApiException) as err:
        v1.list_namespaced_pod("default", field_selector="spec.bogus=1")
    assert (
        err.value.status == 400 and status_of(err.value)["message"] == "field label not supported: spec.bogus"
    )
    with pytest.raises(client.ApiException) as err:
        v1.read_namespaced_pod("missing", "default")
    assert status_of(err.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "missing" not found',
        "reason": "NotFound",
        "details": {"name": "missing", "kind": "pods"},
        "code": 404,
    }
    with pytest.raises(client.ApiException) as err:
        v1.create_namespaced_pod(
            "default", {"metadata": {"name": "nocontainers"}, "spec": {"containers": []}}
        )
    assert err.value.status == 422
    assert status_of(err.value)["details"]["causes"][0]["field"] == "spec.containers"

    page = v1.list_namespaced_pod("default", limit=2)
    assert len(page.items) == 2 and page.metadata._continue
    rest = v1.list_namespaced_pod("default", limit=2, _continue=page.metadata._continue)
    assert [p.metadata.name for p in rest.items] == ["c"]


def test_patch_labels_and_delete_collection(kube: FakeKubeAPI, v1: client.CoreV1Api) -> None:
    for name in ("p1", "p2", "p3"):
        v1.create_namespaced_pod("default", pod_body(name, SLEEP, labels={"run": "r1"}))
    patched = v1.patch_namespaced_pod("p1", "default", {"metadata": {"labels": {"already_checked": "True"}}})
    assert patched.metadata.labels == {"run": "r1", "already_checked": "True"}
    patched = v1.patch_namespaced_pod(
        "p1", "default", [{"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}}]
    )
    assert patched.metadata.annotations == {"a": "b"}
    with pytest.raises(client.ApiException) as err:
        v1.patch_namespaced_pod("p1", "default", {"spec": {"restartPolicy": "Always"}})
    assert err.value.status == 422
    kube.wait_for_pod("p3", phase="Running")
    v1.delete_collection_namespaced_pod(
        "default", label_selector="run=r1,already_checked!=True", grace_period_seconds=0
    )
    assert [p["metadata"]["name"] for p in kube.pods()] == ["p1"]


def test_delete_honours_the_grace_period_then_the_pod_is_gone(
    kube: FakeKubeAPI, v1: client.CoreV1Api
) -> None:
    # A process that ignores SIGTERM: the fake must SIGKILL it once the grace period is over.
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    v1.create_namespaced_pod("default", pod_body("stubborn", code))
    kube.wait_for_pod("stubborn", phase="Running", predicate=lambda p: "up" in kube.logs("stubborn"))
    pid = kube.process_of("stubborn")
    assert pid is not None and alive(pid)
    started = time.monotonic()
    deleted = v1.delete_namespaced_pod("stubborn", "default", grace_period_seconds=1)
    assert (
        deleted.metadata.deletion_timestamp is not None
        and deleted.metadata.deletion_grace_period_seconds == 1
    )
    time.sleep(0.5)
    assert alive(pid) and kube.pod("stubborn") is not None  # Terminating: still there within the grace
    kube.wait_for_pod("stubborn", gone=True, timeout=5)
    assert time.monotonic() - started >= 1.0
    assert not alive(pid)
    with pytest.raises(client.ApiException) as err:
        v1.read_namespaced_pod("stubborn", "default")
    assert err.value.status == 404
    reasons = [e["reason"] for e in kube.events_for("stubborn")]
    assert reasons[:1] == ["Scheduled"] or "Killing" in reasons


# -- pod lifecycle, env, logs ---------------------------------------------------------------------


def test_pod_runs_its_command_to_succeeded_with_the_injected_environment(
    kube: FakeKubeAPI, v1: client.CoreV1Api, tmp_path: Path
) -> None:
    code = (
        "import json, os; keys = ['CASE_ID', 'AVSIM_KUBE_API_URL', 'AVSIM_KUBE_TOKEN', 'POD_NAME', "
        "'POD_NAMESPACE', 'PATH', 'FROM_FIELD']; print(json.dumps({k: os.environ.get(k) for k in keys}))"
    )
    body = pod_body("ok", code, env={"CASE_ID": "c7"})
    body["spec"]["containers"][0]["env"].append(
        {"name": "FROM_FIELD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    )
    v1.create_namespaced_pod("ns1", body)
    pod = kube.wait_for_pod("ok", "ns1", phase="Succeeded")
    assert pod is not None
    state = terminated(pod)
    assert state["exitCode"] == 0 and state["reason"] == "Completed"
    assert state["startedAt"] and state["finishedAt"]
    assert {c["type"]: c["status"] for c in pod["status"]["conditions"]} == {
        "PodReadyToStartContainers": "False",
        "Initialized": "True",
        "Ready": "False",
        "ContainersReady": "False",
        "PodScheduled": "True",
    }
    # _preload_content=False: the client would json-decode a log that happens to be JSON.
    env = json.loads(v1.read_namespaced_pod_log("ok", "ns1", _preload_content=False).data)
    assert env["CASE_ID"] == "c7" and env["POD_NAME"] == "ok" and env["POD_NAMESPACE"] == "ns1"
    assert env["AVSIM_KUBE_API_URL"] == kube.url and env["AVSIM_KUBE_TOKEN"] == kube.token
    assert env["PATH"] == os.environ["PATH"] and env["FROM_FIELD"] == "ok"
    assert v1.read_namespaced_pod("ok", "ns1").status.phase == "Succeeded"  # terminal status is kept


def test_failed_pod_reports_its_exit_code_and_log_tail(kube: FakeKubeAPI, v1: client.CoreV1Api) -> None:
    body = pod_body("bad", "import sys; print('boom'); sys.exit(3)")
    body["spec"]["containers"][0]["terminationMessagePolicy"] = "FallbackToLogsOnError"
    v1.create_namespaced_pod("default", body)
    pod = kube.wait_for_pod("bad", phase="Failed")
    assert pod is not None
    assert terminated(pod) | {"startedAt": None, "finishedAt": None, "containerID": None} == {
        "exitCode": 3,
        "reason": "Error",
        "message": "boom\n",
        "startedAt": None,
        "finishedAt": None,
        "containerID": None,
    }


def test_logs_tail_timestamps_since_and_follow(kube: FakeKubeAPI, v1: client.CoreV1Api) -> None:
    code = "import time\nfor i in range(5):\n    print('line', i, flush=True)\n    time.sleep(0.3)"
    v1.create_namespaced_pod("default", pod_body("talk", code))
    kube.wait_for_pod("talk", phase="Running")
    followed = v1.read_namespaced_pod_log("talk", "default", follow=True, _preload_content=False)
    chunks = [bytes(c) for c in followed.stream(amt=None)]
    assert b"".join(chunks) == b"".join(f"line {i}\n".encode() for i in range(5))
    assert len(chunks) > 1  # streamed as the lines were written, not at the end
    tail = v1.read_namespaced_pod_log(
        "talk", "default", tail_lines=2, timestamps=True, _preload_content=False
    )
    lines = tail.data.decode().splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == ["line 3", "line 4"]
    assert lines[0].split(" ")[0].endswith("Z") and len(lines[0].split(" ")[0]) == 30  # RFC3339Nano
    time.sleep(1.2)
    assert v1.read_namespaced_pod_log("talk", "default", since_seconds=1, _preload_content=False).data == b""
    with pytest.raises(client.ApiException) as err:
        v1.read_namespaced_pod_log("talk", "default", container="nope")
    assert err.value.status == 400


def test_active_deadline_fails_the_pod_with_deadline_exceeded(
    kube: FakeKubeAPI, v1: client.CoreV1Api
) -> None:
    v1.create_namespaced_pod(
        "default", pod_body("slow", SLEEP, activeDeadlineSeconds=1, terminationGracePeriodSeconds=1)
    )
    pod = kube.wait_for_pod("slow", phase="Failed", timeout=10)
    assert pod is not None
    assert pod["status"]["reason"] == "DeadlineExceeded"
    assert pod["status"]["message"] == "Pod was active on the node longer than the specified deadline"
    assert terminated(pod)["exitCode"] == 143  # SIGTERM


# -- watch ----------------------------------------------------------------------------------------


def test_watch_sees_added_modified_deleted_in_order_and_resumes(
    kube: FakeKubeAPI, v1: client.CoreV1Api
) -> None:
    start_rv = v1.list_namespaced_pod("default").metadata.resource_version
    v1.create_namespaced_pod("default", pod_body("w1", "print('hi')"))
    kube.wait_for_pod("w1", phase="Succeeded")
    v1.delete_namespaced_pod("w1", "default")
    kube.wait_for_pod("w1", gone=True)

    seen: list[tuple[str, str, str | None]] = []
    stream = watch.Watch().stream(
        v1.list_namespaced_pod, "default", resource_version=start_rv, timeout_seconds=2
    )
    for event in stream:
        obj = event["object"]
        seen.append((event["type"], obj.metadata.resource_version, obj.status.phase))
        if event["type"] == "DELETED":
            break
    types = [t for t, _, _ in seen]
    assert types[0] == "ADDED" and types[-1] == "DELETED" and set(types[1:-1]) == {"MODIFIED"}
    rvs = [int(rv) for _, rv, _ in seen]
    assert rvs == sorted(rvs) and len(set(rvs)) == len(rvs)
    phases = [p for _, _, p in seen]
    assert phases.index("Running") < phases.index("Succeeded")

    middle = seen[len(seen) // 2]
    resumed = [
        (e["type"], e["object"].metadata.resource_version)
        for e in watch.Watch().stream(
            v1.list_namespaced_pod, "default", resource_version=middle[1], timeout_seconds=1
        )
    ]
    assert resumed == [(t, rv) for t, rv, _ in seen[len(seen) // 2 + 1 :]]


def test_watch_with_selectors_sees_objects_enter_and_leave(kube: FakeKubeAPI, v1: client.CoreV1Api) -> None:
    events: list[tuple[str, str]] = []

    def watch_running() -> None:
        for event in watch.Watch().stream(
            v1.list_namespaced_pod,
            "default",
            field_selector="status.phase=Running",
            label_selector="case=c1",
            timeout_seconds=3,
        ):
            events.append((event["type"], event["object"].metadata.name))

    thread = threading.Thread(target=watch_running)
    thread.start()
    time.sleep(0.3)
    v1.create_namespaced_pod(
        "default", pod_body("other", "import time; time.sleep(0.5)", labels={"case": "c2"})
    )
    v1.create_namespaced_pod(
        "default", pod_body("sel", "import time; time.sleep(0.5)", labels={"case": "c1"})
    )
    thread.join()
    # Entering status.phase=Running is ADDED for this watch; leaving it (Succeeded) is DELETED.
    assert events == [("ADDED", "sel"), ("DELETED", "sel")]


def test_too_old_resource_version_is_410_gone(tmp_path: Path) -> None:
    with FakeKubeAPI(workdir=tmp_path, history_size=5) as kube:
        kubeconfig = kube.write_kubeconfig(tmp_path / "kc")
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        leases = client.CoordinationV1Api(client.ApiClient(cfg))
        for i in range(10):
            leases.create_namespaced_lease("default", {"metadata": {"name": f"l{i}"}, "spec": {}})
        with pytest.raises(client.ApiException) as err:
            list(
                watch.Watch().stream(
                    leases.list_namespaced_lease, "default", resource_version="2", timeout_seconds=1
                )
            )
        assert err.value.status == 410 and "Expired: too old resource version: 2" in err.value.reason
        raw = urllib.request.Request(
            f"{kube.url}/apis/coordination.k8s.io/v1/leases?watch=1&resourceVersion=1"
        )
        raw.add_header("Authorization", f"Bearer {kube.token}")
        with urllib.request.urlopen(raw) as response:
            line = json.loads(response.readline())
        assert line["type"] == "ERROR"
        assert line["object"] == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "too old resource version: 1 (6)",
            "reason": "Expired",
            "code": 410,
        }


def test_bookmarks_and_watch_timeout(kube: FakeKubeAPI, v1: client.CoreV1Api) -> None:
    v1.create_namespaced_pod("default", pod_body("bm", SLEEP))
    kube.wait_for_pod("bm", phase="Running")
    rv = v1.list_namespaced_pod("default").metadata.resource_version
    started = time.monotonic()
    types = [
        e["type"]
        for e in watch.Watch().stream(
            v1.list_namespaced_pod,
            "default",
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=1,
        )
    ]
    assert 0.9 < time.monotonic() - started < 3
    assert types and set(types) == {"BOOKMARK"}


def test_hundred_concurrent_watches_then_no_leaked_threads_or_processes(tmp_path: Path) -> None:
    baseline = threading.active_count()
    kube = FakeKubeAPI(workdir=tmp_path / "kube").start()
    try:
        kubeconfig = kube.write_kubeconfig(tmp_path / "kc")
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        cfg.connection_pool_maxsize = 128
        api_client = client.ApiClient(cfg)
        v1 = client.CoreV1Api(api_client)
        counts: list[int] = []
        ready = threading.Barrier(101)

        def watcher() -> None:
            n = 0
            stream = watch.Watch().stream(
                v1.list_namespaced_pod, "default", resource_version="1", timeout_seconds=8
            )
            ready.wait()
            for event in stream:
                n += 1
                if event["type"] == "DELETED" and event["object"].metadata.name == "last":
                    break
            counts.append(n)

        v1.create_namespaced_pod("default", pod_body("first", SLEEP))
        threads = [threading.Thread(target=watcher) for _ in range(100)]
        for t in threads:
            t.start()
        ready.wait()
        for i in range(3):
            v1.create_namespaced_pod("default", pod_body(f"p{i}", "print(1)"))
        v1.create_namespaced_pod("default", pod_body("last", "print(1)"))
        kube.wait_for_pod("last", phase="Succeeded")
        v1.delete_namespaced_pod("last", "default")
        for t in threads:
            t.join(timeout=20)
        assert len(counts) == 100 and len(set(counts)) == 1 and counts[0] >= 20
        assert kube.call_count(verb="watch", resource="pods") == 100
        assert kube.watch_events_sent >= 100 * counts[0]
        pid = kube.process_of("first")
        api_client.close()
    finally:
        kube.stop()
    assert pid is not None and not alive(pid)
    deadline = time.monotonic() + 5
    while threading.active_count() > baseline and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= baseline
    assert kube.open_connections == 0 and kube.active_watches == 0


def test_stop_kills_every_process_group_it_started(tmp_path: Path) -> None:
    with FakeKubeAPI(workdir=tmp_path) as kube:
        tree = {
            "metadata": {"name": "tree"},
            "spec": {
                "containers": [
                    {
                        "name": "base",
                        "image": "busybox:1",
                        "command": ["sh", "-c", "sleep 60 & echo $!; wait"],
                    }
                ]
            },
        }
        kube.verbs.create(PODS, "default", tree)
        kube.wait_for_pod("tree", predicate=lambda p: kube.logs("tree").strip().isdigit())
        leader, child = kube.process_of("tree"), int(kube.logs("tree"))
        assert leader is not None and alive(leader) and alive(child)
    assert not alive(leader) and not alive(child)
    assert kube.started_pids() == []


# -- leases ---------------------------------------------------------------------------------------


def test_lease_crud_conflict_and_watch(kube: FakeKubeAPI, api_client: client.ApiClient) -> None:
    leases = client.CoordinationV1Api(api_client)
    rv0 = leases.list_namespaced_lease("default").metadata.resource_version
    body = {
        "metadata": {"name": "case-c7", "labels": {"run": "w1"}},
        "spec": {
            "holderIdentity": "pod-a",
            "leaseDurationSeconds": 15,
            "renewTime": "2026-01-01T00:00:00.000000Z",
        },
    }
    created = leases.create_namespaced_lease("default", body)
    assert created.spec.holder_identity == "pod-a" and created.spec.lease_duration_seconds == 15
    got = leases.read_namespaced_lease("case-c7", "default")
    got.spec.renew_time = None
    got.spec.holder_identity = "pod-b"
    replaced = leases.replace_namespaced_lease("case-c7", "default", got)
    assert int(replaced.metadata.resource_version) > int(created.metadata.resource_version)

    created.spec.holder_identity = "pod-c"  # stale resourceVersion
    with pytest.raises(client.ApiException) as err:
        leases.replace_namespaced_lease("case-c7", "default", created)
    assert err.value.status == 409
    assert status_of(err.value)["message"] == (
        'Operation cannot be fulfilled on leases.coordination.k8s.io "case-c7": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    assert status_of(err.value)["details"] == {
        "name": "case-c7",
        "group": "coordination.k8s.io",
        "kind": "leases",
    }

    patched = leases.patch_namespaced_lease(
        "case-c7",
        "default",
        {"spec": {"renewTime": "2026-01-01T00:00:05.000000Z", "leaseDurationSeconds": 30}},
    )
    assert patched.spec.lease_duration_seconds == 30 and patched.spec.holder_identity == "pod-b"
    assert [
        x.metadata.name for x in leases.list_namespaced_lease("default", label_selector="run=w1").items
    ] == ["case-c7"]
    leases.delete_namespaced_lease("case-c7", "default")
    with pytest.raises(client.ApiException) as err:
        leases.read_namespaced_lease("case-c7", "default")
    assert err.value.status == 404
    assert status_of(err.value)["message"] == 'leases.coordination.k8s.io "case-c7" not found'

    types = [
        e["type"]
        for e in watch.Watch().stream(
            leases.list_lease_for_all_namespaces, resource_version=rv0, timeout_seconds=1
        )
    ]
    assert types == ["ADDED", "MODIFIED", "MODIFIED", "DELETED"]


# -- faults ---------------------------------------------------------------------------------------


def test_evict_fault_leaves_an_evicted_failed_pod(kube: FakeKubeAPI, v1: client.CoreV1Api) -> None:
    kube.add_fault("evict", match={"env": {"CASE_ID": "c7", "PHASE": "simulate"}}, after_seconds=0.2)
    v1.create_namespaced_pod("default", pod_body("other", SLEEP, env={"CASE_ID": "c8", "PHASE": "simulate"}))
    v1.create_namespaced_pod("default", pod_body("victim", SLEEP, env={"CASE_ID": "c7", "PHASE": "simulate"}))
    pod = kube.wait_for_pod("victim", phase="Failed")
    assert pod is not None
    assert pod["status"]["reason"] == "Evicted"
    assert pod["status"]["message"].startswith("The node was low on resource: memory.")
    disruption = condition(pod, "DisruptionTarget")
    assert disruption["status"] == "True"
    assert disruption["reason"] == "TerminationByKubelet"
    assert terminated(pod)["exitCode"] == 137
    assert phase(kube, "other") == "Running"
    assert kube.faults()[0].claimed == ["default/victim"]
    assert "Evicted" in [e["reason"] for e in kube.events_for("victim")]


def test_evict_via_the_eviction_api_removes_the_pod(kube: FakeKubeAPI, v1: client.CoreV1Api) -> None:
    kube.add_fault("evict", match={"name": "drain-*"}, after_seconds=0.3, via="api", grace_seconds=1)
    ignore_term = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    v1.create_namespaced_pod("default", pod_body("drain-1", ignore_term))
    seen = kube.wait_for_pod("drain-1", predicate=lambda p: bool(condition(p, "DisruptionTarget")))
    assert seen is not None and condition(seen, "DisruptionTarget")["reason"] == "EvictionByEvictionAPI"
    assert seen["metadata"].get("deletionTimestamp")
    kube.wait_for_pod("drain-1", gone=True, timeout=5)


def test_preempt_fault_terminates_like_a_node_shutdown(kube: FakeKubeAPI, v1: client.CoreV1Api) -> None:
    kube.add_fault("preempt", match={"labels": {"spot": "yes"}}, after_seconds=0.2, grace_seconds=0.5)
    v1.create_namespaced_pod("default", pod_body("spot", SLEEP, labels={"spot": "yes"}))
    pod = kube.wait_for_pod("spot", phase="Failed")
    assert pod is not None
    assert pod["status"]["reason"] == "Terminated"
    assert pod["status"]["message"] == "Pod was terminated in response to imminent node shutdown."
    assert condition(pod, "DisruptionTarget")["reason"] == "TerminationByKubelet"
    assert terminated(pod)["exitCode"] == 143  # the process took its SIGTERM


def test_node_loss_marks_then_removes_the_pod(kube: FakeKubeAPI, v1: client.CoreV1Api) -> None:
    kube.add_fault("node_loss", match={"name": "lost"}, after_seconds=0.2, mark_seconds=0.3)
    v1.create_namespaced_pod("default", pod_body("lost", SLEEP))
    kube.wait_for_pod("lost", phase="Running")
    pid = kube.process_of("lost")
    marked = kube.wait_for_pod("lost", predicate=lambda p: bool(condition(p, "DisruptionTarget")))
    assert marked is not None and condition(marked, "DisruptionTarget")["reason"] == "DeletionByTaintManager"
    kube.wait_for_pod("lost", gone=True)
    assert pid is not None and not alive(pid)


def test_node_lost_stuck_leaves_the_pod_terminating_until_it_is_force_deleted(
    kube: FakeKubeAPI, v1: client.CoreV1Api
) -> None:
    kube.add_fault("node_lost_stuck", match={"name": "stuck"}, after_seconds=0.2, grace_seconds=1)
    v1.create_namespaced_pod("default", pod_body("stuck", SLEEP))
    kube.wait_for_pod("stuck", phase="Running")
    pid = kube.process_of("stuck")
    marked = kube.wait_for_pod("stuck", predicate=lambda p: bool(p["metadata"].get("deletionTimestamp")))
    assert marked is not None and condition(marked, "DisruptionTarget")["reason"] == "DeletionByTaintManager"
    assert condition(marked, "Ready")["status"] == "False"
    assert pid is not None and not alive(pid)
    # Nobody reports on it: its container still reads as running, the pod as Running, well past
    # its deletion time, and a graceful delete changes nothing.
    time.sleep(2.0)
    v1.delete_namespaced_pod("stuck", "default", grace_period_seconds=1)
    time.sleep(1.5)
    pod = v1.read_namespaced_pod("stuck", "default")
    assert pod.status.phase == "Running" and pod.status.container_statuses[0].state.running is not None
    assert pod.metadata.deletion_timestamp is not None
    # A force delete (grace 0) removes it, as the API server does without the kubelet.
    v1.delete_namespaced_pod("stuck", "default", grace_period_seconds=0)
    kube.wait_for_pod("stuck", gone=True, timeout=5)


def test_vanish_deletes_at_once_and_kills_the_process(kube: FakeKubeAPI, v1: client.CoreV1Api) -> None:
    kube.add_fault("vanish", match={"name": "ghost"}, after_seconds=0.2)
    rv = v1.list_namespaced_pod("default").metadata.resource_version
    v1.create_namespaced_pod("default", pod_body("ghost", SLEEP))
    kube.wait_for_pod("ghost", phase="Running")
    pid = kube.process_of("ghost")
    kube.wait_for_pod("ghost", gone=True)
    with pytest.raises(client.ApiException) as err:
        v1.read_namespaced_pod("ghost", "default")
    assert err.value.status == 404
    events = list(
        watch.Watch().stream(v1.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=1)
    )
    assert events[-1]["type"] == "DELETED" and events[-1]["object"].status.phase == "Running"
    assert pid is not None and not alive(pid)


def test_oom_and_exit_code_faults(kube: FakeKubeAPI, v1: client.CoreV1Api) -> None:
    kube.add_fault("oom", match={"name": "hungry"}, after_seconds=0.1)
    kube.add_fault("exit_code", match={"name": "flaky"}, after_seconds=0.1, exit_code=42)
    v1.create_namespaced_pod("default", pod_body("hungry", SLEEP))
    v1.create_namespaced_pod("default", pod_body("flaky", SLEEP))
    oom = kube.wait_for_pod("hungry", phase="Failed")
    assert oom is not None and terminated(oom)["reason"] == "OOMKilled" and terminated(oom)["exitCode"] == 137
    flaky = kube.wait_for_pod("flaky", phase="Failed")
    assert (
        flaky is not None and terminated(flaky)["exitCode"] == 42 and terminated(flaky)["reason"] == "Error"
    )


def test_image_pull_error_never_starts(kube: FakeKubeAPI, v1: client.CoreV1Api) -> None:
    kube.add_fault("image_pull_error", match={"image": "avsim/sim:*"}, backoff_after_seconds=0.3)
    v1.create_namespaced_pod("default", pod_body("nopull", "print('never')"))

    def waiting_reason(pod: dict[str, Any]) -> str | None:
        return (
            (pod["status"].get("containerStatuses") or [{}])[0]
            .get("state", {})
            .get("waiting", {})
            .get("reason")
        )

    err = kube.wait_for_pod("nopull", predicate=lambda p: waiting_reason(p) == "ErrImagePull")
    assert (
        err is not None
        and 'failed to pull and unpack image "avsim/sim:1"'
        in (err["status"]["containerStatuses"][0]["state"]["waiting"]["message"])
    )
    backoff = kube.wait_for_pod("nopull", predicate=lambda p: waiting_reason(p) == "ImagePullBackOff")
    assert backoff is not None and backoff["status"]["phase"] == "Pending"
    assert backoff["status"]["containerStatuses"][0]["state"]["waiting"]["message"] == (
        'Back-off pulling image "avsim/sim:1"'
    )
    assert kube.process_of("nopull") is None and kube.logs("nopull") == ""


def test_hang_freezes_the_process_until_deleted(kube: FakeKubeAPI, v1: client.CoreV1Api) -> None:
    code = "import time\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.05)"
    kube.add_fault("hang", match={"name": "frozen"}, after_seconds=0.3)
    v1.create_namespaced_pod("default", pod_body("frozen", code, terminationGracePeriodSeconds=1))
    kube.wait_for_pod("frozen", phase="Running")
    time.sleep(0.6)
    before = kube.logs("frozen")
    time.sleep(0.4)
    assert kube.logs("frozen") == before and before.count("tick") > 1
    pid = kube.process_of("frozen")
    assert pid is not None and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    assert phase(kube, "frozen") == "Running"
    v1.delete_namespaced_pod("frozen", "default")
    kube.wait_for_pod("frozen", gone=True, timeout=5)
    assert not alive(pid)


def test_slow_start_keeps_the_pod_pending(kube: FakeKubeAPI, v1: client.CoreV1Api) -> None:
    kube.add_fault("slow_start", match={"labels": {"slow": "1"}}, after_seconds=0.8, times=2)
    created = time.monotonic()
    for name in ("s1", "s2", "s3"):
        v1.create_namespaced_pod("default", pod_body(name, SLEEP, labels={"slow": "1"}))
    kube.wait_for_pod("s3", phase="Running")
    assert phase(kube, "s1") == "Pending"  # times=2: s3 was not slowed
    kube.wait_for_pod("s1", phase="Running")
    assert time.monotonic() - created >= 0.8
    assert kube.faults()[0].claimed == ["default/s1", "default/s2"]


def test_faults_posted_over_http_and_loaded_from_a_file(kube: FakeKubeAPI, tmp_path: Path) -> None:
    rules = [{"kind": "exit_code", "match": {"env": {"ATTEMPT": "1"}}, "exit_code": 7, "times": 3}]
    request = urllib.request.Request(
        f"{kube.url}/_fake/faults", data=json.dumps({"faults": rules}).encode(), method="POST"
    )
    request.add_header("Authorization", f"Bearer {kube.token}")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request) as response:
        assert response.status == 201 and json.loads(response.read())["faults"][0]["exit_code"] == 7
    path = tmp_path / "faults.json"
    path.write_text(json.dumps([{"kind": "oom", "match": {"name": "x"}, "after_seconds": 1}]))
    kube.load_faults(path)
    assert [(r.kind, r.times, r.params) for r in kube.faults()] == [
        ("exit_code", 3, {"exit_code": 7}),
        ("oom", 1, {}),
    ]
    with pytest.raises(ValueError, match="unknown fault kind"):
        kube.add_fault("meteor")


# -- kubernetes_asyncio ---------------------------------------------------------------------------


def test_kubernetes_asyncio_client_create_watch_logs(kube: FakeKubeAPI, kubeconfig: Path) -> None:
    from kubernetes_asyncio import client as aclient
    from kubernetes_asyncio import config as aconfig
    from kubernetes_asyncio import watch as awatch

    async def scenario() -> tuple[list[str], str, int]:
        cfg = aclient.Configuration()
        await aconfig.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        async with aclient.ApiClient(cfg) as api:
            v1 = aclient.CoreV1Api(api)
            body = pod_body("aio", "print('from asyncio')")
            created = await v1.create_namespaced_pod("default", body)  # type: ignore[arg-type]  # dict bodies are sent as is
            phases = []
            async with awatch.Watch().stream(
                v1.list_namespaced_pod,
                "default",
                field_selector="metadata.name=aio",
                resource_version=created.metadata.resource_version,
                timeout_seconds=5,
            ) as stream:
                async for event in stream:
                    phases.append(event["object"].status.phase)
                    if event["object"].status.phase == "Succeeded":
                        break
            logs = await v1.read_namespaced_pod_log("aio", "default")
            await v1.delete_namespaced_pod("aio", "default")
            try:
                await v1.read_namespaced_pod("never", "default")
            except aclient.ApiException as exc:
                return phases, logs, exc.status
        raise AssertionError("expected a 404")

    phases, logs, status = asyncio.run(scenario())
    assert phases[0] == "Pending" and phases[-1] == "Succeeded" and "Running" in phases
    assert logs == "from asyncio\n" and status == 404


# -- standalone entry point -----------------------------------------------------------------------


def test_module_entry_point_prints_the_url_and_writes_a_kubeconfig(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [PY, "-m", "tests.support.kube_api", "--port", "0", "--workdir", str(tmp_path)],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(tmp_path / "kubeconfig"), client_configuration=cfg)
        assert cfg.host == url
        with client.ApiClient(cfg) as api:
            assert client.CoreV1Api(api).list_namespaced_pod("default").items == []
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0


# -- the stock cncf.kubernetes provider -----------------------------------------------------------


class _HandBuiltTI:
    """Hand-built stand-in for the task instance in the context (no metadata DB): the attributes
    the operator reads for pod labels, ``xcom_push`` and ``start_date``. Everything the operator
    does against Kubernetes goes to the fake API server over HTTP through KubernetesHook."""

    dag_id = "avsim_kpo"
    task_id = "simulate"
    map_index = 7
    try_number = 1

    def __init__(self) -> None:
        import datetime as dt

        self.start_date = dt.datetime.now(dt.UTC)
        self.xcom: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = value


def _hand_built_context() -> dict[str, Any]:
    # Hand-built: ti (above), run_id and dag; the operator reads nothing else in these paths.
    return {
        "ti": _HandBuiltTI(),
        "run_id": "manual__2026-01-05",
        "dag": type("Dag", (), {"dag_id": "avsim_kpo"})(),
    }


@pytest.fixture
def kpo_conn(kube: FakeKubeAPI, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    for key, value in kube.airflow_conn_env("avsim_kube", kubeconfig, namespace="sims").items():
        monkeypatch.setenv(key, value)
    return "avsim_kube"


def _kpo(conn_id: str, code: str, *, name: str = "sim-c7", case: str = "c7", **kwargs: Any) -> Any:
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    return KubernetesPodOperator(
        task_id="simulate",
        kubernetes_conn_id=conn_id,
        image="avsim/sim:1",
        cmds=[PY, "-c"],
        arguments=[code],
        env_vars={"CASE_ID": case, "PHASE": "simulate"},
        name=name,
        get_logs=True,
        **kwargs,
    )


CASE = "import os, time\nfor i in range(3):\n    print('step', i, os.environ['CASE_ID'], flush=True)\n    time.sleep(0.2)"


def test_stock_kubernetes_pod_operator_sync_runs_to_completion(
    kube: FakeKubeAPI, kpo_conn: str, kubeconfig: Path
) -> None:
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    assert KubernetesHook(conn_id=kpo_conn).core_v1_client.list_namespaced_pod("sims").items == []
    by_file = KubernetesHook(config_file=str(kubeconfig))
    assert by_file.get_namespace() is None and by_file.is_in_cluster is False
    assert by_file.core_v1_client.list_namespaced_pod("sims").items == []
    context = _hand_built_context()
    _kpo(kpo_conn, CASE, on_finish_action="keep_pod").execute(context)
    (pod,) = kube.pods("sims")
    assert context["ti"].xcom == {"pod_name": pod["metadata"]["name"], "pod_namespace": "sims"}
    assert pod["status"]["phase"] == "Succeeded"
    labels = pod["metadata"]["labels"]
    assert labels["dag_id"] == "avsim_kpo" and labels["map_index"] == "7" and labels["try_number"] == "1"
    assert kube.logs(pod["metadata"]["name"], "sims") == "".join(f"step {i} c7\n" for i in range(3))
    assert kube.call_count("create", "pods") == 1 and kube.call_count("get", "pods", "log") >= 1
    assert kube.call_count("list", "pods") >= 2  # find_pod by labels, including `!=` and `!key`

    kube.add_fault("oom", match={"env": {"CASE_ID": "c8"}}, after_seconds=0.3)
    from airflow.exceptions import AirflowException

    failing = _kpo(kpo_conn, SLEEP, on_finish_action="delete_succeeded_pod", name="sim-c8", case="c8")
    with pytest.raises(AirflowException, match="returned a failure"):
        failing.execute(_hand_built_context())
    (oom,) = [p for p in kube.pods("sims") if p["metadata"]["name"].startswith("sim-c8")]
    assert terminated(oom)["reason"] == "OOMKilled"
    assert oom["metadata"]["labels"]["already_checked"] == "True"  # the operator's patch_already_checked


def test_stock_kubernetes_pod_trigger_drives_a_deferred_pod(kube: FakeKubeAPI, kpo_conn: str) -> None:
    from airflow.providers.cncf.kubernetes.triggers.pod import KubernetesPodTrigger
    from airflow.sdk.exceptions import TaskDeferred

    kube.add_fault("slow_start", match={"env": {"CASE_ID": "c7"}}, after_seconds=1.5)
    context = _hand_built_context()
    operator = _kpo(kpo_conn, CASE, deferrable=True, poll_interval=0.5, startup_check_interval_seconds=1)
    with pytest.raises(TaskDeferred) as deferred:
        operator.execute(context)
    trigger = deferred.value.trigger
    assert isinstance(trigger, KubernetesPodTrigger)
    # Serialised and rebuilt as the triggerer would, then run in this test's event loop.
    classpath, kwargs = trigger.serialize()
    assert classpath.endswith("KubernetesPodTrigger")
    rebuilt = KubernetesPodTrigger(**kwargs)

    async def first_event() -> Any:
        async for event in rebuilt.run():
            return event
        raise AssertionError("the trigger ended without an event")

    event = asyncio.run(first_event())
    assert event.payload["status"] == "success"
    assert kube.call_count("get", "pods") >= 3  # the trigger polls the pod
    assert kube.call_count("watch", "events") + kube.call_count("list", "events") >= 1  # startup events
    operator.trigger_reentry(context, event.payload)
    assert kube.pods("sims") == []  # on_finish_action=delete_pod


def test_objects_the_real_api_server_would_refuse_get_422(
    kube: FakeKubeAPI, api_client: client.ApiClient
) -> None:
    """The loopback API checks pods and Leases against the supported versions' schemas (strict)."""
    v1 = client.CoreV1Api(api_client)
    body = pod_body("typo", SLEEP)
    body["spec"]["containers"][0]["resource"] = {"limits": {"cpu": "1"}}  # resources, misspelt
    with pytest.raises(client.ApiException) as err:
        v1.create_namespaced_pod("default", body)
    assert err.value.status == 422
    status = status_of(err.value)
    assert (status["kind"], status["status"], status["reason"], status["code"]) == (
        "Status",
        "Failure",
        "Invalid",
        422,
    )
    assert status["details"]["kind"] == "Pod" and status["details"]["name"] == "typo"
    assert status["details"]["causes"][0]["field"] == "spec.containers[0]"
    assert "'resource' was unexpected" in status["details"]["causes"][0]["message"]
    assert kube.pod("typo") is None and kube.process_of("typo") is None
    leases = client.CoordinationV1Api(api_client)
    bad = {"metadata": {"name": "hb"}, "spec": {"leaseDurationSeconds": "30s"}}
    with pytest.raises(client.ApiException) as err:
        leases.create_namespaced_lease("default", bad)
    assert (
        err.value.status == 422
        and status_of(err.value)["details"]["causes"][0]["field"] == "spec.leaseDurationSeconds"
    )
    # A valid Lease is accepted, and a patch that breaks it is refused like a create.
    leases.create_namespaced_lease(
        "default", {"metadata": {"name": "hb"}, "spec": {"leaseDurationSeconds": 30}}
    )
    with pytest.raises(client.ApiException) as err:
        leases.patch_namespaced_lease("hb", "default", {"spec": {"holderIdentity": 7}})
    assert err.value.status == 422
    assert leases.read_namespaced_lease("hb", "default").spec.holder_identity is None
