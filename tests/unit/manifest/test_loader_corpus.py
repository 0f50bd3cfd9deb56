"""The bad-input corpus (``tests/unit/corpus``): every malformed manifest and DAG-run conf is refused
by the code path the DAGs run, with a problem at the path of the field and a message that says the fix.

Manifests go through :func:`avsim.dagbuild.prepare.prepare_week` (what the weekly DAG's ``prepare``
task calls) on a real file:// artifact store, which must stay empty: no snapshot, no shard cases, so
no shard run could start. DAG-run confs go through ``manifest_source`` + ``prepare_week`` (weekly)
and ``load_shard`` + ``summarize`` (shard) against a week prepared from ``good_minimal.yaml``, the
corpus's control, of which every ``bad_*`` file is a copy with one defect.
"""

from __future__ import annotations

import json
import os
import threading
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from avsim.dagbuild import tasks
from avsim.dagbuild.factory import load_plan
from avsim.dagbuild.prepare import prepare_week
from avsim.errors import ManifestError, Problem
from avsim.manifest.loader import DEFAULT_MAX_BYTES, load_manifest
from avsim.manifest.secrets import USE_A_CONNECTION
from avsim.manifest.source import manifest_source
from avsim.plan.model import WeeklyPlan
from avsim.settings import AvsimSettings, ManifestSafetySettings

ROOT = Path(__file__).resolve().parents[3]
CORPUS = Path(__file__).parents[1] / "corpus"
CONF = CORPUS / "conf"
GOOD = CORPUS / "good_minimal.yaml"
#: Problems at these paths end with the fix named after "; " or "(allowed: ...)".
PHASE = "graphs.standard.phases"
SIM_POD = f"{PHASE}.simulate.pod"


@dataclass(frozen=True)
class Bad:
    """One corpus file: the path its problem names ("" for a problem of the whole file) and a part of
    that problem's message that says what is wrong and what to do. ``secret``: text of the file that
    no message may repeat."""

    file: str
    path: str
    says: str
    secret: str | None = None


