"""A phase's ``deterministic_outputs``: optional, checked with the field's path and the fix, and carried
through YAML, the snapshot and the case's phase spec as written."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from avsim.artifacts import RunLayout
from avsim.contracts.case import CaseEntry
from avsim.errors import ManifestError
from avsim.manifest.loader import parse_manifest_text
from avsim.manifest.sample import sample_manifest
from avsim.manifest.snapshot import read_snapshot, write_snapshot
from avsim.manifest.validation import validate_manifest
from avsim.plan.shards import case_entry

BASE = sample_manifest(2, iso_week="2026-W49")
GRAPH = BASE["cases"][0]["graph"]
WHERE = f"graphs.{GRAPH}.phases.simulate.deterministic_outputs"


def with_outputs(outputs: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["graphs"][GRAPH]["phases"]["simulate"]["deterministic_outputs"] = outputs
    return doc


def problems(doc: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ManifestError) as raised:
        validate_manifest(doc, source="week.yaml")
    return {p.path: p.message for p in raised.value.problems}


def test_the_field_is_optional_and_empty_by_default() -> None:
    manifest = validate_manifest(copy.deepcopy(BASE))
    assert manifest.graphs[GRAPH].phases["simulate"].deterministic_outputs == ()


@pytest.mark.parametrize(
    ("outputs", "path", "says"),
    [
        (["../other-case/trace.jsonl"], f"{WHERE}[0]", "is not a path under the phase's OUTPUT_URI"),
        (["trace.jsonl", "/etc/passwd"], f"{WHERE}[1]", "write it relative, e.g. trace.jsonl"),
        (["s3://bucket/trace.jsonl"], f"{WHERE}[0]", "is not a path under the phase's OUTPUT_URI"),
        ([" trace.jsonl"], f"{WHERE}[0]", "leading or trailing whitespace"),
        (["trace.jsonl", "trace.jsonl"], WHERE, "lists trace.jsonl more than once; list each once"),
        ("trace.jsonl", WHERE, "list"),
    ],
)
def test_a_bad_output_names_the_field_and_the_fix(outputs: Any, path: str, says: str) -> None:
    found = problems(with_outputs(outputs))
    assert path in found and says in found[path], found


def test_an_unknown_key_beside_it_is_refused() -> None:
    doc = with_outputs(["trace.jsonl"])
    doc["graphs"][GRAPH]["phases"]["simulate"]["deterministic_output"] = ["trace.jsonl"]
    found = problems(doc)
    [message] = [m for p, m in found.items() if p.endswith("deterministic_output")]
    assert "deterministic_outputs" in message  # the allowed fields are listed


def test_it_round_trips_through_yaml_and_the_snapshot(tmp_path: Path) -> None:
    outputs = ["trace.jsonl", "metrics/summary.json"]
    loaded = parse_manifest_text(yaml.safe_dump(with_outputs(outputs)), fmt="yaml")
    assert loaded.manifest.graphs[GRAPH].phases["simulate"].deterministic_outputs == tuple(outputs)
    layout = RunLayout(f"file://{tmp_path}", "avsim_weekly__outputs")
    write_snapshot(loaded, layout)
    snap = read_snapshot(layout)
    assert snap.manifest == loaded.manifest
    head = json.loads(snap.canonical_json)
    entry = CaseEntry.model_validate(json.loads(json.dumps(case_entry(snap.manifest.cases[0], GRAPH))))
    assert entry.phase_spec(head, "simulate")["deterministic_outputs"] == outputs
    again = validate_manifest(json.loads(snap.canonical_json))
    assert again == loaded.manifest
