"""Failure economics as plain data: the retry policy hook, the breaker, the cache key, the canary rule,
and compare-and-swap on a real S3 API (moto's server on loopback)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from avsim.contracts.case import CaseEntry
from avsim.ledger.breaker import Breaker, BreakerConfig
from avsim.ledger.cache import PhaseCache, cache_key
from avsim.ledger.documents import DocumentStore
from avsim.ledger.records import AttemptRecord, OutcomeRecord
from avsim.manifest.models import RetrySpec
from avsim.operators.retry import PhaseRetryPolicy
from avsim.phases.contract import Detail, Outcome, classify_exit_code
from avsim.plan.canary import FAILED, PASSED, WAITING, canary_size, gate_decision, select_canary


def test_exit_codes_and_classes() -> None:
    assert classify_exit_code(0) is Outcome.PASSED
    assert classify_exit_code(3) is Outcome.SCENARIO_FAILED
    assert classify_exit_code(65) is Outcome.BAD_INPUT
    assert classify_exit_code(143) is Outcome.PREEMPTED and classify_exit_code(-15) is Outcome.PREEMPTED
    assert classify_exit_code(1) is Outcome.INFRA_FAILED and classify_exit_code(-9) is Outcome.INFRA_FAILED
    assert {o for o in Outcome if o.retriable} == {Outcome.INFRA_FAILED, Outcome.PREEMPTED}
    assert {o for o in Outcome if o.counts_against_build} == {Outcome.INFRA_FAILED, Outcome.BAD_BUILD}


def test_the_fallback_must_fit_the_preemption_budget() -> None:
    # Budgets, delays and hand-over are the failure policy's (tests/unit/phases/test_policy.py).
    with pytest.raises(ValueError, match="on_demand_after_preemptions"):
        RetrySpec(preemption=1, on_demand_after_preemptions=2)


def test_retry_policy_hands_the_class_delay_to_airflow() -> None:
    import datetime as dt

    from airflow.sdk.definitions.retry_policy import RetryAction

    from avsim.operators.exceptions import PhaseBadInput, PhasePreempted

    policy = PhaseRetryPolicy()
    decision = policy.evaluate(PhasePreempted("x", retry_delay=dt.timedelta(seconds=7)), 1, 5)
    assert decision.action is RetryAction.RETRY and decision.retry_delay == dt.timedelta(seconds=7)
    assert policy.evaluate(ValueError("y"), 1, 5).action is RetryAction.DEFAULT
    assert policy.evaluate(PhaseBadInput("z"), 1, 5).action is RetryAction.DEFAULT  # fails fast anyway
    assert PhaseRetryPolicy.deserialize(policy.serialize()) == policy


def test_breaker_opens_on_the_failure_ratio_and_resets(tmp_path: Path) -> None:
    b = Breaker(
        f"file://{tmp_path}",
        "sha256:" + "a" * 64,
        "build-7",
        BreakerConfig(window=10, min_finished=4, max_failure_ratio=0.5),
    )
    assert not b.state().is_open
    assert [b.record(failed, f"c{i}") for i, failed in enumerate([False, True, True])] == [
        False,
        False,
        False,
    ]
    assert not b.state().is_open  # 3 finished: fewer than min_finished
    assert b.record(True, "c3") is True  # 3 of 4 failed
    state = b.state()
    assert state.is_open and "3 of the last 4" in state.reason and "build-7" in state.reason
    assert b.record(True, "c4") is False  # already open
    b.reset(by="engineer")
    doc = b.document()
    assert (
        doc is not None
        and doc["state"] == "closed"
        and doc["window"] == []
        and doc["resets"][-1]["by"] == "engineer"
    )
    # The window slides: old failures fall out.
    for i in range(10):
        b.record(False, f"ok{i}")
    assert b.document()["failures"] == 0  # type: ignore[index]
    # A new build has its own, closed breaker.
    assert not Breaker(f"file://{tmp_path}", "sha256:" + "b" * 64).state().is_open


def test_cache_key_covers_what_decides_the_result(tmp_path: Path) -> None:
    spec = {"command": ["sim"], "args": ["--x"], "checkpoint": True, "timeout_seconds": 10}
    case = CaseEntry(
        case_id="c1", seed=1, scenario_uri="s3://s/1", scenario_version="v1", parameters={"p": 1}
    )
    base = dict(
        image="r/sim@sha256:" + "1" * 64,
        phase="simulate",
        spec=spec,
        case=case,
        upstream_keys={"prepare": "k1"},
    )
    key = cache_key(**base)  # type: ignore[arg-type]
    # Pinned: a cache key outlives its run, so the same case, spec and upstream keep their key across
    # versions (this one was computed when the case entry was a dict).
    pinned = dict(
        base,
        case=case.model_copy(update={"seed": 7, "family": "standard", "graph": "standard", "tags": ("a",)}),
    )
    assert cache_key(**pinned) == "cdd804e507b480fb0fb5c13c237e8831c2fd286f3720526414371b6f954e99e1"  # type: ignore[arg-type]
    assert key == cache_key(**{**base, "spec": {**spec, "timeout_seconds": 99}})  # type: ignore[arg-type]
    for change in (
        {"image": "r/sim@sha256:" + "2" * 64},
        {"spec": {**spec, "args": ["--y"]}},
        {"case": case.model_copy(update={"seed": 2})},
        {"case": case.model_copy(update={"scenario_version": "v2"})},
        {"upstream_keys": {"prepare": "k2"}},
    ):
        assert cache_key(**{**base, **change}) != key  # type: ignore[arg-type]
    cache = PhaseCache(f"file://{tmp_path}")
    rec = OutcomeRecord(
        "rk", "c1", "simulate", 2, Outcome.PASSED, "file:///o", "now", result={"metrics": {"a": 1}}
    )
    assert cache.lookup(key) is None
    assert cache.store(key, rec) is True and cache.store(key, rec) is False  # the first stays
    hit = cache.lookup(key)
    assert hit is not None and hit.output_uri == "file:///o" and hit.outcome is Outcome.PASSED
    assert hit.result == {"metrics": {"a": 1}} and hit.origin == "rk:c1/simulate#2"
    failed = OutcomeRecord("rk", "c1", "simulate", 3, Outcome.INFRA_FAILED, "", "now")
    assert cache.store("other", failed) is False  # only results are cached


def test_canary_selection_is_proportional_and_stable() -> None:
    ids = [f"case-{i:05d}" for i in range(10_000)]
    fams = ["standard"] * 6_000 + ["with_render"] * 3_000 + ["perception"] * 1_000
    assert canary_size(10_000, 0.01, 20) == 100
    assert canary_size(1_000, 0.01, 20) == 20
    assert canary_size(20, 0.01, 20) == 0  # a week as small as a canary runs at once
    chosen = select_canary(ids, fams, 0.01, 20)
    assert len(chosen) == 100 and chosen == select_canary(ids, fams, 0.01, 20)
    per = {f: sum(1 for i in chosen if fams[i] == f) for f in set(fams)}
    assert per == {"standard": 60, "with_render": 30, "perception": 10}
    small = select_canary(ids[:100], ["a"] * 97 + ["b"] * 3, 0.01, 20)
    assert len(small) == 20 and any(i >= 97 for i in small)  # every family is represented


def _ended(outcome: Outcome, detail: str = "") -> AttemptRecord:
    return AttemptRecord(
        run_key="r",
        case_id="c",
        phase="prepare",
        attempt=1,
        started_at="",
        ended_at="",
        exit_code=None,
        outcome=outcome,
        reason="",
        output_uri="",
        host="",
        duration_seconds=0.0,
        detail=detail,
    )


def test_gate_decision() -> None:
    ok = _ended(Outcome.PASSED)
    crash = _ended(Outcome.INFRA_FAILED, Detail.CRASH)
    pull = _ended(Outcome.BAD_BUILD, Detail.IMAGE_PULL)
    cases = {f"c{i}": [ok] for i in range(8)} | {"c8": [ok, crash], "c9": []}
    d = gate_decision(cases, threshold=0.2, canary_done=False, build="b1")
    assert d.state == WAITING and d.failed_cases == 1
    assert gate_decision(cases, threshold=0.2, canary_done=True, build="b1").state == PASSED
    bad = {**cases, "c9": [pull], "c7": [crash]}
    d = gate_decision(bad, threshold=0.2, canary_done=False, build="b1")
    assert d.state == FAILED and d.failed_cases == 3
    assert (
        "3 of 10 canary cases failed on build b1" in d.message
        and "crash 2" in d.message
        and "image_pull 1" in d.message
    )
    # Failed scenarios are results, not evidence of a bad build.
    sf = {f"c{i}": [_ended(Outcome.SCENARIO_FAILED)] for i in range(10)}
    assert gate_decision(sf, threshold=0.2, canary_done=True, build="b1").state == PASSED


def test_documents_compare_and_swap_on_s3(s3_server: str) -> None:
    docs = DocumentStore()
    uri = "s3://avsim_s3@avsim/cas/counter.json"
    assert docs.create(uri, {"n": 0}) is True and docs.create(uri, {"n": 9}) is False

    def bump() -> None:
        for _ in range(10):
            docs.update(uri, lambda d: {"n": int(d["n"]) + 1})

    threads = [threading.Thread(target=bump) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert docs.read(uri) == {"n": 60}  # no lost update among 6 writers
    assert docs.read("s3://avsim_s3@avsim/cas/absent.json") is None


def test_documents_compare_and_swap_on_files(tmp_path: Path) -> None:
    docs = DocumentStore()
    uri = f"file://{tmp_path}/d/counter.json"

    def bump() -> None:
        for _ in range(25):
            docs.update(uri, lambda d: {"n": (d or {"n": 0})["n"] + 1})

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert docs.read(uri) == {"n": 100}
    with pytest.raises(Exception, match="file:// and s3://"):
        docs.read("gs://bucket/x.json")
