"""The audit of a finished chaos week (:mod:`tests.support.chaos`): the invariants, from the ledger
and the metadata database, and the figures the test and the bench print.

Invariants, one :class:`Check` each:

* **terminal state and right class**: the week, its shard runs and every phase task instance
  ended; every phase and case ended in the class the injected faults give (the fake simulator's
  seeded draws replayed through the phase contract's rules); the report's totals agree;
* **attempts as the injected faults dictate**: each recorded attempt did what its draw says, ran
  on the task and node class the rules give, and one attempt per Airflow try;
* **no phase committed twice**: attempt numbers 1..n, the committed attempt is the last claimed
  one, no attempt left started, the committed outcome never changed once written;
* **no result lost**: every phase that had to run has a committed outcome; a committed result's
  files are complete under its own attempt's prefix, and its downstream read exactly that prefix;
* **no scenario failure retried**: a scenario failure is the last attempt of its phase;
* **retries within their class budgets**: per task and round, each class's failures counted
  against the manifest's budgets; nothing retried once a budget was spent;
* **zombie and duplicate reports refused**: every injected report left the ledger unchanged.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from tests.support.airflow_run import query
from tests.support.chaos import (
    INFRA,
    NOT_RUN,
    PASSED,
    PREEMPTED,
    SCENARIO_FAILED,
    ChaosRates,
    PlannedPhase,
    ZombieReporter,
    budgets_of,
    fakesim_verdict,
    has_twin,
    plan_case,
)

from avsim import storage
from avsim.artifacts import RUN_LEVEL_CASE, RunLayout, canary_run_id, shard_run_id
from avsim.contracts.week import CaseSummary
from avsim.devstack.stack import LocalStack
from avsim.ledger.breaker import Breaker
from avsim.ledger.records import AttemptRecord, OutcomeRecord
from avsim.ledger.store import Ledger
from avsim.phases.contract import NODE_ON_DEMAND, Outcome, case_class
from avsim.phases.policy import Role, preemption_budget
from avsim.plan.model import ON_DEMAND_SUFFIX
from avsim.plan.shards import CANARY_SHARD, ShardPlan
from avsim.verdict import shard_verdict

TERMINAL_TI_STATES = frozenset({"success", "failed", "skipped", "upstream_failed"})
#: How an attempt whose worker was killed ends: recorded by the next try, or by the phase's own watch.
LOST = frozenset({(INFRA, "abandoned"), (INFRA, "worker_lost")})
CHECKS = (
    "terminal state and right class",
    "attempts as the injected faults dictate",
    "no phase committed twice",
    "no result lost",
    "no scenario failure retried",
    "retries within their class budgets",
    "zombie and duplicate reports refused",
)


@dataclasses.dataclass
class Check:
    name: str
    problems: list[str] = dataclasses.field(default_factory=list)
    checked: int = 0

    def fail(self, message: str) -> None:
        self.problems.append(message)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclasses.dataclass
class Audit:
    checks: dict[str, Check]
    figures: dict[str, Any]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks.values())

    def problems(self, limit: int = 25) -> str:
        lines = [f"[{c.name}] {p}" for c in self.checks.values() for p in c.problems]
        more = f"\n... and {len(lines) - limit} more" if len(lines) > limit else ""
        return "\n".join(lines[:limit]) + more

    def lines(self) -> list[str]:
        """The figures and the checks, as the test and the bench print them."""
        f = self.figures
        out = [
            f"chaos week: {f['cases']} cases in {f['shard_runs']} shard runs, {f['phases']} phases, "
            f"{f['attempts']} attempts, {f['seconds']:.0f} s from trigger to end",
            f"  fault rates:       {f['rates']}",
            "  case classes:      " + _counts(f["case_classes"]),
            "  committed phases:  " + _counts(f["phase_classes"]),
            "  attempts by class: " + _counts(f["attempt_classes"]),
            "  attempts by node:  " + _counts(f["attempt_nodes"]),
            f"  retries:           {f['retries']} in {f['retried_phases']} phases; {f['fallbacks']} phases "
            f"handed over to on-demand nodes; longest phase {f['max_attempts']} attempts",
            f"  forced faults:     {f['forced']} cases; attempts the draws did not foresee "
            f"(a start slower than the lease): {f['unforeseen']}; lost with a killed worker: {f['lost']}",
            f"  zombie reports:    {f['late']} late ({f['late_before_commit']} before the phase committed, "
            f"{f['late'] - f['late_before_commit']} after), {f['duplicates']} duplicates: "
            f"{f['refused']} of {f['late'] + f['duplicates']} refused",
            f"  circuit breaker:   {f['breaker']}",
        ]
        for c in self.checks.values():
            state = "PASS" if c.ok else f"FAIL ({len(c.problems)})"
            out.append(f"  {state:<9} {c.name} ({c.checked} checked)")
        return out


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) or "none"


def _out(a: AttemptRecord) -> str:
    return a.outcome.value if a.outcome else a.state


def _path(uri: str) -> Any:
    """A file:// or s3:// URI as a path (ObjectStoragePath)."""
    return storage.path(uri)


