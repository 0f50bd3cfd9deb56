"""The neutral plan: graph algorithms, catalog checks, families, weights, shards. No Airflow objects."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from avsim.errors import ManifestError
from avsim.manifest.models import Manifest, RunClass
from avsim.plan.build import build_plan
from avsim.plan.catalog import load_catalog, parse_catalog, shape_fingerprint
from avsim.plan.graph import CycleError, find_cycle, remaining_path, topological_order
from avsim.plan.shards import ShardPlan, assign_families, cut_shards
from avsim.settings import AvsimSettings

ROOT = Path(__file__).resolve().parents[3]
CATALOG = ROOT / "dags" / "avsim_graphs.yaml"


def test_topological_order_and_cycle() -> None:
    deps = {
        "report": ["evaluate", "render"],
        "prepare": [],
        "simulate": ["prepare"],
        "evaluate": ["simulate"],
        "render": ["simulate"],
    }
    order = topological_order(deps)
    for name, ups in deps.items():
        assert all(order.index(u) < order.index(name) for u in ups)
    cyc = {"a": ["c"], "b": ["a"], "c": ["b"]}
    cycle = find_cycle(cyc)
    assert cycle is not None and cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"}
    with pytest.raises(CycleError) as exc:
        topological_order(cyc)
    assert " -> " in str(exc.value)


def test_remaining_path_is_the_heaviest_tail() -> None:
    deps = {"p": [], "s": ["p"], "e": ["s"], "r": ["s"], "rep": ["e", "r"]}
    w = {"p": 3, "s": 30, "e": 5, "r": 10, "rep": 1}
    rem = remaining_path(deps, w)
    assert rem["rep"] == 1
    assert rem["s"] == 30 + 10 + 1  # through render, the longer branch
    assert rem["p"] == 3 + 41


def test_deployed_catalog_builds_a_plan() -> None:
    plan = build_plan(load_catalog(CATALOG), AvsimSettings())
    assert len(plan.families) >= 3
    for fam in plan.families:
        names = fam.phase_names
        for ph in fam.phases:
            assert all(names.index(u) < names.index(ph.name) for u in ph.upstream)
            if ph.resource_class == "gpu":
                assert ph.pool == "avsim_gpu_spot" and ph.pool_slots == ph.gpus >= 1
            else:
                assert ph.pool == "avsim_cpu" and ph.pool_slots == 1
        # Depth-first: an earlier phase of a case outranks a later one of the same case.
        weights = [p.priority_weight for p in fam.phases]
        assert weights[0] == max(weights)
        assert fam.critical_path_seconds == fam.phases[0].remaining_critical_path_seconds
    assert {p.name for p in plan.pools} == {"avsim_gpu_spot", "avsim_gpu_on_demand", "avsim_cpu"}


def test_weekly_weights_stay_above_adhoc() -> None:
    from avsim.plan.priority_rule import ADHOC_BASE, WEEKLY_BASE, path_weight, phase_priority

    # A week-long remaining path still leaves a weekly phase above any ad-hoc one.
    assert phase_priority(RunClass.ADHOC, 7 * 24 * 3600) < phase_priority(RunClass.WEEKLY, 1)
    weekly = build_plan(load_catalog(CATALOG), AvsimSettings())
    adhoc = build_plan(load_catalog(CATALOG), AvsimSettings(), RunClass.ADHOC)
    assert weekly.run_class is RunClass.WEEKLY and adhoc.run_class is RunClass.ADHOC
    for fam, other in zip(weekly.families, adhoc.families, strict=True):
        for ph, twin in zip(fam.phases, other.phases, strict=True):
            assert ph.path_weight == twin.path_weight == path_weight(ph.remaining_critical_path_seconds)
            assert ph.priority_weight == WEEKLY_BASE + ph.path_weight
            assert twin.priority_weight == ADHOC_BASE + ph.path_weight


def test_run_phases_take_their_retry_arguments_from_the_catalog(tmp_path: Path) -> None:
    doc = yaml.safe_load(CATALOG.read_text())
    name = next(iter(doc["run_phases"]))
    doc["run_phases"][name]["retry"] = {
        "infrastructure": 1,
        "preemption": 2,
        "delay_seconds": 7,
        "backoff": 3.0,
        "max_delay_seconds": 900,
    }
    path = tmp_path / "graphs.yaml"
    path.write_text(yaml.safe_dump(doc))
    rp = build_plan(load_catalog(path), AvsimSettings()).run_phases[0]
    assert (rp.name, rp.retries, rp.retry_delay_seconds) == (name, 3, 7)
    assert (rp.retry_backoff, rp.max_retry_delay_seconds) == (3.0, 900)
    assert rp.path_weight == 1 and rp.gpus == doc["run_phases"][name]["resources"].get("gpus", 0)


def test_catalog_errors_name_the_field(tmp_path: Path) -> None:
    doc = yaml.safe_load(CATALOG.read_text())
    first = next(iter(doc["graphs"]))
    phases = doc["graphs"][first]["phases"]
    names = list(phases)
    phases[names[0]]["depends_on"] = [names[-1]]  # closes a cycle
    phases[names[1]]["depends_on"] = [*phases[names[1]].get("depends_on", []), "nope"]
    with pytest.raises(ManifestError) as exc:
        parse_catalog(doc, "test")
    text = str(exc.value)
    n = len(phases[names[1]]["depends_on"]) - 1
    assert f"graphs.{first}.phases.{names[1]}.depends_on[{n}]: unknown phase 'nope'" in text
    assert "cycle" in text
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ManifestError, match="file not found"):
        load_catalog(missing)


def _manifest(cases: int) -> Manifest:
    from avsim.manifest.sample import sample_manifest
    from avsim.manifest.validation import validate_manifest

    return validate_manifest(sample_manifest(cases))


def test_sample_graphs_match_the_deployed_catalog() -> None:
    """The sample manifest (the demo's) and the deployed catalog describe the same shapes."""
    catalog = load_catalog(CATALOG)
    m = _manifest(5)
    assert set(m.graphs) == set(catalog.graphs)
    for name, graph in m.graphs.items():
        assert shape_fingerprint(graph.phases) == shape_fingerprint(catalog.graphs[name].phases)


def test_assign_families_and_cut_shards() -> None:
    plan = build_plan(load_catalog(CATALOG), AvsimSettings(shard_size=40))
    m = _manifest(130)
    fams = assign_families(m, plan)
    assert len(fams) == 130 and set(fams) <= set(plan.family_names)
    canary, shards = cut_shards(m, fams, plan.shard_size)
    assert canary is None and [s.case_count for s in shards] == [40, 40, 40, 10]
    assert [s.index for s in shards] == [1, 2, 3, 4]
    ids = [c["case_id"] for s in shards for entries in s.by_family.values() for c in entries]
    assert sorted(ids) == sorted(c.id for c in m.cases)
    canary, rest = cut_shards(m, fams, plan.shard_size, canary=[0, 5, 129])
    assert canary is not None and canary.index == 0 and canary.case_count == 3
    assert [s.case_count for s in rest] == [40, 40, 40, 7]
    ids = [c["case_id"] for s in [canary, *rest] for entries in s.by_family.values() for c in entries]
    assert sorted(ids) == sorted(c.id for c in m.cases)
    again = ShardPlan.from_json(shards[1].to_json())
    assert again == shards[1]
    entry = shards[0].by_family[fams[0]][0]
    assert set(entry) >= {"case_id", "family", "seed", "scenario_uri", "scenario_version", "parameters"}


def test_manifest_with_a_graph_of_another_shape_is_rejected() -> None:
    from avsim.manifest.sample import sample_manifest
    from avsim.manifest.validation import validate_manifest

    plan = build_plan(load_catalog(CATALOG), AvsimSettings())
    doc = sample_manifest(3)
    gname = next(iter(doc["graphs"]))
    last = list(doc["graphs"][gname]["phases"])[-1]
    doc["graphs"][gname]["phases"][last]["retry"] = {"infrastructure": 9}
    with pytest.raises(ManifestError) as exc:
        assign_families(validate_manifest(doc), plan)
    assert f"graphs.{gname}: graph '{gname}' differs in shape" in str(exc.value)


def test_inline_case_phases_join_the_family_of_their_shape() -> None:
    from avsim.manifest.sample import sample_manifest
    from avsim.manifest.validation import validate_manifest

    plan = build_plan(load_catalog(CATALOG), AvsimSettings())
    doc = sample_manifest(3)
    case = doc["cases"][1]
    gname = case.pop("graph")
    case["phases"] = doc["graphs"][gname]["phases"]
    fams = assign_families(validate_manifest(doc), plan)
    assert fams[1] == gname
    # A shape nobody deployed is rejected with the case's path.
    doc["cases"][2].pop("graph")
    only = {
        "solo": {
            "resources": {"class": "cpu"},
            "estimated_duration_seconds": 1,
            "timeout_seconds": 5,
            "command": ["true"],
        }
    }
    doc["cases"][2]["phases"] = only
    with pytest.raises(ManifestError) as exc:
        assign_families(validate_manifest(doc), plan)
    assert "cases[2].phases: this phase graph (solo[cpu])" in str(exc.value)
