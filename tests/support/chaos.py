"""Chaos weeks: a weekly run with faults at stated rates, zombie reports at the ledger boundary,
and an audit of what the run left in the ledger and the metadata database.

Used by ``tests/integration/test_chaos.py`` (a small week) and ``bench/chaos.py`` (a longer one).

Faults come from two places:

* the fake simulator itself: ``--crash-rate`` and ``--hang-rate`` on every phase, ``--preempt-rate``
  on GPU phases (a spot reclaim ends the process with SIGTERM), ``--scenario-fail-rate`` on the
  driving phases, drawn per attempt, plus a few per-case forced faults (``parameters.fakesim``)
  so that every budget is used up at least once;
* :class:`ZombieReporter`, a thread that plays zombie workers while the run goes: late reports
  from superseded attempts and duplicate reports of committed outcomes, made through
  ``Ledger.commit``, the call a worker's report makes.

Every draw of the fake simulator is seeded by (seed, case, phase, purpose, attempt), so
:func:`fakesim_verdict` says in advance what each attempt of each phase does, and
:func:`replay_phase` applies the phase contract's rules (one budget per failure class, the
fallback from spot to on-demand nodes) to say how each phase and case must end and which task
ran each attempt. :func:`audit_week` compares that with what the run recorded.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from avsim.artifacts import RunLayout
from avsim.devstack import fakesim
from avsim.devstack.fakesim_artifacts import DRIVING_KINDS
from avsim.ledger.records import AttemptRecord, OutcomeRecord
from avsim.ledger.store import Ledger
from avsim.manifest.sample import sample_manifest
from avsim.phases.contract import NODE_CPU, NODE_ON_DEMAND, NODE_SPOT, Outcome
from avsim.phases.policy import Role, preemption_budget, task_retries
from avsim.plan.model import ON_DEMAND_SUFFIX

PASSED = Outcome.PASSED.value
SCENARIO_FAILED = Outcome.SCENARIO_FAILED.value
BAD_INPUT = Outcome.BAD_INPUT.value
INFRA = Outcome.INFRA_FAILED.value
PREEMPTED = Outcome.PREEMPTED.value
NOT_RUN = "upstream_failed"
PRODUCED = (PASSED, SCENARIO_FAILED)
#: How the local backend records each fault of the fake simulator: (outcome, detail).
FAULT_RESULTS = {
    "crash": (INFRA, "crash"),  # exit 1
    "preempt": (PREEMPTED, "terminated"),  # SIGTERM
    "hang": (INFRA, "lease_expired"),  # no heartbeat: killed when the lease expires
}
TERMINAL_TI_STATES = frozenset({"success", "failed", "skipped", "upstream_failed"})

#: Forced faults, one per standard case from the first on: (phase, parameters.fakesim value, why).
FORCED_FAULTS: tuple[tuple[str, str, str], ...] = (
    ("simulate", "crash", "crashes every attempt: the infrastructure budget is used up on spot nodes"),
    (
        "simulate",
        "preempt_before:9",
        "preempted on spot and on on-demand nodes: the preemption budget is used up",
    ),
    ("simulate", "preempt_before:3", "preempted twice on spot: falls back to on-demand nodes and passes"),
    ("prepare", "bad_input", "bad input: fails at once, never retried"),
    ("simulate", "scenario_failed", "the driving software fails the scenario: a result, never retried"),
    ("evaluate", "hang_once", "hangs without heartbeat once: the lease expires, the retry passes"),
    ("evaluate", "crash_before:3", "crashes twice: passes on its last infrastructure retry"),
)


# -- the week ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ChaosRates:
    """Per-attempt probabilities of each fault (see the module docstring for where each applies)."""

    crash: float = 0.06
    preempt: float = 0.10
    hang: float = 0.02
    scenario_fail: float = 0.06

    def describe(self) -> str:
        return (
            f"crash {self.crash:.0%} and hang {self.hang:.0%} per attempt of every phase, "
            f"preemption {self.preempt:.0%} per attempt of GPU phases, "
            f"scenario failure {self.scenario_fail:.0%} per driving phase"
        )


def _set_flags(args: Sequence[str], flags: Mapping[str, float]) -> list[str]:
    out = list(args)
    for flag, value in flags.items():
        if flag in out:
            out[out.index(flag) + 1] = f"{value:g}"
        else:
            out += [flag, f"{value:g}"]
    return out


def chaos_manifest(
    cases: int,
    rates: ChaosRates,
    *,
    seed: int,
    time_scale: float,
    heartbeat_seconds: float = 1.0,
    lease_seconds: float = 10.0,
    forced: Sequence[tuple[str, str, str]] = FORCED_FAULTS,
    deadline: dt.datetime | None = None,
) -> dict[str, Any]:
    """The sample week of ``cases`` cases with the fake simulator's fault rates set, small heartbeat
    and lease values (a hang is found within ``lease_seconds``), one-second retry delays, and
    ``forced`` faults on the first standard cases. A small canary stage runs first with a gate that
    never stops the week (its threshold is tested elsewhere; here its cases take the same faults).
    The build's circuit breaker keeps its defaults: at these rates it must stay closed (the audit
    checks it did)."""
    doc = sample_manifest(
        cases,
        seed=seed,
        time_scale=time_scale,
        scenario_fail_rate=rates.scenario_fail,
        canary={"share": 0.05, "min_cases": 3, "max_failure_rate": 1.0},
        deadline=deadline,
    )
    for graph in doc["graphs"].values():
        for phase in graph["phases"].values():
            flags = {"--crash-rate": rates.crash, "--hang-rate": rates.hang}
            if phase["resources"]["gpus"]:
                flags["--preempt-rate"] = rates.preempt
            phase["args"] = _set_flags(phase["args"], flags)
            phase.update(heartbeat_seconds=heartbeat_seconds, lease_seconds=lease_seconds)
            phase["retry"].update(delay_seconds=1, backoff=1.0, preemption_delay_seconds=1)
    standard = [c for c in doc["cases"] if c["graph"] == "standard"]
    if len(standard) < len(forced):
        raise ValueError(
            f"{cases} cases hold {len(standard)} standard cases, fewer than {len(forced)} forced faults"
        )
    for case, (phase, fault, _) in zip(standard, forced, strict=False):
        case["parameters"]["fakesim"] = {phase: fault}
    return doc


# -- what each attempt does, and how each phase must end ------------------------------------------
def fakesim_verdict(
    case: Mapping[str, Any], phase: str, args: Sequence[str], attempt: int
) -> tuple[str, str]:
    """What attempt ``attempt`` of the fake simulator does, as the local backend records it: (outcome, detail).

    The same draws, in the same order, as ``avsim.devstack.fakesim.run``: bad input, the scenario's
    verdict (seeded without the attempt: a retry gets the same verdict), then the fault (seeded
    with the attempt), forced faults first.
    """
    opts = fakesim.parser().parse_args(list(args))
    env = fakesim.PhaseEnv(
        run_id="",
        case_id=str(case["id"]),
        phase=phase,
        attempt=attempt,
        seed=int(case["seed"]),
        inputs={},
        scenario_uri="",
        scenario_version="",
        output_uri="",
        checkpoint_uri="",
        parameters=dict(case.get("parameters") or {}),
        build_id="",
        image="",
    )
    if env.forced == "bad_input" or env.rng("bad_input").random() < opts.bad_input_rate:
        return BAD_INPUT, ""
    failed = env.forced == "scenario_failed" or (
        opts.kind in DRIVING_KINDS and env.rng("scenario").random() < opts.scenario_fail_rate
    )
    fault = next((f for f in fakesim.FAULTS if env.fault_forced(f)), "")
    if not fault:
        draw = env.rng("crash", attempt).random()
        for name, rate in (
            ("crash", opts.crash_rate),
            ("preempt", opts.preempt_rate),
            ("hang", opts.hang_rate),
        ):
            if draw < rate:
                fault = name
                break
            draw -= rate
    if fault:
        return FAULT_RESULTS[fault]
    return (SCENARIO_FAILED if failed else PASSED), ""


@dataclasses.dataclass(frozen=True)
class PlannedAttempt:
    attempt: int
    outcome: str
    detail: str
    #: "" for the phase's own task, "_on_demand" for a GPU phase's on-demand twin.
    task: str
    node_class: str


@dataclasses.dataclass(frozen=True)
class PlannedPhase:
    attempts: tuple[PlannedAttempt, ...]
    #: The committed outcome, or ``upstream_failed`` when an upstream phase produced nothing.
    outcome: str
    #: task suffix -> (final task-instance state, tries it made)
    tasks: Mapping[str, tuple[str, int]]


def budgets_of(spec: Mapping[str, Any]) -> tuple[int, int, int]:
    """A phase's (infrastructure, preemption, on_demand_after_preemptions) retry budgets."""
    retry = spec.get("retry") or {}
    return (
        int(retry.get("infrastructure", 2)),
        int(retry.get("preemption", 3)),
        int(retry.get("on_demand_after_preemptions", 2)),
    )


