"""Reading triage's runs back (:func:`avsim.triage.collect.collect`): summaries in, verdicts out.

The boundary: the runs' shard summaries and the outputs' digests are given as functions (what the
ledger and the artifact store would answer), so each case's path to its verdict is checked alone.
"""

from __future__ import annotations

from typing import Any

from avsim.contracts.week import CaseSummary, PhaseSummary, ShardSummary
from avsim.triage.collect import collect
from avsim.triage.decide import Candidate
from avsim.triage.model import BuildSide, TriageVerdict
from avsim.triage.runs import TriageBook, TriageRound, TriageRun

A, B = "reg/sim@sha256:" + "a" * 64, "reg/sim@sha256:" + "b" * 64


def _case(case_id: str, outcome: str, uri: str = "") -> CaseSummary:
    phase = PhaseSummary(outcome=outcome, attempt=1, output_uri=uri or f"file:///o/{case_id}/simulate")
    return CaseSummary(case_id=case_id, graph="driving", outcome=outcome, phases={"simulate": phase})


def _run(side: BuildSide, n: int, cases: tuple[str, ...], audit: tuple[str, ...] = ()) -> TriageRun:
    label = f"1_{side.value}_{n}"
    return TriageRun(
        label=label, build=side, index=n, image=B if side is BuildSide.THIS else A,
        run_id=f"w__triage_{label}", run_key=f"k__triage_{label}", cases=cases, audit=audit,
    )  # fmt: skip


CASES = ("reg", "flk", "env", "late")
RUNS = (
    _run(BuildSide.THIS, 1, CASES, audit=("ok1", "ok2")),
    _run(BuildSide.THIS, 2, CASES),
    _run(BuildSide.LAST, 1, CASES),
    _run(BuildSide.LAST, 2, CASES),
)
OUTCOMES = {  # case -> run label -> outcome
    "reg": {"1_this_1": "scenario_failed", "1_this_2": "scenario_failed", "1_last_1": "passed", "1_last_2": "passed"},
    "flk": {"1_this_1": "passed", "1_this_2": "scenario_failed", "1_last_1": "passed", "1_last_2": "passed"},
    "env": {"1_this_1": "infra_failed", "1_this_2": "infra_failed", "1_last_1": "infra_failed", "1_last_2": "passed"},
}  # fmt: skip


def _book() -> TriageBook:
    chosen = tuple(Candidate(case_id=c, graph="driving", failing_phase="simulate") for c in CASES)
    rnd = TriageRound(round=1, chosen=chosen, audit=("ok1", "ok2"), passed_cases=2, runs=RUNS)
    return TriageBook(week_run_key="k", rounds=(rnd,))


def _summary_of(unfinished: str = "") -> Any:
    def summary_of(run_key: str) -> ShardSummary | None:
        label = run_key.rsplit("__triage_", 1)[1]
        if label == unfinished:
            return None
        cases = [_case(c, by_run[label]) for c, by_run in OUTCOMES.items()]
        cases.append(_case("late", "passed"))
        if label == "1_this_1":
            cases += [
                _case("ok1", "passed", "file:///again/ok1"),
                _case("ok2", "passed", "file:///again/ok2"),
            ]
        return ShardSummary(shard=1, cases=tuple(cases))

    return summary_of


WEEK = {c: _case(c, "passed", f"file:///week/{c}") for c in ("ok1", "ok2")}
HEAD = {"graphs": {"driving": {"phases": {"simulate": {"deterministic_outputs": ["trace.jsonl"]}}}}}


def _digest(uri: str) -> str:
    return "sha256:different" if uri == "file:///again/ok2/trace.jsonl" else "sha256:same"


def test_each_case_gets_the_verdict_its_reruns_give() -> None:
    report = collect(_book(), WEEK, HEAD, summary_of=_summary_of(), digest_of=_digest)
    verdicts = {c.case_id: c.verdict for c in report.cases}
    assert verdicts == {
        "reg": TriageVerdict.REGRESSION,
        "flk": TriageVerdict.FLAKY,
        "env": TriageVerdict.ENVIRONMENT,
        "late": TriageVerdict.FLAKY,  # passed on this build
    }
    reg = next(c for c in report.cases if c.case_id == "reg")
    assert [(r.build, r.index) for r in reg.reruns] == [
        (BuildSide.THIS, 1),
        (BuildSide.THIS, 2),
        (BuildSide.LAST, 1),
        (BuildSide.LAST, 2),
    ]
    assert reg.reruns[0].output_uri == "file:///o/reg/simulate"
    audit = report.audit
    assert audit is not None and audit.sampled == ("ok1", "ok2") and audit.rate == 0.5
    assert [(d.case_id, d.output) for d in audit.differing] == [("ok2", "trace.jsonl")]


