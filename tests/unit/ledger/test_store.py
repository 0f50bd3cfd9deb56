"""The ledger: records, commit rules and shard summaries, against a real file:// artifact store."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from avsim.artifacts import RunLayout
from avsim.contracts.week import PhaseSummary, ShardSummary
from avsim.ledger import store
from avsim.ledger.records import AttemptRecord, OutcomeRecord
from avsim.ledger.store import Ledger
from avsim.ledger.summaries import summarize_shard
from avsim.phases.contract import NOT_RUN, Outcome, case_class


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(RunLayout(f"file://{tmp_path}", "avsim_weekly__manual__2026-12-07"))


def outcome_rec(
    case: str, phase: str, attempt: int, outcome: Outcome = Outcome.PASSED, **kw: Any
) -> OutcomeRecord:
    return OutcomeRecord(
        run_key="rk",
        case_id=case,
        phase=phase,
        attempt=attempt,
        outcome=outcome,
        output_uri=kw.pop("output_uri", f"file:///out/{case}/{phase}/attempt-{attempt}"),
        committed_at="2026-12-07T10:00:00+00:00",
        **kw,
    )


def attempt_rec(case: str, phase: str, attempt: int, outcome: Outcome | None, **kw: Any) -> AttemptRecord:
    fields: dict[str, Any] = {
        "run_key": "rk",
        "case_id": case,
        "phase": phase,
        "attempt": attempt,
        "started_at": "2026-12-07T10:00:00+00:00",
        "ended_at": "2026-12-07T10:01:00+00:00",
        "exit_code": 0,
        "outcome": outcome,
        "reason": "",
        "output_uri": f"file:///out/{case}/{phase}/attempt-{attempt}",
        "host": "worker-1",
        "duration_seconds": 60.0,
    }
    fields.update(kw)
    return AttemptRecord(**fields)


def test_records_round_trip() -> None:
    a = attempt_rec("c", "simulate", 2, Outcome.INFRA_FAILED, exit_code=-9, reason="killed")
    assert AttemptRecord.from_json(json.loads(json.dumps(a.to_json()))) == a
    assert AttemptRecord.from_json({**a.to_json(), "outcome": None, "exit_code": None}).outcome is None
    o = outcome_rec("c", "simulate", 2, Outcome.SCENARIO_FAILED, result={"metrics": {"collisions": 1}})
    data = json.loads(json.dumps(o.to_json()))
    assert data["outcome"] == "scenario_failed"
    assert OutcomeRecord.from_json({**data, "added_later": 1}) == o


def test_commit_rules(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    warnings: list[str] = []
    # Airflow's logging setup routes records past caplog, so watch the module's logger directly.
    monkeypatch.setattr(store.log, "warning", lambda msg, *a: warnings.append(msg % a))
    assert ledger.outcome("c1", "simulate") is None
    failed = outcome_rec("c1", "simulate", 2, Outcome.INFRA_FAILED, output_uri="")
    assert ledger.commit(failed) is True  # first
    assert ledger.commit(outcome_rec("c1", "simulate", 2, Outcome.PASSED)) is False  # duplicate
    assert ledger.outcome("c1", "simulate") == failed
    late = outcome_rec("c1", "simulate", 1, Outcome.PASSED)
    assert ledger.commit(late) is False  # late report from an abandoned attempt
    assert len(warnings) == 1 and "late report from abandoned attempt 1" in warnings[0]
    assert ledger.outcome("c1", "simulate") == failed
    rerun = outcome_rec("c1", "simulate", 3, Outcome.SCENARIO_FAILED)
    assert ledger.commit(rerun) is True  # a rerun after the engineer cleared the failed task
    assert ledger.outcome("c1", "simulate") == rerun
    # The first committed result wins: a later attempt's result does not replace it.
    assert ledger.commit(outcome_rec("c1", "simulate", 4, Outcome.PASSED)) is False
    assert ledger.outcome("c1", "simulate") == rerun and "first committed result wins" in warnings[-1]
    folder = Path(ledger.layout.outcome_record("c1", "simulate").removeprefix("file://")).parent
    assert sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock")) == ["simulate.json"]


def test_only_the_current_attempt_commits(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    warnings: list[str] = []
    monkeypatch.setattr(store.log, "warning", lambda msg, *a: warnings.append(msg % a))
    template = attempt_rec("c1", "simulate", 0, None, state="started", try_number=1, task_id="g.simulate")
    first = ledger.claim_attempt(template)
    second = ledger.claim_attempt(replace(template, try_number=2))
    assert (first.attempt, second.attempt) == (1, 2)
    assert first.output_uri.endswith("/cases/c1/simulate/attempt-1") and first.state == "started"
    assert [a.attempt for a in ledger.attempts("c1", "simulate")] == [1, 2]
    assert ledger.current_attempt("c1", "simulate") == 2
    # Attempt 1 was given up on (its worker vanished) but reports late: ignored and logged.
    assert ledger.commit(outcome_rec("c1", "simulate", 1, Outcome.PASSED)) is False
    assert ledger.outcome("c1", "simulate") is None
    assert (
        "late report from abandoned attempt 1" in warnings[0]
        and "attempt 2 is the current one" in warnings[0]
    )
    assert ledger.commit(outcome_rec("c1", "simulate", 2, Outcome.PASSED)) is True


def test_claims_are_unique_under_concurrency(ledger: Ledger) -> None:
    """Many processes claiming attempts of one (case, phase) at once never share a number."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(8) as pool:
        numbers = pool.map(
            _claim_in_child, [(ledger.layout.root, ledger.layout.run_key, i) for i in range(40)]
        )
    assert sorted(numbers) == list(range(1, 41))