def has_twin(spec: Mapping[str, Any]) -> bool:
    return bool(spec["resources"]["gpus"]) and budgets_of(spec)[1] > 0


def replay_phase(
    verdict: Callable[[int], tuple[str, str]], spec: Mapping[str, Any], *, limit: int = 64
) -> PlannedPhase:
    """The attempts of one phase and how it ends, by the phase contract's rules, given what each
    attempt does (``verdict(n)``).

    The rules (``avsim.operators.lifecycle``): a result (passed, scenario_failed) is committed and
    ends the phase; bad input is committed at once; an infrastructure failure or a preemption is
    retried while the task's budget of its class lasts (``count > budget`` commits it), and a spot
    task preempted ``on_demand_after_preemptions`` times hands the phase to its on-demand twin,
    which gets its own budgets; a task's last Airflow try commits whatever it got.
    """
    gpus = int(spec["resources"]["gpus"])
    infra, preempt, after = budgets_of(spec)
    role = Role.SPOT if has_twin(spec) else Role.REGULAR
    attempts: list[PlannedAttempt] = []
    tasks: dict[str, tuple[str, int]] = {}
    counts = {INFRA: 0, PREEMPTED: 0}
    tries = 0
    committed = ""
    for n in range(1, limit + 1):
        tries += 1
        outcome, detail = verdict(n)
        task = ON_DEMAND_SUFFIX if role == Role.ON_DEMAND else ""
        node = NODE_CPU if not gpus else (NODE_ON_DEMAND if role == Role.ON_DEMAND else NODE_SPOT)
        attempts.append(PlannedAttempt(n, outcome, detail, task, node))
        if outcome in PRODUCED:
            tasks[task], committed = ("success", tries), outcome
            break
        if outcome == BAD_INPUT:
            tasks[task], committed = ("failed", tries), outcome
            break
        counts[outcome] += 1
        if outcome == PREEMPTED and role == Role.SPOT and counts[PREEMPTED] >= after:
            tasks[task] = ("skipped", tries)
            role, counts, tries = Role.ON_DEMAND, {INFRA: 0, PREEMPTED: 0}, 0
            continue
        budget = {INFRA: infra, PREEMPTED: preemption_budget(role, preempt, after)}
        if counts[outcome] > budget[outcome] or tries > task_retries(role, infra, preempt, after):
            tasks[task], committed = ("failed", tries), outcome
            break
    else:
        raise AssertionError(f"no end after {limit} attempts")
    if has_twin(spec) and ON_DEMAND_SUFFIX not in tasks:
        # The twin's trigger rule is all_skipped on its spot task: it runs only after a hand-over.
        tasks[ON_DEMAND_SUFFIX] = ("skipped", 0)
    return PlannedPhase(tuple(attempts), committed, tasks)


