"""The attempt service without Airflow: begin -> end -> commit, typed answers, no operator.

The boundary: the service (:mod:`avsim.attempt.service`) on a real prepared run on a ``file://``
ledger, with the real breaker, cache and failure policy. The task side it calls (the ``avsim_outcome``
XCom, readying the twin) and its meter are recorders (:class:`Side`, :class:`Meter`): the effects the
operator adapter makes on Airflow's side. The week is prepared by the DAG builder's ``prepare_week``
(which imports Airflow); the service itself is driven in a subprocess that never imports it
(:func:`test_the_service_runs_a_whole_cycle_without_importing_airflow`).
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tests.support.lifecycle import prepared_week, wrote_result

from avsim.artifacts import RunLayout
from avsim.attempt.args import PhaseArgs, TryView
from avsim.attempt.service import AttemptService, ResolvedInputs
from avsim.attempt.steps import Done, HandOver, Launch, Stop
from avsim.contracts import PhaseResult
from avsim.ledger.store import AttemptSuperseded, Ledger
from avsim.phases.contract import AttemptResult, Detail, Outcome
from avsim.phases.policy import Failure, Role, task_retries

ROOT = Path(__file__).resolve().parents[3]
SERVICE_FILES = sorted((ROOT / "provider" / "avsim" / "attempt").glob("*.py"))
NO_INPUTS = ResolvedInputs({})


@dataclass
class Side:
    """The task side the service calls: what it published, and whether it readied the twin."""

    published: list[PhaseResult] = field(default_factory=list)
    readied: int = 0

    def publish(self, result: PhaseResult) -> None:
        self.published.append(result)

    def ready_twin(self) -> None:
        self.readied += 1


@dataclass
class Meter:
    seen: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)

    def phase_outcome(self, *a: Any) -> None:
        self.seen.append(("phase_outcome", a))

    def gpu_seconds(self, *a: Any) -> None:
        self.seen.append(("gpu_seconds", a))

    def preemption(self, *a: Any) -> None:
        self.seen.append(("preemption", a))

    def breaker_trip(self, *a: Any) -> None:
        self.seen.append(("breaker_trip", a))


Week = tuple[dict[str, Any], dict[str, Any], Ledger]


@pytest.fixture
def week(tmp_path: Path) -> Week:
    return prepared_week(tmp_path)


def service(
    week: Week, role: Role = Role.REGULAR, gpus: int = 0, meter: Meter | None = None
) -> AttemptService:
    """The service of the case's ``prepare`` task of ``role``, with the task's retries as the DAG sets them."""
    run, case, _ = week
    task_id = "standard.prepare" + ("_on_demand" if role is Role.ON_DEMAND else "")
    args = PhaseArgs.of(phase="prepare", case=case, run=run, task_id=task_id, role=role, gpus=gpus)
    retry = AttemptService(args, meter=meter or Meter()).books.runtime_spec().get("retry") or {}
    retries = task_retries(
        role,
        int(retry.get("infrastructure", 2)),
        int(retry.get("preemption", 3)),
        int(retry.get("on_demand_after_preemptions", 2)),
    )
    return AttemptService(PhaseArgs.of(**{**vars(args), "retries": retries}), meter=meter or Meter())


def one_try(svc: AttemptService, try_number: int, result: AttemptResult, side: Side | None = None) -> Any:
    """One try of the task: begin (claim), then end with ``result``; the service's answer."""
    side = side or Side()
    tv = TryView(try_number, int(svc.args.retries or 0), 0)
    begun = svc.begin(tv, NO_INPUTS, side)
    assert isinstance(begun, Launch), begun
    if result.outcome.produced_output:
        wrote_result(begun.attempt)
    return svc.end(tv, begun.attempt, result, dt.datetime.now(dt.UTC), side)


def test_a_pass_is_committed_measured_and_cached(week: Week) -> None:
    meter = Meter()
    svc = service(week, meter=meter)
    side = Side()
    done = one_try(svc, 1, AttemptResult(Outcome.PASSED, 0), side)
    assert isinstance(done, Done) and (done.result.outcome, done.result.attempt) == (Outcome.PASSED, 1)
    committed = week[2].outcome(week[1]["case_id"], "prepare")
    assert committed is not None and committed.attempt == 1 and committed.cache_key == done.result.cache_key
    assert svc.books.cache.lookup(done.result.cache_key) is not None
    assert side.published == []  # a result is the return value, not an avsim_outcome
    assert ("phase_outcome", ("prepare", "passed", "cpu", "cpu")) in meter.seen
    assert svc.books.breaker.state().finished == 1
    # A later try of the same task: the committed result, nothing claimed.
    again = svc.begin(TryView(2, int(svc.args.retries or 0), 0), NO_INPUTS, side)
    assert again == done and [a.attempt for a in week[2].attempts(week[1]["case_id"], "prepare")] == [1]


