"""A real Airflow deployment for integration tests: PostgreSQL, the four components, the repo's DAGs and plugin."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from tests.support.postgres import postgres_cluster

from avsim.devstack.demo import demo_pools, wait_for_dag
from avsim.devstack.stack import LocalStack

ROOT = Path(__file__).resolve().parents[2]


def fast_retry_catalog(target: Path) -> Path:
    """The deployed catalog with 1-second retry delays (same shapes, so manifests still match)."""
    catalog = yaml.safe_load((ROOT / "dags" / "avsim_graphs.yaml").read_text())
    for graph in catalog["graphs"].values():
        for phase in graph["phases"].values():
            phase.setdefault("retry", {}).update(delay_seconds=1, backoff=1.0, preemption_delay_seconds=1)
    target.write_text(yaml.safe_dump(catalog))
    return target


def fast_retries(doc: dict[str, Any]) -> dict[str, Any]:
    """The manifest ``doc`` with 1-second retry delays and no backoff in every phase (in place): a
    test whose phases fail and retry waits seconds, not the default 30 s doubling."""
    for graph in doc["graphs"].values():
        for phase in graph["phases"].values():
            phase.setdefault("retry", {}).update(delay_seconds=1, backoff=1.0, preemption_delay_seconds=1)
    return doc


@contextlib.contextmanager
def weekly_stack(
    base: Path,
    *,
    shard_size: int = 10,
    max_active_shards: int = 2,
    gpus: int = 4,
    cpus: int = 8,
    extra_env: Mapping[str, str] | None = None,
    port: int = 0,
    cases_in_flight: int | None = None,
) -> Iterator[LocalStack]:
    """Start the stack with the weekly DAGs loaded; stop everything after (``port``: the API
    server's, when a test must name it in a connection before the stack starts).

    The weeks admit by cases in flight (the shipped ``[avsim] admission``) with a target of
    ``cases_in_flight`` (0: derived from the pools, as shipped); by default 3 x S x W: the shard runs
    keep S cases (a third of the target)
    and ``max_active_shards`` binds, so a test written for a window of W shard runs of S sees that
    window while every ``shards`` task counts the week's cases before it starts its shard run."""
    catalog = fast_retry_catalog(base / "graphs.yaml")
    with postgres_cluster() as url:
        stack = LocalStack(
            home=base / "airflow",
            dags_folder=ROOT / "dags",
            plugins_folder=ROOT / "plugins",
            sql_alchemy_conn=url,
            port=port,
            extra_env={
                "AIRFLOW__AVSIM__SHARD_SIZE": str(shard_size),
                "AIRFLOW__AVSIM__MAX_ACTIVE_SHARDS": str(max_active_shards),
                "AIRFLOW__AVSIM__CASES_IN_FLIGHT": str(
                    3 * shard_size * max_active_shards if cases_in_flight is None else cases_in_flight
                ),
                "AIRFLOW__AVSIM__SHARD_POLL_SECONDS": "1",
                "AIRFLOW__AVSIM__GRAPH_CATALOG": str(catalog),
                # The deadline tracker ends with the week at its next pass: every 5 s, not every 5
                # minutes, or each test's week would wait up to 5 minutes for it.
                "AIRFLOW__AVSIM__DEADLINE_INTERVAL_SECONDS": "5",
                **(extra_env or {}),
            },
        )
        stack.set_pools(demo_pools(gpus=gpus, cpus=cpus))
        stack.start()
        try:
            wait_for_dag(stack, "avsim_weekly")
            wait_for_dag(stack, "avsim_weekly_shard")
            yield stack
        finally:
            stack.stop()


def read_json(uri: str) -> Any:
    return json.loads(Path(uri.removeprefix("file://")).read_text())


@contextlib.contextmanager
def kubernetes_stack(
    base: Path, namespace: str, extra_env: Mapping[str, str] | None = None, **stack_options: Any
) -> Iterator[tuple[Any, LocalStack]]:
    """The weekly stack on the Kubernetes backend against the loopback API of tests/support/kube_api.

    Yields (the fake API, the stack); ``stack_options`` go to :func:`weekly_stack`.
    """
    from tests.support.kube_api import FakeKubeAPI

    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"  # the pods find avsim-fakesim
    with FakeKubeAPI(workdir=base / "pods", env=env) as kube:
        kubeconfig = kube.write_kubeconfig(base / "kubeconfig", namespace=namespace)
        extra = {
            **kube.airflow_conn_env("kubernetes_default", kubeconfig, namespace=namespace),
            "AIRFLOW__AVSIM__BACKEND": "kubernetes",
            "AIRFLOW__AVSIM__KUBERNETES_NAMESPACE": namespace,
            **(extra_env or {}),
        }
        with weekly_stack(base, extra_env=extra, **stack_options) as stack:
            yield kube, stack
