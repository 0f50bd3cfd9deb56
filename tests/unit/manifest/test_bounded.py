"""Bad input costs at most its size (issue 28): bombs are refused by cheap structural limits, in
bounded memory, with the location; prepare validates in a bounded child process; inline manifests
in the DAG-run conf and the CLI's arguments get the same bounds.

The memory assertions run the validator in the test's own subprocess (under a 3 GiB address-space
ceiling, so that a regression cannot take the machine with it) and compare its peak RSS with a
fixed budget: deterministic enough on one run, and no timing.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from avsim.cli import app
from avsim.dagbuild.factory import load_plan
from avsim.dagbuild.prepare import prepare_week
from avsim.errors import ManifestError
from avsim.manifest import bounded, loader
from avsim.manifest.loader import parse_manifest_text
from avsim.manifest.policy import ManifestPolicy
from avsim.manifest.prescan import MAX_DEPTH
from avsim.manifest.source import INLINE_SOURCE, manifest_source
from avsim.settings import AvsimSettings, ManifestSafetySettings

ROOT = Path(__file__).resolve().parents[3]
GOOD = Path(__file__).parents[1] / "corpus" / "good_minimal.yaml"
FLOW = "{ego_speed_kph: 114, weather: overcast}"
CEILING = 3 * 2**30
#: Peak RSS allowed for refusing a 20,000-deep bomb: the interpreter and its imports (~35 MiB here)
#: plus a few MiB; the scanner that kept a path per frame took 2 GB.
DEPTH_BUDGET = 96 * 2**20


def _good_doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(GOOD.read_text())
    doc["run"]["deadline"] = "2026-12-06T18:00:00Z"
    return doc


def json_depth_bomb(depth: int, opener: str = '{"a":', closer: str = "}") -> str:
    doc = _good_doc()
    doc["cases"][0]["parameters"] = "@P@"
    inner = (
        opener * depth + "1" + closer * depth if opener != "[" else '{"a":' + "[" * depth + "]" * depth + "}"
    )
    return json.dumps(doc).replace('"@P@"', inner)


def yaml_depth_bomb(depth: int) -> str:
    return GOOD.read_text().replace(FLOW, "{a: " * depth + "1" + "}" * depth, 1)


PROBE = r"""
import json, sys
from avsim.errors import ManifestError
from avsim.manifest.loader import load_manifest
from avsim.manifest.policy import ManifestPolicy
try:
    load_manifest(sys.argv[1], policy=ManifestPolicy())
    problems = []
