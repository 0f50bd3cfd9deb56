"""Run time: a validated manifest against the deployed plan -> families per case -> shards.

A week is cut into shards of at most ``shard_size`` cases; each shard becomes one
shard DAG run holding one mapped task group per graph family. Everything here is
plain data so the parent run can write it to the artifact store and each shard run
can read just its own part.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from avsim.contracts.case import CaseEntry
from avsim.errors import ManifestError, Problem
from avsim.manifest.models import CaseSpec, Manifest
from avsim.plan.catalog import describe_shape, shape_fingerprint
from avsim.plan.model import WeeklyPlan


@dataclass(frozen=True)
class ShardPlan:
    index: int
    #: family name -> case entries (JSON-friendly dicts), in manifest order.
    by_family: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def case_count(self) -> int:
        return sum(len(v) for v in self.by_family.values())

    def to_json(self) -> dict[str, Any]:
        return {"shard": self.index, "by_family": self.by_family}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShardPlan:
        return cls(index=int(data["shard"]), by_family={k: list(v) for k, v in data["by_family"].items()})


def assign_families(manifest: Manifest, plan: WeeklyPlan) -> list[str]:
    """The deployed family each case runs in. Every mismatch is collected into one ManifestError."""
    by_fp = {f.fingerprint: f.name for f in plan.families}
    deployed = {f.name: f for f in plan.families}
    known = ", ".join(plan.family_names)
    problems: list[Problem] = []
    graph_ok: dict[str, bool] = {}
    for gname, graph in manifest.graphs.items():
        fam = deployed.get(gname)
        if fam is None:
            problems.append(
                Problem(
                    f"graphs.{gname}",
                    f"graph {gname!r} is not deployed in the weekly DAG (deployed: {known}); "
                    "add it to the graph catalog and redeploy, or use a deployed graph",
                )
            )
            graph_ok[gname] = False
        elif shape_fingerprint(graph.phases) != fam.fingerprint:
            problems.append(
                Problem(
                    f"graphs.{gname}",
                    f"graph {gname!r} differs in shape from the deployed one "
                    f"(manifest: {describe_shape(graph.phases)}); phases, depends_on, resource class, "
                    "gpus and retries must match the catalog; change them there and redeploy",
                )
            )
            graph_ok[gname] = False
        else:
            graph_ok[gname] = True
    families: list[str] = []
    for i, case in enumerate(manifest.cases):
        if case.graph is not None:
            # Unknown-to-the-manifest graphs are reported by manifest validation; here only
            # whether the graph is deployed matters (a shape mismatch is reported above once).
            if case.graph not in deployed and graph_ok.get(case.graph, True):
                problems.append(
                    Problem(f"cases[{i}].graph", f"graph {case.graph!r} is not deployed (deployed: {known})")
                )
            families.append(case.graph if case.graph in deployed else "")
            continue
        assert case.phases is not None
        fam_name = by_fp.get(shape_fingerprint(case.phases))
        if fam_name is None:
            problems.append(
                Problem(
                    f"cases[{i}].phases",
                    f"this phase graph ({describe_shape(case.phases)}) has the shape of no deployed graph "
                    f"({known}); name a deployed graph in graph:, or add this graph to the catalog",
                )
            )
            families.append("")
        else:
            families.append(fam_name)
    if problems:
        raise ManifestError(problems, source="manifest (checked against the deployed DAG)")
    return families


def case_entry(case: CaseSpec, family: str) -> dict[str, Any]:
    """What a mapped group receives for one case: a :class:`avsim.contracts.case.CaseEntry` as JSON."""
    return CaseEntry(
        case_id=case.id,
        family=family,
        graph=case.graph or family,
        seed=case.seed,
        scenario_uri=case.scenario.uri,
        scenario_version=case.scenario.version,
        parameters=case.parameters,
        tags=tuple(case.tags),
        phases=(
            {n: p.model_dump(mode="json", by_alias=True) for n, p in case.phases.items()}
            if case.phases is not None
            else None
        ),
    ).to_json()


#: The canary's shard index; the week's other shards are numbered from 1.
CANARY_SHARD = 0


def cut_shards(
    manifest: Manifest, families: list[str], shard_size: int, canary: list[int] | None = None
) -> tuple[ShardPlan | None, list[ShardPlan]]:
    """The canary shard (the cases at indexes ``canary``, or None) and the week's other cases in
    consecutive shards of at most ``shard_size`` cases, in manifest order, numbered from 1."""
    picked = set(canary or ())
    canary_shard = None
    if picked:
        by_family: dict[str, list[dict[str, Any]]] = {}
        for i in sorted(picked):
            by_family.setdefault(families[i], []).append(case_entry(manifest.cases[i], families[i]))
        canary_shard = ShardPlan(index=CANARY_SHARD, by_family=by_family)
    rest = [i for i in range(len(manifest.cases)) if i not in picked]
    shards: list[ShardPlan] = []
    for n, start in enumerate(range(0, len(rest), shard_size), start=1):
        by_family = {}
        for i in rest[start : start + shard_size]:
            by_family.setdefault(families[i], []).append(case_entry(manifest.cases[i], families[i]))
        shards.append(ShardPlan(index=n, by_family=by_family))
    return canary_shard, shards


def planned_work(manifest: Manifest, families: list[str]) -> dict[str, Any]:
    """What the week plans to run: phase executions, GPU and CPU seconds, the longest case, per phase task."""
    from avsim.plan.graph import remaining_path

    gpu = cpu = 0.0
    phases = 0
    longest = 0.0
    per_phase: dict[str, dict[str, Any]] = {}
    paths: dict[str, float] = {}
    for case, fam in zip(manifest.cases, families, strict=True):
        specs = case.phases if case.phases is not None else manifest.graphs[case.graph or fam].phases
        memo = case.graph if case.phases is None else None
        if memo is None or memo not in paths:
            deps = {n: list(p.depends_on) for n, p in specs.items()}
            path = max(
                remaining_path(deps, {n: p.estimated_duration_seconds for n, p in specs.items()}).values()
            )
            if memo is not None:
                paths[memo] = path
        else:
            path = paths[memo]
        longest = max(longest, path)
        for name, p in specs.items():
            phases += 1
            gpus = p.resources.gpus
            if gpus:
                gpu += gpus * p.estimated_duration_seconds
            else:
                cpu += p.resources.cpus * p.estimated_duration_seconds
            entry = per_phase.setdefault(
                f"{fam}.{name}", {"cases": 0, "gpus": gpus, "estimated_seconds": 0.0}
            )
            entry["cases"] += 1
            entry["estimated_seconds"] = p.estimated_duration_seconds
    return {
        "cases": len(manifest.cases),
        "phases": phases,
        "gpu_seconds": gpu,
        "cpu_seconds": cpu,
        "critical_path_seconds": longest,
        "deadline": manifest.run.deadline.isoformat(),
        "per_phase": per_phase,
    }
