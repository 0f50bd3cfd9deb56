"""load_manifest / parse_manifest_text on real files, and the run's immutable snapshot."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from avsim.artifacts import RunLayout
from avsim.errors import AvsimError, ManifestError
from avsim.manifest.loader import LoadedManifest, load_manifest, parse_manifest_text
from avsim.manifest.sample import sample_manifest, write_sample
from avsim.manifest.snapshot import SnapshotInfo, read_head, read_snapshot, write_snapshot

CORPUS = Path(__file__).parents[1] / "corpus"


def only_problem(source: str | Path, **kw: int) -> str:
    with pytest.raises(ManifestError) as exc:
        load_manifest(source, **kw)
    assert len(exc.value.problems) == 1, exc.value.problems
    return str(exc.value.problems[0])


# --------------------------------------------------------------------------------------- loading


@pytest.mark.parametrize("ext", ["yaml", "yml", "json"])
def test_load_sample_file(tmp_path: Path, ext: str) -> None:
    path = write_sample(tmp_path / f"week.{ext}", cases=12, iso_week="2026-W49")
    loaded = load_manifest(path)
    assert isinstance(loaded, LoadedManifest)
    assert loaded.source == str(path)
    assert loaded.case_count == 12 and loaded.manifest.run.iso_week == "2026-W49"
    assert loaded.raw["cases"][0]["id"] == "case-00001"
    assert hashlib.sha256(loaded.canonical_json).hexdigest() == loaded.sha256
    assert json.loads(loaded.canonical_json) == loaded.manifest.model_dump(mode="json", by_alias=True)


def test_content_hash_is_the_same_for_yaml_and_json_of_one_document(tmp_path: Path) -> None:
    doc = sample_manifest(20, iso_week="2026-W49")
    as_json = load_manifest(write_sample(tmp_path / "w.json", cases=20, iso_week="2026-W49"))
    as_yaml = load_manifest(write_sample(tmp_path / "w.yaml", cases=20, iso_week="2026-W49"))
    # Hand-written YAML: other key order, defaults omitted, an unquoted timestamp, flow style.
    doc["cases"] = [{k: c[k] for k in reversed(list(c))} for c in doc["cases"]]
    del doc["run"]["run_class"]
    text = yaml.safe_dump(doc, sort_keys=True, default_flow_style=True).replace(
        "'2026-12-06T18:00:00Z'", "2026-12-06T18:00:00Z"
    )
    hand = parse_manifest_text(text, source="hand.yaml")
    assert hand.raw["run"]["deadline"].tzinfo is not None  # YAML parsed it as a timestamp
    assert as_json.sha256 == as_yaml.sha256 == hand.sha256
    assert as_json.canonical_json == hand.canonical_json


def test_format_is_sniffed_without_a_known_extension(tmp_path: Path) -> None:
    doc = sample_manifest(2, iso_week="2026-W49")
    (tmp_path / "a.manifest").write_text("  \n" + json.dumps(doc))
    (tmp_path / "b.manifest").write_text(yaml.safe_dump(doc))
    assert load_manifest(tmp_path / "a.manifest").sha256 == load_manifest(str(tmp_path / "b.manifest")).sha256


def test_file_uri(tmp_path: Path) -> None:
    path = write_sample(tmp_path / "week.yaml", cases=3, iso_week="2026-W49")
    loaded = load_manifest(f"file://{path}")
    assert loaded.source == f"file://{path}" and loaded.case_count == 3
    missing = f"file://{tmp_path}/nope.yaml"
    assert only_problem(missing) == f"file not found: {missing}; check the path or URI"


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "week.yaml"
    assert only_problem(missing) == f"file not found: {missing}; check the path or URI"


def test_directory(tmp_path: Path) -> None:
    assert "is a directory" in only_problem(tmp_path)


@pytest.mark.parametrize("name", ["empty.yaml", "comments_only.yaml"])
def test_empty(name: str) -> None:
    assert "empty" in only_problem(CORPUS / name)


def test_not_utf8_names_the_byte_offset() -> None:
    assert only_problem(CORPUS / "not_utf8.yaml") == (
        "the file is not UTF-8: byte 0xe9 at offset 37 (line 3) cannot be decoded; save the file as UTF-8"
    )


def test_yaml_syntax_error_has_line_and_column() -> None:
    assert only_problem(CORPUS / "syntax_error.yaml") == (
        "YAML syntax error at line 4, column 6: did not find expected ',' or ']' "
        "(while parsing a flow sequence at line 3, column 9)"
    )


def test_json_syntax_error_has_line_and_column() -> None:
    assert only_problem(CORPUS / "syntax_error.json") == (
        "JSON syntax error at line 3, column 23: Expecting property name enclosed in double quotes"
    )


def test_json_nan_is_refused() -> None:
    assert "NaN is not a JSON number" in only_problem(CORPUS / "nan.json")


def test_oversized_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = write_sample(tmp_path / "week.json", cases=5, iso_week="2026-W49")
    size = path.stat().st_size
    msg = only_problem(path, max_bytes=1000)
    assert msg == (
        f"{path} is too large: {size} bytes, the limit is 1000 bytes; split the week into several "
        "manifests or raise [avsim] max_manifest_bytes"
    )
    assert load_manifest(path, max_bytes=size).case_count == 5


def test_duplicate_yaml_key_names_key_line_and_path() -> None:
    assert only_problem(CORPUS / "duplicate_keys.yaml") == (
        "cases[0].seed: duplicate key 'seed' at line 22 (first at line 21); keep one of them"
    )


def test_duplicate_json_key() -> None:
    assert only_problem(CORPUS / "duplicate_keys.json") == (
        "apiVersion: duplicate key 'apiVersion' in a JSON object (first at line 1); keep one of them (line 1, column 28)"
    )


def test_alias_bomb_is_refused() -> None:
    msg = only_problem(CORPUS / "billion_laughs.yaml")
    assert msg.startswith("YAML aliases expand 28 written nodes to 490329064 (the limit is 1000000)")


def test_recursive_alias_is_refused() -> None:
    assert "recursive YAML alias" in only_problem(CORPUS / "recursive_alias.yaml")


def test_moderate_aliases_and_merge_keys_are_allowed() -> None:
    doc = sample_manifest(2, iso_week="2026-W49")
    del doc["graphs"]
    for case in doc["cases"]:
        case["graph"] = "tiny"
    graphs = """
