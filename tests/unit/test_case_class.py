"""Issue 30 (1): one outcome vocabulary. A case's class is ranked once (``case_class``), and the
ledger's shard summary, the verdict, the report and the page's SQL class every case the same way.

Real parts throughout: the ledger on a local artifact store, the report and verdict functions on its
summary, and the page's aggregation SQL (:func:`avsim.ui.progress.compute_digests`) run on SQLite
against task-instance and XCom rows written as the scheduler and the phase operator leave them
(as ``bench/ui_progress.py`` builds a week for the page's other unit tests).
"""

from __future__ import annotations

import datetime as dt
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bench.ui_progress import NOW, _ti_row, metadata_engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from avsim.artifacts import RunLayout, shard_run_id
from avsim.contracts import OUTCOME_XCOM_KEY
from avsim.contracts.week import ShardSummary
from avsim.ledger.records import OutcomeRecord
from avsim.ledger.store import Ledger
from avsim.ledger.summaries import summarize_shard
from avsim.phases.contract import (
    CASE_PRECEDENCE,
    ENDED,
    NOT_RUN,
    PHASES_GIVING,
    RESULTS,
    Detail,
    Outcome,
    case_class,
    values,
)
from avsim.report.build import build_report
from avsim.ui.progress import CASE_CLASSES, CASE_RULES, FAILED, compute_digests
from avsim.verdict import failing_phase, needs_attention, shard_verdict

SHARD_DAG = "avsim_weekly_shard"
GPU_POOLS = ("avsim_gpu_spot", "avsim_gpu_on_demand")
#: Every class a phase of a case can have in a shard summary.
PHASE_CLASSES = (*values(ENDED), Outcome.UPSTREAM_FAILED.value, NOT_RUN)
#: A case: its phases' classes, in phase order.
cases_st = st.lists(st.lists(st.sampled_from(PHASE_CLASSES), min_size=1, max_size=5), min_size=1, max_size=8)


def test_the_precedence_is_the_ledgers() -> None:
    """Today's observable precedence: bad_input > bad_build > preempted > infra_failed (a phase that
    never ran included) > scenario_failed > passed."""
    assert values(CASE_PRECEDENCE) == (
        "bad_input",
        "bad_build",
        "preempted",
        "infra_failed",
        "scenario_failed",
        "passed",
    )
    assert case_class(["passed", "scenario_failed", "preempted", "bad_build"]) is Outcome.BAD_BUILD
    assert case_class(["bad_build", "bad_input"]) is Outcome.BAD_INPUT
    assert case_class(["infra_failed", "preempted"]) is Outcome.PREEMPTED
    assert case_class(["scenario_failed", "not_run"]) is Outcome.INFRA_FAILED
    assert case_class(["passed", "upstream_failed"]) is Outcome.INFRA_FAILED
    assert case_class(["passed", "something else"]) is Outcome.INFRA_FAILED, "an unknown class is infra"
    assert case_class([Outcome.SCENARIO_FAILED, Outcome.PASSED]) is Outcome.SCENARIO_FAILED
    assert case_class([]) is Outcome.PASSED


def test_the_pages_rules_are_generated_from_the_precedence() -> None:
    """The page's own classes (an unrecorded ``failed``, a ``skipped`` phase) slot into the one list."""
    assert [c for c in CASE_CLASSES if c != FAILED] == list(values(CASE_PRECEDENCE))
    rules = dict(CASE_RULES)
    assert CASE_CLASSES.index(FAILED) == CASE_CLASSES.index("infra_failed") - 1
    assert rules["infra_failed"] == (*PHASES_GIVING[Outcome.INFRA_FAILED], "skipped")


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    engine = metadata_engine(tmp_path_factory.mktemp("case-class") / "airflow.db")
    yield engine
    engine.dispose()