MANIFESTS: list[Any] = [
    # the file itself
    Bad("empty.yaml", "", "the file is empty; a manifest needs run and cases"),
    Bad("comments_only.yaml", "", "the document is empty"),
    Bad("not_utf8.yaml", "", "byte 0xe9 at offset 37 (line 3) cannot be decoded; save the file as UTF-8"),
    Bad("bad_utf16.yaml", "", "byte 0xff at offset 0 (line 1) cannot be decoded; save the file as UTF-8"),
    Bad("syntax_error.yaml", "", "YAML syntax error at line 4, column 6"),
    Bad("syntax_error.json", "", "JSON syntax error at line 3, column 23"),
    Bad("nan.json", "run.base_priority", "NaN is not a JSON number; use a finite number (line 1, column 53)"),
    Bad("top_level_list.yaml", "", "a manifest is a mapping (YAML mapping / JSON object) at the top level"),
    Bad("two_documents.yaml", "", "expected a single document"),
    Bad("python_tag.yaml", "apiVersion", "explicit YAML tag !!python/object/apply:os.system at line 1; a"),
    Bad("billion_laughs.yaml", "", "write the repeated parts out or use fewer nested aliases"),
    Bad("recursive_alias.yaml", "cases[0]", "recursive YAML alias at line 1; remove it"),
    Bad("bad_json_deep.json", "run" + "[0]" * 199, "JSON nesting is too deep: more than 200 levels here (a"),
    Bad("bad_yaml_deep_flow.yaml", "", "exceeded maximum nesting depth"),
    Bad("bad_env_file.txt", "", "at the top level, got a str", secret="wJalrXUtnFEMI"),
    # duplicate keys
    Bad(
        "duplicate_keys.yaml", "cases[0].seed", "duplicate key 'seed' at line 22 (first at line 21); keep one"
    ),
    Bad(
        "duplicate_keys.json",
        "apiVersion",
        "duplicate key 'apiVersion' in a JSON object (first at line 1); keep",
    ),
    Bad(
        "bad_duplicate_key_nested.json",
        "cases[0].seed",
        "(first at line 126); keep one of them (line 126, col",
    ),
    # graphs and cases
    Bad("bad_cycle.yaml", PHASE, "cycle: prepare -> simulate -> evaluate -> report -> prepare; break it"),
    Bad("bad_self_dependency.yaml", f"{PHASE}.simulate.depends_on[1]", "depends on itself; remove it"),
    Bad("bad_unknown_dependency.yaml", f"{PHASE}.evaluate.depends_on[0]", "did you mean 'simulate'?"),
    Bad("bad_duplicate_case_id.yaml", "cases[1].id", "duplicate case id 'case-00001' (also cases[0]); give"),
    Bad("bad_unknown_graph.yaml", "cases[1].graph", "unknown graph 'perception_v2' (known: standard)"),
    Bad("bad_case_without_graph.yaml", "cases[1]", "a case needs a graph template (graph: NAME) or its own"),
    Bad("bad_no_cases.yaml", "cases", "cases needs at least 1 item; add one"),
    # wrong types
    Bad("bad_seed_string.yaml", "cases[1].seed", "seed must be an integer, got str '97533201'"),
    Bad("bad_seed_bool.json", "cases[0].seed", "seed must be an integer, got bool True"),
    Bad("bad_gpus_word.yaml", f"{PHASE}.simulate.resources.gpus", "gpus must be an integer, got str 'one'"),
    Bad("bad_depends_on_string.yaml", f"{PHASE}.report.depends_on", "write it as a list: [evaluate]"),
    Bad("bad_cases_mapping.yaml", "cases", "cases must be a list, got a mapping of 2 keys"),
    Bad("bad_json_graphs_list.json", "graphs", "graphs must be a mapping, got a list of 1 item"),
    Bad("bad_parameters_list.yaml", "cases[1].parameters", "parameters must be a mapping, got a list"),
    Bad("bad_checkpoint_word.yaml", f"{PHASE}.simulate.checkpoint", "must be true or false, got str"),
    Bad("bad_deadline_no_zone.yaml", "run.deadline", "deadline has no time zone; add one"),
    Bad("bad_resource_class.yaml", f"{PHASE}.report.resources.class", "class must be 'gpu' or 'cpu'"),
    Bad(
        "bad_unknown_field.yaml", f"{PHASE}.evaluate.timeout_secs", "unknown field 'timeout_secs'; remove it"
    ),
    # the build's image
    Bad(
        "bad_image_tag.yaml",
        "run.build.image",
        "is not pinned by digest; write it as 'registry.example.com/team/simulator@sha256:",
    ),
    Bad("bad_image_short_digest.yaml", "run.build.image", "it must be 'sha256:' and 64 lowercase hex digits"),
    Bad("bad_image_missing.yaml", "run.build.image", "required field missing; add it"),
    # huge values
    Bad(
        "bad_duration_1e308.yaml",
        f"{PHASE}.simulate.estimated_duration_seconds",
        "less than or equal to 604800",
    ),
    Bad(
        "bad_timeout_infinite.yaml",
        f"{PHASE}.simulate.timeout_seconds",
        "'.inf' at line 24 is not a finite number; write a finite number",
    ),
    Bad(
        "bad_duration_nan.yaml",
        f"{PHASE}.evaluate.estimated_duration_seconds",
        "'.nan' at line 36 is not a finite",
    ),
    Bad("bad_gpus_huge.yaml", f"{PHASE}.simulate.resources.gpus", "less than or equal to 16, got 100000"),
    Bad("bad_cpus_huge.yaml", f"{PHASE}.evaluate.resources.cpus", "less than or equal to 256"),
    Bad("bad_memory_huge.yaml", f"{PHASE}.simulate.resources.memory", "is not a quantity; write it like"),
    Bad("bad_seed_huge.yaml", "cases[0].seed", "less than or equal to 9223372036854775807"),
    Bad("bad_seed_negative.yaml", "cases[0].seed", "greater than or equal to 0, got -1"),
    Bad("bad_seed_float.yaml", "cases[0].seed", "seed must be an integer, got float 1e+308"),
    Bad("bad_retries_huge.yaml", f"{PHASE}.simulate.retry.infrastructure", "less than or equal to 20"),
    Bad("bad_parameters_deep.yaml", "cases[0].parameters" + ".a" * 32, "nested more than 32 levels deep"),
    Bad("bad_nul_in_argument.json", f"{PHASE}.prepare.args[3]", "holds a NUL character"),
    Bad("bad_lone_surrogate.json", "cases[1].parameters.weather", "holds a lone UTF-16 surrogate"),
    # pod fields outside the allow-list
    Bad(
        "bad_pod_privileged.yaml",
        f"{SIM_POD}.privileged",
        "pods never run privileged; a manifest may set only",
    ),
    Bad("bad_pod_host_path.yaml", f"{SIM_POD}.hostPath", "host paths would expose the node's file system"),
    Bad("bad_pod_host_network.yaml", f"{SIM_POD}.hostNetwork", "pods never share the node's network"),
    Bad("bad_pod_host_pid.yaml", f"{SIM_POD}.hostPID", "pods never share the node's process namespace"),
    Bad("bad_pod_volumes.yaml", f"{SIM_POD}.volumes", "volumes are fixed by avsim"),
    Bad(
        "bad_pod_security_context.yaml",
        f"{SIM_POD}.securityContext",
        "the security context is fixed by avsim",
    ),
    Bad(
        "bad_pod_service_account.yaml", f"{SIM_POD}.serviceAccountName", "[avsim] kubernetes_service_account"
    ),
    Bad("bad_pod_image.yaml", f"{SIM_POD}.image", "the image is the run's pinned build"),
    Bad("bad_pod_many_forbidden.yaml", f"{SIM_POD}.hostIPC", "pods never share the node's IPC namespace"),
    Bad("bad_pod_nested_spec.yaml", f"{SIM_POD}.spec", "unknown field 'spec'; remove it (allowed: labels,"),
    Bad("bad_pod_env_reserved.yaml", f"{SIM_POD}.env", "env 'OUTPUT_URI' is set by the phase contract"),
    Bad("bad_pod_label_reserved.yaml", f"{SIM_POD}.labels", "the prefix avsim.io/ is avsim's"),
    Bad(
        "bad_pod_apparmor_unconfined.yaml",
        f"{SIM_POD}.annotations",
        "'container.apparmor.security.beta.kubernetes.io/base' would change the pod's sandbox",
    ),
    # credentials
    Bad(
        "bad_secret_aws_key.yaml",
        "cases[0].parameters.s3_key",
        "an AWS access key id (AKIA****)",
        "IOSFODNN7",
    ),
    Bad(
        "bad_secret_uri_password.yaml",
        "cases[1].scenario.uri",
        "a password in a URI (https://reader:****@)",
        "Tr0ub4dor3",
    ),
    Bad("bad_secret_query_password.yaml", "cases[0].scenario.uri", "(&password=****)", "Tr0ub4dor3"),
    Bad(
        "bad_secret_env_password.yaml",
        f"{SIM_POD}.env.DB_PASSWORD",
        "under the key 'DB_PASSWORD'",
        "Tr0ub4dor3",
    ),
    Bad("bad_secret_bearer.yaml", f"{PHASE}.evaluate.args[2]", "(Bearer ****)", "abcdef0123456789"),
    Bad("bad_secret_token_option.yaml", f"{PHASE}.report.args[2]", "after '--token'", "c0ffee-d00d-feed"),
    Bad(
        "bad_secret_github_token.yaml",
        "cases[1].parameters.checkout",
        "an API token (ghp_****)",
        "abcdefghij",
    ),
    Bad("bad_secret_private_key.yaml", "cases[1].parameters.tls", "a private key (-----BEGIN RSA", "MIIEow"),
    # found by this corpus: PyYAML's constructor raised ValueError, which the loader let through
    Bad(
        "bad_yaml_impossible_date.yaml", "run.deadline", "at line 6 is no date-time (month must be in 1..12)"
    ),
    Bad("bad_yaml_huge_int.yaml", "cases[0].seed", "has 5000 digits (at most 4300); quote it"),
    # issue 16: no silent changes, the OCI grammar, ids, URIs, deadlines, locations
    Bad("bad_case_id_spaces.yaml", "cases[0].id", "case id ' case-00001' has leading or trailing whitespace"),
    Bad("bad_case_id_cyrillic.yaml", "cases[0].id", "(U+0430 CYRILLIC SMALL LETTER A) at position 1"),
    Bad("bad_case_id_case_collision.yaml", "cases[1].id", "differs from cases[0].id 'case-00001' only in"),
    Bad("bad_build_id_spaces.yaml", "run.build.build_id", "'sim-2026.49.1 ' has leading or trailing"),
    Bad("bad_gpus_yes.yaml", f"{PHASE}.simulate.resources.gpus", "the plain word 'yes' at line 22 is read"),
    Bad("bad_checkpoint_number.yaml", f"{PHASE}.simulate.checkpoint", "must be true or false, got int 1"),
    Bad("bad_parameters_nan.yaml", "cases[0].parameters.ego_speed_kph", "'.nan' at line 54 is not a finite"),
    Bad("bad_parameters_binary.yaml", "cases[0].parameters.weather", "explicit YAML tag !!binary at line 54"),
    Bad(
        "bad_parameters_norway.yaml", "cases[0].parameters.country", "read by YAML 1.1 as false; write false"
    ),
    Bad("bad_parameters_octal.yaml", "cases[0].parameters.mode", "'0755' at line 54 is read by YAML 1.1"),
    Bad("bad_parameters_date.yaml", "cases[0].parameters.day", "is read by YAML as a date; quote it"),
    Bad("bad_list_as_key.yaml", "cases[0].parameters", "is a list; a mapping key is a plain name"),
    Bad("bad_image_empty_component.yaml", "run.build.image", "empty path component"),
    Bad(
        "bad_image_tag_and_digest.yaml", "run.build.image", "the digest pins what runs and the tag would mis"
    ),
    Bad("bad_image_uppercase.yaml", "run.build.image", "invalid path component 'Avsim' (upper case"),
    Bad("bad_uri_metadata.yaml", "cases[0].scenario.uri", "points at a cloud metadata service"),
    Bad("bad_uri_loopback_decimal.yaml", "cases[0].scenario.uri", "points at a loopback address"),
    Bad("bad_uri_file_passwd.yaml", "cases[0].scenario.uri", "is outside the allowed roots"),
    Bad("bad_uri_dotdot.yaml", "cases[0].scenario.uri", "has a '.' or '..' path segment"),
    Bad("bad_deadline_before_week.yaml", "run.deadline", "is before ISO week 2026-W49 starts"),
    Bad("bad_phase_names_differ_in_case.yaml", f"{PHASE}.report", "'report' differs from 'Report' only in"),
    Bad(
        "bad_json_infinity.json", "cases[1].seed", "Infinity is not a JSON number; use a finite number (line"
    ),
    # issue 28: bombs are refused by cheap structural limits, the path cut at the depth limit (200 levels)
    Bad(
        "bad_json_depth_bomb.json",
        "cases[0].parameters" + ".a" * 197,
        "JSON nesting is too deep: more than 200 levels here (a fixed limit); flatten it (line 127, column 1003)",
    ),
    Bad(
        "bad_json_depth_lists.json",
        f"{PHASE}.prepare.args[2]" + "[0]" * 194,
        "JSON nesting is too deep: more than 200 levels here (a fixed limit); flatten it (line 32, column 201)",
    ),
    Bad(
        "bad_yaml_depth_bomb.yaml",
        "cases[0].parameters" + ".a" * 197,
        "YAML nesting is too deep: more than 200 levels here (a fixed limit); flatten it (line 55, column 805)",
    ),
    Bad(
        "bad_yaml_depth_block.yaml",
        "cases[0].parameters" + ".a" * 197,
        "YAML nesting is too deep: more than 200 levels here (a fixed limit); flatten it (line 253, column 401)",
    ),
    Bad(
        "bad_json_huge_number.json",
        "cases[0].parameters.ego_speed_kph",
        "is too large for a float; use a finite number (line 127, column 36)",
    ),
]