def test_an_infrastructure_failure_is_retried_after_its_delay_then_the_budget_ends_it(week: Week) -> None:
    svc = service(week)
    rules = svc.books.runtime_spec().get("retry") or {}
    budget, delay = int(rules.get("infrastructure", 2)), float(rules.get("delay_seconds", 30))
    side = Side()
    first = one_try(svc, 1, AttemptResult(Outcome.INFRA_FAILED, 1, "segfault", Detail.CRASH), side)
    assert isinstance(first, Stop) and first.failure is Failure.INFRASTRUCTURE
    assert first.retry_delay == dt.timedelta(seconds=delay) and f"1 of {budget} infra_failed" in first.message
    assert [(p.outcome, p.attempt, p.detail) for p in side.published] == [(Outcome.INFRA_FAILED, 1, "crash")]
    for n in range(2, budget + 2):
        last = one_try(svc, n, AttemptResult(Outcome.INFRA_FAILED, 1, "segfault", Detail.CRASH))
    assert isinstance(last, Stop) and last.failure is Failure.BUDGET_EXHAUSTED and last.retry_delay is None
    committed = week[2].outcome(week[1]["case_id"], "prepare")
    assert committed is not None and (committed.outcome, committed.attempt) == (
        Outcome.INFRA_FAILED,
        budget + 1,
    )


def test_bad_input_fails_fast_and_is_committed(week: Week) -> None:
    svc = service(week)
    stop = one_try(svc, 1, AttemptResult(Outcome.BAD_INPUT, 65, "no scenario"))
    assert isinstance(stop, Stop) and stop.failure is Failure.BAD_INPUT and stop.retry_delay is None
    assert "rejected its input: no scenario" in stop.message
    committed = week[2].outcome(week[1]["case_id"], "prepare")
    assert committed is not None and committed.outcome is Outcome.BAD_INPUT and committed.output_uri == ""


def test_spot_preemptions_hand_over_after_readying_the_twin(week: Week) -> None:
    svc = service(week, Role.SPOT, 1)
    n = int((svc.books.runtime_spec().get("retry") or {}).get("on_demand_after_preemptions", 2))
    for k in range(1, n):
        retried = one_try(svc, k, AttemptResult(Outcome.PREEMPTED, 143, "reclaimed", Detail.EVICTED))
        assert (
            isinstance(retried, Stop)
            and retried.failure is Failure.EVICTED
            and retried.retry_delay is not None
        )
    side = Side()
    handed = one_try(svc, n, AttemptResult(Outcome.PREEMPTED, 143, "reclaimed", Detail.EVICTED), side)
    assert isinstance(handed, HandOver) and handed.twin_task_id == "standard.prepare_on_demand"
    assert (handed.case, handed.run) == (week[1], week[0]) and f"preempted {n} times" in handed.message
    assert side.readied == 1 and [p.outcome for p in side.published] == [Outcome.PREEMPTED]
    assert week[2].outcome(week[1]["case_id"], "prepare") is None  # the twin runs next


def test_a_rerun_with_the_same_pins_reuses_the_cached_result(week: Week, tmp_path: Path) -> None:
    first = one_try(service(week), 1, AttemptResult(Outcome.PASSED, 0))
    assert isinstance(first, Done)
    # A second run on the same artifact root: another run key, the same case, phase, spec and image.
    run2 = {**week[0], "run_key": week[0]["run_key"] + "_again"}
    head = RunLayout(run2["artifact_root"], run2["run_key"]).head_uri.removeprefix("file://")
    Path(head).parent.mkdir(parents=True, exist_ok=True)
    Path(head).write_text(Path(service(week).books.layout.head_uri.removeprefix("file://")).read_text())
    svc2 = service((run2, week[1], week[2]))
    reused = svc2.begin(TryView(1, int(svc2.args.retries or 0), 0), NO_INPUTS, Side())
    assert (
        isinstance(reused, Done)
        and reused.result.reused
        and reused.result.output_uri == first.result.output_uri
    )
    assert reused.result.detail == Detail.REUSED
    [rec] = svc2.books.ledger.attempts(week[1]["case_id"], "prepare")
    assert (rec.outcome, rec.detail) == (Outcome.PASSED, "reused")


def test_an_open_breaker_launches_nothing(week: Week) -> None:
    svc = service(week)
    svc.books.breaker.trip("the canary gate failed")
    side = Side()
    stop = svc.begin(TryView(1, int(svc.args.retries or 0), 0), NO_INPUTS, side)
    assert (
        isinstance(stop, Stop)
        and stop.failure is Failure.BREAKER_OPEN
        and "circuit breaker open" in stop.message
    )
    assert [(p.outcome, p.detail) for p in side.published] == [(Outcome.BAD_BUILD, "breaker_open")]
    committed = week[2].outcome(week[1]["case_id"], "prepare")
    assert committed is not None and (committed.outcome, committed.detail) == (
        Outcome.BAD_BUILD,
        "breaker_open",
    )