except ManifestError as exc:
    problems = [[p.path, p.message] for p in exc.problems]
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec, from the forked copy of pytest.
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) * 1024
print(json.dumps({"rss": hwm, "problems": problems}))
"""


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CEILING, CEILING))


def validate_in_subprocess(path: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(path)],
        capture_output=True,
        text=True,
        preexec_fn=_limit,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("deep.json", lambda: json_depth_bomb(20_000)),
        ("deep_lists.json", lambda: json_depth_bomb(20_000, "[", "]")),
        ("deep.yaml", lambda: yaml_depth_bomb(20_000)),
    ],
)
def test_a_depth_bomb_is_refused_within_a_fixed_memory_budget(tmp_path: Path, name: str, make: Any) -> None:
    path = tmp_path / name
    path.write_text(make())
    result = validate_in_subprocess(path)
    assert result["rss"] < DEPTH_BUDGET, f"peak RSS {result['rss'] / 2**20:.0f} MiB refusing a depth bomb"
    [(where, message)] = result["problems"]
    assert "nesting is too deep: more than 200 levels here (a fixed limit); flatten it (line " in message
    # The path stops at the limit: 200 segments, not 20,000.
    assert where.startswith("cases[0].parameters.a")
    assert 1 + where.count(".") + where.count("[") == MAX_DEPTH


def test_too_many_cases_are_refused_before_any_model_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """The case count is a structural check: the models and the document checks never run."""
    doc = _good_doc()
    doc["cases"] = [{**doc["cases"][0], "id": f"case-{i:05d}"} for i in range(1_001)]
    validated: list[Any] = []
    real = loader.validate_manifest
    monkeypatch.setattr(loader, "validate_manifest", lambda *a, **k: validated.append(1) or real(*a, **k))
    policy = ManifestPolicy(max_cases=1_000)
    for fmt, text in (("json", json.dumps(doc)), ("yaml", yaml.safe_dump(doc))):
        with pytest.raises(ManifestError) as exc:
            parse_manifest_text(text, source=f"week.{fmt}", policy=policy)
        assert [str(p) for p in exc.value.problems] == [
            "cases: 1001 cases, the limit is 1000; split the week into several manifests or raise "
            "[avsim] max_manifest_cases"
        ], fmt
    assert validated == [], "the full validation ran on a manifest its case count refuses"
    doc["cases"] = doc["cases"][:1_000]
    assert (
        len(parse_manifest_text(json.dumps(doc), source="week.json", policy=policy).manifest.cases) == 1_000
    )


def test_nesting_the_c_parser_takes_is_still_held_to_the_limit() -> None:
    """300 levels parse with json.loads (its limit is ~1,000); the structural check refuses them."""
    with pytest.raises(ManifestError) as exc:
        parse_manifest_text(json_depth_bomb(300), source="week.json")
    [problem] = exc.value.problems
    assert problem.path == "cases[0].parameters" + ".a" * 197
    assert problem.message.endswith("flatten it (line 1, column 2643)")


def test_a_wide_and_deep_document_costs_its_walks_no_path_per_node() -> None:
    """199 levels deep, 100,000 mappings wide: the validation walks keep one link per node, not a
    199-segment path (which was 160 MB for this 300 KB document)."""
    import tracemalloc

    doc = _good_doc()
    doc["cases"][0]["parameters"] = "@P@"
    inner = '{"a":' * 190 + "[" + ",".join(['{"x":"\\u0000"}'] * 100_000) + "]" + "}" * 190
    text = json.dumps(doc).replace('"@P@"', inner)
    parse_manifest_text(json.dumps(_good_doc()), source="warm.json")
    tracemalloc.start()
    try:
        with pytest.raises(ManifestError) as exc:
            parse_manifest_text(text, source="week.json")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    messages = [p.message for p in exc.value.problems]
    assert len(messages) == 1001 and messages[-1].startswith("... and at least 2 more problems not shown")
    assert sum("holds a NUL character" in m for m in messages) == 999
    assert peak < 40 * len(text) + 64 * 2**20, f"peak {peak / 2**20:.0f} MiB for {len(text)} bytes"


# --------------------------------------------------------------------------- the bounded process


def _settings(root: Path) -> AvsimSettings:
    return AvsimSettings(
        shard_size=10,
        artifact_root=f"file://{root}",
        manifest_safety=ManifestSafetySettings(allow_past_deadline=True),
    )


@pytest.fixture(scope="module")
def plan() -> Any:
    return load_plan(ROOT / "dags" / "avsim_graphs.yaml", AvsimSettings(shard_size=10))


def test_an_inline_manifest_in_the_conf_prepares_a_week(plan: Any, tmp_path: Path) -> None:
    text = json.dumps(_good_doc())
    settings = _settings(tmp_path / "artifacts")
    source = manifest_source({"manifest": text}, settings, None)
    prepared = prepare_week(
        source=source, plan=plan, settings=settings, dag_id="avsim_weekly", run_id="manual__inline"
    )
    assert prepared["run"]["case_count"] == 2
    assert prepared["run"]["manifest_source"] == INLINE_SOURCE  # not the whole text in XCom
    # decided once, where the parameter is read: its readers ask for its name, format and bytes
    assert (source.text, source.name, source.fmt) == (text, INLINE_SOURCE, None)
    assert source.read(1) == text.encode()  # the text's size was checked by manifest_source
    path = tmp_path / "week.json"
    path.write_text(text)
    located = manifest_source({"manifest": str(path)}, settings, None)
    assert (located.text, located.name, located.fmt, located.read(10**6)) == (
        None,
        str(path),
        "json",
        text.encode(),
    )


def test_an_inline_depth_bomb_is_refused_by_prepare_with_its_location(plan: Any, tmp_path: Path) -> None:
    settings = _settings(tmp_path / "artifacts")
    source = manifest_source({"manifest": json_depth_bomb(100_000)}, settings, None)
    with pytest.raises(ManifestError) as exc:
        prepare_week(source=source, plan=plan, settings=settings, dag_id="avsim_weekly", run_id="manual__b")
    assert exc.value.source == INLINE_SOURCE
    [problem] = exc.value.problems
    assert problem.path == "cases[0].parameters" + ".a" * 197
    assert "JSON nesting is too deep: more than 200 levels here" in problem.message
    assert not (tmp_path / "artifacts").exists() or not any((tmp_path / "artifacts").rglob("*"))


def test_an_inline_manifest_over_the_byte_limit_is_refused_unread(tmp_path: Path) -> None:
    settings = AvsimSettings(artifact_root=f"file://{tmp_path}", max_manifest_bytes=1_000)
    with pytest.raises(ManifestError) as exc:
        manifest_source({"manifest": "{" + " " * 1_000 + "}"}, settings, None)
    assert [str(p) for p in exc.value.problems] == [
        "params.manifest: the inline manifest is too large: 1002 bytes, the limit is 1000 bytes; split the "
        "week into several manifests or raise [avsim] max_manifest_bytes"
    ]


def test_a_validation_over_its_memory_bound_is_refused_and_the_caller_lives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The child's ceiling, made small here (the child needs ~45 MiB of address space to validate
    the control), is what stops it: the caller gets a ManifestError that names the bound."""
    monkeypatch.setattr(bounded, "MEMORY_BASE", 0)
    monkeypatch.setattr(bounded, "ADDRESS_SLACK", 24 * 2**20)
    with pytest.raises(ManifestError) as exc:
        bounded.parse_bounded(GOOD.read_bytes(), "week.yaml", "yaml", None)
    [problem] = exc.value.problems
    assert problem.message.startswith(
        "validating this YAML manifest needs more than 0 MiB, the bound for its"
    )
    assert "(0 MiB + 64 x its" in problem.message


