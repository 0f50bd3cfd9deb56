"""The benches that run no week run their ``--quick`` mode on a tiny input and print their line.

Each runs as a user runs it (``python bench/<name>.py --quick ...``, a process of its own); the
assertions read the bench's last line (``<name>: key=value ...``) and check what must hold of any
run, however small. Seconds each (shard_pass and k8s_api_load, half a minute each, in the long tier);
the benches that run weeks on a stack are in test_bench_stacks.py.
"""

from __future__ import annotations

import pytest
from tests.support.bench_cli import finite, run_bench, summary


def test_planner_quick_prints_admission_line() -> None:
    out = run_bench("planner", "--quick", "--cases", "300", timeout=180)
    got = summary(out, "admission")
    finite(got, "makespan_vs_bound", "inflight_tis_vs_today", "twin_share", "loop_makespan_vs_bound")
    # A simulated makespan never beats the lower bound; the twins are a share of the task instances.
    assert got["makespan_vs_bound"] >= 1.0
    assert got["loop_makespan_vs_bound"] >= got["makespan_vs_bound"] - 1e-9
    assert 0.0 <= got["twin_share"] <= 1.0
    # The same week with tails: never below the bound of the same work, and admission refills the
    # target, so the week never sinks below it while cases wait.
    tails = summary(out, "stragglers")
    finite(tails, "makespan_vs_bound", "inflight_min_vs_target")
    assert tails["makespan_vs_bound"] >= 1.0 and tails["inflight_min_vs_target"] >= 0.99


def test_parse_time_quick_prints_its_ratios() -> None:
    got = summary(run_bench("parse_time", "--quick", "--cases", "200", timeout=240), "parse_time")
    finite(got, "large_vs_small", "naive_large_vs_small")
    assert got["large_vs_small"] > 0 and got["naive_large_vs_small"] > 0


def test_input_bounds_quick_prints_the_bound_held() -> None:
    out = run_bench("input_bounds", "--quick", "--shape", "huge_numbers", "--repeats", "1", timeout=180)
    got = summary(out, "input_bounds")
    finite(got, "worst_memory_ratio", "worst_time_exponent")
    # The stated memory bound holds for this shape (a child killed by its limit would print 99).
    assert 0.0 < got["worst_memory_ratio"] <= 1.0
    assert out.count("huge_numbers         n=") == 3


@pytest.mark.integration
@pytest.mark.long  # about 40 s of dags test passes
def test_shard_pass_quick_prints_per_case_cost() -> None:
    got = summary(run_bench("shard_pass", "--quick", timeout=300), "shard_pass")
    finite(got, "largest_vs_smallest", "ms_per_case")
    assert got["ms_per_case"] > 0


@pytest.mark.integration
@pytest.mark.long  # about 30 s of phases on the loopback Kubernetes API
def test_k8s_api_load_quick_prints_calls_per_phase_second() -> None:
    got = summary(run_bench("k8s_api_load", "--quick", timeout=300), "k8s_api_load")
    finite(got, "avsim_vs_stock", "avsim_calls_per_phase_second", "stock_calls_per_phase_second")
    # The stock trigger polls each pod every 2 s; the shared watch and a 5 s heartbeat ask less.
    assert got["stock_calls_per_phase_second"] > 0
    assert got["avsim_vs_stock"] < 1.0


@pytest.mark.integration
def test_ui_progress_quick_prints_its_ratio() -> None:
    # A private PostgreSQL and the real API server: about 15 s on 2 cores.
    got = summary(run_bench("ui_progress", "--quick", timeout=300), "ui_progress")
    finite(got, "largest_vs_smallest", "cold_largest_vs_smallest", "median_ms")
    assert got["median_ms"] > 0