def test_a_run_that_did_not_end_leaves_its_cases_not_triaged_with_the_reason() -> None:
    report = collect(
        _book(), WEEK, HEAD, summary_of=_summary_of("1_last_2"), digest_of=_digest,
        why_unfinished="the week's deadline came before its triage run ended",
    )  # fmt: skip
    assert {c.verdict for c in report.cases} == {TriageVerdict.NOT_TRIAGED}
    assert report.cases[0].reason == "the week's deadline came before its triage run ended"


def test_a_later_round_replaces_an_earlier_rounds_verdict() -> None:
    first = _book().rounds[0]
    later_run = TriageRun(
        label="2_this_1", build=BuildSide.THIS, index=1, image=B, run_id="w__triage_2_this_1",
        run_key="k__triage_2_this_1", cases=("env",),
    )  # fmt: skip
    second = TriageRound(round=2, chosen=(first.chosen[2],), runs=(later_run,))
    book = TriageBook(week_run_key="k", rounds=(first, second))

    def summary_of(run_key: str) -> ShardSummary | None:
        if run_key.endswith("2_this_1"):
            return ShardSummary(shard=1, cases=(_case("env", "passed"),))
        return _summary_of()(run_key)

    report = collect(book, WEEK, HEAD, summary_of=summary_of, digest_of=_digest)
    [env] = [c for c in report.cases if c.case_id == "env"]
    assert env.verdict is TriageVerdict.FLAKY and len(env.reruns) == 1
    assert len(report.cases) == len(CASES)


def test_last_weeks_image_that_no_longer_pulls_gives_environment_with_the_reason() -> None:
    """On Kubernetes an image that no longer pulls ends the attempt bad_build / image_pull
    (avsim.kube.pods); the verdict names it."""
    pull = "image_pull: ErrImagePull: manifest for reg/sim@sha256:aaaa not found"

    def summary_of(run_key: str) -> ShardSummary | None:
        label = run_key.rsplit("__triage_", 1)[1]
        if "_last_" in label:
            phase = PhaseSummary(outcome="bad_build", attempt=1, reason=pull)
            return ShardSummary(
                shard=1,
                cases=(
                    CaseSummary(
                        case_id="reg", graph="driving", outcome="bad_build", phases={"simulate": phase}
                    ),
                ),
            )
        return ShardSummary(shard=1, cases=(_case("reg", "scenario_failed"),))

    rnd = TriageRound(
        round=1, chosen=(Candidate(case_id="reg", graph="driving", failing_phase="simulate"),),
        runs=tuple(_run(side, n, ("reg",)) for side in BuildSide for n in (1, 2)),
    )  # fmt: skip
    report = collect(TriageBook(week_run_key="k", rounds=(rnd,)), {}, HEAD, summary_of=summary_of)
    [case] = report.cases
    assert case.verdict is TriageVerdict.ENVIRONMENT
    assert "last week's build ended bad_build" in case.reason and "ErrImagePull" in case.reason


def test_a_newly_passing_case_is_confirmed_by_its_rerun() -> None:
    from avsim.triage.text import render

    run = _run(BuildSide.THIS, 1, ()).model_copy(update={"confirm": ("ok1", "ok2", "gone")})
    book = TriageBook(week_run_key="k", rounds=(TriageRound(round=1, confirm=run.confirm, runs=(run,)),))
    summary = ShardSummary(shard=1, cases=(_case("ok1", "passed"), _case("ok2", "scenario_failed")))
    report = collect(book, {}, HEAD, summary_of=lambda key: summary)
    assert [(c.case_id, c.confirmed) for c in report.confirmations] == [
        ("ok1", True),
        ("ok2", False),
        ("gone", False),
    ]
    assert "did not end" in report.confirmations[2].reason
    assert "newly passing confirmed: 1 of 3" in render(report)