def test_a_superseded_attempt_records_and_counts_nothing(week: Week) -> None:
    meter = Meter()
    svc = service(week, meter=meter)
    retries = int(svc.args.retries or 0)
    first = svc.begin(TryView(1, retries, 0), NO_INPUTS, Side())
    second = svc.begin(TryView(2, retries, 0), NO_INPUTS, Side())  # try 1's worker was lost
    assert isinstance(first, Launch) and isinstance(second, Launch) and second.attempt.attempt == 2
    wrote_result(first.attempt)
    with pytest.raises(AttemptSuperseded, match="attempt 2 is the current one"):
        svc.end(
            TryView(1, retries, 0),
            first.attempt,
            AttemptResult(Outcome.PASSED, 0),
            dt.datetime.now(dt.UTC),
            Side(),
        )
    rec = week[2].attempts(week[1]["case_id"], "prepare")[0]
    assert (rec.outcome, rec.detail) == (Outcome.INFRA_FAILED, "abandoned")
    assert week[2].outcome(week[1]["case_id"], "prepare") is None
    assert meter.seen == [] and svc.books.breaker.state().finished == 0


def test_the_service_modules_import_nothing_of_airflow() -> None:
    """Read from the source: no ``airflow`` import in the service's package, deferred ones included."""
    found = [
        f"{path.name}:{node.lineno}"
        for path in SERVICE_FILES
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        and any(
            n.split(".")[0] == "airflow"
            for n in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""])
        )
    ]
    assert SERVICE_FILES and found == []


CYCLE = """
import datetime as dt, json, sys
from pathlib import Path
from avsim.attempt.args import PhaseArgs, TryView
from avsim.attempt.service import AttemptService, ResolvedInputs
from avsim.attempt.steps import Done, Launch, NoTaskSide
from avsim.phases.contract import AttemptResult, Outcome

class Meter:
    def __getattr__(self, name):
        return lambda *a: None

run, case = json.loads(sys.argv[1]), json.loads(sys.argv[2])
svc = AttemptService(PhaseArgs.of(phase="prepare", case=case, run=run, task_id="standard.prepare"), meter=Meter())
tv = TryView(1, 0, 0)
begun = svc.begin(tv, ResolvedInputs({}), NoTaskSide())
assert isinstance(begun, Launch), begun
out = Path(begun.attempt.output_uri.removeprefix("file://"))
out.mkdir(parents=True, exist_ok=True)
(out / "result.json").write_text(json.dumps({"outcome": "passed", "metrics": {}}))
done = svc.end(tv, begun.attempt, AttemptResult(Outcome.PASSED, 0), dt.datetime.now(dt.UTC), NoTaskSide())
assert isinstance(done, Done), done
print(json.dumps({"result": done.xcom(), "airflow": sorted(m for m in sys.modules if m.split(".")[0] == "airflow")}))
"""


