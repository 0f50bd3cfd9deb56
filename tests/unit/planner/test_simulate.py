"""The capacity planner: exact makespans of hand-computed instances, the lower bound, the failure
models, the GPU search, determinism, and the ``avsim plan`` command.

Workloads are built from real manifests (validated by the manifest's own models), so the tests
also cover the path from a manifest to what is simulated.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.support.planner_workloads import CHAIN, phase, workload
from typer.testing import CliRunner

from avsim.cli import app
from avsim.manifest.sample import write_sample
from avsim.planner import (
    STRATEGIES,
    Capacity,
    PlannerError,
    SimOptions,
    WorkLeft,
    Workload,
    estimate_finish_seconds,
    gpus_for_deadline,
    lower_bound,
    plan_capacity,
    simulate,
    smallest_gpus,
)

FORK = {
    "prepare": phase("cpu", 60),
    "simulate": phase("gpu", 600, "prepare"),
    "evaluate": phase("cpu", 120, "simulate"),
    "render": phase("gpu", 300, "simulate"),
    "report": phase("cpu", 60, "evaluate", "render"),
}
ONE_SHARD = SimOptions(shard_size=1000, max_active_shards=1)


def test_one_chain_runs_its_critical_path() -> None:
    w = workload({"chain": CHAIN}, ["chain"])
    for strategy in STRATEGIES:
        r = simulate(w, Capacity(gpus=2, cpus=2), SimOptions(strategy=strategy))
        assert r.makespan_seconds == 720 and r.case_end_seconds == (720,)
    assert lower_bound(w, Capacity(gpus=2, cpus=2)).seconds == 720


def test_three_chains_on_two_gpus() -> None:
    # Prepares 0-60; simulates of c0, c1 60-660, of c2 660-1260; its report 1260-1320.
    w = workload({"chain": CHAIN}, ["chain"] * 3)
    r = simulate(w, Capacity(gpus=2, cpus=10), ONE_SHARD)
    assert r.makespan_seconds == 1320
    assert r.case_end_seconds == (720, 720, 1320)
    assert r.gpu_busy_seconds == 1800 and r.gpu_utilisation == pytest.approx(1800 / (2 * 1320))
    bound = lower_bound(w, Capacity(gpus=2, cpus=10))
    assert bound.seconds == 900 and bound.binding == "GPU work"


def test_a_fork_on_one_gpu() -> None:
    # One GPU: c0 simulate 60-660; then c1's simulate (960 s of path left) before c0's render
    # (360 s left): 660-1260; c0 render 1260-1560, report 1560-1620; c1 render 1560-1860, report 1860-1920.
    w = workload({"fork": FORK}, ["fork", "fork"])
    r = simulate(w, Capacity(gpus=1, cpus=4), ONE_SHARD)
    assert r.case_end_seconds == (1620, 1920) and r.makespan_seconds == 1920
    # Alone, a case takes its critical path: 60 + 600 + max(120, 300) + 60.
    assert simulate(workload({"fork": FORK}, ["fork"]), Capacity(gpus=1, cpus=4)).makespan_seconds == 1020


def test_run_level_phases_follow_every_case() -> None:
    w = workload({"chain": CHAIN}, ["chain"], run_phases={"summary": phase("cpu", 600)})
    r = simulate(w, Capacity(gpus=1, cpus=1))
    assert r.case_end_seconds == (720,) and r.makespan_seconds == 1320
    assert lower_bound(w, Capacity(gpus=1, cpus=1)).seconds == 1320


def test_the_shard_window_and_the_per_run_task_limit() -> None:
    w = workload({"g": {"simulate": phase("gpu", 100)}}, ["g"] * 4)
    plenty = Capacity(gpus=10, cpus=1)
    # S = 1, W = 2: two shard runs at a time, the next starts when one ends.
    assert simulate(w, plenty, SimOptions(shard_size=1, max_active_shards=2)).makespan_seconds == 200
    assert (
        simulate(
            w, plenty, SimOptions(shard_size=1, max_active_shards=2, shard_start_seconds=30)
        ).makespan_seconds
        == 260
    )
    assert simulate(w, plenty, SimOptions(shard_size=4, max_active_shards=1)).makespan_seconds == 100
    limited = SimOptions(shard_size=4, max_active_shards=1, max_active_tasks_per_shard=2)
    assert simulate(w, plenty, limited).makespan_seconds == 200


def test_a_task_waits_for_its_slots_and_smaller_ones_pass() -> None:
    # 3 GPUs: the 2-GPU phase of c0 runs; c1's 2-GPU phase does not fit beside it, c2's 1-GPU one does.
    w = workload(
        {"wide": {"simulate": phase("gpu", 100, gpus=2)}, "narrow": {"simulate": phase("gpu", 100)}},
        ["wide", "wide", "narrow"],
    )
    r = simulate(w, Capacity(gpus=3, cpus=1), SimOptions(strategy="fifo", shard_size=10))
    assert r.case_end_seconds == (100, 100, 200)
    with pytest.raises(PlannerError, match="takes 2 GPUs but the spot GPU pool has 1"):
        simulate(w, Capacity(gpus=1, cpus=1))


def adversarial() -> Workload:
    """Five short GPU cases come first; one case needs the GPU briefly, then a long CPU tail."""
    graphs = {
        "short": {"simulate": phase("gpu", 100)},
        "long": {
            "prepare": phase("cpu", 10),
            "simulate": phase("gpu", 100, "prepare"),
            "evaluate": phase("cpu", 1000, "simulate"),
        },
    }
    return workload(graphs, ["short"] * 5 + ["long"])


def test_critical_path_beats_fifo_on_an_adversarial_instance() -> None:
    w = adversarial()
    cap = Capacity(gpus=1, cpus=4)
    # FIFO: the five short ones were ready first (0-500), then the long case's simulate (500-600)
    # and its CPU tail (600-1600). Critical path: short 0-100, then the long simulate 100-200 and
    # its tail (200-1200) while the other short ones run.
    fifo = simulate(w, cap, SimOptions(strategy="fifo")).makespan_seconds
    critical = simulate(w, cap, SimOptions(strategy="critical_path")).makespan_seconds
    assert (fifo, critical) == (1600, 1200)
    assert lower_bound(w, cap).seconds == 1110


def test_checkpoints_make_preemption_cheaper() -> None:
    def run(checkpoint: bool) -> Any:
        w = workload(
            {
                "g": {
                    "simulate": phase(
                        "gpu", 3600, checkpoint=checkpoint, preemption=20, on_demand_after_preemptions=20
                    )
                }
            },
            ["g"] * 40,
        )
        return simulate(
            w,
            Capacity(gpus=10, cpus=1, on_demand_gpus=1),
            SimOptions(preemption_rate=0.5, checkpoint_seconds=300, seed=3),
        )

    with_ckpt, without = run(True), run(False)
    assert with_ckpt.preemptions > 10 and without.preemptions > 10
    # Each preemption loses at most one checkpoint interval of work with checkpoints.
    assert with_ckpt.lost_gpu_seconds <= with_ckpt.preemptions * 300
    assert with_ckpt.lost_gpu_seconds < without.lost_gpu_seconds / 3
    assert with_ckpt.makespan_seconds < without.makespan_seconds
    no_preemption = simulate(
        workload({"g": {"simulate": phase("gpu", 3600, checkpoint=True)}}, ["g"] * 40),
        Capacity(gpus=10, cpus=1),
    )
    assert no_preemption.makespan_seconds == 4 * 3600 < with_ckpt.makespan_seconds


def test_on_demand_after_n_preemptions() -> None:
    # At 1,000 preemptions per GPU-hour an attempt on spot lasts ~4 s: every GPU phase is preempted
    # exactly twice on spot, then runs whole on an on-demand GPU, where nothing preempts it.
    graph = {
        "prepare": phase("cpu", 30),
        "simulate": phase("gpu", 600, "prepare", preemption=3, on_demand_after_preemptions=2),
    }
    w = workload({"g": graph}, ["g"] * 6)
    r = simulate(w, Capacity(gpus=4, cpus=4, on_demand_gpus=2), SimOptions(preemption_rate=1000))
    assert r.preemptions == 12 and r.on_demand_attempts == 6 and r.cases_failed == 0
    assert r.on_demand_gpu_seconds == 6 * 600
    with pytest.raises(PlannerError, match=r"on-demand pool after a few preemptions.*--on-demand-gpus"):
        simulate(w, Capacity(gpus=4, cpus=4), SimOptions(preemption_rate=0.05))


def test_a_phase_out_of_budget_fails_its_case_and_nothing_downstream_runs() -> None:
    graph = {"simulate": phase("gpu", 600, preemption=0), "report": phase("cpu", 60, "simulate")}
    w = workload({"g": graph}, ["g"] * 3)
    r = simulate(w, Capacity(gpus=3, cpus=3), SimOptions(preemption_rate=1000))
    assert r.cases_failed == 3 and r.preemptions == 3 and r.cpu_busy_seconds == 0
    crashing = SimOptions(failure_rate=0.5, seed=1)
    retried = simulate(
        workload({"g": {"simulate": phase("gpu", 60, infrastructure=20, delay_seconds=1)}}, ["g"] * 20),
        Capacity(gpus=5, cpus=1),
        crashing,
    )
    assert retried.infra_failures > 5 and retried.cases_failed == 0


def test_same_seed_same_run_other_seed_other_luck() -> None:
    w = workload(
        {"fork": {**FORK, "simulate": phase("gpu", 1800, "prepare", checkpoint=True)}}, ["fork"] * 30
    )
    cap = Capacity(gpus=5, cpus=5, on_demand_gpus=1)
    opts = SimOptions(preemption_rate=0.5, duration_spread=0.2, failure_rate=0.05, seed=11)
    a, b = simulate(w, cap, opts), simulate(w, cap, opts)
    assert a == b
    c = simulate(w, cap, SimOptions(preemption_rate=0.5, duration_spread=0.2, failure_rate=0.05, seed=12))
    assert (c.preemptions, c.makespan_seconds) != (a.preemptions, a.makespan_seconds)


def test_the_gpu_search_is_monotone_and_tight() -> None:
    w = workload({"fork": FORK, "chain": CHAIN}, ["fork", "chain", "chain"] * 10)
    cap = Capacity(gpus=1, cpus=8)
    opts = SimOptions(shard_size=10, max_active_shards=2)
    found = []
    for hours in (1.5, 2, 3, 4, 6, 8):
        search = smallest_gpus(w, cap, opts, hours * 3600)
        assert search.gpus is not None
        g = search.gpus
        assert simulate(w, Capacity(gpus=g, cpus=8), opts).makespan_seconds <= hours * 3600
        if g > 1:
            assert simulate(w, Capacity(gpus=g - 1, cpus=8), opts).makespan_seconds > hours * 3600
        found.append(g)
    assert found == sorted(found, reverse=True) and found[0] > found[-1]
    hopeless = smallest_gpus(w, cap, opts, 600)
    assert hopeless.gpus is None and "longest case alone takes" in hopeless.reason


@st.composite
def instances(draw: st.DrawFn) -> tuple[Workload, Capacity, SimOptions]:
    graphs: dict[str, dict[str, dict]] = {}
    for g in range(draw(st.integers(1, 3))):
        phases: dict[str, dict] = {}
        for i in range(draw(st.integers(1, 4))):
            after = draw(st.lists(st.sampled_from(sorted(phases)), unique=True, max_size=2)) if phases else []
            kind = draw(st.sampled_from(["cpu", "gpu"]))
            phases[f"p{i}"] = phase(
                kind,
                draw(st.integers(1, 300)),
                *after,
                gpus=draw(st.integers(1, 2)),
                checkpoint=draw(st.booleans()),
                # A budget no 20 % failure rate exhausts: a failed case would skip work the bound counts.
                infrastructure=12,
                delay_seconds=draw(st.integers(0, 30)),
            )
        graphs[f"g{g}"] = phases
    cases = draw(st.lists(st.sampled_from(sorted(graphs)), min_size=1, max_size=8))
    capacity = Capacity(
        gpus=draw(st.integers(2, 4)), cpus=draw(st.integers(1, 3)), on_demand_gpus=draw(st.integers(2, 3))
    )
    options = SimOptions(
        shard_size=draw(st.integers(1, 4)),
        max_active_shards=draw(st.integers(1, 3)),
        preemption_rate=draw(st.sampled_from([0.0, 5.0])),
        checkpoint_seconds=draw(st.integers(10, 200)),
        failure_rate=draw(st.sampled_from([0.0, 0.2])),
        duration_spread=draw(st.sampled_from([0.0, 0.3])),
        shard_logical_dates=draw(st.booleans()),
        seed=draw(st.integers(0, 1000)),
    )
    return workload(graphs, cases), capacity, options


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_no_strategy_beats_the_lower_bound(instance: tuple[Workload, Capacity, SimOptions]) -> None:
    w, capacity, options = instance
    bound = lower_bound(w, capacity, options).seconds
    for strategy in STRATEGIES:
        r = simulate(w, capacity, SimOptions(**{**vars(options), "strategy": strategy}))
        assert r.complete and r.cases_failed == 0
        assert r.makespan_seconds >= bound - 1e-6
        assert r.gpu_busy_seconds <= capacity.total_gpus * r.makespan_seconds + 1e-6


def test_work_left_and_the_closed_form_estimates() -> None:
    w = workload({"chain": CHAIN}, ["chain"] * 20)
    left = WorkLeft.of(w)
    assert (left.gpu_seconds, left.cpu_seconds, left.path_seconds) == (12_000, 2_400, 720)
    cap = Capacity(gpus=4, cpus=4)
    assert estimate_finish_seconds(left, cap, efficiency=1.0) == lower_bound(w, cap).seconds == 3000
    assert estimate_finish_seconds(left, cap) > simulate(w, cap).makespan_seconds * 0.99
    assert gpus_for_deadline(left, 3000, cpus=4, efficiency=1.0) == 4
    assert gpus_for_deadline(left, 600, cpus=4) is None  # the chain alone takes 720 s
    # Half the cases done, the other half prepared: the work left shrinks accordingly.
    done = [(c.case_id, p.name) for c in w.cases[:10] for p in c.phases] + [
        (c.case_id, "prepare") for c in w.cases[10:]
    ]
    rest = w.remaining(done, shard_size=250)
    assert (
        len(rest.cases) == 10
        and WorkLeft.of(rest).gpu_seconds == 6_000
        and WorkLeft.of(rest).path_seconds == 660
    )
    assert simulate(rest, cap).makespan_seconds == 3 * 600 + 60


def test_plan_compares_strategies(tmp_path: Path) -> None:
    w = adversarial()
    plan = plan_capacity(w, Capacity(gpus=1, cpus=4), deadline_seconds=1300)
    assert plan.ratio("critical_path") < plan.ratio("fifo")
    assert (
        plan.outcomes["critical_path"].search is not None and plan.outcomes["critical_path"].search.gpus == 1
    )
    assert plan.outcomes["fifo"].search is not None and plan.outcomes["fifo"].search.gpus == 2
    from avsim.planner.plot import write_progress_plot

    png = write_progress_plot(plan, tmp_path / "p.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


runner = CliRunner()


def test_the_plan_command_prints_the_table_and_writes_the_plot(tmp_path: Path) -> None:
    manifest = write_sample(tmp_path / "week.yaml", cases=60, iso_week="2026-W10")
    plot = tmp_path / "out" / "plan.png"
    done = runner.invoke(
        app,
        [
            "plan",
            str(manifest),
            "--gpus",
            "6",
            "--cpus",
            "4",
            "--on-demand-gpus",
            "2",
            "--deadline-hours",
            "8",
            "--preemption-rate",
            "0.05",
            "--shard-size",
            "20",
            "--max-active-shards",
            "2",
            "--plot",
            str(plot),
        ],
    )
    assert done.exit_code == 0, done.output
    out = done.output
    assert "lower bound:" in out and "deadline: 8.00 h" in out
    rows = {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if line.split() and line.split()[0] in STRATEGIES
    }
    assert set(rows) == set(STRATEGIES)
    for row in rows.values():
        assert float(row[3]) >= 1.0  # makespan / bound
        assert int(row[-1]) >= 1  # GPUs for the deadline
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000

    as_json = runner.invoke(
        app,
        [
            "plan",
            str(manifest),
            "--gpus",
            "6",
            "--cpus",
            "4",
            "--shard-size",
            "20",
            "--max-active-shards",
            "2",
            "--json",
            "--no-search",
        ],
    )
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.output)
    # The manifest's own deadline: Sunday 18:00 of its week, from Monday 06:00.
    assert data["deadline_seconds"] == (6 * 24 + 12) * 3600
    assert set(data["strategies"]) == set(STRATEGIES)
    cp = data["strategies"]["critical_path"]
    assert (
        cp["makespan_seconds"] >= data["lower_bound"]["seconds"] and cp["smallest_gpus_for_deadline"] is None
    )
    assert math.isclose(cp["gpu_hours"], data["lower_bound"]["gpu_work_seconds"] / 3600)


def test_the_plan_command_names_the_fix(tmp_path: Path) -> None:
    manifest = write_sample(tmp_path / "week.yaml", cases=5)
    done = runner.invoke(
        app,
        [
            "plan",
            str(manifest),
            "--gpus",
            "0",
            "--cpus",
            "4",
            "--shard-size",
            "5",
            "--max-active-shards",
            "1",
        ],
    )
    assert done.exit_code == 1 and "raise --gpus" in done.output
    both = runner.invoke(
        app,
        [
            "plan",
            str(manifest),
            "--gpus",
            "2",
            "--cpus",
            "2",
            "--deadline",
            "2026-01-01T00:00:00Z",
            "--deadline-hours",
            "3",
            "--shard-size",
            "5",
            "--max-active-shards",
            "1",
        ],
    )
    assert both.exit_code == 1 and "not both" in both.output


def test_the_plan_counts_the_task_instances_each_scheduler_loop_carries() -> None:
    # CHAIN is 3 phases and 4 tasks a case (its GPU phase has an on-demand twin); without a
    # preemption budget the GPU phase has no twin: 3 tasks.
    no_twin = {**CHAIN, "simulate": phase("gpu", 600, "prepare", preemption=0)}
    w = workload({"chain": CHAIN, "plain": no_twin}, ["chain"] * 7 + ["plain"] * 3)
    # shards of 3 cases: [4+4+4, 4+4+4, 4+3+3, 3] tasks; the busiest 2 consecutive ones hold 24
    assert w.window_task_instances(3, 2) == 24
    assert w.window_task_instances(3, 3) == 34
    assert w.window_task_instances(3, 10) == 37  # a window wider than the week holds all of it
    assert w.window_task_instances(100, 1) == 37
    plan = plan_capacity(
        w, Capacity(gpus=2, cpus=2), SimOptions(shard_size=3, max_active_shards=2), search=False
    )
    assert plan.window_task_instances == 24
    from avsim.planner.report import format_table, plan_to_json

    assert "up to 24 phase task instances in the 2 active shard runs" in format_table(plan)
    assert plan_to_json(plan)["window_task_instances"] == 24
