"""Run ids and the artifact layout: one low module names every run and finds its files."""

from __future__ import annotations

import ast
from pathlib import Path

import avsim.artifacts as artifacts
from avsim.artifacts import (
    RunLayout,
    canary_run_id,
    is_canary_run,
    parent_run,
    run_key_for,
    shard_dag_id,
    shard_run_id,
    week_run_ids,
)


def test_shard_and_canary_runs_lead_back_to_their_run() -> None:
    parent = "scheduled__2026-11-30T06:00:00+00:00"
    shard_dag = shard_dag_id("avsim_weekly")
    assert shard_dag == "avsim_weekly_shard"
    assert shard_run_id(parent, 3) == f"{parent}__shard_0003"
    assert canary_run_id(parent) == f"{parent}__canary"
    for child in (shard_run_id(parent, 1), shard_run_id(parent, 12), canary_run_id(parent)):
        assert parent_run(shard_dag, child) == ("avsim_weekly", parent)
    # a run of another DAG, or a shard DAG's run triggered by hand, is its own
    assert parent_run("avsim_weekly", parent) == ("avsim_weekly", parent)
    assert parent_run(shard_dag, "manual__by_hand") == (shard_dag, "manual__by_hand")
    assert is_canary_run(canary_run_id(parent)) and not is_canary_run(shard_run_id(parent, 1))
    assert not is_canary_run(None) and not is_canary_run("")


def test_a_weeks_shard_runs_are_named_in_the_order_they_start() -> None:
    parent = "scheduled__2026-11-30T06:00:00+00:00"
    assert week_run_ids(parent, 2, canary=True) == [
        canary_run_id(parent),
        shard_run_id(parent, 1),
        shard_run_id(parent, 2),
    ]
    assert week_run_ids(parent, 2, canary=False) == [shard_run_id(parent, 1), shard_run_id(parent, 2)]
    assert week_run_ids(parent, 0, canary=False) == []


def test_a_run_key_is_one_safe_object_key_segment() -> None:
    key = run_key_for("avsim_weekly", "manual__2026-12-07T06:00:00+00:00")
    assert key == "avsim_weekly__manual__2026-12-07T06_00_00_00_00"
    layout = RunLayout("file:///art/", key)
    assert layout.base == f"file:///art/runs/{key}"
    assert (
        layout.outcome_record("c1", "simulate") == f"file:///art/runs/{key}/ledger/outcomes/c1/simulate.json"
    )


def test_the_module_imports_nothing_from_avsim() -> None:
    tree = ast.parse(Path(artifacts.__file__).read_text(encoding="utf-8"))
    imported = [
        name
        for node in ast.walk(tree)
        for name in (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
    ]
    assert imported and not [n for n in imported if n.split(".")[0] == "avsim"]


def test_a_triage_run_is_told_by_the_end_of_its_id() -> None:
    from avsim.artifacts import is_triage_run, parent_run, triage_run_id

    run = triage_run_id("bench__triage_a", "1_this_2")
    assert run == "bench__triage_a__triage_1_this_2" and is_triage_run(run)
    assert not is_triage_run("bench__triage_a") and not is_triage_run("bench__triage_a__shard_0001")
    assert parent_run("avsim_weekly_shard", run) == ("avsim_weekly", "bench__triage_a")
    assert parent_run("avsim_weekly_shard", "bench__triage_a__shard_0001") == (
        "avsim_weekly",
        "bench__triage_a",
    )
