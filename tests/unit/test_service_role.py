"""The service account's least-privilege role: exactly the permissions avsim's REST calls need.

The role's effect on a real API server (each permission needed by a call, nothing else allowed) is
checked on the distributed stack (tests/integration/test_distributed.py); here, its definition.
"""

from __future__ import annotations

from avsim.service_role import (
    CAN_EDIT,
    CAN_READ,
    DAG_PREFIX,
    DAG_RUNS,
    POOLS,
    TASK_INSTANCES,
    Permission,
    RoleChanges,
    role_diff,
    service_permissions,
)


def test_names_are_fabs() -> None:
    from airflow.providers.fab.www.security import permissions as fab

    assert (CAN_READ, CAN_EDIT) == (fab.ACTION_CAN_READ, fab.ACTION_CAN_EDIT)
    assert (POOLS, DAG_RUNS, TASK_INSTANCES) == (
        fab.RESOURCE_POOL,
        fab.RESOURCE_DAG_RUN,
        fab.RESOURCE_TASK_INSTANCE,
    )
    assert f"{DAG_PREFIX}avsim_weekly" == fab.resource_name("avsim_weekly", fab.RESOURCE_DAG)


def test_the_role_reads_and_edits_pools_and_the_avsim_dags_task_instances_only() -> None:
    perms = service_permissions()
    resources = {p.resource for p in perms}
    assert resources == {
        "Pools",
        "DAG Runs",
        "Task Instances",
        "DAG:avsim_weekly",
        "DAG:avsim_weekly_shard",
        "DAG:avsim_adhoc",
        "DAG:avsim_adhoc_shard",
    }
    assert {p.action for p in perms} == {"can_read", "can_edit"}
    assert len(perms) == 2 * len(resources) and list(perms) == sorted(perms)
    # Never the all-DAGs resource, never delete or create.
    assert Permission("can_edit", "DAGs") not in perms
    only = service_permissions(["avsim_weekly", "avsim_weekly_shard", "avsim_weekly"])
    assert {p.resource for p in only if p.resource.startswith("DAG:")} == {
        "DAG:avsim_weekly",
        "DAG:avsim_weekly_shard",
    }


def test_sync_adds_what_is_missing_and_takes_away_anything_else() -> None:
    wanted = service_permissions(["avsim_weekly"])
    extra = Permission("can_delete", "Connections")
    current = [*wanted[:3], extra]
    added, removed = role_diff(current, wanted)
    assert set(added) == set(wanted[3:]) and removed == (extra,)
    assert role_diff(wanted, wanted) == ((), ())
    # FAB gives every custom role its home page at each start: a sync does not fight it.
    assert role_diff([*wanted, Permission("can_read", "Website")], wanted) == ((), ())
    lines = RoleChanges("avsim-service", False, (), ()).lines()
    assert lines == ["role avsim-service: exists", "  permissions already as they should be"]
