"""Issue 16: strings reach the phase byte for byte (hypothesis).

load (YAML or JSON text) -> snapshot (the artifact store) -> the shard's case entry -> the phase's
environment and argv: every argument, env value, scenario field and parameter comes out exactly as
it went in.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from avsim.artifacts import RunLayout
from avsim.attempt import PhaseAttempt, PhaseRuntime
from avsim.contracts.case import CaseEntry
from avsim.manifest.loader import parse_manifest_text
from avsim.manifest.sample import sample_manifest
from avsim.manifest.snapshot import read_snapshot, write_snapshot
from avsim.plan.shards import case_entry

BASE = sample_manifest(1, iso_week="2026-W49")
# What a phase can be given: no NUL, no lone surrogate (both refused with a message), no credentials.
TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20
).filter(lambda s: "://" not in s and "@" not in s and ":" not in s)
SCALAR = st.one_of(
    TEXT,
    st.integers(-(2**63), 2**63),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False, allow_infinity=False),
)
PARAMS = st.dictionaries(
    TEXT,
    st.recursive(
        SCALAR, lambda c: st.lists(c, max_size=3) | st.dictionaries(TEXT, c, max_size=3), max_leaves=8
    ),
    max_size=4,
)


@settings(
    max_examples=40, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
@given(
    args=st.lists(TEXT, max_size=4),
    env=st.dictionaries(st.from_regex(r"\A[A-Z][A-Z0-9_]{0,8}\Z"), TEXT, max_size=3),
    params=PARAMS,
    fmt=st.sampled_from(["json", "yaml"]),
)
def test_strings_reach_the_phase_byte_for_byte(
    tmp_path_factory: Any, args: list[str], env: dict[str, str], params: dict[str, Any], fmt: str
) -> None:
    env = {
        k: v for k, v in env.items() if not k.startswith("AVSIM_") and k not in {"RUN_ID", "PHASE", "SEED"}
    }
    doc = copy.deepcopy(BASE)
    case = doc["cases"][0]
    phase = doc["graphs"][case["graph"]]["phases"]["prepare"]
    phase["args"] = args
    phase.setdefault("pod", {})["env"] = env
    case["parameters"] = params
    text = json.dumps(doc) if fmt == "json" else yaml.safe_dump(doc, allow_unicode=True)
    loaded = parse_manifest_text(text, fmt=fmt)  # type: ignore[arg-type]
    root: Path = tmp_path_factory.mktemp("rt")
    layout = RunLayout(f"file://{root}", "avsim_weekly__rt")
    write_snapshot(loaded, layout)
    snap = read_snapshot(layout)
    head = json.loads(snap.canonical_json)
    entry = CaseEntry.model_validate(
        json.loads(json.dumps(case_entry(snap.manifest.cases[0], case["graph"])))
    )
    runtime = PhaseRuntime.from_spec(entry.phase_spec(head, "prepare"))
    attempt = PhaseAttempt(layout, entry, "prepare", 1, runtime, "b", "i")
    environ = attempt.environment()
    assert attempt.argv[1:] == args
    assert runtime.pod.env == env
    assert json.loads(environ["PARAMETERS"]) == params
    assert environ["SCENARIO_URI"] == case["scenario"]["uri"]
    assert environ["SCENARIO_VERSION"] == case["scenario"]["version"]
