"""The critical-path priority strategies on real task instances of a real, serialized DAG.

The DAGs are built with ``airflow.sdk`` in the shape of a shard DAG (a mapped task group per
graph family, one task per phase), serialized and deserialized the way the dag-processor and the
scheduler do, and the weights are those Airflow computes when it creates a task instance
(``TaskInstance.__init__`` -> ``refresh_from_task`` -> ``weight_rule.get_weight``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from avsim.manifest.models import RunClass
from avsim.manifest.sample import sample_manifest
from avsim.manifest.validation import validate_manifest
from avsim.plan.graph import remaining_path
from avsim.priority import (
    ADHOC_BASE,
    CANARY_BASE,
    STRATEGIES,
    WEEKLY_BASE,
    AdhocCriticalPathPriority,
    WeeklyCriticalPathPriority,
    path_weight,
    phase_priority,
)

GRAPHS = validate_manifest(sample_manifest(1)).graphs
CASES = 3


def remaining(family: str) -> dict[str, float]:
    phases = GRAPHS[family].phases
    return remaining_path(
        {n: list(p.depends_on) for n, p in phases.items()},
        {n: p.estimated_duration_seconds for n, p in phases.items()},
    )


def build_dag(dag_id: str, weight_rule: Any) -> Any:
    """A shard-shaped DAG: a list of cases, one mapped group per family, one task per phase."""
    from airflow.sdk import DAG, task, task_group

    with DAG(dag_id, schedule=None, start_date=dt.datetime(2026, 1, 5, tzinfo=dt.UTC)) as dag:

        @task
        def cases() -> list[str]:
            return [f"case-{i}" for i in range(CASES)]

        listed = cases()
        for family, graph in GRAPHS.items():
            path = remaining(family)

            @task_group(group_id=family)
            def group(case: str, graph: Any = graph, path: dict[str, float] = path) -> None:
                created = {}
                for name in graph.phases:

                    @task(task_id=name, priority_weight=path_weight(path[name]), weight_rule=weight_rule)
                    def phase(case: str) -> str:
                        return case

                    created[name] = phase(case)
                for name, spec in graph.phases.items():
                    for up in spec.depends_on:
                        created[up] >> created[name]

            group.expand(case=listed)
    return dag


def serialized(dag: Any) -> Any:
    from airflow.serialization.serialized_objects import DagSerialization

    return DagSerialization.from_dict(DagSerialization.to_dict(dag))


def weights(dag: Any, run_id: str) -> dict[tuple[str, str, int], int]:
    """(family, phase, map index) -> the priority weight Airflow gives the new task instance."""
    from airflow.models.taskinstance import TaskInstance

    out = {}
    for family, graph in GRAPHS.items():
        for name in graph.phases:
            task = dag.get_task(f"{family}.{name}")
            for i in range(CASES):
                ti = TaskInstance(task=task, run_id=run_id, map_index=i, dag_version_id=None)
                out[family, name, i] = ti.priority_weight
    return out


@pytest.fixture(scope="module")
def weekly_dag() -> Any:
    return serialized(build_dag("prio_weekly", WeeklyCriticalPathPriority()))


@pytest.fixture(scope="module")
def adhoc_dag() -> Any:
    return serialized(build_dag("prio_adhoc", AdhocCriticalPathPriority()))


def test_the_plugin_registers_both_strategies() -> None:
    from airflow import plugins_manager

    registered = plugins_manager.get_priority_weight_strategy_plugins()
    for cls in STRATEGIES:
        assert registered[f"{cls.__module__}.{cls.__qualname__}"] is cls


def test_strategies_survive_serialization(weekly_dag: Any, adhoc_dag: Any) -> None:
    task = weekly_dag.get_task("standard.simulate")
    assert isinstance(task.weight_rule, WeeklyCriticalPathPriority)
    assert task.priority_weight == path_weight(remaining("standard")["simulate"])
    assert isinstance(adhoc_dag.get_task("standard.simulate").weight_rule, AdhocCriticalPathPriority)


def test_weight_is_the_run_base_plus_the_remaining_path(weekly_dag: Any) -> None:
    got = weights(weekly_dag, "manual__2026-01-05__shard-0003")
    for (family, phase, _), weight in got.items():
        seconds = remaining(family)[phase]
        # The strategy in the scheduler and the planner's entry are the same rule.
        assert weight == phase_priority(RunClass.WEEKLY, seconds) == WEEKLY_BASE + path_weight(seconds)
    # Prepare of a standard case: 3 + 30 + 5 + 1 minutes to go.
    assert got["standard", "prepare", 0] == WEEKLY_BASE + 39


def test_weekly_outranks_adhoc_for_every_phase(weekly_dag: Any, adhoc_dag: Any) -> None:
    weekly = weights(weekly_dag, "manual__w__shard-0000")
    adhoc = weights(adhoc_dag, "manual__adhoc-42")
    assert min(weekly.values()) > max(adhoc.values())
    for key in weekly:
        assert weekly[key] - adhoc[key] == WEEKLY_BASE - ADHOC_BASE


def test_the_canary_outranks_weekly_and_adhoc(weekly_dag: Any, adhoc_dag: Any) -> None:
    canary = weights(weekly_dag, "manual__w__shard-0000__canary")
    weekly = weights(weekly_dag, "manual__w__shard-0000")
    adhoc = weights(adhoc_dag, "manual__adhoc-42")
    assert min(canary.values()) > max(weekly.values()) > max(adhoc.values())
    assert all(w >= CANARY_BASE for w in canary.values())


def test_later_phases_rank_below_earlier_ones_only_by_path(weekly_dag: Any) -> None:
    got = weights(weekly_dag, "manual__w__shard-0001")
    for family, graph in GRAPHS.items():
        path = remaining(family)
        for name, spec in graph.phases.items():
            for up in spec.depends_on:
                for i in range(CASES):
                    assert got[family, up, i] > got[family, name, i]
                    assert got[family, up, i] - got[family, name, i] == path_weight(path[up]) - path_weight(
                        path[name]
                    )
    # Every case of a family gets the same weights: the order between equal weights is Airflow's
    # (logical date, then map index).
    assert len({got["with_render", "render", i] for i in range(CASES)}) == 1
    # Depth-first: a case's simulate outranks every other case's prepare of a shorter graph.
    assert got["with_render", "simulate", 0] > got["perception", "prepare", 1]


class UnregisteredPriority(WeeklyCriticalPathPriority):
    """The same rule under a class no plugin lists (as if it were defined in a DAG file)."""


def test_an_unregistered_strategy_cannot_be_serialized() -> None:
    """Why the plugin registers the strategies: Airflow stores only the class's import path and
    loads it back from the plugins' registry, so it refuses a class the scheduler could not load."""
    from airflow.exceptions import SerializationError
    from airflow.serialization.serialized_objects import DagSerialization

    with pytest.raises(SerializationError, match=r"Unknown priority strategy .*\.UnregisteredPriority"):
        DagSerialization.to_dict(build_dag("prio_unregistered", UnregisteredPriority()))
    # The registered parent class, same rule, serializes (see the fixtures above).
    DagSerialization.to_dict(build_dag("prio_registered", WeeklyCriticalPathPriority()))


