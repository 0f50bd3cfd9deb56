"""The demo's stack: its executor has a slot for every pool slot (docs/performance.md, "The demo's GPUs").

With ``[core] parallelism`` below the pools' slots, a full CPU pool fills the executor too, and the
GPUs idle while GPU phases wait for an executor slot. Nothing is started here.
"""

from __future__ import annotations

from pathlib import Path

from avsim.devstack.demo import demo_parallelism, demo_pools, demo_stack


def test_the_demo_executor_runs_every_pool_full_at_once(tmp_path: Path) -> None:
    pools = demo_pools(8, 16)
    slots = {name: n for name, (n, _) in pools.items()}
    assert sorted(slots.values()) == [2, 8, 16]  # spot GPUs, on-demand GPUs (a quarter), CPUs
    stack = demo_stack(tmp_path / "home", 50, 2, pools)
    assert stack.parallelism == demo_parallelism(pools) == 26


def test_the_demo_stack_keeps_its_settings_and_adds_the_callers(tmp_path: Path) -> None:
    stack = demo_stack(tmp_path / "home", 40, 3, demo_pools(4, 8), {"AIRFLOW__X__Y": "1"})
    assert stack.parallelism == 4 + 1 + 8
    assert stack.extra_env["AIRFLOW__AVSIM__SHARD_SIZE"] == "40"
    assert stack.extra_env["AIRFLOW__AVSIM__MAX_ACTIVE_SHARDS"] == "3"
    assert stack.extra_env["AIRFLOW__X__Y"] == "1"