def _bad(param: Any) -> Bad:
    return param.values[0] if hasattr(param, "values") else param


def _ids(params: list[Any]) -> list[str]:
    return [_bad(p).file for p in params]


@pytest.fixture(scope="module")
def plan() -> WeeklyPlan:
    return load_plan(ROOT / "dags" / "avsim_graphs.yaml", AvsimSettings(shard_size=10))


def _settings(root: Path, **kw: Any) -> AvsimSettings:
    # The corpus is one fixed week (2026-W49): once it is over, preparing it replays a past week.
    kw.setdefault("manifest_safety", ManifestSafetySettings(allow_past_deadline=True))
    return AvsimSettings(shard_size=10, artifact_root=f"file://{root}", **kw)


def _prepare(source: str, plan: WeeklyPlan, root: Path, run_id: str = "manual__corpus") -> dict[str, Any]:
    return prepare_week(
        source=source, plan=plan, settings=_settings(root), dag_id="avsim_weekly", run_id=run_id
    )


def _problem(problems: tuple[Problem, ...], path: str, says: str) -> Problem:
    assert problems, "a ManifestError without problems"
    assert all(p.message.strip() for p in problems), problems
    found = [p for p in problems if p.path == path and says in p.message]
    assert found, f"no problem at {path!r} saying {says!r}; got:\n" + "\n".join(map(str, problems))
    return found[0]


