"""The benches that run weeks on a real Airflow stack run their ``--quick`` mode on a tiny input.

Long tier (``make test-long``): each starts real components (scheduler, dag-processor, triggerer,
api-server, PostgreSQL; Celery and Redis for celery_workers), a few minutes each on 2 cores. Each
runs as a user runs it (``python bench/<name>.py --quick ...``); the assertions read the bench's last
line (``<name>: key=value ...``) and check what must hold of any run, however small.
"""

from __future__ import annotations

import pytest
from tests.support.bench_cli import finite, run_bench, summary

pytestmark = [pytest.mark.long, pytest.mark.integration]


@pytest.mark.timeout(1500)
def test_phase_overhead_quick_prints_cost_per_phase() -> None:
    out = run_bench("phase_overhead", "--quick", "--cases", "2", "--idle-seconds", "5", timeout=1400)
    got = summary(out, "phase_overhead")
    finite(got, "local_vs_empty", "k8s_vs_stock", "k8s_vs_empty", "latency_vs_empty")
    assert all(v > 0 for v in got.values())
    finite(summary(out, "deferral_floor"), "deferral_vs_empty", "k8s_vs_deferral", "trigger_end_vs_empty")


@pytest.mark.timeout(1200)
def test_bad_build_quick_prints_spent_share() -> None:
    got = summary(run_bench("bad_build", "--quick", "--cases", "100", timeout=1100), "bad_build")
    finite(got, "spent_vs_planned", "after_decision_share")
    # The week stops on the canary: a bad build burns a small share of the week's GPU-hours.
    assert 0.0 < got["spent_vs_planned"] < 0.5
    assert 0.0 <= got["after_decision_share"] <= 1.0


@pytest.mark.timeout(1500)
def test_celery_workers_quick_prints_two_vs_one() -> None:
    got = summary(run_bench("celery_workers", "--quick", timeout=1400), "celery_workers")
    finite(got, "two_vs_one", "round_trips_per_phase")
    assert got["two_vs_one"] > 0 and got["round_trips_per_phase"] > 0


@pytest.mark.timeout(1200)
def test_chaos_quick_holds_every_invariant() -> None:
    got = summary(run_bench("chaos", "--quick", timeout=1100), "chaos")
    finite(got, "cases", "attempts", "retries", "failed_checks", "seconds")
    assert got["cases"] == 30
    assert got["attempts"] > got["cases"]
    assert got["failed_checks"] == 0


@pytest.mark.timeout(1200)
def test_planner_forecast_quick_prints_forecast_vs_real() -> None:
    got = summary(run_bench("planner_forecast", "--quick", timeout=1100), "planner_forecast")
    finite(got, "forecast_vs_real")
    assert got["forecast_vs_real"] > 0


@pytest.mark.timeout(1200)
def test_scheduler_scale_quick_prints_its_ratios() -> None:
    got = summary(run_bench("scheduler_scale", "--quick", timeout=1100), "scheduler_scale")
    finite(got, "throughput_ratio", "loop_ratio")
    assert got["throughput_ratio"] > 0 and got["loop_ratio"] > 0


@pytest.mark.timeout(1800)
def test_whole_week_quick_prints_its_ratios() -> None:
    out = run_bench(
        "whole_week", "--quick", "--small", "20", "--cases", "40", "--sweep", "10x5", timeout=1700
    )
    got = summary(out, "whole_week")
    finite(got, "cases", "loop_ratio", "shipped_vs_tuned")
    assert got["cases"] == 40


@pytest.mark.timeout(1500)
def test_stragglers_quick_prints_the_cost_of_hung_phases() -> None:
    out = run_bench("stragglers", "--quick", "--cases", "40", "--target", "12", timeout=1400)
    got = summary(out, "stragglers_real")
    finite(got, "makespan_vs_clean", "inflight_min_vs_target", "expanded_mean_vs_target")
    assert got["makespan_vs_clean"] > 0 and got["inflight_min_vs_target"] >= 0


@pytest.mark.timeout(2400)
def test_triage_quick_classifies_the_planted_cases_within_its_share() -> None:
    got = summary(run_bench("triage", "--quick", timeout=2300), "triage")
    finite(got, "classified", "correct", "gpu_share", "bound", "delay_of_report_s", "triage_s")
    # 3 planted regressions and 2 planted flakes: each gets a verdict, and the one it was planted with.
    assert got["classified"] == got["correct"] == 5, got
    assert 0.0 < got["gpu_share"] <= got["bound"], got