def test_the_service_runs_a_whole_cycle_without_importing_airflow(week: Week) -> None:
    """In a fresh interpreter: begin, end and commit a passed attempt on the prepared run; no
    ``airflow`` module is loaded at any point."""
    run, case, ledger = week
    proc = subprocess.run(
        [sys.executable, "-c", CYCLE, json.dumps(run), json.dumps(case)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["airflow"] == []
    assert (report["result"]["outcome"], report["result"]["attempt"]) == ("passed", 1)
    committed = ledger.outcome(case["case_id"], "prepare")
    assert committed is not None and committed.outcome is Outcome.PASSED  # the subprocess's commit, read here


def test_a_cache_entry_written_before_the_model_is_reused(week: Week) -> None:
    """A cache entry outlives its run: one written as the dict the model replaces (same keys) is read
    as a CacheEntry and reused as before."""
    from avsim.artifacts import cache_uri
    from avsim.contracts.case import CacheEntry

    svc = service(week)
    key = svc.attempt_for(NO_INPUTS).cache_key
    old = {
        "key": key,
        "outcome": "passed",
        "output_uri": "file:///elsewhere/prepare/attempt-4",
        "result": {"metrics": {"m": 2}},
        "run_key": "avsim_weekly__w40",
        "case_id": week[1]["case_id"],
        "phase": "prepare",
        "attempt": 4,
        "committed_at": "2026-10-01T10:00:00+00:00",
    }
    assert svc.books.ledger.documents.create(cache_uri(svc.books.layout.root, key), old)
    assert svc.books.cache.lookup(key) == CacheEntry.model_validate(old)
    reused = svc.begin(TryView(1, int(svc.args.retries or 0), 0), NO_INPUTS, Side())
    assert isinstance(reused, Done) and reused.result.output_uri == old["output_uri"] and reused.result.reused
    committed = week[2].outcome(week[1]["case_id"], "prepare")
    assert (
        committed is not None
        and committed.reused_from == "avsim_weekly__w40:" + week[1]["case_id"] + "/prepare#4"
    )
    assert committed.result == {"metrics": {"m": 2}}


def test_a_phase_runtime_takes_the_manifests_defaults_and_checks(week: Week) -> None:
    """The snapshot's phase spec is read through the manifest's PhaseSpec: what a spec leaves out is the
    model's default (not a copy kept in avsim.attempt), and a snapshot edited after validation into a
    spec the manifest refuses (a lease under two heartbeats) is refused at run time too."""
    from pydantic import ValidationError

    from avsim.attempt import PhaseRuntime
    from avsim.manifest.models import PhaseSpec

    minimal = {
        "resources": {"class": "cpu"},
        "estimated_duration_seconds": 60,
        "timeout_seconds": 120,
        "command": ["avsim-fakesim", "prepare"],
    }
    runtime = PhaseRuntime.from_spec(minimal)
    model = PhaseSpec.model_validate(minimal)
    assert (runtime.cpus, runtime.memory, runtime.heartbeat_seconds, runtime.lease_seconds) == (
        model.resources.cpus,
        model.resources.memory,
        model.heartbeat_seconds,
        model.lease_seconds,
    )
    assert runtime.retry == model.retry and runtime.pod == model.pod and runtime.spec == minimal
    # The snapshot's own specs (graphs and run phases) all read.
    head = service(week).books.head
    for graph in head["graphs"].values():
        for spec in graph["phases"].values():
            assert PhaseRuntime.from_spec(spec).command
    for spec in head.get("run_phases", {}).values():
        assert not PhaseRuntime.from_spec(spec).checkpoint
    with pytest.raises(ValidationError, match="under twice heartbeat_seconds"):
        PhaseRuntime.from_spec({**minimal, "heartbeat_seconds": 60, "lease_seconds": 90})


def test_a_case_entry_keeps_its_json_and_refuses_a_misspelt_field(week: Week) -> None:
    """The case entry the plan writes (a shard's case lists, the mapped groups' XCom) is a CaseEntry:
    its JSON is the dict's it replaced (``phases`` only for a case with its own), one written before
    the model parses, and a misspelt field is refused where a phase task reads it."""
    from pydantic import ValidationError

    from avsim.contracts.case import CaseEntry
    from avsim.manifest.sample import sample_manifest
    from avsim.manifest.validation import validate_manifest
    from avsim.plan.shards import case_entry

    m = validate_manifest(sample_manifest(2))
    case = m.cases[0]
    entry = case_entry(case, "standard")
    assert entry == {
        "case_id": case.id,
        "family": "standard",
        "graph": case.graph or "standard",
        "seed": case.seed,
        "scenario_uri": case.scenario.uri,
        "scenario_version": case.scenario.version,
        "parameters": case.parameters,
        "tags": list(case.tags),
    }
    assert CaseEntry.model_validate(week[1]).to_json() == week[1]  # the prepared week's, as XCom holds it
    run, _, _ = week
    with pytest.raises(ValidationError, match="sede"):
        PhaseArgs.of(phase="prepare", case={**week[1], "sede": 3}, run=run, task_id="standard.prepare")
    svc = service(week)
    assert svc.books.runtime_spec() == svc.books.head["graphs"][week[1]["graph"]]["phases"]["prepare"]


def test_a_passed_end_reads_who_owns_the_phase_once(week: Week) -> None:
    """The fence (Ledger.end_attempt) reads the phase's current attempt before anything of the end is
    written; the commit that follows an owned end does not read it again (a GET per phase, per pass)."""
    svc = service(week)
    tv = TryView(1, int(svc.args.retries or 0), 0)
    begun = svc.begin(tv, NO_INPUTS, Side())
    assert isinstance(begun, Launch)
    wrote_result(begun.attempt)
    current_uri = svc.books.ledger.current_uri(week[1]["case_id"], "prepare")
    reads: list[str] = []
    real = svc.books.ledger.documents.read
    svc.books.ledger.documents.read = lambda uri: (
        (reads.append(uri) if uri == current_uri else None) or real(uri)
    )  # type: ignore[method-assign]
    done = svc.end(tv, begun.attempt, AttemptResult(Outcome.PASSED, 0), dt.datetime.now(dt.UTC), Side())
    assert isinstance(done, Done) and done.result.attempt == 1
    assert reads == [current_uri]
