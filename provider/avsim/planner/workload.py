"""What the planner simulates: the cases of a week, each a small graph of phases, as plain data.

Built from a validated manifest (:func:`workload_from_manifest`), or derived from another
workload by dropping the phases already finished (:meth:`Workload.remaining`), which is how a
tracker re-estimates a run in flight. Nothing here imports Airflow.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from avsim.manifest.models import Manifest, PhaseSpec, ResourceClass, RetrySpec, RunClass, RunPhaseSpec
from avsim.plan.catalog import shape_fingerprint
from avsim.plan.graph import remaining_path, topological_order
from avsim.plan.inflight import CaseLoad, PhaseLoad


@dataclass(frozen=True)
class PhaseWork:
    """One phase of a case (one task instance of the shard DAG), as the planner sees it."""

    name: str
    upstream: tuple[str, ...]
    #: GPUs the phase holds (its pool slots in the GPU pools); 0 for a CPU phase (one CPU slot).
    gpus: int
    seconds: float
    checkpoint: bool = False
    retry: RetrySpec = field(default_factory=RetrySpec)
    #: Seconds from this phase's start to the end of its case along the heaviest path of the
    #: graph that shapes its tasks (what the critical-path priority is computed from).
    path_seconds: float = 0.0
    #: Tasks downstream of it in its DAG (what Airflow's default ``downstream`` rule counts).
    downstream_tasks: int = 0
    #: Its task has an on-demand twin after it (a GPU phase with a preemption budget).
    twin: bool = False

    @property
    def is_gpu(self) -> bool:
        return self.gpus > 0

    @property
    def tasks(self) -> int:
        """Its task instances in a shard run: the phase's task, and its on-demand twin if it has one."""
        return 2 if self.twin else 1


@dataclass(frozen=True)
class CaseWork:
    case_id: str
    family: str
    #: In a topological order.
    phases: tuple[PhaseWork, ...]
    #: The shard run it belongs to; ``None``: cut by the simulation's shard size, in case order.
    shard: int | None = None


@dataclass(frozen=True)
class Workload:
    cases: tuple[CaseWork, ...]
    #: Run-level phases (the weekly summary): after every shard, in a topological order.
    run_phases: tuple[PhaseWork, ...] = ()
    run_class: RunClass = RunClass.WEEKLY
    #: The run's deadline (from the manifest), if known.
    deadline: dt.datetime | None = None
    iso_week: str | None = None
    #: case id -> names of phases already finished (kept so :meth:`remaining` composes).
    finished: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @property
    def gpu_seconds(self) -> float:
        return sum(p.seconds * p.gpus for c in self.cases for p in c.phases) + sum(
            p.seconds * p.gpus for p in self.run_phases
        )

    @property
    def cpu_seconds(self) -> float:
        return sum(p.seconds for c in self.cases for p in c.phases if not p.is_gpu) + sum(
            p.seconds for p in self.run_phases if not p.is_gpu
        )

    def scaled(self, factor: float) -> Workload:
        """The same run with every phase's duration times ``factor`` (the fake phases' time scale:
        a demo or bench week works ``estimate x factor`` seconds). Priorities are unchanged: they
        come from the graphs' estimates, as the deployed weights do."""
        if factor <= 0:
            raise ValueError(f"time scale {factor}: use a positive factor")
        memo: dict[int, tuple[PhaseWork, ...]] = {}

        def scale(phases: tuple[PhaseWork, ...]) -> tuple[PhaseWork, ...]:
            found = memo.get(id(phases))
            if found is None:  # one scaled tuple per shared graph, as the simulation templates them
                found = memo[id(phases)] = tuple(replace(p, seconds=p.seconds * factor) for p in phases)
            return found

        return replace(
            self,
            cases=tuple(replace(c, phases=scale(c.phases)) for c in self.cases),
            run_phases=scale(self.run_phases),
        )

    def window_task_instances(self, shard_size: int, max_active_shards: int) -> int:
        """The most phase task instances ``max_active_shards`` consecutive shard runs hold (a GPU
        phase with a preemption budget is two tasks, its spot task and its on-demand twin).

        Airflow 3.3 re-evaluates the dependencies of every unfinished task instance of every active
        run in each scheduler loop, so the loop carries at most this many, whatever the week's size
        (docs/design.md, "Choosing S and W")."""
        per_shard: dict[int, int] = {}
        for index, case in enumerate(self.cases):
            shard = case.shard if case.shard is not None else index // shard_size
            per_shard[shard] = per_shard.get(shard, 0) + sum(p.tasks for p in case.phases)
        counts = [per_shard[k] for k in sorted(per_shard)]
        width = max(1, max_active_shards)
        return max((sum(counts[i : i + width]) for i in range(max(1, len(counts) - width + 1))), default=0)

    def case_load(
        self, phase_overhead_seconds: float = 0.0, held_overhead_seconds: float | None = None
    ) -> CaseLoad:
        """The mean case, as :mod:`avsim.plan.inflight` sizes the cases in flight from it."""
        memo: dict[int, tuple[PhaseLoad, ...]] = {}

        def loads(phases: tuple[PhaseWork, ...]) -> tuple[PhaseLoad, ...]:
            found = memo.get(id(phases))
            if found is None:  # one tuple per shared graph, so the path is computed once per graph
                found = memo[id(phases)] = tuple(
                    PhaseLoad(p.name, p.upstream, p.gpus, p.seconds, p.twin) for p in phases
                )
            return found

        return CaseLoad.of_cases(
            (loads(c.phases) for c in self.cases),
            phase_overhead_seconds=phase_overhead_seconds,
            held_overhead_seconds=held_overhead_seconds,
        )

    def remaining(self, finished: Iterable[tuple[str, str]], shard_size: int) -> Workload:
        """The work left once the ``(case id, phase)`` pairs in ``finished`` are done.

        Finished phases are dropped (and their edges with them), a case with nothing left is
        dropped, and every case keeps the shard run it is in (cut by ``shard_size`` in case order
        unless already pinned), so a simulation resumes the same shard runs in the same order.
        Phases in progress count whole (their elapsed time is not known here)."""
        done: dict[str, set[str]] = {k: set(v) for k, v in self.finished.items()}
        for case_id, phase in finished:
            done.setdefault(case_id, set()).add(phase)
        cases = []
        for index, case in enumerate(self.cases):
            shard = case.shard if case.shard is not None else index // shard_size
            gone = done.get(case.case_id, set())
            left = tuple(
                replace(p, upstream=tuple(u for u in p.upstream if u not in gone))
                for p in case.phases
                if p.name not in gone
            )
            if left:
                cases.append(replace(case, phases=left, shard=shard))
        return replace(self, cases=tuple(cases), finished={k: frozenset(v) for k, v in done.items()})


