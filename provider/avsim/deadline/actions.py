"""What the deadline tracker does when the run will be late: more GPU slots, more GPU nodes.

Both only raise capacity, never above their bounds, and each is off unless configured
(``[avsim] deadline_*``): the GPU pools' slots through Airflow's REST API
(:class:`avsim.hooks.airflow_api.AirflowApiHook`) and the EKS managed node group's desired size
through the amazon provider's ``EksHook``. docs/design.md, "The deadline" (*The actions*).
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from typing import Any

from avsim.hooks.airflow_api import AirflowApiError, AirflowApiHook

log = logging.getLogger(__name__)


class ScalingError(AirflowApiError):
    """A scaling action could not be carried out."""


@dataclass(frozen=True)
class ScalingPolicy:
    """Where and how far the tracker may scale. JSON-able (``asdict``) for the sensor's arguments."""

    api_conn_id: str = ""
    gpu_pool: str = "avsim_gpu_spot"
    on_demand_pool: str = "avsim_gpu_on_demand"
    max_gpu_slots: int = 0
    aws_conn_id: str = "aws_default"
    eks_cluster: str = ""
    eks_nodegroup: str = ""
    eks_max_nodes: int = 0
    gpus_per_node: int = 1

    @property
    def pool_enabled(self) -> bool:
        return bool(self.api_conn_id) and self.max_gpu_slots > 0

    @property
    def eks_enabled(self) -> bool:
        return bool(self.eks_cluster and self.eks_nodegroup) and self.eks_max_nodes > 0

    @property
    def enabled(self) -> bool:
        return self.pool_enabled or self.eks_enabled

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ActionResult:
    """One action: what it changed (``raised``), or why it did not (``unchanged``, ``failed``)."""

    action: str
    target: str
    outcome: str
    before: int | None
    after: int | None
    detail: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def spot_gpus_wanted(gpus_needed: int, on_demand_gpus: int) -> int:
    """GPUs the spot pool (and its node group) must hold: what the on-demand pool does not cover."""
    return max(0, gpus_needed - max(0, on_demand_gpus))


def raise_gpu_pool(client: AirflowApiHook, policy: ScalingPolicy, gpus_needed: int) -> ActionResult:
    """Raise the GPU spot pool's slots toward the GPUs needed, at most to ``max_gpu_slots``."""
    before = client.pool_slots(policy.gpu_pool)
    if before is None:
        raise ScalingError(f"there is no pool {policy.gpu_pool!r}; create it with 'avsim pools sync'")
    on_demand = client.pool_slots(policy.on_demand_pool) or 0
    target = min(policy.max_gpu_slots, spot_gpus_wanted(gpus_needed, on_demand))
    if target <= before:
        why = (
            f"the bound max_gpu_slots={policy.max_gpu_slots} is reached"
            if spot_gpus_wanted(gpus_needed, on_demand) > before
            else f"{before} slots already cover the {gpus_needed} GPUs needed ({on_demand} on demand)"
        )
        return ActionResult("pool_slots", policy.gpu_pool, "unchanged", before, before, why)
    after = client.set_pool_slots(policy.gpu_pool, target)
    capped = " (capped by max_gpu_slots)" if target < spot_gpus_wanted(gpus_needed, on_demand) else ""
    return ActionResult(
        "pool_slots",
        policy.gpu_pool,
        "raised",
        before,
        after,
        f"{gpus_needed} GPUs needed, {on_demand} on demand: spot pool {before} -> {after}{capped}",
    )


def scale_node_group(
    policy: ScalingPolicy, gpus_needed: int, *, on_demand_gpus: int = 0, hook: Any = None
) -> ActionResult:
    """Raise the EKS managed node group's desired size toward the GPUs needed, at most to ``eks_max_nodes``."""
    if hook is None:
        from airflow.providers.amazon.aws.hooks.eks import EksHook

        hook = EksHook(aws_conn_id=policy.aws_conn_id)
    target_name = f"{policy.eks_cluster}/{policy.eks_nodegroup}"
    group = hook.conn.describe_nodegroup(clusterName=policy.eks_cluster, nodegroupName=policy.eks_nodegroup)
    scaling = group["nodegroup"].get("scalingConfig") or {}
    before = int(scaling.get("desiredSize", 0))
    wanted = math.ceil(spot_gpus_wanted(gpus_needed, on_demand_gpus) / max(1, policy.gpus_per_node))
    target = min(policy.eks_max_nodes, wanted)
    if target <= before:
        why = (
            f"the bound eks_max_nodes={policy.eks_max_nodes} is reached"
            if wanted > before
            else f"{before} nodes already cover the {gpus_needed} GPUs needed"
        )
        return ActionResult("node_group", target_name, "unchanged", before, before, why)
    update: dict[str, int] = {"desiredSize": target}
    if target > int(scaling.get("maxSize", target)):
        update["maxSize"] = target
    hook.conn.update_nodegroup_config(
        clusterName=policy.eks_cluster, nodegroupName=policy.eks_nodegroup, scalingConfig=update
    )
    capped = " (capped by eks_max_nodes)" if target < wanted else ""
    return ActionResult(
        "node_group",
        target_name,
        "raised",
        before,
        target,
        f"{gpus_needed} GPUs needed at {policy.gpus_per_node} per node: desired size {before} -> {target}{capped}",
    )


def act(
    policy: ScalingPolicy, gpus_needed: int, *, api: AirflowApiHook | None = None, eks_hook: Any = None
) -> list[ActionResult]:
    """Run the configured actions; a failing action is reported (``failed``), the others still run."""
    results: list[ActionResult] = []
    on_demand = 0
    if policy.pool_enabled:
        client = api or AirflowApiHook(policy.api_conn_id)
        try:
            on_demand = client.pool_slots(policy.on_demand_pool) or 0
            results.append(raise_gpu_pool(client, policy, gpus_needed))
        except Exception as exc:
            results.append(
                ActionResult(
                    "pool_slots", policy.gpu_pool, "failed", None, None, f"{type(exc).__name__}: {exc}"
                )
            )
    if policy.eks_enabled:
        try:
            results.append(scale_node_group(policy, gpus_needed, on_demand_gpus=on_demand, hook=eks_hook))
        except Exception as exc:
            results.append(
                ActionResult(
                    "node_group",
                    f"{policy.eks_cluster}/{policy.eks_nodegroup}",
                    "failed",
                    None,
                    None,
                    f"{type(exc).__name__}: {exc}",
                )
            )
    for r in results:
        (log.warning if r.outcome == "failed" else log.info)(
            "deadline action %s %s: %s (%s)", r.action, r.target, r.outcome, r.detail
        )
    return results