def test_a_width_bomb_past_the_bound_is_stopped_by_the_watchdog() -> None:
    """300,000 wrong items of a typed list (600 KB): pydantic builds an error for each (~1.6 KB), past
    the bound of 256 MiB + 32 x 600 KB. Under the address-space cap alone the child's failed
    allocation inside pydantic-core left it asleep on a lock, and prepare waited forever; the
    watchdog kills it at the bound and the caller gets the refusal."""
    doc = _good_doc()
    doc["cases"][0]["tags"] = [0] * 300_000
    data = json.dumps(doc, separators=(",", ":")).encode()
    with pytest.raises(ManifestError) as exc:
        bounded.parse_bounded(data, "week.json", "json", ManifestPolicy())
    [problem] = exc.value.problems
    bound = bounded.memory_bound(len(data), "json") // 2**20
    assert problem.message.startswith(f"validating this JSON manifest needs more than {bound} MiB, the bound")


def test_the_bounded_validator_runs_under_an_inherited_hard_limit(tmp_path: Path) -> None:
    """A worker with a hard address-space limit below the child's cap (a container's, a ulimit): the
    child keeps the inherited one (it may not raise it) instead of failing; the bench found this at
    60 MB under its 3 GiB ceiling ("ValueError: not allowed to raise maximum limit")."""
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (2**31, 2**31))\n"
        "from avsim.manifest import bounded\n"
        "bounded.MEMORY_BASE = 2**32\n"  # the child's cap would be 8 GiB, above the inherited 2 GiB
        "loaded = bounded.parse_bounded(open(sys.argv[1], 'rb').read(), 'week.yaml', 'yaml', None)\n"
        "print(len(loaded.manifest.cases))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(GOOD)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "2", done.stderr[-1000:]