def _downstream_counts(deps: Mapping[str, Sequence[str]], twins: Iterable[str] = ()) -> dict[str, int]:
    """Per phase, how many tasks are downstream of it in a shard DAG: its descendants' tasks (two
    for a GPU phase with an on-demand twin, ``<phase>_on_demand``, which follows its spot task),
    its own twin, and ``summarize``, which every phase of a shard run is upstream of."""
    tasks = {n: 1 for n in deps}
    for n in twins:
        tasks[n] = 2
    children: dict[str, list[str]] = {n: [] for n in deps}
    for name, ups in deps.items():
        for up in ups:
            children[up].append(name)
    below: dict[str, set[str]] = {}
    for name in reversed(topological_order(deps)):
        seen: set[str] = set()
        for child in children[name]:
            seen.add(child)
            seen |= below[child]
        below[name] = seen
    own_twin = {n: tasks[n] - 1 for n in deps}
    summarize = 1
    return {n: sum(tasks[d] for d in below[n]) + own_twin[n] + summarize for n in deps}


def phase_works(
    phases: Mapping[str, PhaseSpec] | Mapping[str, RunPhaseSpec],
    shape: Mapping[str, PhaseSpec] | None = None,
) -> tuple[PhaseWork, ...]:
    """The phases of one graph. Durations and checkpointing come from ``phases``; the priority
    inputs (path, downstream count) from ``shape``, the graph that shapes the tasks (default:
    the same graph)."""
    deps = {n: list(p.depends_on) for n, p in phases.items()}
    shaping: Mapping[str, PhaseSpec | RunPhaseSpec] = shape if shape is not None else phases
    paths = remaining_path(
        {n: list(p.depends_on) for n, p in shaping.items()},
        {n: p.estimated_duration_seconds for n, p in shaping.items()},
    )
    # The DAG builder gives a GPU phase with a preemption budget an on-demand twin task.
    twins = [n for n, p in phases.items() if p.can_fall_back_to_on_demand]
    below = _downstream_counts(deps, twins)
    out = []
    for name in topological_order(deps):
        spec = phases[name]
        gpu = spec.resources.resource_class is ResourceClass.GPU
        out.append(
            PhaseWork(
                name=name,
                upstream=tuple(spec.depends_on),
                gpus=max(1, spec.resources.gpus) if gpu else 0,
                seconds=float(spec.estimated_duration_seconds),
                checkpoint=bool(getattr(spec, "checkpoint", False)),
                retry=spec.retry,
                path_seconds=float(paths.get(name, spec.estimated_duration_seconds)),
                downstream_tasks=below[name],
                twin=spec.can_fall_back_to_on_demand,
            )
        )
    return tuple(out)


def workload_from_manifest(manifest: Manifest) -> Workload:
    """Every case of the manifest with the phases of its graph (or its own phases), in manifest
    order. A case with its own phases is weighted like the manifest graph of the same shape, the
    way it runs in that graph's task group; its durations stay its own."""
    by_graph = {name: phase_works(g.phases) for name, g in manifest.graphs.items()}
    by_shape = {shape_fingerprint(g.phases): name for name, g in manifest.graphs.items()}
    cases = []
    for case in manifest.cases:
        if case.graph is not None:
            cases.append(CaseWork(case.id, case.graph, by_graph[case.graph]))
            continue
        assert case.phases is not None
        family = by_shape.get(shape_fingerprint(case.phases))
        shape = manifest.graphs[family].phases if family else None
        cases.append(CaseWork(case.id, family or f"own:{case.id}", phase_works(case.phases, shape)))
    run_phases = tuple(replace(p, downstream_tasks=0) for p in phase_works(manifest.run_phases))
    return Workload(
        cases=tuple(cases),
        run_phases=run_phases,
        run_class=manifest.run.run_class,
        deadline=manifest.run.deadline,
        iso_week=manifest.run.iso_week,
    )


def week_start(iso_week: str) -> dt.datetime:
    """When the scheduled weekly run of an ISO week starts: its Monday, 06:00 UTC (the weekly
    DAG's schedule, ``avsim.dagbuild.weekly.WEEKLY_SCHEDULE``)."""
    year, week = int(iso_week[:4]), int(iso_week[6:])
    return dt.datetime.combine(dt.date.fromisocalendar(year, week, 1), dt.time(6, 0), tzinfo=dt.UTC)
