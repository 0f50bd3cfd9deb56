"""validate_manifest: every problem of a document, with its path and the fix."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from avsim.errors import ManifestError, Problem
from avsim.manifest.models import Manifest
from avsim.manifest.sample import sample_manifest
from avsim.manifest.validation import MAX_PROBLEMS, format_path, validate_manifest

BASE = sample_manifest(5, iso_week="2026-W49")


def doc() -> dict[str, Any]:
    return copy.deepcopy(BASE)


def problems(data: object) -> list[Problem]:
    with pytest.raises(ManifestError) as exc:
        validate_manifest(data, source="week.yaml")
    assert exc.value.source == "week.yaml"
    return list(exc.value.problems)


def by_path(data: object) -> dict[str, str]:
    return {p.path: p.message for p in problems(data)}


def phase(**kw: Any) -> dict[str, Any]:
    base = {
        "resources": {"class": "cpu"},
        "estimated_duration_seconds": 10,
        "timeout_seconds": 30,
        "command": ["avsim-fakesim"],
    }
    return {**base, **kw}


# ------------------------------------------------------------------------------------ valid input


def test_sample_is_valid() -> None:
    m = validate_manifest(doc())
    assert isinstance(m, Manifest)
    assert len(m.cases) == 5
    assert m.run.deadline.utcoffset() is not None


def test_sample_of_10000_cases_validates() -> None:
    # How long it takes is a bench's figure (docs/performance.md), never a test's assertion.
    m = validate_manifest(sample_manifest(10_000))
    assert len(m.cases) == 10_000 and len({c.id for c in m.cases}) == 10_000


# ----------------------------------------------------------------------------- one problem each


def test_unknown_graph_names_the_known_graphs() -> None:
    d = doc()
    d["cases"][3]["graph"] = "perception_v2"
    msg = by_path(d)["cases[3].graph"]
    assert msg.startswith("unknown graph 'perception_v2' (known: standard, with_render, perception)")
    assert "did you mean 'perception'?" in msg


def test_unknown_graph_message_is_built_once_for_many_cases() -> None:
    d = doc()
    for case in d["cases"]:
        case["graph"] = "nope"
    found = problems(d)
    assert [p.path for p in found] == [f"cases[{i}].graph" for i in range(5)]
    assert len({p.message for p in found}) == 1


def test_cycle_is_reported_in_run_order() -> None:
    d = doc()
    d["graphs"]["standard"]["phases"]["prepare"]["depends_on"] = ["report"]
    msg = by_path(d)["graphs.standard.phases"]
    assert "cycle: prepare -> simulate -> evaluate -> report -> prepare" in msg
    assert "removing one of these depends_on" in msg


def test_two_separate_cycles_in_one_graph_are_both_reported() -> None:
    d = doc()
    d["graphs"]["g"] = {
        "phases": {
            "a": phase(depends_on=["b"]),
            "b": phase(depends_on=["a"]),
            "c": phase(depends_on=["d"]),
            "d": phase(depends_on=["c"]),
        }
    }
    msgs = [p.message for p in problems(d) if p.path == "graphs.g.phases"]
    assert len(msgs) == 2
    assert "a -> b -> a" in msgs[0] and "c -> d -> c" in msgs[1]


def test_self_dependency_and_unknown_dependency() -> None:
    d = doc()
    phases = d["graphs"]["with_render"]["phases"]
    phases["render"]["depends_on"] = ["render"]
    phases["report"]["depends_on"] = ["evaluate", "rendr"]
    got = by_path(d)
    assert got["graphs.with_render.phases.render.depends_on[0]"] == (
        "phase 'render' depends on itself; remove it from depends_on"
    )
    assert got["graphs.with_render.phases.report.depends_on[1]"] == (
        "unknown phase 'rendr' (known: prepare, simulate, evaluate, render, report); did you mean 'render'?"
    )


def test_inline_case_phases_and_run_phases_are_checked() -> None:
    d = doc()
    case = d["cases"][2]
    del case["graph"]
    case["phases"] = {"solo": phase(depends_on=["missing"])}
    d["run_phases"]["weekly_summary"]["depends_on"] = ["nothing"]
    got = by_path(d)
    assert got["cases[2].phases.solo.depends_on[0]"].startswith("unknown phase 'missing' (known: solo)")
    assert got["run_phases.weekly_summary.depends_on[0]"].startswith(
        "unknown run phase 'nothing' (known: weekly_summary)"
    )


def test_duplicate_case_id_names_both_indexes() -> None:
    d = doc()
    d["cases"][4]["id"] = d["cases"][1]["id"]
    assert by_path(d) == {
        "cases[4].id": "duplicate case id 'case-00002' (also cases[1]); give each case a unique id"
    }


def test_image_not_pinned_by_digest() -> None:
    d = doc()
    d["run"]["build"]["image"] = "registry.example.com/avsim/simulator:latest"
    msg = by_path(d)["run.build.image"]
    assert "is not pinned by digest" in msg and "@sha256:<64 hex digits>" in msg


@pytest.mark.parametrize(
    ("seed", "expected"),
    [
        ("12", "seed must be an integer, got str '12'"),
        (True, "seed must be an integer, got bool True"),
        (12.0, "seed must be an integer, got float 12.0"),
    ],
)
def test_seed_must_be_a_real_integer(seed: object, expected: str) -> None:
    d = doc()
    d["cases"][1]["seed"] = seed
    assert by_path(d) == {"cases[1].seed": expected}


def test_missing_field() -> None:
    d = doc()
    del d["run"]["build"]["image"]
    assert by_path(d) == {"run.build.image": "required field missing; add it"}


def test_extra_field_lists_the_allowed_fields_with_aliases() -> None:
    d = doc()
    d["graphs"]["standard"]["phases"]["simulate"]["resources"]["klass"] = "gpu"
    d["graphs"]["standard"]["phases"]["simulate"]["timout_seconds"] = 10
    got = by_path(d)
    assert got["graphs.standard.phases.simulate.resources.klass"] == (
        "unknown field 'klass'; remove it (allowed: class, gpus, cpus, memory); did you mean 'class'?"
    )
    msg = got["graphs.standard.phases.simulate.timout_seconds"]
    assert msg.startswith("unknown field 'timout_seconds'; remove it (allowed: depends_on, resources,")
    assert msg.endswith("did you mean 'timeout_seconds'?")


def test_extra_top_level_field_names_the_alias() -> None:
    d = doc()
    d["api_version"] = "avsim/v1"
    assert "allowed: apiVersion, run, graphs, cases, run_phases" in by_path(d)["api_version"]


def test_wrong_types() -> None:
    d = doc()
    d["cases"][0]["scenario"]["version"] = 3
    d["cases"][0]["tags"] = "smoke"
    d["graphs"]["standard"]["phases"]["evaluate"]["estimated_duration_seconds"] = "five minutes"
    d["cases"][1] = "case-00002"
    got = by_path(d)
    assert got["cases[0].scenario.version"] == "version must be a string, got int 3; quote it: '3'"
    assert got["cases[0].tags"] == "tags must be a list, got str 'smoke'; write it as a list: [smoke]"
    assert got["graphs.standard.phases.evaluate.estimated_duration_seconds"] == (
        "estimated_duration_seconds must be a number, got str 'five minutes'"
    )
    assert got["cases[1]"] == "cases[1] must be a mapping, got str 'case-00002'"


def test_timeout_below_estimate_points_at_the_timeout() -> None:
    d = doc()
    d["graphs"]["perception"]["phases"]["perceive"]["timeout_seconds"] = 60
    d["run_phases"]["weekly_summary"]["timeout_seconds"] = 1
    got = by_path(d)
    assert got["graphs.perception.phases.perceive.timeout_seconds"] == (
        "timeout_seconds (60) is below estimated_duration_seconds (1200); raise the timeout"
    )
    assert "raise the timeout" in got["run_phases.weekly_summary.timeout_seconds"]


def test_cpu_phase_with_gpus_and_gpu_phase_without() -> None:
    d = doc()
    d["graphs"]["standard"]["phases"]["evaluate"]["resources"]["gpus"] = 2
    del d["graphs"]["standard"]["phases"]["simulate"]["resources"]["gpus"]
    got = by_path(d)
    assert got["graphs.standard.phases.evaluate.resources.gpus"] == (
        "a cpu phase cannot take gpus (2); set gpus: 0 or use class: gpu"
    )
    assert got["graphs.standard.phases.simulate.resources.gpus"] == (
        "a gpu phase needs gpus >= 1; set gpus or use class: cpu"
    )


@pytest.mark.parametrize(
    ("week", "expected"),
    [
        ("2026-49", "iso_week '2026-49' is not an ISO week; write it like '2026-W49'"),
        ("2026-W54", "iso_week '2026-W54': 2026 has no week 54"),
    ],
)
def test_bad_iso_week(week: str, expected: str) -> None:
    d = doc()
    d["run"]["iso_week"] = week
    assert by_path(d) == {"run.iso_week": expected}


def test_naive_deadline() -> None:
    d = doc()
    d["run"]["deadline"] = "2026-12-06T18:00:00"
    assert by_path(d) == {"run.deadline": "deadline has no time zone; add one, e.g. '2026-12-06T18:00:00Z'"}


def test_case_with_both_or_neither_graph_and_phases() -> None:
    d = doc()
    d["cases"][0]["phases"] = {"solo": phase()}
    del d["cases"][1]["graph"]
    got = by_path(d)
    assert "not both; remove one" in got["cases[0]"]
    assert got["cases[1]"] == "a case needs a graph template (graph: NAME) or its own phases; add one"


def test_invalid_names() -> None:
    d = doc()
    d["graphs"]["bad-name"] = {"phases": {"p": phase()}}
    d["cases"][0]["id"] = "case 1"
    got = by_path(d)
    assert got["graphs.bad-name"].startswith(
        "graph name 'bad-name': character '-' (U+002D HYPHEN-MINUS) at position 3 is not allowed; use ASCII"
    )
    assert got["cases[0].id"].startswith("case id 'case 1': character ' ' (U+0020 SPACE) at position 4")


def test_bad_api_version_and_empty_cases() -> None:
    d = doc()
    d["apiVersion"] = "avsim/v2"
    d["cases"] = []
    assert by_path(d) == {
        "apiVersion": "apiVersion 'avsim/v2' is not supported; use 'avsim/v1'",
        "cases": "cases needs at least 1 item; add one",
    }


@pytest.mark.parametrize("data", [None, [], "cases: []", 3])
def test_non_mapping_top_level_is_one_clear_problem(data: object) -> None:
    found = problems(data)
    assert len(found) == 1 and found[0].path == ""
    assert "a manifest is a mapping (YAML mapping / JSON object) at the top level" in found[0].message


# ---------------------------------------------------------------------------- many problems


def test_all_problems_are_collected_in_document_order() -> None:
    d = doc()
    d["run"]["build"]["image"] = "simulator:latest"
    d["graphs"]["standard"]["phases"]["prepare"]["depends_on"] = ["report"]
    d["cases"][4]["seed"] = "12"
    d["cases"][3]["graph"] = "perception_v2"
    d["cases"][0]["id"] = "case-00005"
    del d["cases"][2]["scenario"]
    d["cases"][3]["bogus"] = 1
    found = problems(d)
    assert [p.path for p in found] == [
        "run.build.image",
        "graphs.standard.phases",
        "cases[2].scenario",
        "cases[3].graph",
        "cases[3].bogus",
        "cases[4].id",
        "cases[4].seed",
    ]
    assert found[5].message == "duplicate case id 'case-00005' (also cases[0]); give each case a unique id"
    text = str(ManifestError(found, source="week.yaml"))
    assert text.startswith("week.yaml was rejected: 7 problems\n  run.build.image: ")


def test_document_checks_run_even_when_parts_are_malformed() -> None:
    d = doc()
    d["graphs"]["standard"]["phases"]["simulate"]["resources"] = "gpu"  # malformed for pydantic
    d["graphs"]["standard"]["phases"]["evaluate"]["depends_on"] = ["simulat", 7]
    d["cases"][1]["graph"] = "missing"
    d["cases"][2] = None
    got = by_path(d)
    assert got["graphs.standard.phases.simulate.resources"] == "resources must be a mapping, got str 'gpu'"
    assert got["graphs.standard.phases.evaluate.depends_on[0]"].startswith("unknown phase 'simulat'")
    assert got["graphs.standard.phases.evaluate.depends_on[1]"] == (
        "depends_on[1] must be a string, got int 7; quote it: '7'"
    )
    assert got["cases[1].graph"].startswith("unknown graph 'missing'")
    assert got["cases[2]"] == "cases[2] must be a mapping, got null"


def test_problems_are_capped() -> None:
    d = sample_manifest(1500, iso_week="2026-W49")
    for case in d["cases"]:
        case["seed"] = str(case["seed"])
    found = problems(d)
    assert len(found) == MAX_PROBLEMS + 1
    assert found[MAX_PROBLEMS - 1].path == f"cases[{MAX_PROBLEMS - 1}].seed"
    assert found[-1] == Problem("", "... and 500 more problems not shown; fix these and validate again")


def test_format_path() -> None:
    assert format_path(("cases", 412, "graph")) == "cases[412].graph"
    assert format_path(("graphs", "standard", "phases", "simulate", "depends_on", 0)) == (
        "graphs.standard.phases.simulate.depends_on[0]"
    )
    assert format_path(("cases", 0, "parameters", "a key")) == "cases[0].parameters['a key']"
    assert format_path(("graphs", 1), {"graphs": {1: {}}}) == "graphs.1"


def test_a_long_cycle_is_shortened_and_does_not_recurse() -> None:
    d = doc()
    n = 3000
    d["graphs"]["chain"] = {"phases": {f"p{i}": phase(depends_on=[f"p{(i + 1) % n}"]) for i in range(n)}}
    msg = by_path(d)["graphs.chain.phases"]
    assert "cycle: p0 -> p2999 -> p2998" in msg and "... (2981 more) -> " in msg and "p1 -> p0;" in msg


@pytest.mark.parametrize("value", [5_000, None])
def test_base_priority_is_refused_with_why_and_the_fix_and_every_other_problem_still_reported(
    value: object,
) -> None:
    """A phase's weight follows its run class, its week and its path; a manifest's own base would be
    ignored, so a manifest that sets one is refused, naming the field and what to write instead."""
    d = doc()
    d["run"]["base_priority"] = value
    d["run"]["iso_week"] = "2026-W60"
    d["cases"][1]["seed"] = "x"
    got = by_path(d)
    assert got["run.base_priority"] == (
        "base_priority is not a manifest field: a phase's priority follows its run class, its week and "
        "its critical path; remove base_priority (run_class: adhoc ranks a run below the weekly run)"
    )
    assert set(got) == {"run.base_priority", "run.iso_week", "cases[1].seed"}