def _claim_in_child(args: tuple[str, str, int]) -> int:
    root, key, i = args
    rec = attempt_rec("c9", "simulate", 0, None, state="started", try_number=i)
    return Ledger(RunLayout(root, key)).claim_attempt(rec).attempt


def test_attempts_and_outcomes_for(ledger: Ledger) -> None:
    for n in (2, 1, 10):
        ledger.record_attempt(
            attempt_rec("c1", "simulate", n, Outcome.INFRA_FAILED if n < 10 else Outcome.PASSED)
        )
    assert [a.attempt for a in ledger.attempts("c1", "simulate")] == [1, 2, 10]
    assert ledger.attempts("c1", "evaluate") == []
    ledger.commit(outcome_rec("c1", "simulate", 10))
    ledger.commit(outcome_rec("c2", "prepare", 1))
    found = ledger.outcomes_for(iter(["c1", "c2", "c3"]), iter(["prepare", "simulate"]))
    assert set(found) == {("c1", "simulate"), ("c2", "prepare")}
    assert found[("c1", "simulate")].attempt == 10


def test_shard_summaries(ledger: Ledger) -> None:
    assert ledger.shard_summaries() == []
    for k in (2, 0, 11):
        ledger.write_shard_summary(ShardSummary(shard=k))
    assert [s.shard for s in ledger.shard_summaries()] == [0, 2, 11]
    assert ledger.shard_summary(2) == ShardSummary(shard=2) and ledger.shard_summary(3) is None
    assert ledger.layout.shard_summary(2).endswith("/ledger/shards/00002/result.json")


def test_case_class_rule() -> None:
    assert case_class(["passed", "passed"]) is Outcome.PASSED
    assert case_class(["passed", "scenario_failed", "passed"]) is Outcome.SCENARIO_FAILED
    assert case_class(["scenario_failed", "infra_failed"]) is Outcome.INFRA_FAILED
    assert case_class(["passed", "not_run"]) is Outcome.INFRA_FAILED
    assert case_class(["scenario_failed", "upstream_failed"]) is Outcome.INFRA_FAILED
    assert case_class(["infra_failed", "bad_input", "upstream_failed"]) is Outcome.BAD_INPUT