def not_run(spec: Mapping[str, Any]) -> PlannedPhase:
    tasks = {"": ("upstream_failed", 0)}
    if has_twin(spec):
        tasks[ON_DEMAND_SUFFIX] = ("skipped", 0)  # all_skipped on a spot task that never ran
    return PlannedPhase((), NOT_RUN, tasks)


def plan_case(
    case: Mapping[str, Any],
    phases: Mapping[str, Mapping[str, Any]],
    verdict: Callable[[str, int], tuple[str, str]] | None = None,
) -> dict[str, PlannedPhase]:
    """Every phase of a case (in the graph's order, which is topological): its attempts and end.

    ``verdict(phase, n)`` says what attempt n does; by default the fake simulator's draws.
    """
    planned: dict[str, PlannedPhase] = {}
    for name, spec in phases.items():
        if any(planned[up].outcome not in PRODUCED for up in spec.get("depends_on") or ()):
            planned[name] = not_run(spec)
            continue

        def one(n: int, name: str = name, spec: Mapping[str, Any] = spec) -> tuple[str, str]:
            if verdict is not None:
                return verdict(name, n)
            return fakesim_verdict(case, name, spec["args"], n)

        planned[name] = replay_phase(one, spec)
    return planned


# -- zombie workers ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Injected:
    kind: str  # late (a superseded attempt reports) | duplicate (a committed report again)
    case_id: str
    phase: str
    attempt: int
    outcome: str
    #: The (case, phase) had a committed outcome when the report came.
    after_commit: bool
    #: What Ledger.commit answered: True would mean the report changed the committed outcome.
    accepted: bool


