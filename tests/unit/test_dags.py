"""The DAG files: they import cleanly, have the planned shape, serialize, and one bad file harms no other."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(ROOT / "dags"))


def test_no_import_errors(dagbag) -> None:
    assert dagbag.import_errors == {}
    assert {"avsim_weekly", "avsim_weekly_shard", "avsim_adhoc", "avsim_adhoc_shard"} <= set(dagbag.dag_ids)


def test_parent_shape(dagbag) -> None:
    dag = dagbag.dags["avsim_weekly"]
    assert "manifest" in dag.params
    assert type(dag.timetable).__name__ == "CronTriggerTimetable"  # scheduled weekly
    ids = set(dag.task_dict)
    assert {"prepare", "shards", "report"} <= ids
    assert dag.task_dict["report"].trigger_rule == "all_done_min_one_success"
    shards = dag.task_dict["shards"]
    start = dag.task_dict["shard_start"]
    assert "prepare" in start.upstream_task_ids and start.task_id in shards.upstream_task_ids
    # Only the starts are capped: a shard run held by its slowest case never keeps the next from
    # starting, and a repair (a cleared `shards`) never waits for a slot.
    from avsim.operators.shard_start import SHARD_STARTS_AT_ONCE
    from avsim.settings import AvsimSettings

    assert start.max_active_tis_per_dagrun == SHARD_STARTS_AT_ONCE
    assert shards.max_active_tis_per_dagrun is None
    assert start.admission.window == AvsimSettings().max_active_shards
    assert start.admission.start_task_id == "shard_start" and start.admission.case_ends
    # Each family's report (CPU) counts its case as ending once it holds its slot.
    assert start.admission.cpu_ends == tuple(ends[0] for ends in start.admission.case_ends)
    # One map index per shard for both: shards[k] waits for shard_start[k] alone.
    assert start.task_group is shards.task_group and start.task_group.group_id == "shard_runs"
    # A repair of an earlier week runs beside this week: more than one weekly run is active at once.
    assert dag.max_active_runs == 2
    summary = [t for t in ids if t.startswith("run_phases.")]
    assert summary, "the run-level phases follow every shard"
    assert dag.task_dict[summary[0]].trigger_rule == "all_done_min_one_success"
    # The canary runs first; the gate stands between it and the rest of the week.
    assert {"canary", "canary_gate"} <= ids
    assert "canary_gate" in start.upstream_task_ids
    assert {"canary", "shards"} <= dag.task_dict["report"].upstream_task_ids


def test_triage_starts_once_the_week_is_closed_and_the_report_waits_for_it(dagbag) -> None:
    weekly = dagbag.dags["avsim_weekly"].task_dict
    assert weekly["triage_start"].upstream_task_ids == {"prepare", "close_week"}
    assert weekly["triage"].upstream_task_ids == {"prepare", "triage_start"}
    assert "triage" in weekly["report"].upstream_task_ids
    # The run-level phases (the weekly summary) never wait for triage.
    summary = [t for t in weekly if t.startswith("run_phases.")]
    assert all("triage" not in weekly[t].upstream_task_ids for t in summary)
    # Ad-hoc runs are not triaged.
    assert "triage_start" not in dagbag.dags["avsim_adhoc"].task_dict


def _new_ti_weight(dag, task_id: str, run_id: str, map_index: int = 0) -> int:
    """The weight Airflow gives a new task instance of ``task_id`` (the DAG serialized as the
    dag-processor stores it)."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.serialization.serialized_objects import DagSerialization

    task = DagSerialization.from_dict(DagSerialization.to_dict(dag)).get_task(task_id)
    return TaskInstance(task=task, run_id=run_id, map_index=map_index, dag_version_id=None).priority_weight