def _ledger_summary(root: Path, cases: list[list[str]]) -> ShardSummary:
    """The ledger's summary of a shard whose phases ended in ``cases``' classes: a phase with an
    attempt class has its outcome committed; ``not_run`` and ``upstream_failed`` phases have none,
    the latter depending on an upstream that produced no output (one outside the case's phases)."""
    ledger = Ledger(RunLayout(f"file://{root}", "avsim_weekly__manual__2026-12-07"))
    plan = []
    for i, phases in enumerate(cases):
        cid = f"case-{i:03d}"
        names = [f"p{j}" for j in range(len(phases))]
        deps: dict[str, list[str]] = {}
        for name, cls in zip(names, phases, strict=True):
            deps[name] = ["lost-upstream"] if cls == Outcome.UPSTREAM_FAILED.value else []
            if cls in values(ENDED):
                out = Outcome(cls)
                ledger.commit(
                    OutcomeRecord(
                        run_key="rk",
                        case_id=cid,
                        phase=name,
                        attempt=1,
                        outcome=out,
                        output_uri=f"file:///out/{cid}/{name}" if out.produced_output else "",
                        reason=f"{cls} in {name}",
                        committed_at="2026-12-07T10:00:00+00:00",
                    )
                )
        plan.append({"case_id": cid, "graph": "standard", "phases": names, "depends_on": deps})
    return summarize_shard(ledger, 1, plan)


