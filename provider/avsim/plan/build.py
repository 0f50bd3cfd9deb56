"""Catalog + settings -> :class:`WeeklyPlan`."""

from __future__ import annotations

from avsim.errors import ConfigError
from avsim.manifest.models import PhaseSpec, ResourceClass, RunClass
from avsim.plan.catalog import GraphCatalog, shape_fingerprint
from avsim.plan.graph import remaining_path, topological_order
from avsim.plan.model import ON_DEMAND_SUFFIX, FamilyPlan, PhasePlan, PoolPlan, RunPhasePlan, WeeklyPlan
from avsim.plan.priority_rule import path_weight, priority
from avsim.settings import AvsimSettings


def pools_for(settings: AvsimSettings) -> tuple[PoolPlan, ...]:
    return (
        PoolPlan(settings.gpu_spot_pool, "avsim GPU phases on spot nodes (slots = GPUs)", "gpu", "gpu-spot"),
        PoolPlan(
            settings.gpu_on_demand_pool,
            "avsim GPU phases on on-demand nodes (slots = GPUs)",
            "gpu",
            "gpu-on-demand",
        ),
        PoolPlan(settings.cpu_pool, "avsim CPU phases (one slot per phase)", "cpu", "cpu"),
    )


def queue_for(resource_class: ResourceClass, settings: AvsimSettings) -> str:
    """The executor queue of a phase of this resource class: GPU and CPU phases go to different
    Celery queues, so each runs on a machine of its kind ("" leaves the executor's default queue)."""
    return settings.gpu_queue if resource_class is ResourceClass.GPU else settings.cpu_queue


def _pool_and_slots(spec: PhaseSpec, settings: AvsimSettings) -> tuple[str, int]:
    if spec.resources.resource_class is ResourceClass.GPU:
        return settings.gpu_spot_pool, spec.resources.gpus
    return settings.cpu_pool, 1


def family_plan(
    name: str, phases: dict[str, PhaseSpec], settings: AvsimSettings, run_class: RunClass
) -> FamilyPlan:
    clash = sorted(n for n in phases if n.endswith(ON_DEMAND_SUFFIX))
    if clash:
        raise ConfigError(
            f"graph {name!r}: phase names {clash} end in {ON_DEMAND_SUFFIX!r}, which names the on-demand twin "
            "of a GPU phase's task; rename them"
        )
    deps = {n: list(p.depends_on) for n, p in phases.items()}
    order = topological_order(deps)
    remaining = remaining_path(deps, {n: p.estimated_duration_seconds for n, p in phases.items()})
    planned = []
    for pname in order:
        spec = phases[pname]
        pool, slots = _pool_and_slots(spec, settings)
        planned.append(
            PhasePlan(
                name=pname,
                upstream=tuple(spec.depends_on),
                resource_class=spec.resources.resource_class.value,
                pool=pool,
                pool_slots=slots,
                gpus=spec.resources.gpus,
                cpus=spec.resources.cpus,
                memory_bytes=spec.resources.memory_bytes,
                estimated_seconds=spec.estimated_duration_seconds,
                timeout_seconds=spec.timeout_seconds,
                retries=spec.retry.infrastructure,
                retry_delay_seconds=spec.retry.delay_seconds,
                retry_backoff=spec.retry.backoff,
                max_retry_delay_seconds=spec.retry.max_delay_seconds,
                checkpoint=spec.checkpoint,
                remaining_critical_path_seconds=remaining[pname],
                priority_weight=priority(run_class, path_weight(remaining[pname])),
                path_weight=path_weight(remaining[pname]),
                preemption_retries=spec.retry.preemption,
                preemption_delay_seconds=spec.retry.preemption_delay_seconds,
                on_demand_after_preemptions=spec.retry.on_demand_after_preemptions,
                on_demand_fallback=settings.on_demand_fallback and spec.can_fall_back_to_on_demand,
                on_demand_pool=settings.gpu_on_demand_pool,
                queue=queue_for(spec.resources.resource_class, settings),
            )
        )
    return FamilyPlan(
        name=name,
        group_id=name,
        phases=tuple(planned),
        fingerprint=shape_fingerprint(phases),
        critical_path_seconds=max(remaining.values()),
    )


def build_plan(
    catalog: GraphCatalog, settings: AvsimSettings, run_class: RunClass = RunClass.WEEKLY
) -> WeeklyPlan:
    families = tuple(
        family_plan(name, dict(graph.phases), settings, run_class) for name, graph in catalog.graphs.items()
    )
    rdeps = {n: list(p.depends_on) for n, p in catalog.run_phases.items()}
    run_phases = []
    for rname in topological_order(rdeps):
        spec = catalog.run_phases[rname]
        pool = (
            settings.gpu_spot_pool
            if spec.resources.resource_class is ResourceClass.GPU
            else settings.cpu_pool
        )
        run_phases.append(
            RunPhasePlan(
                name=rname,
                upstream=tuple(spec.depends_on),
                pool=pool,
                pool_slots=max(1, spec.resources.gpus),
                gpus=spec.resources.gpus,
                timeout_seconds=spec.timeout_seconds,
                retries=spec.retry.infrastructure + spec.retry.preemption,
                retry_delay_seconds=spec.retry.delay_seconds,
                retry_backoff=spec.retry.backoff,
                max_retry_delay_seconds=spec.retry.max_delay_seconds,
                queue=queue_for(spec.resources.resource_class, settings),
            )
        )
    return WeeklyPlan(
        families=families,
        run_phases=tuple(run_phases),
        pools=pools_for(settings),
        shard_size=settings.shard_size,
        max_active_shards=settings.max_active_shards,
        run_class=run_class,
    )