def test_the_control_is_valid_and_prepares_a_week(plan: WeeklyPlan, tmp_path: Path) -> None:
    prepared = _prepare(str(GOOD), plan, tmp_path / "artifacts")
    assert prepared["run"]["case_count"] == 2 and [s["shard"] for s in prepared["shards"]] == [1]


def test_every_corpus_file_is_in_the_table() -> None:
    on_disk = {p.name for p in CORPUS.iterdir() if p.is_file()} - {GOOD.name}
    assert on_disk == set(_ids(MANIFESTS))
    assert {p.name for p in CONF.iterdir()} == {c[0] for c in WEEKLY_CONFS + SHARD_CONFS} | {
        "shard_good.json"
    }


@pytest.mark.parametrize("param", MANIFESTS, ids=_ids(MANIFESTS))
def test_a_bad_manifest_is_refused_naming_the_field_and_starts_nothing(
    param: Bad, plan: WeeklyPlan, tmp_path: Path
) -> None:
    bad = _bad(param)
    artifacts = tmp_path / "artifacts"
    with pytest.raises(ManifestError) as exc:
        _prepare(str(CORPUS / bad.file), plan, artifacts)
    assert exc.value.source == str(CORPUS / bad.file)
    problem = _problem(exc.value.problems, bad.path, bad.says)
    if bad.file.startswith("bad_secret_"):
        assert problem.message.endswith(USE_A_CONNECTION)
    if bad.secret:
        assert bad.secret in (CORPUS / bad.file).read_text(errors="replace")
        assert bad.secret not in str(exc.value)
    # Nothing was written: no manifest snapshot, no shard cases, so no shard run can start.
    assert not artifacts.exists() or not any(artifacts.rglob("*"))


