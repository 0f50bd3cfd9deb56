"""A week's cases in flight as admission counts them (avsim.plan.week_counts.read_in_flight).

The honest boundary mocked here is the execution API (``RuntimeTaskInstance.get_task_states`` and
``get_ti_count``, what :class:`avsim.plan.week_counts.ExecutionApiCounts` calls): :class:`TaskTable`
answers from an in-memory table of task instances the way Airflow 3.3.2's routes do
(``airflow/api_fastapi/execution_api/routes/task_instances.py``: ``get_task_instance_states`` keys a
run's states by ``task_id`` for map index < 0 and ``f"{task_id}_{map_index}"`` otherwise; an empty
filter list filters nothing; ``get_task_instance_count`` filters by states, ``"null"`` for no state).
The week's case ends come from the real plan of ``dags/avsim_graphs.yaml``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from avsim.artifacts import canary_run_id, shard_run_id
from avsim.dagbuild.factory import load_plan
from avsim.plan.build import build_plan
from avsim.plan.catalog import parse_catalog
from avsim.plan.model import WeeklyPlan
from avsim.plan.week_counts import (
    SHARD_FIRST_TASK,
    WeekShape,
    case_end_tasks,
    cpu_end_tasks,
    decide,
    read_in_flight,
)
from avsim.settings import AvsimSettings

ROOT = Path(__file__).resolve().parents[3]
CATALOG = ROOT / "dags" / "avsim_graphs.yaml"

DAG = "avsim_weekly"
SHARD_DAG = "avsim_weekly_shard"
RUN = "r1"
SHARDS_TASK = "shards"


@dataclass
class TaskTable:
    """Task instances ``(dag_id, run_id, task_id, map_index) -> state``, read as the execution API does
    through the task SDK's client, which drops a map index below 0 from a count's filter
    (``airflow.sdk.api.client`` ``get_count``: ``if map_index is not None and map_index >= 0``)."""

    rows: dict[tuple[str, str, str, int], str | None] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    def set(self, dag_id: str, run_id: str, task_id: str, map_index: int, state: str | None) -> None:
        self.rows[(dag_id, run_id, task_id, map_index)] = state

    def _match(self, dag_id: str, run_ids: list[str], task_ids: list[str]):
        for (d, r, t, m), state in self.rows.items():
            if d != dag_id or (task_ids and t not in task_ids) or (run_ids and r not in run_ids):
                continue
            yield r, t, m, state

    def task_states(
        self, *, dag_id: str, run_ids: list[str], task_ids: list[str]
    ) -> dict[str, dict[str, Any]]:
        self.calls.append("task_states")
        out: dict[str, dict[str, Any]] = defaultdict(dict)
        for r, t, m, state in self._match(dag_id, run_ids, task_ids):
            out[r].update({t: state} if m < 0 else {f"{t}_{m}": state})
        return dict(out)

    def ti_count(
        self,
        *,
        dag_id: str,
        run_ids: list[str],
        task_ids: list[str],
        states: list[str] | None,
        map_index: int | None = None,
    ) -> int:
        self.calls.append("ti_count")
        n = 0
        for _, _, m, state in self._match(dag_id, run_ids, task_ids):
            if map_index is not None and map_index >= 0 and m != map_index:
                continue
            if states:
                if state is None and "null" not in states:
                    continue
                if state is not None and state not in states:
                    continue
            n += 1
        return n


def _plan() -> WeeklyPlan:
    return load_plan(CATALOG, AvsimSettings())


def _gpu_ended_plan() -> WeeklyPlan:
    """The deployed catalog with ``with_render`` ending on its two branches: ``evaluate`` (CPU) and
    ``render`` (GPU, with an on-demand twin)."""
    doc = yaml.safe_load(CATALOG.read_text())
    phases = doc["graphs"]["with_render"]["phases"]
    del phases["report"]
    return build_plan(parse_catalog(doc, "test"), AvsimSettings())


def _week(
    plan: WeeklyPlan, *, shard_count: int = 3, size: int = 10, cases: int = 25, canary: int = 4
) -> WeekShape:
    return WeekShape(
        dag_id=DAG,
        run_id=RUN,
        shard_dag_id=SHARD_DAG,
        shards_task_id=SHARDS_TASK,
        shard_count=shard_count,
        shard_size=size,
        cases=cases,
        canary_cases=canary,
        case_ends=case_end_tasks(plan.families),
        cpu_ends=cpu_end_tasks(plan.families),
    )


def _start_run(table: TaskTable, run_id: str, plan: WeeklyPlan, cases: dict[str, int]) -> None:
    """A shard run with ``cases`` (family name -> its cases) expanded: its ``load_shard`` done and every
    task of every family's group at map indexes 0..n-1, not started. A family without cases keeps its
    group's unexpanded task instances (map index -1), marked skipped as Airflow does for an empty map."""
    table.set(SHARD_DAG, run_id, SHARD_FIRST_TASK, -1, "success")
    for family in plan.families:
        n = cases.get(family.name, 0)
        for phase in family.phases:
            tasks = [phase.name] + ([phase.on_demand_task] if phase.on_demand_fallback else [])
            for task in tasks:
                if not n:
                    table.set(SHARD_DAG, run_id, f"{family.group_id}.{task}", -1, "skipped")
                for i in range(n):
                    table.set(SHARD_DAG, run_id, f"{family.group_id}.{task}", i, None)