@pytest.fixture
def metadata_db(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Airflow's dag_run table (its own model's schema) in a SQLite database, as the strategy's
    metadata database: the boundary replaced is the database server, not the query."""
    import sqlalchemy as sa
    from airflow import settings

    from avsim import priority
    from avsim.airflow_internals import models

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'meta.db'}")
    models()["DagRun"].__table__.create(engine)
    monkeypatch.setattr(settings, "engine", engine)
    monkeypatch.setattr(priority, "_looked_up", {})
    return engine


def _add_week(engine: Any, dag_id: str, run_id: str, day: int) -> None:
    import sqlalchemy as sa

    from avsim.airflow_internals import models

    with engine.begin() as conn:
        conn.execute(
            sa.insert(models()["DagRun"].__table__).values(
                dag_id=dag_id,
                run_id=run_id,
                run_type="manual",
                state="running",
                log_template_id=None,
                run_after=dt.datetime(2026, 12, day, 6, tzinfo=dt.UTC),
            )
        )


def test_a_repair_of_last_week_ranks_below_this_week_in_the_strategy(metadata_db: Any) -> None:
    """The weights Airflow gives the task instances of a shard-shaped DAG, with the weekly DAG's runs in
    the metadata database: last week's phases (its canary too) rank below this week's, by the base."""
    from avsim import priority
    from avsim.priority import EARLIER_WEEK_BASE, TRIAGE_BASE

    dag = serialized(build_dag("prio_weekly_shard", WeeklyCriticalPathPriority()))
    _add_week(metadata_db, "prio_weekly", "week_49", 7)
    before = weights(dag, "week_49__shard_0001")
    assert min(before.values()) > WEEKLY_BASE  # the current week, alone
    _add_week(metadata_db, "prio_weekly", "week_50", 14)
    _add_week(metadata_db, "prio_weekly", "rerun__20261215T101500Z", 15)
    priority._looked_up.clear()  # a process that looked last week up WEEK_LOOKUP_SECONDS ago
    last = weights(dag, "week_49__shard_0001")
    last_canary = weights(dag, "week_49__canary")
    this = weights(dag, "week_50__shard_0001")
    rerun = weights(dag, "rerun__20261215T101500Z__shard_0001")
    assert max([*last.values(), *last_canary.values(), *rerun.values()]) < min(this.values())
    for key, weight in this.items():
        assert weight - last[key] == WEEKLY_BASE - EARLIER_WEEK_BASE  # the same path part
        assert rerun[key] == last[key]
    # A run the database does not know (a DAG test) is the current week.
    assert weights(dag, "unknown__shard_0001") == this
    # Triage's reruns of this week rank below last week's repair, whatever their paths.
    triage = weights(dag, "week_50__triage_1_this_1")
    assert max(triage.values()) < min(last.values())
    assert all(w - TRIAGE_BASE == this[k] - WEEKLY_BASE for k, w in triage.items())