class ZombieReporter:
    """Plays zombie workers at the ledger boundary while the run goes.

    A worker that was given up on (its try failed for a lost heartbeat, its pod was deleted, its
    process hung) can still finish and report; a report can be delivered twice. Either way the
    report is a call to ``Ledger.commit`` for its attempt, so this thread makes exactly those calls
    (the honest boundary: we inject the reports, the ledger's real rules judge them):

    * for every superseded attempt (a lower number than the phase's current attempt): a late report
      of what that attempt recorded, and a forged ``passed`` (the worst case: a zombie whose process
      finished after all), pointing at the attempt's own output prefix;
    * for every committed outcome: the same record again (a duplicate).

    It also keeps the first committed outcome it saw of each (case, phase), to show at the end that
    no report changed it. Ledger documents are listed and read through the ledger's document store
    (``file://`` or ``s3://``).
    """

    def __init__(self, layout: RunLayout, interval: float = 0.5) -> None:
        self.layout = layout
        self.ledger = Ledger(layout)
        self.interval = interval
        #: Listed and read through the ledger's document store, as the store holds them now (an
        #: s3fs listing is cached: a sweep would not see the week's new documents).
        self.store = self.ledger.documents
        self.injected: list[Injected] = []
        self.first_seen: dict[tuple[str, str], dict[str, Any]] = {}
        self._late_done: set[tuple[str, str, int, str]] = set()
        self._dup_done: set[tuple[str, str, str]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos-zombies", daemon=True)
        self.errors: list[str] = []

    def start(self) -> ZombieReporter:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread, then sweep once more: late reports after every phase has ended."""
        self._stop.set()
        self._thread.join(timeout=60)
        self.sweep(final=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sweep()
            except Exception as exc:  # a sweep racing a writer; record it, keep going
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def _load(self, uri: str) -> dict[str, Any] | None:
        try:
            data = self.store.read(uri)
        except ValueError:  # a document being written
            return None
        return data if isinstance(data, dict) else None

    def _listed(self, folder: str) -> list[tuple[str, str, str]]:
        """(case id, phase, URI) of each ``<folder>/<case>/<phase>.json`` of the ledger."""
        found = []
        for uri in self.store.list(f"{self.layout.ledger}/{folder}", "*/*.json"):
            case_id, name = uri.rsplit("/", 2)[1:]
            found.append((case_id, name.removesuffix(".json"), uri))
        return found

    def sweep(self, final: bool = False) -> None:
        for case_id, phase, uri in self._listed("outcomes"):
            key = (case_id, phase)
            doc = self._load(uri)
            if doc is None:
                continue
            self.first_seen.setdefault(key, doc)
            tag = "final" if final else "live"
            if (*key, tag) not in self._dup_done:
                self._dup_done.add((*key, tag))
                self._report("duplicate", OutcomeRecord.from_json(doc))
        for case_id, phase, uri in self._listed("current"):
            doc = self._load(uri)
            current = int(doc["attempt"]) if doc and "attempt" in doc else 0
            for k in range(1, current):
                rec = self._attempt(case_id, phase, k)
                if rec is None:
                    continue
                for forged in (False, True):
                    outcome = Outcome.PASSED if forged else rec.outcome
                    if outcome is None:
                        continue
                    tag = ("final" if final else "live") + ("-forged" if forged else "")
                    if (case_id, phase, k, tag) in self._late_done:
                        continue
                    self._late_done.add((case_id, phase, k, tag))
                    self._report(
                        "late",
                        OutcomeRecord(
                            run_key=self.layout.run_key,
                            case_id=case_id,
                            phase=phase,
                            attempt=k,
                            outcome=outcome,
                            output_uri=rec.output_uri if outcome.produced_output else "",
                            committed_at=dt.datetime.now(dt.UTC).isoformat(),
                            reason="report of a zombie worker (chaos injection)",
                        ),
                    )

    def _attempt(self, case_id: str, phase: str, n: int) -> AttemptRecord | None:
        doc = self._load(self.layout.attempt_record(case_id, phase, n))
        return AttemptRecord.from_json(doc) if doc else None

    def _report(self, kind: str, rec: OutcomeRecord) -> None:
        had = self.ledger.outcome(rec.case_id, rec.phase) is not None
        accepted = self.ledger.commit(rec)
        self.injected.append(
            Injected(kind, rec.case_id, rec.phase, rec.attempt, rec.outcome.value, had, accepted)
        )