def _end_case(
    table: TaskTable, run_id: str, plan: WeeklyPlan, family: str, i: int, state: str = "success"
) -> None:
    """Case ``i`` of ``family`` in ``run_id`` ended: every phase ``state``, a twin skipped (the spot task
    ran it)."""
    fam = plan.family(family)
    for phase in fam.phases:
        table.set(SHARD_DAG, run_id, f"{fam.group_id}.{phase.name}", i, state)
        if phase.on_demand_fallback:
            table.set(SHARD_DAG, run_id, f"{fam.group_id}.{phase.on_demand_task}", i, "skipped")


def _shards_tis(table: TaskTable, *states: str | None) -> None:
    for k, state in enumerate(states):
        table.set(DAG, RUN, SHARDS_TASK, k, state)


ALL3 = ("standard", "with_render", "perception")


def _split(n: int) -> dict[str, int]:
    """``n`` cases over the three families, none left empty for n >= 3."""
    return {f: n // 3 + (1 if i < n % 3 else 0) for i, f in enumerate(ALL3)}


def test_the_fake_answers_like_the_execution_api() -> None:
    table = TaskTable()
    table.set(DAG, RUN, "prepare", -1, "success")
    _shards_tis(table, "success", "deferred")
    table.set(DAG, "r0", SHARDS_TASK, 0, "failed")
    assert table.task_states(dag_id=DAG, run_ids=[RUN], task_ids=[SHARDS_TASK]) == {
        RUN: {"shards_0": "success", "shards_1": "deferred"}
    }
    assert table.task_states(dag_id=DAG, run_ids=[], task_ids=["prepare"]) == {RUN: {"prepare": "success"}}
    assert (
        table.ti_count(dag_id=DAG, run_ids=[RUN, "r0"], task_ids=[SHARDS_TASK], states=["success", "failed"])
        == 2
    )
    assert table.ti_count(dag_id=DAG, run_ids=[RUN], task_ids=[], states=None) == 3


def test_case_ends_of_the_deployed_plan_are_each_familys_report() -> None:
    plan = _plan()
    assert case_end_tasks(plan.families) == tuple((f"{f.group_id}.report",) for f in plan.families)


def test_a_family_ending_on_a_gpu_phase_ends_on_its_twin() -> None:
    plan = _gpu_ended_plan()
    render = plan.family("with_render").phase("render")
    assert render.on_demand_fallback
    ends = dict(zip(plan.family_names, case_end_tasks(plan.families), strict=True))
    assert ends["with_render"] == (
        "with_render.evaluate",
        "with_render.render",
        f"with_render.{render.on_demand_task}",
    )
    assert ends["standard"] == ("standard.report",)


def test_existing_runs_count_their_cases_canary_included() -> None:
    plan, table = _plan(), TaskTable()
    week = _week(plan)  # canary 4; shards of 10, 10, 5
    assert read_in_flight(table, week, 1).admitted_cases == 0
    _start_run(table, canary_run_id(RUN), plan, _split(4))
    assert read_in_flight(table, week, 1).admitted_cases == 4
    _start_run(table, shard_run_id(RUN, 1), plan, _split(10))
    _shards_tis(table, "running")
    found = read_in_flight(table, week, 2)
    assert (found.admitted_cases, found.finished_cases, found.unfinished_cases) == (14, 0, 14)
    # The last, short shard counts its 5 cases, not S.
    _start_run(table, shard_run_id(RUN, 3), plan, _split(5))
    assert read_in_flight(table, week, 1).admitted_cases == 19
    # Another week's runs of the same shard DAG count for nothing.
    _start_run(table, shard_run_id("r0", 2), plan, _split(10))
    for i in range(3):
        _end_case(table, shard_run_id("r0", 2), plan, "standard", i)
    assert read_in_flight(table, week, 1).admitted_cases == 19
    assert read_in_flight(table, week, 1).finished_cases == 0


def test_a_run_created_before_its_groups_expand_counts_its_cases_unfinished() -> None:
    plan, table = _plan(), TaskTable()
    week = _week(plan, canary=0)
    run = shard_run_id(RUN, 1)
    table.set(SHARD_DAG, run, SHARD_FIRST_TASK, -1, None)  # just created: nothing ran yet
    for ends in case_end_tasks(plan.families):
        for task in ends:
            table.set(SHARD_DAG, run, task, -1, None)
    found = read_in_flight(table, week, 2)
    assert (found.admitted_cases, found.unfinished_cases) == (10, 10)


def test_finished_cases_are_those_whose_last_phases_ended() -> None:
    plan, table = _plan(), TaskTable()
    week = _week(plan, canary=4)
    _start_run(table, canary_run_id(RUN), plan, _split(4))
    _start_run(table, shard_run_id(RUN, 1), plan, _split(10))
    _shards_tis(table, "running")
    _end_case(table, canary_run_id(RUN), plan, "standard", 0)
    _end_case(table, canary_run_id(RUN), plan, "perception", 0, state="failed")  # a failed case has ended
    _end_case(table, shard_run_id(RUN, 1), plan, "with_render", 0)
    # upstream_failed ends a case too (its first phase failed for good) ...
    table.set(SHARD_DAG, shard_run_id(RUN, 1), "standard.report", 1, "upstream_failed")
    # ... a case whose earlier phases ended but whose report waits for a slot or retries has not.
    table.set(SHARD_DAG, shard_run_id(RUN, 1), "standard.evaluate", 2, "success")
    table.set(SHARD_DAG, shard_run_id(RUN, 1), "standard.report", 2, "scheduled")
    table.set(SHARD_DAG, shard_run_id(RUN, 1), "perception.report", 1, "up_for_retry")
    found = read_in_flight(table, week, 2)
    assert (found.admitted_cases, found.finished_cases, found.unfinished_cases) == (14, 4, 10)


def test_cpu_ends_of_the_deployed_plan_are_each_familys_report_and_a_gpu_end_is_none() -> None:
    assert cpu_end_tasks(_plan().families) == tuple(f"{f}.report" for f in ALL3)
    assert cpu_end_tasks(_gpu_ended_plan().families) == (
        "standard.report",
        "with_render.evaluate",
        "perception.report",
    )


def test_a_case_whose_cpu_last_phase_holds_its_slot_counts_as_ending() -> None:
    """A refill takes a count and a REST call; a case whose report is queued, running or deferred (its
    slot held) ends within that phase, so it makes room now. A report waiting for a slot (scheduled) or
    retrying after a failed try does not."""
    plan, table = _plan(), TaskTable()
    week = _week(plan, canary=0)
    run = shard_run_id(RUN, 1)
    _start_run(table, run, plan, _split(10))
    _shards_tis(table, "running")
    for i, state in enumerate(("queued", "running", "deferred", "scheduled")):
        table.set(SHARD_DAG, run, "standard.report", i, state)
    table.set(SHARD_DAG, run, "perception.report", 0, "up_for_retry")
    found = read_in_flight(table, week, 2)
    assert (found.finished_cases, found.unfinished_cases) == (3, 7)
    # The same week shape without its CPU ends (a trigger deferred by an earlier version) counts ends only.
    doc = week.to_json()
    del doc["cpu_ends"]
    assert read_in_flight(table, WeekShape.from_json(doc), 2).finished_cases == 0
    assert WeekShape.from_json(week.to_json()) == week


def test_a_gpu_last_phase_in_its_slot_keeps_its_case_in_flight() -> None:
    """A GPU last phase may run for long: its case ends when it has; a CPU branch beside it in its slot
    does not end the case alone."""
    plan, table = _gpu_ended_plan(), TaskTable()
    week = _week(plan, canary=0)
    run, twin = _two_branch_run(table, plan)
    table.set(SHARD_DAG, run, "with_render.evaluate", 0, "success")
    table.set(SHARD_DAG, run, "with_render.render", 0, "running")
    table.set(SHARD_DAG, run, "with_render.evaluate", 1, "running")
    table.set(SHARD_DAG, run, "with_render.render", 1, "skipped")
    table.set(SHARD_DAG, run, twin, 1, "running")
    assert read_in_flight(table, week, 2).finished_cases == 0
    # Render passed on spot (twin skipped) while evaluate runs: ending.
    table.set(SHARD_DAG, run, "with_render.render", 2, "success")
    table.set(SHARD_DAG, run, twin, 2, "skipped")
    table.set(SHARD_DAG, run, "with_render.evaluate", 2, "running")
    assert read_in_flight(table, week, 2).finished_cases == 1


def _two_branch_run(table: TaskTable, plan: WeeklyPlan) -> tuple[str, str]:
    run = shard_run_id(RUN, 1)
    _start_run(table, run, plan, _split(10))  # with_render: 3 cases
    _shards_tis(table, "running")
    return run, f"with_render.{plan.family('with_render').phase('render').on_demand_task}"


def test_a_case_ended_on_two_branches_ends_when_both_have() -> None:
    plan, table = _gpu_ended_plan(), TaskTable()
    week = _week(plan, canary=0)
    run, twin = _two_branch_run(table, plan)
    # Case 0: evaluate done, render's spot task done, its twin skipped: ended.
    _end_case(table, run, plan, "with_render", 0)
    # Case 1: evaluate done; render handed over to on-demand, the twin is running: not ended.
    table.set(SHARD_DAG, run, "with_render.evaluate", 1, "success")
    table.set(SHARD_DAG, run, "with_render.render", 1, "skipped")
    table.set(SHARD_DAG, run, twin, 1, "running")
    assert read_in_flight(table, week, 2).finished_cases == 1
    # The twin passes for case 1: ended.
    table.set(SHARD_DAG, run, twin, 1, "success")
    assert read_in_flight(table, week, 2).finished_cases == 2
    # Case 2 ends on both branches, failed on one: all three ended.
    table.set(SHARD_DAG, run, "with_render.evaluate", 2, "failed")
    table.set(SHARD_DAG, run, "with_render.render", 2, "success")
    table.set(SHARD_DAG, run, twin, 2, "skipped")
    assert read_in_flight(table, week, 2).finished_cases == 3


def test_cases_ended_on_different_branches_are_not_finished() -> None:
    plan, table = _gpu_ended_plan(), TaskTable()
    week = _week(plan, canary=0)
    run, twin = _two_branch_run(table, plan)
    _end_case(table, run, plan, "with_render", 0)
    # Case 1: evaluate done, the twin still running render on on-demand nodes.
    table.set(SHARD_DAG, run, "with_render.evaluate", 1, "success")
    table.set(SHARD_DAG, run, "with_render.render", 1, "skipped")
    table.set(SHARD_DAG, run, twin, 1, "running")
    # Case 2: render passed on spot (its twin skipped), evaluate still waiting for a CPU slot.
    table.set(SHARD_DAG, run, "with_render.render", 2, "success")
    table.set(SHARD_DAG, run, twin, 2, "skipped")
    table.set(SHARD_DAG, run, "with_render.evaluate", 2, "scheduled")
    assert read_in_flight(table, week, 2).finished_cases == 1


def test_the_spot_task_passing_alone_does_not_end_a_gpu_ended_case() -> None:
    """Counting the spot ``render`` task instead of its twin would call case 0 ended while its twin may
    still run it on on-demand nodes: the twin is what ends."""
    plan, table = _gpu_ended_plan(), TaskTable()
    week = _week(plan, canary=0)
    run = shard_run_id(RUN, 1)
    _start_run(table, run, plan, _split(10))  # with_render: 3 cases
    _shards_tis(table, "running")
    for i in range(3):
        table.set(SHARD_DAG, run, "with_render.evaluate", i, "success")
        table.set(SHARD_DAG, run, "with_render.render", i, "skipped")  # handed over to on-demand
    assert read_in_flight(table, week, 2).finished_cases == 0


def test_a_twin_skipped_beside_a_spot_task_in_repair_is_no_finished_case() -> None:
    """A spot task that failed on its budget leaves its twin skipped; a repair clears the spot task
    (``only_failed`` leaves the skipped twin alone), so while it runs again the case is in flight."""
    plan, table = _gpu_ended_plan(), TaskTable()
    week = _week(plan, canary=0)
    run, twin = _two_branch_run(table, plan)
    for i in range(3):
        _end_case(table, run, plan, "with_render", i)
    assert read_in_flight(table, week, 2).finished_cases == 3
    for i in (0, 1):  # repaired: the spot task cleared and queued again, the twin still skipped
        table.set(SHARD_DAG, run, "with_render.render", i, "queued" if i else None)
        table.set(SHARD_DAG, run, twin, i, "skipped")
    assert read_in_flight(table, week, 2).finished_cases == 1


def test_an_earlier_shard_without_run_waits_unless_its_shards_task_ended() -> None:
    plan, table = _plan(), TaskTable()
    week = _week(plan, shard_count=5, size=5, cases=25, canary=0)
    _start_run(table, shard_run_id(RUN, 1), plan, _split(5))
    # Shard 2 is deferred waiting for room, shard 3 has not been scheduled, shard 4 is the one asking.
    _shards_tis(table, "running", "deferred", None, "running")
    assert read_in_flight(table, week, 4).earlier_waiting == 2
    assert read_in_flight(table, week, 4).earlier_waiting_cases == 10  # shards 2 and 3 start first
    assert read_in_flight(table, week, 2).earlier_waiting is None  # shard 1 has its run
    assert read_in_flight(table, week, 1).earlier_waiting is None
    # Shard 2's task failed (it will not start its run unless retried): shard 3, scheduled, goes first.
    _shards_tis(table, "running", "failed", "scheduled", "running")
    assert read_in_flight(table, week, 4).earlier_waiting == 3
    # Up for retry is not ended: shard 2 goes first again.
    _shards_tis(table, "running", "up_for_retry", "scheduled", "running")
    assert read_in_flight(table, week, 4).earlier_waiting == 2
    # Both ended without a run (the breaker stopped the week): nothing to wait for.
    _shards_tis(table, "running", "failed", "skipped", "running")
    assert read_in_flight(table, week, 4).earlier_waiting is None
    # An earlier shard with its run started does not hold anyone.
    _start_run(table, shard_run_id(RUN, 2), plan, _split(5))
    _start_run(table, shard_run_id(RUN, 3), plan, _split(5))
    _shards_tis(table, "running", "running", "running", "deferred", None)
    assert read_in_flight(table, week, 5).earlier_waiting == 4


def test_a_cleared_case_is_unfinished_again() -> None:
    """A repair clears a case's failed phases down to its end: its end task instance has no state again
    until it ends, so the case holds its place among the cases in flight."""
    plan, table = _plan(), TaskTable()
    week = _week(plan, canary=0)
    run = shard_run_id(RUN, 1)
    _start_run(table, run, plan, _split(10))
    for family, n in _split(10).items():
        for i in range(n):
            _end_case(
                table, run, plan, family, i, state="failed" if (family, i) == ("standard", 2) else "success"
            )
    assert read_in_flight(table, week, 2).unfinished_cases == 0
    for phase in plan.family("standard").phase_names:
        table.set(SHARD_DAG, run, f"standard.{phase}", 2, None)  # cleared
    found = read_in_flight(table, week, 2)
    assert (found.admitted_cases, found.finished_cases, found.unfinished_cases) == (10, 9, 1)


def test_a_family_without_cases_in_a_run_adds_no_finished_case() -> None:
    plan, table = _plan(), TaskTable()
    week = _week(plan, canary=0)
    run = shard_run_id(RUN, 1)
    _start_run(table, run, plan, {"standard": 10})  # with_render and perception: empty maps, skipped
    found = read_in_flight(table, week, 2)
    assert (found.admitted_cases, found.finished_cases, found.unfinished_cases) == (10, 0, 10)


def test_one_count_costs_a_bounded_number_of_reads() -> None:
    """Three state reads and no count, whatever the week's size and its families."""
    plan, table = _plan(), TaskTable()
    week = _week(plan, shard_count=200, size=50, cases=10_000, canary=0)
    for k in range(1, 40):
        _start_run(table, shard_run_id(RUN, k), plan, _split(50))
    table.calls.clear()
    read_in_flight(table, week, 100)
    ends = case_end_tasks(plan.families)
    assert all(len(e) == 1 for e in ends)
    assert len(ends) == 3
    assert table.calls.count("task_states") == 3 and table.calls.count("ti_count") == 0


def test_an_ended_shard_run_holds_no_case_and_a_repaired_one_holds_its_cases_again() -> None:
    """A shard run whose ``summarize`` ended holds nothing, even when its case list failed and its
    groups never expanded (their task instances upstream_failed at map index -1: no case ends there);
    a repair clears ``summarize`` and the failed cases, which are in flight again."""
    from avsim.plan.week_counts import SHARD_LAST_TASK

    plan, table = _plan(), TaskTable()
    week = _week(plan, canary=0)
    broken, repaired = shard_run_id(RUN, 1), shard_run_id(RUN, 2)
    table.set(SHARD_DAG, broken, SHARD_FIRST_TASK, -1, "failed")
    for family in plan.families:
        for phase in family.phases:
            table.set(SHARD_DAG, broken, f"{family.group_id}.{phase.name}", -1, "upstream_failed")
    table.set(SHARD_DAG, broken, SHARD_LAST_TASK, -1, "success")
    _start_run(table, repaired, plan, _split(10))
    for family, n in _split(10).items():
        for i in range(n):
            _end_case(table, repaired, plan, family, i)
    _shards_tis(table, "failed", "deferred")
    table.set(SHARD_DAG, repaired, SHARD_LAST_TASK, -1, "failed")  # ended: every case done
    assert read_in_flight(table, week, 3).unfinished_cases == 0
    # The repair clears summarize and case 0 of every family: three cases in flight again.
    table.set(SHARD_DAG, repaired, SHARD_LAST_TASK, -1, None)
    for family in ALL3:
        _end_case(table, repaired, plan, family, 0, state=None)  # type: ignore[arg-type]
    found = read_in_flight(table, week, 3)
    assert (found.admitted_cases, found.unfinished_cases) == (10, 3)


def test_a_shard_that_must_wait_counts_again_in_the_worker_before_it_would_defer() -> None:
    """Every 2 s up to its patience: shard 2, behind shard 1's 10 cases still to start against a target
    of 10, waits its turn and gives up after its patience saying why; with shard 1's run there and one
    of its cases ended on the third count, it is admitted then. Without patience it counts once."""
    from avsim.plan.admission import AdmissionVerdict
    from avsim.plan.week_counts import decide_now

    plan, table = _plan(), TaskTable()
    week = _week(plan, canary=0)
    slept: list[float] = []
    waiting = TaskTable()
    _shards_tis(waiting, "deferred", "running")
    decision = decide_now(waiting, week, 2, 10, patience_seconds=7, sleep=slept.append)
    assert decision.verdict is AdmissionVerdict.WAIT_TURN and slept == [2.0, 2.0, 2.0]
    _start_run(table, shard_run_id(RUN, 1), plan, _split(10))
    # Room: shard run 1 holds 10 unfinished cases against a target of 10; the third count finds one ended.
    slept.clear()

    def a_case_ends_on_the_third_count(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 2:
            family = next(iter(_split(10)))
            _end_case(table, shard_run_id(RUN, 1), plan, family, 0)

    assert decide(week, 2, read_in_flight(table, week, 2), 10).verdict is AdmissionVerdict.WAIT_ROOM
    decision = decide_now(table, week, 2, 10, patience_seconds=30, sleep=a_case_ends_on_the_third_count)
    assert decision.admitted and slept == [2.0, 2.0]
    assert decide_now(table, week, 2, 9, sleep=slept.append).verdict is AdmissionVerdict.WAIT_ROOM
    assert len(slept) == 2  # no patience: one count, no wait


def test_the_execution_api_adapter_splits_many_run_ids_and_never_sends_an_empty_filter(
    monkeypatch: Any,
) -> None:
    """200 shard runs' ids in one query string would pass 14 KB; the adapter asks in calls of at most
    RUN_IDS_PER_CALL and adds the answers up. No call at all for no run: Airflow reads an empty run_ids
    filter as no filter, i.e. every run of the DAG. (The supervisor's RuntimeTaskInstance is replaced
    by a recorder: the boundary is the execution API.)"""
    from avsim import airflow_internals
    from avsim.plan.week_counts import RUN_IDS_PER_CALL, ExecutionApiCounts

    calls: list[tuple[str, int]] = []

    class Recorder:
        @staticmethod
        def get_ti_count(*, run_ids: list[str], **_: Any) -> int:
            calls.append(("ti", len(run_ids)))
            return len(run_ids)

        @staticmethod
        def get_task_states(*, run_ids: list[str], **_: Any) -> dict[str, dict[str, Any]]:
            calls.append(("states", len(run_ids)))
            return {r: {"load_shard": "success"} for r in run_ids}

    monkeypatch.setattr(airflow_internals, "runtime_task_instance", lambda: Recorder)
    runs = [shard_run_id(RUN, k) for k in range(1, 201)]
    counts = ExecutionApiCounts()
    assert counts.ti_count(dag_id=SHARD_DAG, run_ids=runs, task_ids=["x"], states=None) == 200
    assert len(counts.task_states(dag_id=SHARD_DAG, run_ids=runs, task_ids=["load_shard"])) == 200
    assert all(n <= RUN_IDS_PER_CALL for _, n in calls) and len(calls) == 2 * -(-200 // RUN_IDS_PER_CALL)
    calls.clear()
    assert counts.ti_count(dag_id=SHARD_DAG, run_ids=[], task_ids=["x"], states=None) == 0
    assert counts.task_states(dag_id=SHARD_DAG, run_ids=[], task_ids=["x"]) == {} and calls == []
