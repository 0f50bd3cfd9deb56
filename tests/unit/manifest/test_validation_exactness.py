"""Issue 16: the manifest means exactly what it says.

Nothing is stripped or coerced; image references follow the OCI grammar; ids stay unique where they
are used; URIs stay on the stores the platform means to read; a deadline fits its week; the CLI
never writes what validate refuses.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from avsim.cli import app
from avsim.errors import ManifestError
from avsim.manifest.image_ref import parse_image
from avsim.manifest.loader import parse_manifest_text
from avsim.manifest.policy import ManifestPolicy, policy_from_settings
from avsim.manifest.sample import open_iso_week, sample_manifest
from avsim.manifest.uris import uri_problem
from avsim.manifest.validation import validate_manifest
from avsim.settings import AvsimSettings, ManifestSafetySettings

BASE = sample_manifest(3, iso_week="2026-W49")
DIGEST = "sha256:" + "a" * 64
SIM = ("graphs", "standard", "phases", "simulate")


def doc() -> dict[str, Any]:
    return copy.deepcopy(BASE)


def problems(data: Any, policy: ManifestPolicy | None = None) -> dict[str, str]:
    with pytest.raises(ManifestError) as exc:
        validate_manifest(data, policy=policy)
    return {p.path: p.message for p in exc.value.problems}


def yaml_problems(text: str) -> dict[str, str]:
    with pytest.raises(ManifestError) as exc:
        parse_manifest_text(text, fmt="yaml")
    return {p.path: p.message for p in exc.value.problems}


def with_case_line(line: str) -> str:
    """The sample as YAML with ``line`` added to the first case's parameters."""
    text = yaml.safe_dump(doc(), sort_keys=False)
    anchor = "  parameters:\n"
    assert anchor in text
    return text.replace(anchor, anchor + "    " + line + "\n", 1)


# ------------------------------------------------------------------------------ 1. no silent changes


def test_arguments_and_env_values_keep_their_spaces() -> None:
    d = doc()
    sim = d["graphs"]["standard"]["phases"]["simulate"]
    sim["args"] = [" ", "", "  x  ", "a\tb"]
    sim["pod"]["env"] = {"PAD": "  v  ", "EMPTY": ""}
    m = validate_manifest(d)
    got = m.graphs["standard"].phases["simulate"]
    assert got.args == (" ", "", "  x  ", "a\tb")
    assert got.pod.env == {"PAD": "  v  ", "EMPTY": ""}


@pytest.mark.parametrize(
    ("where", "value", "says"),
    [
        (("cases", 0, "id"), " case-1", "case id ' case-1' has leading or trailing whitespace"),
        (("cases", 0, "graph"), "standard ", "'standard ' has leading or trailing whitespace"),
        (("run", "build", "build_id"), "sim-1 ", "'sim-1 ' has leading or trailing whitespace"),
        (("cases", 0, "scenario", "version"), " v3", "' v3' has leading or trailing whitespace"),
    ],
)
def test_an_identifier_with_spaces_is_an_error_naming_it(
    where: tuple[Any, ...], value: str, says: str
) -> None:
    d = doc()
    node: Any = d
    for seg in where[:-1]:
        node = node[seg]
    node[where[-1]] = value
    got = problems(d)
    path = ".".join(str(s) for s in where).replace(".0.", "[0].")
    assert says in got[path], got


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        (("resources", "gpus"), True, "gpus must be an integer, got bool True"),
        (("resources", "cpus"), True, "cpus must be a number, got bool True"),
        (("checkpoint",), 1, "checkpoint must be true or false, got int 1"),
        (("checkpoint",), "yes", "checkpoint must be true or false, got str 'yes'"),
        (("timeout_seconds",), "5400", "timeout_seconds must be a number, got str '5400'"),
    ],
)
def test_booleans_are_never_numbers_nor_numbers_booleans(
    field: tuple[str, ...], value: Any, says: str
) -> None:
    d = doc()
    node = d["graphs"]["standard"]["phases"]["simulate"]
    for seg in field[:-1]:
        node = node[seg]
    node[field[-1]] = value
    got = problems(d)
    assert says in got["graphs.standard.phases.simulate." + ".".join(field)]


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("gpus: yes", "the plain word 'yes' at line"),
        ("country: NO", "is read by YAML 1.1 as false; write false, or quote it ('NO')"),
        ("mode: 0755", "the plain value '0755' at line"),
        ("budget: 1_000", "the plain value '1_000' at line"),
        ("lap: 1:30", "the plain value '1:30' at line"),
        ("ratio: .nan", "'.nan' at line"),
        ("limit: -.inf", "'-.inf' at line"),
        ("day: 2026-12-06", "is read by YAML as a date; quote it ('2026-12-06')"),
        ("blob: !!binary aGVsbG8=", "explicit YAML tag !!binary at line"),
        ("n: !!float 3", "explicit YAML tag !!float at line"),
        ("s: !!set {a: null}", "explicit YAML tag !!set at line"),
    ],
)
def test_yaml_11_readings_and_tags_in_parameters_are_errors_with_a_line(line: str, says: str) -> None:
    got = yaml_problems(with_case_line(line))
    key = line.split(":", 1)[0]
    assert says in got[f"cases[0].parameters.{key}"], got