def test_a_shards_task_waiting_for_its_turn_weighs_less_than_every_phase_of_its_week(dagbag) -> None:
    """A `shards` task held back by W stays *scheduled*. Airflow 3.3's scheduler takes the heaviest
    scheduled task instances (16 a pass), learns from that list only that a task is at its per-run
    limit, and stops once a pass found anything to queue: 15 waiting `shards` weighing 50,001 left
    one phase a loop at the tail of a 2,000-case week (docs/performance.md, 6 December). The run-level
    summary ranks with its run's phases too: an earlier week's below this week's."""
    from avsim.artifacts import shard_run_id
    from avsim.priority import (
        ADHOC_BASE,
        EARLIER_WEEK_BASE,
        EARLIER_WEEK_MAX_PATH,
        MAX_PATH_WEIGHT,
        WEEKLY_BASE,
    )

    for parent, shard_dag, run_id in (
        ("avsim_weekly", "avsim_weekly_shard", "manual__w"),
        ("avsim_adhoc", "avsim_adhoc_shard", "manual__w"),
        # `avsim rerun-failed`'s run ranks as an earlier week: its phases weigh below this week's, and
        # its shards (as many as the failed cases need) below those phases, or they crowd them out.
        ("avsim_weekly", "avsim_weekly_shard", "rerun__w"),
    ):
        shards = _new_ti_weight(dagbag.dags[parent], "shards", run_id)
        phases = [
            _new_ti_weight(dagbag.dags[shard_dag], task_id, shard_run_id(run_id, 1))
            for task_id in dagbag.dags[shard_dag].task_dict
            if "." in task_id and not task_id.startswith("cases_")
        ]
        assert phases and shards < min(phases), (parent, run_id, shards, min(phases))
        summary = _new_ti_weight(dagbag.dags[parent], "run_phases.weekly_summary", run_id)
        assert summary == shards + 1  # after every case of its run: nothing is behind it
        if run_id == "rerun__w":  # still ahead of ad-hoc work
            assert shards == EARLIER_WEEK_BASE > ADHOC_BASE + MAX_PATH_WEIGHT
        elif parent == "avsim_weekly":  # still ahead of last week's repair and of ad-hoc work
            assert shards > EARLIER_WEEK_BASE + EARLIER_WEEK_MAX_PATH
            assert shards == WEEKLY_BASE


def test_the_plans_weights_are_those_the_scheduler_gives_a_current_weeks_shard_run(dagbag) -> None:
    """What the plan says a phase weighs (a shard run of its run class in the current week) is what
    Airflow gives its new task instance through the strategy; the canary's shard run weighs more."""
    from avsim.artifacts import canary_run_id, shard_run_id
    from avsim.dagbuild.factory import load_plan
    from avsim.manifest.models import RunClass
    from avsim.plan.priority_rule import CANARY_BASE

    for shard_dag, run_class in (
        ("avsim_weekly_shard", RunClass.WEEKLY),
        ("avsim_adhoc_shard", RunClass.ADHOC),
    ):
        plan = load_plan(ROOT / "dags" / "avsim_graphs.yaml", run_class=run_class)
        for fam in plan.families:
            ph = fam.phases[0]
            task_id = f"{fam.group_id}.{ph.name}"
            assert (
                _new_ti_weight(dagbag.dags[shard_dag], task_id, shard_run_id("manual__w", 1))
                == ph.priority_weight
            )
            canary = _new_ti_weight(dagbag.dags[shard_dag], task_id, canary_run_id("manual__w"))
            assert canary == CANARY_BASE + ph.path_weight > ph.priority_weight


def test_adhoc_dags_share_the_pools_below_the_weekly_run(dagbag) -> None:
    from avsim.priority import ADHOC_BASE, WEEKLY_BASE

    weekly, adhoc = dagbag.dags["avsim_weekly_shard"], dagbag.dags["avsim_adhoc_shard"]
    assert type(dagbag.dags["avsim_adhoc"].timetable).__name__ == "NullTimetable"  # triggered only
    for task_id, task in weekly.task_dict.items():
        if "." not in task_id:
            continue
        other = adhoc.task_dict[task_id]
        assert (other.pool, other.pool_slots) == (task.pool, task.pool_slots)
        assert type(other.weight_rule).__name__ == "AdhocCriticalPathPriority"
        assert type(task.weight_rule).__name__ == "WeeklyCriticalPathPriority"
    assert ADHOC_BASE + 5_000 < WEEKLY_BASE


