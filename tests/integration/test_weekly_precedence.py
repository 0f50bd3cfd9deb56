"""The weekly run ahead of ad-hoc work on a small GPU pool, on the real scheduler (PostgreSQL).

Two spot GPUs. An ad-hoc run of 25 cases (25 GPU phases) starts first; 20 s later a 20-case weekly
run (the shipped admission: ``cases_in_flight`` 0, the target derived when the week is prepared).
Every weekly phase outranks every ad-hoc one, so between the weekly run's first and last GPU start
the ad-hoc run should get a GPU only when the week has no GPU phase waiting. Admitting the week by
Little's law alone (a handful of cases on two GPUs) left no weekly GPU phase queued in front of the
pool, and the ad-hoc run took about a third of the starts; a week the scheduler carries comfortably
is not throttled, so the weights decide. ``avsim plan``'s forecast of the week, with this machine's
calibration, must be within 0.8 to 1.25 of it. Nothing is mocked: the phases are the fake simulator's.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from tests.support.airflow_run import query, run_descriptor, trigger, wait_for_run
from tests.support.stacks import weekly_stack

from avsim.devstack.stack import LocalStack
from avsim.manifest.sample import sample_manifest

# Long: two runs competing for two GPUs, a few minutes on 2 cores.
pytestmark = [pytest.mark.integration, pytest.mark.long]

GPUS = 2
CPUS = 8
#: The weekly run's share of the GPU starts between its first and last, at least (issue's goal).
SHARE = 0.95
#: The weekly run's span / ``avsim plan``'s forecast of it (issue's goal).
FORECAST_BAND = (0.8, 1.25)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    with weekly_stack(
        tmp_path_factory.mktemp("precedence"),
        shard_size=250,
        max_active_shards=6,
        cases_in_flight=0,
        gpus=GPUS,
        cpus=CPUS,
    ) as s:
        s.airflow("dags", "unpause", "avsim_adhoc")
        s.airflow("dags", "unpause", "avsim_adhoc_shard")
        yield s


def _adhoc_manifest(cases: int) -> dict[str, Any]:
    """``cases`` cases of the standard graph: one GPU phase (simulate) each."""
    doc = sample_manifest(cases * 3, time_scale=0.002, scenario_fail_rate=0.0, canary={"enabled": False})
    doc["cases"] = [c for c in doc["cases"] if c["graph"] == "standard"][:cases]
    assert len(doc["cases"]) == cases
    doc["run"].update(name="adhoc_gpu_load", run_class="adhoc")
    return doc


def _gpu_starts(stack: LocalStack, run_ids: dict[str, str]) -> list[tuple[Any, str]]:
    """(start, "weekly" or "adhoc") of every GPU task instance of the runs' shard runs."""
    out = []
    for label, run_id in run_ids.items():
        for (start,) in query(
            stack,
            # A skipped twin has a start date too: only the task instances that ran.
            "SELECT start_date FROM task_instance WHERE run_id LIKE :p AND pool LIKE 'avsim_gpu%' "
            "AND start_date IS NOT NULL AND state IN ('success', 'failed', 'running', 'up_for_retry')",
            p=f"{run_id}__%",
        ):
            out.append((start, label))
    return sorted(out)


def test_the_weekly_run_gets_the_gpus_ahead_of_an_adhoc_run_that_started_first(stack: LocalStack) -> None:
    adhoc = stack.home / "adhoc.json"
    adhoc.write_text(json.dumps(_adhoc_manifest(25)))
    weekly = stack.home / "week.json"
    weekly.write_text(json.dumps(sample_manifest(20, time_scale=0.002, scenario_fail_rate=0.0)))
    trigger(stack, "avsim_adhoc", "it__adhoc", {"manifest": str(adhoc)})
    time.sleep(20)
    trigger(stack, "avsim_weekly", "it__weekly", {"manifest": str(weekly)})
    assert wait_for_run(stack, "avsim_weekly", "it__weekly", timeout=900) == "success"
    assert wait_for_run(stack, "avsim_adhoc", "it__adhoc", timeout=900) == "success"

    # Not throttled: a 20-case week is far below what the scheduler carries comfortably.
    admission = run_descriptor(stack, "it__weekly")["admission"]
    assert admission["target"] >= 20

    starts = _gpu_starts(stack, {"weekly": "it__weekly", "adhoc": "it__adhoc"})
    weekly_starts = [at for at, label in starts if label == "weekly"]
    first, last = min(weekly_starts), max(weekly_starts)
    window = [label for at, label in starts if first <= at <= last]
    adhoc_after = [at for at, label in starts if label == "adhoc" and at > last]
    # The ad-hoc run still had GPU phases to start after the window: it competed the whole time.
    assert adhoc_after, "the ad-hoc run's GPU phases all started before the weekly run's last one"
    share = window.count("weekly") / len(window)
    print(" ".join(f"{(at - first).total_seconds():.0f}{label[0]}" for at, label in starts))
    print(
        f"weekly GPU starts {window.count('weekly')} of {len(window)} in {(last - first).total_seconds():.0f} s"
    )
    forecast, to_run_level, whole = _real_vs_forecast(stack, weekly)
    print(
        f"real / forecast: {to_run_level:.2f} (forecast {forecast:.1f} s; to the last run-level phase; "
        f"whole run {whole:.2f})"
    )
    assert share >= SHARE, f"the weekly run got {share:.0%} of the GPU starts between its first and last"
    assert FORECAST_BAND[0] <= to_run_level <= FORECAST_BAND[1], (
        f"the weekly run took {to_run_level:.2f} x avsim plan's forecast of it"
    )


def _real_vs_forecast(stack: LocalStack, manifest: Any) -> tuple[float, float, float]:
    """``avsim plan``'s forecast of the weekly run on two GPUs with this machine's calibration
    (:data:`avsim.planner.calibration.LOCAL_STACK`), and the run's span over it: from its start to its
    last run-level phase's end (the span the forecast stands for), and to the run's end (report included)."""
    from avsim.planner import Capacity
    from avsim.planner.calibration import local_stack_options
    from avsim.planner.command import run_plan

    plan = run_plan(
        str(manifest),
        Capacity(gpus=GPUS, cpus=CPUS),
        local_stack_options(),
        search=False,
        time_scale=0.002,
        cases_in_flight=0,
    ).plan
    forecast = plan.outcomes["critical_path"].result.makespan_seconds
    [(start, end, run_level)] = query(
        stack,
        "SELECT dr.start_date, dr.end_date, (SELECT max(ti.end_date) FROM task_instance ti WHERE "
        "ti.dag_id = dr.dag_id AND ti.run_id = dr.run_id AND ti.task_id LIKE 'run\\_phases.%') "
        "FROM dag_run dr WHERE dr.dag_id = 'avsim_weekly' AND dr.run_id = 'it__weekly'",
    )
    return forecast, (run_level - start).total_seconds() / forecast, (end - start).total_seconds() / forecast