def test_a_list_used_as_a_mapping_key_gets_advice_about_keys_not_tags() -> None:
    got = yaml_problems(with_case_line("? [a, b]\n    : 1"))
    message = got["cases[0].parameters"]
    assert "is a list; a mapping key is a plain name: write it as text" in message
    assert "tag" not in message


def test_parameters_keys_must_be_text_and_values_json() -> None:
    d = doc()
    d["cases"][0]["parameters"] = {"nested": {1: "a", "when": dt.date(2026, 1, 1)}, "x": float("nan")}
    got = problems(d)
    assert "the key 1 is int 1, not text" in got["cases[0].parameters.nested.1"]
    assert "date is no JSON value" in got["cases[0].parameters.nested.when"]
    assert "is not a finite number" in got["cases[0].parameters.x"]


def test_json_non_finite_and_deep_nesting_are_located() -> None:
    d = doc()
    d["cases"][1]["parameters"]["big"] = 1
    text = json.dumps(d, indent=1).replace('"big": 1', '"big": 1e999')
    with pytest.raises(ManifestError) as exc:
        parse_manifest_text(text, fmt="json")
    (p,) = exc.value.problems
    assert (
        p.path == "cases[1].parameters.big" and "too large for a float" in p.message and "line " in p.message
    )


def test_duplicate_key_in_one_case_of_many_names_path_line_and_column() -> None:
    d = sample_manifest(20, iso_week="2026-W49")
    text = json.dumps(d, indent=1)
    marker = '"id": "case-00013",'
    text = text.replace(marker, marker + ' "id": "case-00013b",')
    with pytest.raises(ManifestError) as exc:
        parse_manifest_text(text, fmt="json")
    (p,) = exc.value.problems
    line = text[: text.index(marker)].count("\n") + 1
    assert p.path == "cases[12].id"
    assert f"(first at line {line}); keep one of them (line {line}, column" in p.message


# ------------------------------------------------------------------------------------- 2. images


@pytest.mark.parametrize(
    ("image", "says"),
    [
        (f"registry.example.com//sim:@{DIGEST}", "empty path component"),
        (f"registry.example.com/avsim/sim:@{DIGEST}", "empty tag before the digest"),
        (f"registry.example.com/avsim/sim:v1@{DIGEST}", "the digest pins what runs and the tag"),
        (f"registry.example.com/avsim/sim:-bad@{DIGEST}", "invalid tag '-bad'"),
        (f"registry.example.com/Avsim/sim@{DIGEST}", "invalid path component 'Avsim' (upper case"),
        (f"registry.example.com/avsim/sim/@{DIGEST}", "empty path component"),
        (f"registry..example.com/sim@{DIGEST}", "empty host component"),
        (f"registry.example.com:99999/sim@{DIGEST}", "port '99999' is not a number from 1 to 65535"),
        (f"registry.example.com/a__-b@{DIGEST}", "invalid path component 'a__-b'"),
        ("registry.example.com/sim@sha512:" + "a" * 128, "digest algorithm 'sha512' is not sha256"),
        ("registry.example.com/sim@sha256:" + "A" * 64, "64 lowercase hex digits"),
        (f"registry.example.com/{'a' * 250}@{DIGEST}", "the limit is 255"),
        (f"registry.example.com/sim@x@{DIGEST}", "more than one '@'"),
    ],
)
def test_image_references_follow_the_oci_grammar(image: str, says: str) -> None:
    d = doc()
    d["run"]["build"]["image"] = image
    assert says in problems(d)["run.build.image"]