# ------------------------------------------------------------------------------- a 100 MB file


def _write_100_mb(path: Path) -> int:
    head = GOOD.read_bytes()
    line = b"# " + b"padding " * 127 + b"\n"  # 1 KiB of comment per line
    with path.open("wb") as fh:
        fh.write(head)
        fh.write(line * ((100 * 2**20 - len(head)) // len(line)))
    return path.stat().st_size


@pytest.mark.parametrize("as_uri", [False, True], ids=["path", "file-uri"])
def test_a_100_mb_manifest_is_refused_by_its_size_before_it_is_read(tmp_path: Path, as_uri: bool) -> None:
    path = tmp_path / "week.yaml"
    size = _write_100_mb(path)
    assert size > 100 * 2**20 - 2**10 > DEFAULT_MAX_BYTES
    source = f"file://{path}" if as_uri else str(path)
    load_manifest(f"file://{GOOD}" if as_uri else GOOD)  # imports and caches are not what is measured
    tracemalloc.start()
    try:
        with pytest.raises(ManifestError) as exc:
            load_manifest(source)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [str(p) for p in exc.value.problems] == [
        f"{source} is too large: {size} bytes, the limit is {DEFAULT_MAX_BYTES} bytes; split the week into "
        "several manifests or raise [avsim] max_manifest_bytes"
    ]
    # Refused from the file's size: not even one buffer of the limit's size was allocated.
    assert peak < 4 * 2**20, f"peak {peak} bytes while refusing a {size}-byte file"


def test_a_stream_of_unknown_size_is_read_only_up_to_the_limit(tmp_path: Path) -> None:
    """A source whose size is not known up front (a pipe: stat says 0) is read once, up to the limit."""
    fifo = tmp_path / "week.yaml"
    os.mkfifo(fifo)
    limit = 2**20
    offered = 100 * 2**20
    written = 0

    def feed() -> None:
        nonlocal written
        chunk = b"# " + b"x" * (2**16 - 3) + b"\n"
        try:
            with fifo.open("wb") as fh:
                while written < offered:
                    fh.write(chunk)
                    written += len(chunk)
        except BrokenPipeError:  # the reader stopped at the limit and closed the pipe
            pass

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    tracemalloc.start()
    try:
        with pytest.raises(ManifestError) as exc:
            load_manifest(fifo, max_bytes=limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    writer.join(timeout=30)
    assert [p.message for p in exc.value.problems] == [
        f"{fifo} is too large: more than that, the limit is {limit} bytes; split the week into several "
        "manifests or raise [avsim] max_manifest_bytes"
    ]
    assert written < offered // 10, f"the reader took {written} of {offered} bytes"
    assert peak < 3 * limit, f"peak {peak} bytes for a {limit}-byte limit"


# --------------------------------------------------------------------------------- DAG-run conf

#: (file, the path its problem names, what the message says); for the weekly DAG's conf.
WEEKLY_CONFS = [
    ("weekly_no_manifest.json", "params.manifest", "no manifest given; trigger the DAG with conf"),
    ("weekly_blank_manifest.json", "params.manifest", "no manifest given"),
    ("weekly_manifest_list.json", "params.manifest", "must be a path or URI (a string), got list"),
    ("weekly_manifest_number.json", "params.manifest", "must be a path or URI (a string), got int"),
    ("weekly_manifest_password.json", "params.manifest", "a password in a URI (s3://admin:****@)"),
    ("weekly_manifest_presigned.json", "params.manifest", "an AWS access key id (AKIA****)"),
    ("weekly_manifest_unknown_scheme.json", "params.manifest", "is no location avsim can read"),
    ("weekly_manifest_missing.json", "", "file not found: /nonexistent/avsim/2026-W49.yaml; check the path"),
    ("weekly_manifest_directory.json", "", "/ is a directory; pass the manifest file"),
    ("weekly_manifest_not_a_manifest.json", "", "a manifest is a mapping"),
]
#: The same for the shard DAG's conf ({run_key} and {artifact_root}: a week prepared from the control).
SHARD_CONFS = [
    ("shard_empty.json", "conf.run", "missing or incomplete (needs run_key and artifact_root)"),
    ("shard_not_a_mapping.json", "conf", "must be a mapping; shard runs are started by the weekly run"),
    ("shard_run_incomplete.json", "conf.run", "missing or incomplete"),
    ("shard_run_not_strings.json", "conf.run", "missing or incomplete"),
    ("shard_index_bool.json", "conf.shard", "must be an integer shard index (>= 0), got bool True"),
    ("shard_index_negative.json", "conf.shard", "must be an integer shard index (>= 0), got int -1"),
    ("shard_index_string.json", "conf.shard", "must be an integer shard index (>= 0), got str '1'"),
    ("shard_never_cut.json", "conf.shard", "has no shard 99 under file://"),
    ("shard_other_run.json", "conf.shard", "run 'avsim_weekly__never_started' has no shard 1"),
    ("shard_root_password.json", "conf.run.artifact_root", "a password in a URI (s3://avsim:****@)"),
    ("shard_root_unknown_scheme.json", "conf.run.artifact_root", "is no location avsim can read"),
]


def _conf(name: str, **values: str) -> Any:
    text = (CONF / name).read_text()
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return json.loads(text)


@pytest.mark.parametrize(("name", "path", "says"), WEEKLY_CONFS, ids=[c[0] for c in WEEKLY_CONFS])
def test_a_bad_weekly_conf_is_refused_naming_the_field(
    name: str, path: str, says: str, plan: WeeklyPlan, tmp_path: Path
) -> None:
    conf = _conf(name, corpus=str(CORPUS))
    artifacts = tmp_path / "artifacts"
    settings = _settings(artifacts)
    with pytest.raises(ManifestError) as exc:
        # What the prepare task does with its params, in this order.
        source = manifest_source(conf, settings, None)
        _prepare(source, plan, artifacts)
    _problem(exc.value.problems, path, says)
    assert "Tr0ub4dor3" not in str(exc.value) and "0123456789abcdef" not in str(exc.value)
    assert not artifacts.exists() or not any(artifacts.rglob("*"))


@pytest.fixture(scope="module")
def week(plan: WeeklyPlan, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    artifacts = tmp_path_factory.mktemp("week") / "artifacts"
    run = _prepare(str(GOOD), plan, artifacts)["run"]
    return {"run_key": run["run_key"], "artifact_root": run["artifact_root"]}


@pytest.mark.parametrize(("name", "path", "says"), SHARD_CONFS, ids=[c[0] for c in SHARD_CONFS])
def test_a_bad_shard_conf_is_refused_naming_the_field_by_both_ends_of_the_run(
    name: str, path: str, says: str, plan: WeeklyPlan, week: dict[str, str]
) -> None:
    conf = _conf(name, **week)
    with pytest.raises(ManifestError) as exc:
        tasks.load_shard(conf, plan)
    _problem(exc.value.problems, path, says)
    assert "Tr0ub4dor3" not in str(exc.value)
    # summarize runs whatever happened upstream (all_done): it fails too, without retries.
    with pytest.raises(AirflowFailException) as failed:
        tasks.summarize(conf, plan)
    assert says in str(failed.value)


def test_the_good_shard_conf_loads(plan: WeeklyPlan, week: dict[str, str]) -> None:
    loaded = tasks.load_shard(_conf("shard_good.json", **week), plan)
    assert loaded["shard"] == 1 and [c["case_id"] for c in loaded["cases_standard"]] == [
        "case-00001",
        "case-00002",
    ]