class WeekAuditor:
    """Audits one finished chaos week; :meth:`run` returns the :class:`Audit`."""

    def __init__(
        self,
        stack: LocalStack,
        run_id: str,
        layout: RunLayout,
        doc: Mapping[str, Any],
        reporter: ZombieReporter,
        lost_tries: frozenset[tuple[str, str, int]] = frozenset(),
    ) -> None:
        self.stack, self.run_id, self.layout, self.doc, self.reporter = stack, run_id, layout, doc, reporter
        #: (case id, task id, try number) of the tries a test killed with their worker: their attempts
        #: may end infra_failed/abandoned (recorded by the next try) or /worker_lost, whatever the draw.
        self.lost_tries = lost_tries
        self.ledger = Ledger(layout)
        self.checks = {n: Check(n) for n in CHECKS}
        (
            self.terminal,
            self.foreseen,
            self.once,
            self.lost,
            self.scenario,
            self.budgets,
            self.zombies,
        ) = (self.checks[n] for n in CHECKS)
        self.attempt_classes: collections.Counter[str] = collections.Counter()
        self.attempt_nodes: collections.Counter[str] = collections.Counter()
        self.phase_classes: collections.Counter[str] = collections.Counter()
        self.case_classes: collections.Counter[str] = collections.Counter()
        self.n = collections.Counter[str]()
        self.tis: dict[tuple[str, str], tuple[str, int]] = {}

    def run(self, *, seconds: float, rates: ChaosRates) -> Audit:
        shard_runs = self._runs()
        self.tis = self._task_instances()
        for (case_id, task_id), (state, _) in self.tis.items():
            self.terminal.checked += 1
            if state not in TERMINAL_TI_STATES:
                self.terminal.fail(f"{task_id}[{case_id}] left in state {state}")
        summaries = {c.case_id: c for s in self.ledger.shard_summaries() for c in s.cases}
        for case in self.doc["cases"]:
            self._case(case, summaries.get(str(case["id"])))
        self._report_and_run_phases()
        self._zombies()
        closed, breaker = self._breaker()
        if not closed:
            self.terminal.fail(f"the build's circuit breaker opened at these fault rates: {breaker}")
        late = [z for z in self.reporter.injected if z.kind == "late"]
        figures = {
            "cases": len(self.doc["cases"]),
            "shard_runs": shard_runs,
            "seconds": seconds,
            "rates": rates.describe(),
            "phases": self.n["phases"],
            "attempts": self.n["attempts"],
            "retries": self.n["attempts"] - self.n["ran"],
            "retried_phases": self.n["retried"],
            "fallbacks": self.n["fallbacks"],
            "max_attempts": self.n["max"],
            "unforeseen": self.n["unforeseen"],
            "lost": self.n["lost"],
            "forced": self.n["forced"],
            "case_classes": dict(self.case_classes),
            "phase_classes": dict(self.phase_classes),
            "attempt_classes": dict(self.attempt_classes),
            "attempt_nodes": dict(self.attempt_nodes),
            "late": len(late),
            "late_before_commit": sum(1 for z in late if not z.after_commit),
            "duplicates": len(self.reporter.injected) - len(late),
            "refused": sum(1 for z in self.reporter.injected if not z.accepted),
            "breaker": breaker,
        }
        return Audit(self.checks, figures)

    # -- runs and task instances ----------------------------------------------------------------
    def _runs(self) -> int:
        week = query(
            self.stack,
            "SELECT state FROM dag_run WHERE dag_id = 'avsim_weekly' AND run_id = :r",
            r=self.run_id,
        )
        # A run's state is its verdict (avsim.verdict): a shard run fails exactly when a case of it
        # needs attention, the week when any shard did; the cases' classes are checked on their own.
        verdicts = {s.shard: shard_verdict(s) for s in Ledger(self.layout).shard_summaries()}
        want_week = "failed" if any(v.needs_attention for v in verdicts.values()) else "success"
        self.terminal.checked += 1
        if [r[0] for r in week] != [want_week]:
            self.terminal.fail(f"weekly run {self.run_id} ended {week}, expected {want_week}")
        rows = query(
            self.stack,
            "SELECT run_id, state FROM dag_run WHERE dag_id = 'avsim_weekly_shard' AND run_id LIKE :p",
            p=f"{self.run_id}__%",
        )
        for rid, state in rows:
            self.terminal.checked += 1
            tail = rid.rsplit("__", 1)[-1]
            verdict = verdicts.get(0 if tail == "canary" else int(tail.removeprefix("shard_")))
            want = "failed" if verdict is not None and verdict.needs_attention else "success"
            if state != want:
                self.terminal.fail(f"shard run {rid} ended {state}, expected {want}")
        canary = (
            [canary_run_id(self.run_id)] if self.doc["run"].get("canary", {}).get("enabled", True) else []
        )
        want = {*canary, *(shard_run_id(self.run_id, i) for i in range(1, len(rows) - len(canary) + 1))}
        if {r[0] for r in rows} != want:
            self.terminal.fail(f"shard runs {sorted(r[0] for r in rows)}, expected {sorted(want)}")
        return len(rows)

    def _task_instances(self) -> dict[tuple[str, str], tuple[str, int]]:
        """(case id, task id) -> (state, try_number) of every phase task instance of the week's shard runs.

        A task instance that never ran has no rendered map index, so its case is found by map index
        in the shard's case list (the order each family's group maps over).
        """
        rows = query(
            self.stack,
            "SELECT run_id, task_id, map_index, state, try_number FROM task_instance "
            "WHERE dag_id = 'avsim_weekly_shard' AND run_id LIKE :p AND map_index >= 0",
            p=f"{self.run_id}__%",
        )
        shards: dict[str, ShardPlan] = {}
        out: dict[tuple[str, str], tuple[str, int]] = {}
        for shard_run, task_id, map_index, state, tries in rows:
            if shard_run not in shards:
                canary = shard_run == canary_run_id(self.run_id)
                index = CANARY_SHARD if canary else int(shard_run.rsplit("_", 1)[-1])
                shards[shard_run] = ShardPlan.from_json(
                    json.loads(_path(self.layout.shard_cases(index)).read_text())
                )
            family = task_id.split(".", 1)[0]
            case_id = str(shards[shard_run].by_family[family][int(map_index)]["case_id"])
            out[(case_id, task_id)] = (str(state), int(tries or 0))
        return out

    # -- one case -------------------------------------------------------------------------------
    def _case(self, case: Mapping[str, Any], summary: CaseSummary | None) -> None:
        cid = str(case["id"])
        graph: Mapping[str, Mapping[str, Any]] = self.doc["graphs"][case["graph"]]["phases"]
        if (case.get("parameters") or {}).get("fakesim"):
            self.n["forced"] += 1
        recorded = {p: (self.ledger.outcome(cid, p), self.ledger.attempts(cid, p)) for p in graph}
        current = {p: self.ledger.current_attempt(cid, p) for p in graph}
        expected = self._expected(case, graph, recorded)
        for p, planned in expected.items():
            committed, attempts = recorded[p]
            self._count(committed, attempts)
            self._attempts(case, p, planned, attempts)
            self._committed_once(cid, p, planned, committed, attempts, current[p])
            if committed is not None and committed.outcome.produced_output:
                self._result_kept(
                    cid, p, committed, {u: recorded[u][0] for u in graph[p].get("depends_on") or ()}
                )
            self._scenario_not_retried(cid, p, committed, attempts)
            self._budgets(cid, p, graph[p], attempts, committed)
        want = case_class(pl.outcome for pl in expected.values()).value
        self.case_classes[want] += 1
        self.terminal.checked += 1
        got = summary.outcome_name if summary is not None else None
        if got != want:
            self.terminal.fail(f"{cid}: case ended {got}, the injected faults give {want}")

    def _expected(
        self,
        case: Mapping[str, Any],
        graph: Mapping[str, Mapping[str, Any]],
        recorded: Mapping[str, tuple[OutcomeRecord | None, list[AttemptRecord]]],
    ) -> dict[str, PlannedPhase]:
        """How every phase must end. From the injected draws alone, unless the machine added a lease
        expiry the draws did not foresee (a phase that started slower than its lease), or the test
        killed the attempt's worker: then from the attempts as recorded, through the same rules (the
        class must be consistent with them)."""
        cid = str(case["id"])
        actual: dict[tuple[str, int], tuple[str, str]] = {}
        deviated = False
        for p, (_, attempts) in recorded.items():
            for a in attempts:
                self.foreseen.checked += 1
                want = fakesim_verdict(case, p, graph[p]["args"], a.attempt)
                got = (_out(a), a.detail)
                actual[(p, a.attempt)] = got
                if got == want:
                    continue
                if got == (INFRA, "lease_expired"):
                    self.n["unforeseen"] += 1
                    deviated = True
                elif got in LOST and (cid, a.task_id, a.try_number) in self.lost_tries:
                    self.n["lost"] += 1
                    deviated = True
                else:
                    self.foreseen.fail(f"{cid}/{p} attempt {a.attempt}: recorded {got}, its draw says {want}")
        if not deviated:
            return plan_case(case, graph)

        def verdict(phase: str, n: int) -> tuple[str, str]:
            return actual.get((phase, n)) or fakesim_verdict(case, phase, graph[phase]["args"], n)

        return plan_case(case, graph, verdict)

    def _count(self, committed: OutcomeRecord | None, attempts: list[AttemptRecord]) -> None:
        self.n["phases"] += 1
        self.n["attempts"] += len(attempts)
        self.n["ran"] += bool(attempts)
        self.n["retried"] += len(attempts) > 1
        self.n["max"] = max(self.n["max"], len(attempts))
        self.n["fallbacks"] += any(a.node_class == NODE_ON_DEMAND for a in attempts)
        for a in attempts:
            self.attempt_classes[_out(a) + (f"/{a.detail}" if a.detail else "")] += 1
            self.attempt_nodes[a.node_class] += 1
        self.phase_classes[committed.outcome.value if committed else NOT_RUN] += 1

    def _attempts(
        self, case: Mapping[str, Any], p: str, planned: PlannedPhase, attempts: list[AttemptRecord]
    ) -> None:
        """The planned attempts, run by the planned task on the planned node class, one per try."""
        cid, family = str(case["id"]), str(case["graph"])
        self.foreseen.checked += 1
        got = [(a.attempt, _out(a), a.node_class, a.task_id) for a in attempts]
        want = [(x.attempt, x.outcome, x.node_class, f"{family}.{p}{x.task}") for x in planned.attempts]
        if got != want:
            self.foreseen.fail(f"{cid}/{p}: attempts {got}, the rules give {want}")
        for suffix, (state, tries) in planned.tasks.items():
            task_id = f"{family}.{p}{suffix}"
            ti = self.tis.get((cid, task_id))
            self.terminal.checked += 1
            if ti is None or ti[0] != state or (tries and ti[1] != tries):
                self.terminal.fail(f"{task_id}[{cid}]: task instance {ti}, expected ({state}, {tries} tries)")
            ran = [a.try_number for a in attempts if a.task_id == task_id]
            self.foreseen.checked += 1
            if ti is not None and ran and ran != list(range(ti[1] - len(ran) + 1, ti[1] + 1)):
                self.foreseen.fail(f"{task_id}[{cid}]: attempts of tries {ran}, the task made {ti[1]} tries")

    def _committed_once(
        self,
        cid: str,
        p: str,
        planned: PlannedPhase,
        committed: OutcomeRecord | None,
        attempts: list[AttemptRecord],
        current: int | None,
    ) -> None:
        self.once.checked += 1
        numbers = [a.attempt for a in attempts]
        if numbers != list(range(1, len(numbers) + 1)):
            self.once.fail(f"{cid}/{p}: attempt numbers {numbers} are not 1..n")
        if (current or 0) != len(numbers):
            self.once.fail(f"{cid}/{p}: last claimed attempt {current}, {len(numbers)} attempts recorded")
        if any(not a.ended for a in attempts):
            self.once.fail(
                f"{cid}/{p}: attempts left started: {[a.attempt for a in attempts if not a.ended]}"
            )
        if planned.outcome == NOT_RUN:
            if committed is not None or attempts:
                self.once.fail(f"{cid}/{p}: ran although an upstream phase produced nothing")
            return
        self.lost.checked += 1
        if committed is None:
            self.lost.fail(f"{cid}/{p}: no committed outcome (expected {planned.outcome})")
            return
        if committed.attempt != len(numbers):
            self.once.fail(
                f"{cid}/{p}: committed attempt {committed.attempt}, the last claimed is {len(numbers)}"
            )
        self.terminal.checked += 1
        if committed.outcome.value != planned.outcome:
            self.terminal.fail(f"{cid}/{p}: committed {committed.outcome.value}, expected {planned.outcome}")
        first = self.reporter.first_seen.get((cid, p))
        if first is not None and OutcomeRecord.from_json(first) != committed:
            self.once.fail(
                f"{cid}/{p}: the committed outcome changed after it was written: {first} -> {committed}"
            )

    def _result_kept(
        self, cid: str, p: str, rec: OutcomeRecord, upstream: Mapping[str, OutcomeRecord | None]
    ) -> None:
        """A committed result's files are complete under its own attempt's prefix; its downstream
        phases read that prefix, not another attempt's."""
        if rec.output_uri != self.layout.attempt_output(cid, p, rec.attempt):
            self.lost.fail(
                f"{cid}/{p}: committed output {rec.output_uri} is not attempt {rec.attempt}'s prefix"
            )
            return
        folder = _path(rec.output_uri)
        try:
            result = json.loads((folder / "result.json").read_text())
        except (FileNotFoundError, ValueError) as exc:
            self.lost.fail(f"{cid}/{p}: committed result unreadable: {exc}")
            return
        if (result.get("attempt"), result.get("outcome")) != (rec.attempt, rec.outcome.value):
            self.lost.fail(
                f"{cid}/{p}: result.json says attempt {result.get('attempt')} {result.get('outcome')}, "
                f"committed: attempt {rec.attempt} {rec.outcome.value}"
            )
        missing = [a for a in result.get("artifacts", []) if not (folder / a).is_file()]
        if missing:
            self.lost.fail(f"{cid}/{p}: artifacts {missing} missing from {folder}")
        for up, up_rec in upstream.items():
            used = (result.get("inputs") or {}).get(up, {}).get("uri")
            if up_rec is None or used != up_rec.output_uri:
                self.lost.fail(f"{cid}/{p} read {up} from {used}; committed: {up_rec and up_rec.output_uri}")

    def _scenario_not_retried(
        self, cid: str, p: str, committed: OutcomeRecord | None, attempts: list[AttemptRecord]
    ) -> None:
        failed = [a.attempt for a in attempts if a.outcome is Outcome.SCENARIO_FAILED]
        is_committed = committed is not None and committed.outcome.value == SCENARIO_FAILED
        if not failed and not is_committed:
            return
        self.scenario.checked += 1
        if failed != [len(attempts)] or not is_committed:
            self.scenario.fail(
                f"{cid}/{p}: scenario failed in attempts {failed} of {len(attempts)}, "
                f"committed {committed and committed.outcome.value}"
            )

    def _budgets(
        self,
        cid: str,
        p: str,
        spec: Mapping[str, Any],
        attempts: Iterable[AttemptRecord],
        committed: OutcomeRecord | None,
    ) -> None:
        """Each task's failures per class in its round against the manifest's budgets: a class may fail
        ``budget + 1`` times (the last is committed), a spot task hands over after
        ``on_demand_after_preemptions`` preemptions, and nothing is retried once a budget is spent."""
        infra, preempt, after = budgets_of(spec)
        by_task: dict[tuple[str, int], list[AttemptRecord]] = collections.defaultdict(list)
        for a in attempts:
            by_task[(a.task_id, a.round_start)].append(a)
        for (task_id, _), runs in by_task.items():
            if task_id.endswith(ON_DEMAND_SUFFIX):
                role = Role.ON_DEMAND
            else:
                role = Role.SPOT if has_twin(spec) else Role.REGULAR
            limits = {INFRA: infra + 1, PREEMPTED: preemption_budget(role, preempt, after) + 1}
            if role == Role.SPOT:
                limits[PREEMPTED] = after
            counts: collections.Counter[str] = collections.Counter()
            for i, a in enumerate(runs):
                cls = _out(a)
                if cls not in limits:
                    continue
                self.budgets.checked += 1
                counts[cls] += 1
                where = f"{cid}/{p} {task_id} attempt {a.attempt}"
                if counts[cls] > limits[cls]:
                    self.budgets.fail(
                        f"{where}: {counts[cls]} {cls} attempts, the budget allows {limits[cls]}"
                    )
                spent = counts[cls] == limits[cls]
                if spent and i != len(runs) - 1:
                    self.budgets.fail(f"{where}: retried after its {cls} budget was spent")
                hands_over = role == Role.SPOT and cls == PREEMPTED
                if spent and not hands_over and (committed is None or committed.attempt != a.attempt):
                    self.budgets.fail(f"{where}: spent the {cls} budget but was not committed")

    # -- the run ----------------------------------------------------------------------------------
    def _report_and_run_phases(self) -> None:
        for rp in self.doc.get("run_phases") or {}:
            self.terminal.checked += 1
            rec = self.ledger.outcome(RUN_LEVEL_CASE, rp)
            if rec is None or rec.outcome.value != PASSED:
                self.terminal.fail(f"run-level phase {rp}: {rec}")
        try:
            report = json.loads((_path(self.layout.report_dir) / "report.json").read_text())
        except FileNotFoundError:
            self.terminal.fail(f"the week wrote no report.json under {self.layout.report_dir}")
            return
        totals = report["totals"]
        self.terminal.checked += 1
        if totals["cases"] != len(self.doc["cases"]) or totals.get("missing"):
            self.terminal.fail(f"report totals {totals} do not hold {len(self.doc['cases'])} cases")
        for cls, n in self.case_classes.items():
            if totals.get(cls, 0) != n:
                self.terminal.fail(f"report totals: {cls} {totals.get(cls)}, expected {n}")

    def _zombies(self) -> None:
        injected = self.reporter.injected
        self.zombies.checked = len(injected)
        for z in injected:
            if z.accepted:
                self.zombies.fail(
                    f"{z.kind} report of {z.case_id}/{z.phase} attempt {z.attempt} ({z.outcome}) accepted"
                )
        for e in self.reporter.errors:
            self.zombies.fail(f"injector: {e}")
        late = sum(1 for z in injected if z.kind == "late")
        if not late or late == len(injected):
            self.zombies.fail(
                f"{late} late and {len(injected) - late} duplicate reports injected: both kinds expected"
            )
        for (cid, p), first in self.reporter.first_seen.items():
            if self.ledger.outcome(cid, p) != OutcomeRecord.from_json(first):
                self.zombies.fail(f"{cid}/{p}: the committed outcome changed after it was written")

    def _breaker(self) -> tuple[bool, str]:
        digest = str(self.doc["run"]["build"]["image"]).rsplit("@", 1)[-1]
        state = Breaker(self.layout.root, digest).state()
        return (
            not state.is_open,
            f"{state.state}, {state.failures} failed of the {state.finished} first attempts in its window",
        )


def audit_week(
    stack: LocalStack,
    run_id: str,
    layout: RunLayout,
    doc: Mapping[str, Any],
    reporter: ZombieReporter,
    *,
    seconds: float,
    rates: ChaosRates,
    lost_tries: frozenset[tuple[str, str, int]] = frozenset(),
) -> Audit:
    """Check a finished chaos week's invariants and gather its figures (``lost_tries``: see
    :class:`WeekAuditor`)."""
    return WeekAuditor(stack, run_id, layout, doc, reporter, lost_tries).run(seconds=seconds, rates=rates)