def _page_classes(engine: Any, cases: list[list[str]]) -> dict[str, str]:
    """Each case's class as the page's SQL gives it: every case in a shard run of its own (the page
    aggregates per shard run), its phases as task instances in the state the phase ended with and
    with the XCom the phase operator pushes (a result as its return value, a failure as
    ``avsim_outcome``); a phase that never ran is ``upstream_failed`` or ``removed``."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel

    week = f"w-{uuid.uuid4().hex}"
    run_of = {f"case-{i:03d}": shard_run_id(week, i + 1) for i in range(len(cases))}
    state_of = {Outcome.UPSTREAM_FAILED.value: "upstream_failed", NOT_RUN: "removed"}
    with engine.begin() as conn:
        dr = DagRun.__table__
        conn.execute(
            insert(dr),
            [
                {
                    "dag_id": SHARD_DAG,
                    "run_id": run_id,
                    "state": "success",
                    "run_type": "manual",
                    "run_after": NOW,
                    "start_date": NOW - dt.timedelta(hours=1),
                    "end_date": NOW,
                    "clear_number": 0,
                }
                for run_id in run_of.values()
            ],
        )
        ids = dict(conn.execute(select(dr.c.run_id, dr.c.id).where(dr.c.run_id.like(f"{week}__%"))).all())
        tis, xcoms = [], []
        for (cid, run_id), phases in zip(run_of.items(), cases, strict=True):
            for j, cls in enumerate(phases):
                task_id = f"standard.p{j}"
                produced = cls in values(RESULTS)
                state = "success" if produced else state_of.get(cls, "failed")
                ended = state in ("success", "failed")
                row = _ti_row(
                    SHARD_DAG, run_id, task_id, 0, state, 1, NOW if ended else None, 5.0, "avsim_cpu", 1
                )
                row["rendered_map_index"] = cid
                tis.append(row)
                if ended:
                    key = "return_value" if produced else OUTCOME_XCOM_KEY
                    xcoms.append(
                        {
                            "dag_run_id": ids[run_id],
                            "task_id": task_id,
                            "map_index": 0,
                            "key": key,
                            "dag_id": SHARD_DAG,
                            "run_id": run_id,
                            "timestamp": NOW,
                            "value": {"outcome": cls, "reason": f"{cls} in p{j}", "attempt": 1},
                        }
                    )
        conn.execute(insert(TaskInstance.__table__), tis)
        if xcoms:
            conn.execute(insert(XComModel.__table__), xcoms)
    with Session(engine) as session:
        digests = compute_digests(session, SHARD_DAG, list(run_of.values()), GPU_POOLS)
    out = {}
    for cid, run_id in run_of.items():
        (((status, cls), n),) = digests[run_id].cases.items()
        assert (status, n) == ("done", 1), (cid, digests[run_id].cases)
        out[cid] = cls
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases=cases_st)
def test_ledger_verdict_report_and_page_class_every_case_alike(engine: Any, cases: list[list[str]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        summary = _ledger_summary(Path(tmp), cases)
    by_id = {c.case_id: c for c in summary.cases}
    expected = {f"case-{i:03d}": case_class(phases).value for i, phases in enumerate(cases)}

    # The ledger: its summary shows the phases as they ended, and the case takes their one class.
    for i, phases in enumerate(cases):
        case = by_id[f"case-{i:03d}"]
        assert [e.outcome_name for e in case.phases.values()] == phases
        assert case.outcome == expected[case.case_id]

    # The verdict: a case needs attention unless its class is a result, and the phase it names gave
    # the case its class.
    verdict = shard_verdict(summary)
    attention = Counter(c for c in expected.values() if needs_attention(c))
    assert dict(verdict.counts) == dict(attention)
    assert set(attention) <= set(values(CASE_PRECEDENCE)) - set(values(RESULTS))
    for cid, cls in expected.items():
        phase, entry = failing_phase(by_id[cid])
        assert entry is not None and entry.outcome_name in PHASES_GIVING[Outcome(cls)], (cid, cls, phase)

    # The report: its totals and its failed cases (each with the phase that gave its class).
    report = build_report({}, [summary], {}, run_id="r", generated_at="2026-12-09T12:00:00Z")
    totals = report["totals"]
    assert {k: totals[k] for k in values(CASE_PRECEDENCE) if totals[k]} == dict(Counter(expected.values()))
    listed = {f["case_id"]: f for f in report["failed_cases"]}
    assert {cid: f["outcome"] for cid, f in listed.items()} == {
        cid: cls for cid, cls in expected.items() if cls != Outcome.PASSED.value
    }
    for cid, f in listed.items():
        assert by_id[cid].phases[f["phase"]].outcome_name in PHASES_GIVING[Outcome(f["outcome"])]

    # The page: its SQL, on the task instances and XComs of the same phases.
    assert _page_classes(engine, cases) == expected


def _pod(phase: str, *, reason: str = "", **state: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "avsim-c1-simulate-a1-0123456789"},
        "status": {
            "phase": phase,
            "reason": reason,
            "message": "msg",
            "conditions": [],
            "containerStatuses": [{"name": "base", "image": "reg/sim@sha256:" + "0" * 64, "state": state}],
        },
    }


def test_failure_details_are_one_vocabulary() -> None:
    """A detail is a :class:`Detail`, where the failure policy reads it and where the Kubernetes
    backend gives it: a detail spelled differently in one place (which made the policy fall back to
    the outcome's generic kind without a word) no longer exists as a plain string."""
    from avsim.kube.pods import classify_pod
    from avsim.operators.kubernetes import FORCE_DELETE_DETAILS
    from avsim.phases.policy import _BY_DETAIL, Failure, failure_for

    assert all(isinstance(detail, Detail) for _outcome, detail in _BY_DETAIL)
    assert all(isinstance(detail, Detail) for detail in FORCE_DELETE_DETAILS)
    endings = [
        classify_pod(
            _pod("Failed", exitCode=1, terminated={"exitCode": 1, "reason": "Error"}), node_class="cpu"
        ),
        classify_pod(_pod("Failed", terminated={"exitCode": 137, "reason": "OOMKilled"}), node_class="cpu"),
        classify_pod(
            _pod("Failed", reason="DeadlineExceeded", terminated={"exitCode": 137}), node_class="cpu"
        ),
        classify_pod(_pod("Failed", reason="Evicted", terminated={"exitCode": 137}), node_class="gpu-spot"),
        classify_pod(_pod("Failed", terminated={"exitCode": 143}), node_class="gpu-spot"),
        classify_pod(_pod("Pending", waiting={"reason": "ErrImagePull"}), node_class="cpu"),
        classify_pod(None, node_class="gpu-spot"),
        classify_pod(_pod("Running", running={}), node_class="cpu", lease_expired=True, lease_seconds=60),
    ]
    details = [r.detail for r in endings if r is not None]
    assert details == [
        "crash",
        "oom",
        "timeout",
        "evicted",
        "terminated",
        "image_pull",
        "vanished",
        "lease_expired",
    ]
    assert all(isinstance(d, Detail) for d in details), details
    # Serialized as its value, and the policy reads a detail read back from a record as the member.
    assert str(Detail.OOM) == "oom" and f"{Detail.NODE_LOST}" == "node_lost"
    assert failure_for(Outcome.INFRA_FAILED, "oom") is Failure.OUT_OF_MEMORY
    assert failure_for(Outcome.PREEMPTED, Detail.EVICTED) is Failure.EVICTED
