"""The least-privilege role of the account avsim's own REST calls log in as (FAB auth manager).

avsim calls Airflow's REST API itself for a shard run's repair, the deadline tracker's pool reads and its
pool scaling, through :class:`avsim.hooks.airflow_api.AirflowApiHook`; ``avsim service-role sync``
writes exactly :func:`service_permissions` into the role. Pure functions here; only :func:`sync_role`
touches Airflow. The calls and the permissions each needs: docs/deployment.md, "avsim's service account".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from avsim.errors import ConfigError

#: The role ``docker/airflow-init.sh`` creates and gives the service account.
SERVICE_ROLE = "avsim-service"
#: The DAGs whose task instances the repair clears: the weekly pair and the ad-hoc pair.
AVSIM_DAG_IDS = ("avsim_weekly", "avsim_weekly_shard", "avsim_adhoc", "avsim_adhoc_shard")

# FAB's names (airflow.providers.fab.www.security.permissions; tests/unit/test_service_role.py
# checks they still are).
CAN_READ = "can_read"
CAN_EDIT = "can_edit"
POOLS = "Pools"
DAG_RUNS = "DAG Runs"
TASK_INSTANCES = "Task Instances"
DAG_PREFIX = "DAG:"
#: FAB gives every custom role the home page at each start (``add_homepage_access_to_custom_roles``):
#: a sync leaves it, since taking it away would not last.
FAB_MANAGED = frozenset({("can_read", "Website")})


@dataclass(frozen=True, order=True)
class Permission:
    """One FAB permission: an action on a resource."""

    action: str
    resource: str

    def __str__(self) -> str:
        return f"{self.action} on {self.resource}"


@dataclass(frozen=True)
class RoleChanges:
    """What :func:`sync_role` changed (or, in a dry run, would change)."""

    role: str
    created: bool
    added: tuple[Permission, ...]
    removed: tuple[Permission, ...]

    def lines(self) -> list[str]:
        out = [f"role {self.role}: " + ("created" if self.created else "exists")]
        out += [f"  + {p}" for p in self.added]
        out += [f"  - {p}" for p in self.removed]
        if not self.added and not self.removed:
            out.append("  permissions already as they should be")
        return out


def service_permissions(dag_ids: Sequence[str] = AVSIM_DAG_IDS) -> tuple[Permission, ...]:
    """Every permission avsim's REST calls need, and nothing more (sorted)."""
    if not dag_ids:
        raise ValueError("name at least one DAG whose task instances the repair clears")
    resources = (POOLS, DAG_RUNS, TASK_INSTANCES, *(f"{DAG_PREFIX}{d}" for d in dict.fromkeys(dag_ids)))
    return tuple(sorted(Permission(a, r) for a in (CAN_READ, CAN_EDIT) for r in resources))


def role_diff(
    current: Iterable[Permission], wanted: Iterable[Permission]
) -> tuple[tuple[Permission, ...], tuple[Permission, ...]]:
    """(to add, to remove) to make a role hold exactly ``wanted`` (and what FAB itself gives it)."""
    have, want = set(current), set(wanted)
    extra = {p for p in have - want if (p.action, p.resource) not in FAB_MANAGED}
    return tuple(sorted(want - have)), tuple(sorted(extra))


def sync_role(role: str, permissions: Iterable[Permission], *, dry_run: bool = False) -> RoleChanges:
    """Make the FAB role ``role`` hold exactly ``permissions`` (creating the role, and the resources of
    DAGs not parsed yet); needs the FAB auth manager and the metadata database."""
    try:
        from airflow.providers.fab.auth_manager.cli_commands.utils import get_application_builder
    except ImportError:
        raise ConfigError(
            "the service role is a role of the FAB auth manager, and the FAB provider is not installed: "
            'pip install "airflow-provider-avsim[fab]"'
        ) from None

    wanted = tuple(permissions)
    with get_application_builder() as appbuilder:
        sm: Any = appbuilder.sm
        found = sm.find_role(role)
        created = found is None
        current = (
            [] if found is None else [Permission(p.action.name, p.resource.name) for p in found.permissions]
        )
        added, removed = role_diff(current, wanted)
        if dry_run:
            return RoleChanges(role, created, added, removed)
        target = sm.add_role(role) if found is None else found
        for p in added:
            sm.add_permission_to_role(target, sm.create_permission(p.action, p.resource))
        for p in removed:
            sm.remove_permission_from_role(target, sm.get_permission(p.action, p.resource))
    return RoleChanges(role, created, added, removed)
