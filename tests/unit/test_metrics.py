"""avsim's metrics arrive as StatsD datagrams on a real UDP socket, through Airflow's own metrics layer."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from avsim import metrics


class StatsdListener:
    """A StatsD server on loopback: receives datagrams and keeps their lines."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])

    def lines(self, expect: int, timeout: float = 10.0) -> list[str]:
        got: list[str] = []
        deadline = time.monotonic() + timeout
        while len(got) < expect and time.monotonic() < deadline:
            try:
                data, _ = self.sock.recvfrom(65535)
            except TimeoutError:
                continue
            # Airflow's own metrics (e.g. serde.load_serializers) share the socket: keep avsim's.
            got.extend(line for line in data.decode().splitlines() if ".avsim." in line)
        return got

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[StatsdListener]:
    s = StatsdListener()
    try:
        yield s
    finally:
        s.close()


def _statsd_env(port: int, **extra: str) -> dict[str, str]:
    return {
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(port),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
        **extra,
    }


@pytest.fixture
def sdk_stats(listener: StatsdListener, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The task SDK's stats initialized as the task runner does (``task_runner.main``), then restored."""
    from airflow.sdk._shared.observability.metrics import stats
    from airflow.sdk.observability.metrics import stats_utils

    saved = (stats._factory, stats._backend, stats._export_legacy_names)
    for k, v in _statsd_env(listener.port).items():
        monkeypatch.setenv(k, v)
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=True)
    try:
        yield
    finally:
        stats._factory, stats._backend, stats._export_legacy_names = saved


def test_every_function_sends_its_documented_datagrams(listener: StatsdListener, sdk_stats: None) -> None:
    metrics.phase_outcome("simulate", "scenario_failed", "gpu", "spot")
    metrics.gpu_seconds("simulate", 1800.25, "on_demand")
    metrics.preemption("render", "spot")
    metrics.breaker_trip("b-2026.12.1", "sha256:abc")
    metrics.canary_decision("b-2026.12.1", passed=False)
    metrics.finish_estimate(-3600.5)
    metrics.gpus_needed(280)
    metrics.triage_verdicts({"regression": 3, "flaky": 0, "environment": 1})  # none sent for a 0
    lines = listener.lines(expect=16)
    assert sorted(lines) == sorted(
        [
            "airflow.avsim.phase.outcome:1|c",
            "airflow.avsim.phase.outcome.simulate.scenario_failed.gpu.spot:1|c",
            "airflow.avsim.gpu_seconds:1800.25|c",
            "airflow.avsim.gpu_seconds.simulate.on_demand:1800.25|c",
            "airflow.avsim.preemption:1|c",
            "airflow.avsim.preemption.render.spot:1|c",
            "airflow.avsim.breaker.trip:1|c",
            "airflow.avsim.canary.decision:1|c",
            "airflow.avsim.canary.decision.failed:1|c",
            # A negative gauge is sent as "reset to 0, then add the value" by the statsd client.
            "airflow.avsim.deadline.seconds_late:0|g",
            "airflow.avsim.deadline.seconds_late:-3600.5|g",
            "airflow.avsim.capacity.gpus_needed:280|g",
            "airflow.avsim.triage.verdict:3|c",
            "airflow.avsim.triage.verdict.regression:3|c",
            "airflow.avsim.triage.verdict:1|c",
            "airflow.avsim.triage.verdict.environment:1|c",
        ]
    )


def test_tags_ride_on_the_name_when_influxdb_tags_are_on(
    listener: StatsdListener, sdk_stats: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.sdk._shared.observability.metrics import stats
    from airflow.sdk.observability.metrics import stats_utils

    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED", "True")
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=True)
    metrics.breaker_trip("b-2026.12.1", "sha256:abc,def")
    metrics.canary_decision("b-7", passed=True)
    lines = listener.lines(expect=3)
    assert "airflow.avsim.breaker.trip,build_id=b-2026.12.1,digest=sha256_abc_def:1|c" in lines
    assert "airflow.avsim.canary.decision,build_id=b-7,result=passed:1|c" in lines


def test_dimensions_cannot_break_the_dotted_name(listener: StatsdListener, sdk_stats: None) -> None:
    metrics.phase_outcome("sim.v2:gpu|x", "passed", "", None)  # type: ignore[arg-type]
    lines = listener.lines(expect=2)
    assert "airflow.avsim.phase.outcome.sim_v2_gpu_x.passed.unknown.unknown:1|c" in lines


def test_bad_values_and_a_broken_backend_never_raise(
    listener: StatsdListener, sdk_stats: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics.gpu_seconds("simulate", float("nan"), "spot")
    metrics.gpu_seconds("simulate", -1, "spot")
    metrics.finish_estimate("soon")  # type: ignore[arg-type]
    metrics.gpus_needed(None)  # type: ignore[arg-type]
    assert listener.lines(expect=1, timeout=0.5) == [], "nothing sensible to send, nothing sent"

    from airflow.sdk._shared.observability.metrics import stats

    class Broken:  # a backend whose socket fails: stands in for any backend error
        def incr(self, *a: object, **k: object) -> None:
            raise OSError("network is unreachable")

        gauge = incr

    monkeypatch.setattr(stats, "_backend", Broken())
    metrics.phase_outcome("simulate", "passed", "gpu", "spot")
    metrics.finish_estimate(10)


def test_a_plain_process_initializes_stats_from_airflow_config(listener: StatsdListener) -> None:
    """The ``avsim`` command or any process no Airflow component initialized: [metrics] still holds."""
    code = "from avsim import metrics; metrics.preemption('simulate', 'spot'); metrics.gpus_needed(12)"
    env = {**os.environ, **_statsd_env(listener.port, AIRFLOW__METRICS__STATSD_PREFIX="avx")}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    assert sorted(listener.lines(expect=3)) == [
        "avx.avsim.capacity.gpus_needed:12|g",
        "avx.avsim.preemption.simulate.spot:1|c",
        "avx.avsim.preemption:1|c",
    ]


def test_a_component_process_with_initialized_core_stats_emits(listener: StatsdListener) -> None:
    """Scheduler, triggerer and API server initialize the core stats object; avsim emits through it."""
    code = (
        "from airflow._shared.observability.metrics import stats\n"
        "from airflow.observability.metrics import stats_utils\n"
        "stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=True)\n"
        "from avsim import metrics\n"
        "metrics.canary_decision('b-1', passed=True)\n"
    )
    env = {**os.environ, **_statsd_env(listener.port)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    assert sorted(listener.lines(expect=2)) == [
        "airflow.avsim.canary.decision.passed:1|c",
        "airflow.avsim.canary.decision:1|c",
    ]


def test_metrics_off_sends_nothing(listener: StatsdListener) -> None:
    code = "from avsim import metrics; metrics.preemption('simulate', 'spot')"
    env = {**os.environ, **_statsd_env(listener.port, AIRFLOW__METRICS__STATSD_ON="False")}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    assert listener.lines(expect=1, timeout=1.0) == []
