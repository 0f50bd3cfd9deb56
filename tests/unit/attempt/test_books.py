"""An artifact store that stops answering while a phase ends is the store's failure, never the build's.

A real S3 API (moto's server on loopback) is stopped under a passed attempt's check of its outputs:
back within the patience, the result stands; down for longer, the attempt ends
``infra_failed``/``storage_unavailable``, which neither the breaker nor the canary gate counts.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from avsim import storage
from avsim.attempt import books
from avsim.attempt.books import AttemptBooks
from avsim.attempt.service import AttemptService
from avsim.phases.contract import AttemptResult, Detail, Outcome, is_build_evidence
from avsim.plan.canary import FAILED, SKIP, TAKE, attempt_evidence, gate_decision

PREFIX = "s3://avsim_s3@avsim/run/case-1/simulate/a1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PORT = _free_port()


class Store:
    """moto's S3 server on a fixed loopback port, stopped and started again like a store's blip (its
    objects live in the process, so they are there again when it answers)."""

    def __init__(self, port: int) -> None:
        from moto.server import ThreadedMotoServer

        self.port = port
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.server.start()

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    import boto3

    port = PORT  # one port for the module: fsspec keeps the filesystem it made for the connection
    s = Store(port)
    url = f"http://127.0.0.1:{port}"
    for k, v in {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": url,
        "AWS_MAX_ATTEMPTS": "1",
        "AIRFLOW_CONN_AVSIM_S3": json.dumps({"conn_type": "aws", "extra": {"endpoint_url": url}}),
    }.items():
        monkeypatch.setenv(k, v)
    boto3.client("s3", endpoint_url=url).create_bucket(Bucket="avsim")
    storage.write_json(f"{PREFIX}/result.json", {"metrics": {"ttc": 1.5}, "artifacts": []})
    try:
        yield s
    finally:
        s.stop()


def _books() -> AttemptBooks:
    args: Any = SimpleNamespace(phase="simulate", where=lambda attempt=None: "phase simulate of case-1")
    return AttemptBooks(args)


PASSED = AttemptResult(Outcome.PASSED, exit_code=0)


def test_a_store_back_within_the_patience_keeps_the_result(store: Store) -> None:
    store.stop()
    threading.Timer(3.0, store.start).start()
    began = time.monotonic()
    checked, doc = _books().outputs_checked(PASSED, PREFIX)
    assert checked is PASSED and doc == {"metrics": {"ttc": 1.5}, "artifacts": []}
    assert time.monotonic() - began >= 2.5  # it waited for the store, and did not call it missing


def test_a_store_down_longer_is_its_own_failure_not_the_builds(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(books, "STORE_PATIENCE_SECONDS", 3.0)
    store.stop()
    checked, doc = _books().outputs_checked(PASSED, PREFIX)
    assert (checked.outcome, checked.detail, doc) == (Outcome.INFRA_FAILED, Detail.STORAGE_UNAVAILABLE, None)
    assert "artifact store did not answer" in checked.reason
    assert not is_build_evidence(checked.outcome, checked.detail)
    # What it was before: a missing output, which counts against the build.
    assert is_build_evidence(Outcome.INFRA_FAILED, Detail.MISSING_OUTPUT)


def test_a_missing_result_is_still_missing_at_once(store: Store) -> None:
    began = time.monotonic()
    checked, _ = _books().outputs_checked(PASSED, f"{PREFIX}-none")
    assert (checked.outcome, checked.detail) == (Outcome.INFRA_FAILED, Detail.MISSING_OUTPUT)
    assert time.monotonic() - began < 5  # an answer (404), not an outage: no patience spent


def test_the_breaker_and_the_canary_gate_skip_a_storage_outage() -> None:
    from avsim.ledger.records import AttemptRecord

    def rec(case: str, detail: str) -> AttemptRecord:
        return AttemptRecord(
            run_key="r", case_id=case, phase="simulate", attempt=1, started_at="", ended_at="x",
            exit_code=0, outcome=Outcome.INFRA_FAILED, reason="", output_uri="", host="h",
            duration_seconds=1.0, detail=detail,
        )  # fmt: skip

    blip = {f"c{i}": [rec(f"c{i}", Detail.STORAGE_UNAVAILABLE)] for i in range(10)}
    assert gate_decision(blip, threshold=0.2, canary_done=True, build="b").state != FAILED
    # The gate looks past a lost attempt to the phase's next one.
    assert attempt_evidence(rec("c1", Detail.STORAGE_UNAVAILABLE), "") == SKIP
    assert attempt_evidence(rec("c1", Detail.ABANDONED), "") == SKIP
    assert attempt_evidence(rec("c1", Detail.CRASH), "") == TAKE
    crash = {f"c{i}": [rec(f"c{i}", Detail.CRASH)] for i in range(10)}
    assert gate_decision(crash, threshold=0.2, canary_done=True, build="b").state == FAILED

    fed: list[bool] = []
    svc = AttemptService(
        _books().args, meter=SimpleNamespace(phase_outcome=lambda *a: None, gpu_seconds=lambda *a: None)
    )
    svc.books.__dict__["breaker"] = SimpleNamespace(record=lambda bad, where: fed.append(bad) and False)
    svc.books.__dict__["descriptor"] = SimpleNamespace(triage_of=None)  # the week's own attempts
    svc.args.node_class, svc.args.is_run_level = "gpu-spot", False
    svc._measure(rec("c1", Detail.STORAGE_UNAVAILABLE), gpus=1)
    svc._measure(rec("c3", Detail.ABANDONED), gpus=1)
    svc._measure(rec("c2", Detail.CRASH), gpus=1)
    assert fed == [True]  # the lost attempts are neither failures nor successes of the build