@pytest.mark.parametrize(
    "image",
    [
        f"localhost:5000/sim@{DIGEST}",
        f"sim@{DIGEST}",
        f"[::1]:5000/team/sim@{DIGEST}",
        f"registry.example.com/a.b_c__d-e--f/sim@{DIGEST}",
        f"192.168.0.1/sim@{DIGEST}",
    ],
)
def test_valid_references(image: str) -> None:
    assert parse_image(image).digest == DIGEST


# ---------------------------------------------------------------------------------------- 4. ids


def test_look_alike_letters_are_named_by_code_point() -> None:
    d = doc()
    d["cases"][0]["id"] = "c\u0430se-1"
    message = problems(d)["cases[0].id"]
    assert "U+0430 CYRILLIC SMALL LETTER A" in message and "looks like 'a'" in message


def test_ids_differing_only_in_case_collide() -> None:
    d = doc()
    d["cases"][1]["id"] = d["cases"][0]["id"].upper()
    d["graphs"]["Standard"] = d["graphs"]["standard"]
    d["graphs"]["perception"]["phases"]["Evaluate"] = d["graphs"]["perception"]["phases"]["evaluate"]
    got = problems(d)
    assert "differs from cases[0].id 'case-00001' only in letter case" in got["cases[1].id"]
    assert "graph name 'Standard' differs from 'standard' only in letter case" in got["graphs.Standard"]
    assert "'Evaluate' differs from 'evaluate'" in got["graphs.perception.phases.Evaluate"]


# ---------------------------------------------------------------------------------------- 5. URIs


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("http://169.254.169.254/latest/meta-data/", "a cloud metadata service"),
        ("http://[fd00:ec2::254]/latest", "a cloud metadata service"),
        ("http://metadata.google.internal/computeMetadata/v1/", "a cloud metadata service"),
        ("http://127.0.0.1:8080/x", "a loopback address"),
        ("http://2130706433/x", "a loopback address"),
        ("http://0x7f.1/x", "a loopback address"),
        ("http://[::ffff:127.0.0.1]/x", "a loopback address"),
        ("http://localhost./x", "a loopback address"),
        ("http://169.254.10.1/x", "a link-local address"),
        ("http://[fe80::1]/x", "a link-local address"),
        ("http://0.0.0.0/x", "the unspecified address"),
        ("s3://bucket/a/../../etc/passwd", "'..' path segment"),
        ("s3://bucket/a/%2e%2e/b", "'..' path segment"),
        ("file://host/etc/passwd", "names a host"),
        ("scenarios/x.json", "is not an absolute URI"),
        ("S3://bucket/x", "write the scheme in lower case"),
        (" s3://bucket/x", "holds whitespace"),
        ("s3:///x", "has no host or bucket"),
    ],
)
def test_uris_no_deployment_reads(uri: str, says: str) -> None:
    problem = uri_problem(uri)
    assert problem is not None and says in problem


def test_site_allow_list_schemes_and_roots(tmp_path: Path) -> None:
    root = f"file://{tmp_path}/artifacts"
    policy = policy_from_settings(
        AvsimSettings(artifact_root=root, manifest_safety=ManifestSafetySettings(uri_schemes=("s3",)))
    )
    assert policy.uri_problem("s3://avsim-scenarios/x.json") is None
    assert policy.uri_problem(f"{root}/scenarios/x.json") is None
    assert "outside the allowed roots" in (policy.uri_problem("file:///etc/passwd") or "")
    assert "outside the allowed roots" in (policy.uri_problem(f"{root}-evil/x") or "")
    assert "scheme https:// is not allowed here (allowed: file://, s3://)" in (
        policy.uri_problem("https://example.com/x") or ""
    )
    narrow = policy_from_settings(
        AvsimSettings(
            artifact_root=root,
            manifest_safety=ManifestSafetySettings(uri_prefixes=("s3://avsim-scenarios/",)),
        )
    )
    assert narrow.uri_problem("s3://avsim-scenarios/a.json") is None
    assert "outside the allowed roots" in (narrow.uri_problem("s3://avsim-scenarios-2/a.json") or "")
    d = doc()
    d["cases"][2]["scenario"]["uri"] = "file:///etc/passwd"
    assert "outside the allowed roots" in problems(d, policy)["cases[2].scenario.uri"]