def test_summarize_shard(ledger: Ledger) -> None:
    phases = ["prepare", "simulate", "evaluate", "report"]
    # ok: all passed, simulate retried once
    for p in phases:
        ledger.commit(outcome_rec("ok", p, 1 if p != "simulate" else 2))
        ledger.record_attempt(
            attempt_rec("ok", p, 1, Outcome.PASSED if p != "simulate" else Outcome.INFRA_FAILED)
        )
    ledger.record_attempt(attempt_rec("ok", "simulate", 2, Outcome.PASSED, duration_seconds=90.0))
    # sf: the scenario failed in simulate; downstream ran and passed
    for p in phases:
        ledger.commit(outcome_rec("sf", p, 1, Outcome.SCENARIO_FAILED if p == "simulate" else Outcome.PASSED))
    # inf: simulate failed on its last try; evaluate and report never ran
    ledger.commit(outcome_rec("inf", "prepare", 1))
    ledger.record_attempt(
        attempt_rec("inf", "simulate", 1, Outcome.INFRA_FAILED, exit_code=1, reason="crash")
    )
    ledger.record_attempt(
        attempt_rec("inf", "simulate", 2, Outcome.INFRA_FAILED, exit_code=1, reason="crash 2")
    )
    ledger.commit(outcome_rec("inf", "simulate", 2, Outcome.INFRA_FAILED, output_uri="", reason="crash 2"))
    # bad: prepare rejected its input
    ledger.commit(outcome_rec("bad", "prepare", 1, Outcome.BAD_INPUT, output_uri="", reason="no scenario"))
    # lost: nothing committed at all (the task was killed before it could commit)
    cases = [
        {"case_id": c, "graph": "standard", "phases": phases} for c in ("ok", "sf", "inf", "bad", "lost")
    ]
    summary = summarize_shard(ledger, 4, cases)
    assert summary.shard == 4
    by_id = {c.case_id: c for c in summary.cases}
    assert [c.case_id for c in summary.cases] == ["ok", "sf", "inf", "bad", "lost"]
    assert {c: by_id[c].outcome for c in by_id} == {
        "ok": "passed",
        "sf": "scenario_failed",
        "inf": "infra_failed",
        "bad": "bad_input",
        "lost": "infra_failed",
    }
    sim = by_id["ok"].phases["simulate"]
    assert sim == PhaseSummary(
        outcome=Outcome.PASSED,
        attempt=2,
        output_uri="file:///out/ok/simulate/attempt-2",
        reason="",
        duration_seconds=90.0,
        attempts=2,
        started_at="2026-12-07T10:00:00+00:00",
        ended_at="2026-12-07T10:01:00+00:00",
        gpus=0,
    )
    inf = by_id["inf"].phases
    assert inf["simulate"].outcome is Outcome.INFRA_FAILED and inf["simulate"].reason == "crash 2"
    assert inf["evaluate"].outcome is inf["report"].outcome is Outcome.UPSTREAM_FAILED
    assert by_id["bad"].phases["simulate"].outcome is Outcome.UPSTREAM_FAILED
    lost = by_id["lost"].phases
    assert lost["prepare"].outcome == NOT_RUN and lost["prepare"].attempts == 0
    assert lost["simulate"].outcome is Outcome.UPSTREAM_FAILED
    # explicit dependencies: render only needs prepare, so it is not_run, not upstream_failed
    diamond = [
        {
            "case_id": "inf",
            "graph": "g",
            "phases": ["prepare", "simulate", "render"],
            "depends_on": {"prepare": [], "simulate": ["prepare"], "render": ["prepare"]},
        }
    ]
    render = summarize_shard(ledger, 0, diamond).cases[0].phases["render"]
    assert render.outcome == NOT_RUN


@pytest.fixture
def s3_root(s3_server: str) -> str:
    """The artifact root in the moto S3 server's bucket, through the ``avsim_s3`` connection."""
    return "s3://avsim_s3@avsim/artifacts"


def test_ledger_on_an_object_store(s3_root: str) -> None:
    ledger = Ledger(RunLayout(s3_root, "run-s3"))
    assert not ledger.is_local
    failed = outcome_rec("c1", "simulate", 1, Outcome.INFRA_FAILED, output_uri="")
    assert ledger.commit(failed) is True
    assert ledger.commit(failed) is False
    assert ledger.commit(outcome_rec("c1", "simulate", 2, Outcome.SCENARIO_FAILED)) is True
    assert ledger.commit(outcome_rec("c1", "simulate", 3, Outcome.PASSED)) is False  # first result wins
    # Claims use S3 conditional writes: numbers stay unique across writers.
    template = attempt_rec("c2", "prepare", 0, None, state="started")
    assert [ledger.claim_attempt(template).attempt for _ in range(3)] == [1, 2, 3]
    ledger.record_attempt(attempt_rec("c1", "simulate", 2, Outcome.SCENARIO_FAILED))
    found = ledger.outcomes_for([f"c{i}" for i in range(20)], ["prepare", "simulate"])  # threaded reads
    assert list(found) == [("c1", "simulate")] and found[("c1", "simulate")].attempt == 2
    assert ledger.current_attempt("c2", "prepare") == 3
    ledger.write_shard_summary(ShardSummary(shard=1))
    ledger.write_shard_summary(ShardSummary(shard=0))
    assert [s.shard for s in ledger.shard_summaries()] == [0, 1]
    summary = summarize_shard(ledger, 0, [{"case_id": "c1", "graph": "g", "phases": ["simulate"]}])
    assert summary.cases[0].outcome is Outcome.SCENARIO_FAILED
    assert summary.cases[0].phases["simulate"].attempts == 1