def test_the_bounded_validator_agrees_with_the_loader() -> None:
    loaded = bounded.parse_bounded(GOOD.read_bytes(), "week.yaml", "yaml", ManifestPolicy())
    direct = parse_manifest_text(GOOD.read_bytes(), source="week.yaml", policy=ManifestPolicy())
    assert loaded.sha256 == direct.sha256 and loaded.manifest == direct.manifest
    bad = GOOD.read_text().replace("seed: 311111475", "seed: '311111475'")
    with pytest.raises(ManifestError) as exc:
        bounded.parse_bounded(bad.encode(), "week.yaml", "yaml", ManifestPolicy())
    assert [p.path for p in exc.value.problems] == ["cases[0].seed"]


def test_one_bounded_load_takes_a_location_or_the_pasted_text(tmp_path: Path) -> None:
    """prepare and the CLI load through load_manifest_bounded: from a path, the format comes from its
    name; from the trigger's pasted text, it is sniffed and problems name the inline source."""
    from avsim.manifest.source import ManifestSource

    policy = ManifestPolicy()
    from_path = bounded.load_manifest_bounded(str(GOOD), policy)
    pasted = bounded.load_manifest_bounded(ManifestSource(text=GOOD.read_text()), policy)
    assert pasted.source == INLINE_SOURCE and from_path.source == str(GOOD)
    assert pasted.sha256 == from_path.sha256
    as_json = tmp_path / "week.json"
    as_json.write_text(GOOD.read_text())  # YAML under a .json name: the name decides, and refuses it
    with pytest.raises(ManifestError) as exc:
        bounded.load_manifest_bounded(ManifestSource.of(str(as_json)), policy)
    assert "JSON syntax error" in exc.value.problems[0].message
    bad = GOOD.read_text().replace("seed: 311111475", "seed: '311111475'")
    with pytest.raises(ManifestError) as exc:
        bounded.load_manifest_bounded(ManifestSource(text=bad), policy)
    assert exc.value.source == INLINE_SOURCE
    assert [p.path for p in exc.value.problems] == ["cases[0].seed"]


# ----------------------------------------------------------------------------------------- CLI

runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["plan", "m.yaml", "--gpus", "1", "--cpus", "1", "--time-scale", "nan"], "'--time-scale'"),
        (["plan", "m.yaml", "--gpus", "1", "--cpus", "1", "--deadline-hours", "inf"], "'--deadline-hours'"),
        (["plan", "m.yaml", "--gpus", "1", "--cpus", "1", "--preemption-rate", "inf"], "'--preemption-rate'"),
        (["plan", "m.yaml", "--gpus", "10000000000", "--cpus", "1"], "'--gpus'"),
        (["plan", "m.yaml", "--gpus", "1", "--cpus", "1", "--parallelism", "99999999999"], "'--parallelism'"),
        (["demo", "--cases", "100000000"], "'--cases'"),
    ],
)
def test_a_bad_cli_argument_is_a_usage_error(args: list[str], says: str) -> None:
    done = runner.invoke(app, args)
    assert done.exit_code == 2, done.output
    assert says in done.output and "Traceback" not in done.output


def test_validate_refuses_a_depth_bomb_with_the_location(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text(json_depth_bomb(20_000))
    done = runner.invoke(app, ["manifest", "validate", str(path)])
    assert done.exit_code == 1, done.output
    assert "cases[0].parameters.a.a" in done.output and "more than 200 levels here" in done.output
    assert len(done.output) < 1_000, "the path is cut at the depth limit"


def test_plan_validates_the_manifest_within_the_same_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """`avsim plan` reads the manifest through the bounded child as `manifest validate` and prepare do:
    with the bound made tiny, it refuses a good manifest naming the bound (in-process it planned it)."""
    monkeypatch.setattr(bounded, "MEMORY_BASE", 0)
    monkeypatch.setattr(bounded, "ADDRESS_SLACK", 24 * 2**20)
    done = runner.invoke(app, ["plan", str(GOOD), "--gpus", "4", "--cpus", "4", "--no-search"])
    assert done.exit_code == 1, done.output
    assert "needs more than 0 MiB, the bound for its" in done.output and "Traceback" not in done.output