def test_the_sample_is_valid_under_the_default_policy(tmp_path: Path) -> None:
    policy = policy_from_settings(AvsimSettings(artifact_root=f"file://{tmp_path}"))
    validate_manifest(sample_manifest(50), policy=policy)


# ------------------------------------------------------------------------------------ 5. deadline


@pytest.mark.parametrize(
    ("deadline", "says"),
    [
        ("2023-12-06T18:00:00Z", "is before ISO week 2026-W49 starts (2026-11-30T00:00:00Z)"),
        ("2026-11-29T23:59:59Z", "is before ISO week 2026-W49 starts"),
        ("2029-12-06T18:00:00Z", "more than 8 weeks after ISO week 2026-W49 ends"),
    ],
)
def test_a_deadline_outside_its_week_is_an_error(deadline: str, says: str) -> None:
    d = doc()
    d["run"]["deadline"] = deadline
    assert says in problems(d)["run.deadline"]


def test_a_past_deadline_is_refused_at_start_unless_rerun_or_allowed() -> None:
    m = validate_manifest(doc())
    after = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)
    with pytest.raises(ManifestError) as exc:
        ManifestPolicy().check_start(m, "week.yaml", now=after)
    (p,) = exc.value.problems
    assert p.path == "run.deadline" and "has already passed" in p.message
    assert "manifest_allow_past_deadline" in p.message
    ManifestPolicy(allow_past_deadline=True).check_start(m, "week.yaml", now=after)
    rerun = doc()
    rerun["run"]["rerun_of"] = "avsim_weekly/manual__x"
    ManifestPolicy().check_start(validate_manifest(rerun), "week.yaml", now=after)
    ManifestPolicy().check_start(m, "week.yaml", now=dt.datetime(2026, 12, 6, tzinfo=dt.UTC))


def test_the_sample_week_is_still_open_on_sunday_evening() -> None:
    assert open_iso_week(dt.datetime(2026, 12, 6, 17, 0, tzinfo=dt.UTC)) == "2026-W49"
    assert open_iso_week(dt.datetime(2026, 12, 6, 18, 0, tzinfo=dt.UTC)) == "2026-W50"


# ------------------------------------------------------------------------------------- 6. limits


def test_max_cases_is_enforced_by_validate() -> None:
    got = problems(sample_manifest(5, iso_week="2026-W49"), ManifestPolicy(max_cases=4))
    assert got["cases"].startswith("5 cases, the limit is 4; split the week")


def test_sample_never_writes_what_validate_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    out = tmp_path / "week.yaml"
    monkeypatch.setenv("AIRFLOW__AVSIM__MAX_MANIFEST_CASES", "10")
    done = runner.invoke(app, ["manifest", "sample", "-o", str(out), "--cases", "11"])
    assert done.exit_code == 1 and "above [avsim] max_manifest_cases (10)" in done.output
    assert not out.exists()
    monkeypatch.setenv("AIRFLOW__AVSIM__MAX_MANIFEST_BYTES", "5000")
    done = runner.invoke(app, ["manifest", "sample", "-o", str(out), "--cases", "10"])
    assert done.exit_code == 1 and "above [avsim] max_manifest_bytes (5000)" in done.output
    assert not out.exists()
    monkeypatch.setenv("AIRFLOW__AVSIM__MAX_MANIFEST_BYTES", "67108864")
    done = runner.invoke(app, ["manifest", "sample", "-o", str(out), "--cases", "10"])
    assert done.exit_code == 0, done.output
    assert runner.invoke(app, ["manifest", "validate", str(out)]).exit_code == 0