def test_attempts_rewritten_since_the_last_listing_are_read_as_they_are_now(s3_root: str) -> None:
    """The lost-worker path on S3: a try lists a phase's attempts, rewrites a lost one as ended,
    then lists and reads them again to decide. Read through fsspec's s3fs, the second read opened
    the rewritten document against the ETag cached by the first listing and failed with
    FileExpired (seen on the distributed stack); the ledger must read the store as it is now."""
    ledger = Ledger(RunLayout(s3_root, "run-s3-rewrite"))
    started = attempt_rec("c1", "simulate", 1, None, state="started")
    ledger.record_attempt(started)
    [before] = ledger.attempts("c1", "simulate")
    assert before.state == "started"
    ledger.record_attempt(attempt_rec("c1", "simulate", 1, Outcome.INFRA_FAILED, detail="abandoned"))
    ledger.record_attempt(attempt_rec("c1", "simulate", 2, Outcome.PASSED))
    after = ledger.attempts("c1", "simulate")
    assert [(a.attempt, a.outcome, a.detail) for a in after] == [
        (1, Outcome.INFRA_FAILED, "abandoned"),
        (2, Outcome.PASSED, ""),
    ]
    # Only the folder's own documents: nothing of another phase or of a deeper folder.
    ledger.record_attempt(attempt_rec("c1", "simulate_on_demand", 1, Outcome.PASSED))
    assert [a.attempt for a in ledger.attempts("c1", "simulate")] == [1, 2]
    # Repairs are listed the same way, and appear as soon as they are written.
    assert ledger.repairs() == []
    ledger.record_repair(0, 2, {"shard": 0, "at": "t1"})
    assert [r["at"] for r in ledger.repairs()] == ["t1"]


def test_a_summary_carries_when_each_phase_ran_and_the_report_its_cases_times(ledger: Ledger) -> None:
    """The report's cases.csv (started_at, finished_at) and its progress plot read a phase's times from
    the shard summary: summarize_shard writes the attempt's start, end and GPUs, committed or not."""
    from avsim.report.cases import case_row

    ledger.record_attempt(
        attempt_rec("c", "prepare", 1, Outcome.PASSED, ended_at="2026-12-07T10:03:00+00:00")
    )
    ledger.commit(outcome_rec("c", "prepare", 1))
    ledger.record_attempt(
        attempt_rec(
            "c",
            "simulate",
            1,
            Outcome.INFRA_FAILED,
            started_at="2026-12-07T10:04:00+00:00",
            ended_at="2026-12-07T10:34:00+00:00",
            gpus=1,
        )
    )
    [case] = summarize_shard(
        ledger, 0, [{"case_id": "c", "graph": "standard", "phases": ["prepare", "simulate"]}]
    ).cases
    prepare, simulate = case.phases["prepare"], case.phases["simulate"]
    assert (prepare.started_at, prepare.ended_at, prepare.gpus) == (
        "2026-12-07T10:00:00+00:00",
        "2026-12-07T10:03:00+00:00",
        0,
    )
    assert (simulate.started_at, simulate.ended_at, simulate.gpus) == (
        "2026-12-07T10:04:00+00:00",
        "2026-12-07T10:34:00+00:00",
        1,
    )
    row = case_row(case, {"graphs": {}}, ("simulate", simulate), shard=0)
    assert (row["started_at"], row["finished_at"]) == (
        "2026-12-07T10:00:00+00:00",
        "2026-12-07T10:34:00+00:00",
    )