graphs:
  tiny:
    phases:
      a: &cpu_phase
        resources: {class: cpu, cpus: 1, memory: 2Gi}
        estimated_duration_seconds: 5
        timeout_seconds: 15
        command: &cmd [avsim-fakesim]
      b:
        <<: *cpu_phase
        depends_on: [a]
        timeout_seconds: 30
      c: {<<: *cpu_phase, depends_on: [b], command: *cmd}
"""
    loaded = parse_manifest_text(yaml.safe_dump(doc) + graphs, source="aliases.yaml")
    phases = loaded.manifest.graphs["tiny"].phases
    assert phases["b"].timeout_seconds == 30 and phases["b"].depends_on == ("a",)
    assert phases["c"].command == ("avsim-fakesim",) and phases["c"].resources.memory == "2Gi"


def test_other_corpus_files() -> None:
    assert "a manifest is a mapping" in only_problem(CORPUS / "top_level_list.yaml")
    assert "expected a single document" in only_problem(CORPUS / "two_documents.yaml")
    assert "explicit YAML tag !!python/object/apply:os.system at line 1" in only_problem(
        CORPUS / "python_tag.yaml"
    )


def test_validation_problems_come_through_with_the_source(tmp_path: Path) -> None:
    doc = sample_manifest(3, iso_week="2026-W49")
    doc["cases"][1]["seed"] = "12"
    path = tmp_path / "week.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ManifestError) as exc:
        load_manifest(path)
    assert exc.value.source == str(path)
    assert [str(p) for p in exc.value.problems] == ["cases[1].seed: seed must be an integer, got str '12'"]


# -------------------------------------------------------------------------------------- snapshot


def _layout(tmp_path: Path, run_key: str = "manual__2026-12-01T06:00:00+00:00") -> RunLayout:
    return RunLayout(root=f"file://{tmp_path}/artifacts", run_key=run_key)


def test_snapshot_round_trip(tmp_path: Path) -> None:
    loaded = parse_manifest_text(json.dumps(sample_manifest(7, iso_week="2026-W49")), source="w.json")
    layout = _layout(tmp_path)
    info = write_snapshot(loaded, layout)
    assert info == SnapshotInfo(layout.manifest_uri, layout.head_uri, loaded.sha256, 7)
    base = tmp_path / "artifacts" / "runs" / "manual__2026-12-01T06_00_00_00_00" / "manifest"
    assert (base / "manifest.json").read_bytes() == loaded.canonical_json
    assert (base / "sha256").read_text().strip() == loaded.sha256
    head = read_head(layout)
    assert set(head) == {"apiVersion", "run", "graphs", "run_phases", "case_count"}
    assert head["case_count"] == 7 and head["run"]["iso_week"] == "2026-W49"
    again = read_snapshot(layout)
    assert again.sha256 == loaded.sha256 and again.manifest == loaded.manifest
    assert again.canonical_json == loaded.canonical_json and again.source == layout.manifest_uri


def test_snapshot_is_idempotent_for_retries(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    first = parse_manifest_text(json.dumps(sample_manifest(4, iso_week="2026-W49")), source="a.json")
    info = write_snapshot(first, layout)
    manifest_file = tmp_path / "artifacts" / "runs" / layout.run_key.replace(":", "_").replace("+", "_")
    manifest_file = manifest_file / "manifest" / "manifest.json"
    mtime = manifest_file.stat().st_mtime_ns
    # The same document, loaded again from YAML by a retry: nothing is rewritten.
    retry = parse_manifest_text(yaml.safe_dump(sample_manifest(4, iso_week="2026-W49")), source="a.yaml")
    assert write_snapshot(retry, layout) == info
    assert manifest_file.stat().st_mtime_ns == mtime
    # A retry after losing the head rewrites it from the same content.
    (manifest_file.parent / "head.json").unlink()
    assert write_snapshot(retry, layout) == info
    assert read_head(layout)["case_count"] == 4


def test_snapshot_is_immutable(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    first = parse_manifest_text(json.dumps(sample_manifest(4, iso_week="2026-W49")), source="a.json")
    write_snapshot(first, layout)
    changed = parse_manifest_text(json.dumps(sample_manifest(5, iso_week="2026-W49")), source="b.json")
    with pytest.raises(AvsimError) as exc:
        write_snapshot(changed, layout)
    msg = str(exc.value)
    assert first.sha256 in msg and changed.sha256 in msg and repr(layout.run_key) in msg
    assert "a run's manifest snapshot is immutable; start a new run" in msg
    assert read_snapshot(layout).sha256 == first.sha256
    # Another run key takes the changed manifest.
    assert write_snapshot(changed, _layout(tmp_path, "manual__2")).sha256 == changed.sha256


def test_uncommitted_leftovers_are_replaced(tmp_path: Path) -> None:
    """An attempt that died before writing sha256 committed nothing; the next attempt overwrites."""
    layout = _layout(tmp_path, "r1")
    base = tmp_path / "artifacts" / "runs" / "r1" / "manifest"
    base.mkdir(parents=True)
    (base / "manifest.json").write_bytes(b'{"truncated')
    loaded = parse_manifest_text(json.dumps(sample_manifest(2, iso_week="2026-W49")), source="a.json")
    write_snapshot(loaded, layout)
    assert read_snapshot(layout).sha256 == loaded.sha256


def test_read_snapshot_detects_damage_and_absence(tmp_path: Path) -> None:
    layout = _layout(tmp_path, "r2")
    with pytest.raises(AvsimError, match="has no manifest snapshot"):
        read_snapshot(layout)
    loaded = parse_manifest_text(json.dumps(sample_manifest(2, iso_week="2026-W49")), source="a.json")
    write_snapshot(loaded, layout)
    path = tmp_path / "artifacts" / "runs" / "r2" / "manifest" / "manifest.json"
    path.write_bytes(path.read_bytes().replace(b"case-00001", b"case-00009"))
    with pytest.raises(AvsimError, match="changed or damaged"):
        read_snapshot(layout)