def test_shard_dag_has_one_mapped_group_per_family(dagbag) -> None:
    from avsim.dagbuild.factory import load_plan

    plan = load_plan(ROOT / "dags" / "avsim_graphs.yaml")
    dag = dagbag.dags["avsim_weekly_shard"]
    # Every shard run of the two weeks active at once (a repair of last week beside this week), their
    # canaries included: the weekly run admits shard runs, and an admitted one never queues behind a
    # shard run held by a straggler.
    from avsim.dagbuild.weekly import WEEKS_AT_ONCE
    from avsim.plan.admission import MAX_SHARD_RUNS

    assert dag.max_active_runs == WEEKS_AT_ONCE * (max(MAX_SHARD_RUNS, plan.max_active_shards) + 1)
    assert dag.max_active_tasks >= 2 * plan.shard_size
    for fam in plan.families:
        group = dag.task_group_dict[fam.group_id]
        assert type(group).__name__ == "MappedTaskGroup"
        for ph in fam.phases:
            t = dag.task_dict[f"{fam.group_id}.{ph.name}"]
            assert t.pool == ph.pool and t.pool_slots == ph.pool_slots
            assert t.priority_weight == ph.path_weight
            assert type(t.weight_rule).__name__ == "WeeklyCriticalPathPriority"
            assert {f"{fam.group_id}.{u}" for u in ph.upstream} <= t.upstream_task_ids
            if ph.resource_class == "gpu":
                # Spot task with its budgets, and an on-demand twin that runs only when the spot task
                # hands over (it ends skipped after too many preemptions).
                assert ph.on_demand_fallback
                twin = dag.task_dict[f"{fam.group_id}.{ph.name}_on_demand"]
                assert twin.pool == ph.on_demand_pool and twin.trigger_rule == "all_skipped"
                # Its only upstream is the spot task: all_skipped means "the spot task handed over".
                assert twin.upstream_task_ids == {t.task_id}
                assert t.retries == ph.retries + ph.on_demand_after_preemptions
                assert twin.retries == ph.retries + ph.preemption_retries - ph.on_demand_after_preemptions
                # The phases after it wait on both tasks (one of them ends skipped).
                for down in twin.downstream_task_ids - {"summarize"}:
                    assert {t.task_id, twin.task_id} <= dag.task_dict[down].upstream_task_ids
                    assert dag.task_dict[down].trigger_rule == "none_failed"
            else:
                assert t.retries == ph.retries + ph.preemption_retries
        assert f"cases_{fam.name}" in dag.task_dict
        assert "summarize" in dag.task_dict[f"{fam.group_id}.{fam.phases[-1].name}"].downstream_task_ids
    assert dag.task_dict["summarize"].trigger_rule == "all_done"


def test_dags_serialize(dagbag) -> None:
    from airflow.serialization.serialized_objects import DagSerialization

    for dag_id in ("avsim_weekly", "avsim_weekly_shard"):
        data = DagSerialization.to_dict(dagbag.dags[dag_id])
        assert DagSerialization.from_dict(data).dag_id == dag_id


def test_a_bad_catalog_breaks_only_its_own_file(tmp_path: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    shutil.copy(ROOT / "dags" / "avsim_weekly.py", tmp_path / "avsim_weekly.py")
    shutil.copy(ROOT / "dags" / "avsim_weekly_shard.py", tmp_path / "avsim_weekly_shard.py")
    shutil.copy(ROOT / "dags" / "avsim_graphs.yaml", tmp_path / "avsim_graphs.yaml")
    (tmp_path / "broken_graphs.yaml").write_text("apiVersion: avsim/v1\ngraphs:\n  g:\n    phases: {}\n")
    (tmp_path / "avsim_broken.py").write_text(
        "# airflow DAG file with a bad catalog\nfrom pathlib import Path\n"
        "from avsim.dagbuild.factory import load_weekly_dags\n"
        "globals().update(load_weekly_dags(catalog=Path(__file__).with_name('broken_graphs.yaml'), "
        "dag_id='avsim_broken'))\n"
    )
    bag = DagBag(dag_folder=str(tmp_path))
    assert list(bag.import_errors) == [str(tmp_path / "avsim_broken.py")]
    assert "graphs.g.phases" in next(iter(bag.import_errors.values()))
    assert {"avsim_weekly", "avsim_weekly_shard"} <= set(bag.dag_ids)


def test_control_tasks_ride_out_an_api_outage_of_a_few_minutes(dagbag) -> None:
    """Control tasks fail on a passing outage of the API server (the execution API) or the artifact
    store. Airflow's default retry delay (300 s) made a 2-minute outage cost 5 minutes of the week, and
    two retries (or none, for `shards`) let a longer one fail the week: each retries within seconds of
    the API coming back, and their retries span at least 3 minutes of an outage."""
    from airflow.serialization.serialized_objects import DagSerialization

    for dag_id in ("avsim_weekly", "avsim_weekly_shard"):
        dag = DagSerialization.from_dict(DagSerialization.to_dict(dagbag.dags[dag_id]))
        control = [t for t in dag.tasks if not t.task_type.endswith("PhaseOperator")]
        names = {t.task_id for t in control}
        assert names >= (
            {"prepare", "shards", "canary", "canary_gate", "close_week", "report"}
            if dag_id == "avsim_weekly"
            else {"load_shard", "summarize"}
        )
        for t in control:
            delays = [t.retry_delay.total_seconds()]
            for _ in range(1, t.retries):
                step = delays[-1] * (t.retry_exponential_backoff or 1)
                delays.append(min(step, t.max_retry_delay.total_seconds() if t.max_retry_delay else step))
            assert t.retries >= 5, (dag_id, t.task_id, t.retries)
            assert delays[0] <= 15, (dag_id, t.task_id, delays)
            assert max(delays) <= 60, (dag_id, t.task_id, delays)
            assert sum(delays) >= 180, (dag_id, t.task_id, delays)
