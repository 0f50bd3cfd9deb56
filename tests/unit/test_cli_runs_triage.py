"""``avsim triage RUN`` on a real file:// artifact root: the table, exit 1 on regressions, one line on errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from avsim.artifacts import RunLayout, run_key_for
from avsim.cli import app
from avsim.phases.contract import Outcome
from avsim.triage.model import (
    BuildSide,
    CaseTriage,
    DeterminismAudit,
    OutputDifference,
    Rerun,
    TriageReport,
    TriageVerdict,
)
from avsim.triage.store import read_triage, triage_uri, write_triage

runner = CliRunner()
THIS = "sha256:" + "b" * 64
LAST = "sha256:" + "a" * 64
RUN_ID = "scheduled__2026-12-07T06:00:00+00:00"


def case(case_id: str, verdict: TriageVerdict, this: list[Outcome | None], last: list[Outcome]) -> CaseTriage:
    reruns = [
        Rerun(
            case_id=case_id,
            build=BuildSide.THIS,
            build_digest=THIS,
            index=i,
            outcome=o,
            reason="" if o else "no GPU node",
        )
        for i, o in enumerate(this, 1)
    ] + [
        Rerun(case_id=case_id, build=BuildSide.LAST, build_digest=LAST, index=i, outcome=o)
        for i, o in enumerate(last, 1)
    ]
    return CaseTriage(
        case_id=case_id,
        failing_phase="simulate",
        reruns=tuple(reruns),
        verdict=verdict,
        reason=f"{verdict.value} because of its reruns",
    )


F, P = Outcome.SCENARIO_FAILED, Outcome.PASSED
CASES = [
    case("flaky-1", TriageVerdict.FLAKY, [F, P], [P]),
    case("env-1", TriageVerdict.ENVIRONMENT, [None, None], []),
    case("reg-1", TriageVerdict.REGRESSION, [F, F], [P]),
]


@pytest.fixture
def store(tmp_path: Path) -> tuple[str, RunLayout]:
    """A weekly run's folder with its snapshot head, as prepare leaves it."""
    root = f"file://{tmp_path / 'store'}"
    layout = RunLayout(root, run_key_for("avsim_weekly", RUN_ID))
    head = Path(layout.head_uri.removeprefix("file://"))
    head.parent.mkdir(parents=True)
    head.write_text(json.dumps({"run": {"iso_week": "2026-W50"}, "graphs": {}, "case_count": 3}))
    return root, layout


def week(layout: RunLayout, cases: list[CaseTriage], **rest: object) -> TriageReport:
    report = TriageReport.of(
        layout.run_key, cases, iso_week="2026-W50", build_digest=THIS, previous_build_digest=LAST, **rest
    )
    write_triage(layout, report)
    return report


def test_regressions_are_listed_first_and_exit_1(store: tuple[str, RunLayout]) -> None:
    root, layout = store
    audit = DeterminismAudit.of(
        600,
        ["p1", "p2", "p3", "p4", "p5"],
        [OutputDifference(case_id="p4", phase="simulate", output="trace.jsonl", first="d1", again="d2")],
    )
    written = week(layout, CASES, audit=audit)
    assert triage_uri(layout) == f"{layout.report_dir}/triage.json"
    assert read_triage(layout) == written
    done = runner.invoke(app, ["triage", RUN_ID, "--artifact-root", root])
    assert done.exit_code == 1, done.output
    lines = done.stdout.splitlines()
    assert (
        lines[0]
        == f"triage of {layout.run_key} (2026-W50): build sha256:bbbbbbbbbbbb against sha256:aaaaaaaaaaaa"
    )
    assert lines[1] == "regression 1 · flaky 1 · environment 1 · not triaged 0"
    assert lines[2].split() == ["verdict", "case", "phase", "reruns", "this", "|", "last", "reason"]
    assert lines[3].split()[:7] == ["regression", "reg-1", "simulate", "fail", "fail", "|", "pass"]
    assert lines[4].split()[:7] == ["flaky", "flaky-1", "simulate", "fail", "pass", "|", "pass"]
    assert lines[5].split()[:6] == ["environment", "env-1", "simulate", "not-started", "not-started", "|"]
    assert lines[6] == "determinism audit: 5 of 600 passed cases rerun, 1 with different outputs (20.0%)"
    assert lines[7] == "  p4 simulate/trace.jsonl: d1 -> d2"
    assert done.stderr == ""


def test_a_week_without_regressions_exits_0_and_a_message_is_said_once(store: tuple[str, RunLayout]) -> None:
    root, layout = store
    week(layout, [c for c in CASES if c.verdict is not TriageVerdict.REGRESSION])
    done = runner.invoke(app, ["triage", layout.run_key, "--artifact-root", root])
    assert done.exit_code == 0, done.output
    week(layout, [], message="nothing to triage: no weekly run recorded for 2026-W49")
    done = runner.invoke(app, ["triage", layout.run_key, "--artifact-root", root])
    assert done.exit_code == 0, done.output
    assert done.stdout.splitlines()[1:] == [
        "regression 0 · flaky 0 · environment 0 · not triaged 0",
        "nothing to triage: no weekly run recorded for 2026-W49",
    ]


def test_a_missing_or_damaged_document_is_one_line_and_exit_1(store: tuple[str, RunLayout]) -> None:
    root, layout = store
    done = runner.invoke(app, ["triage", RUN_ID, "--artifact-root", root])
    assert done.exit_code == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"run {layout.run_key!r} has no triage document ({triage_uri(layout)}): its weekly run writes it "
        "once the week's cases have run once and the newly failing ones were rerun"
    ]
    path = Path(triage_uri(layout).removeprefix("file://"))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"schema": "avsim/triage/v1", "run_key": "k", "counts": {"regression": 1}}))
    done = runner.invoke(app, ["triage", RUN_ID, "--artifact-root", root])
    assert done.exit_code == 1 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert (
        line.startswith(f"{triage_uri(layout)} is not a triage document (")
        and "rerun the week's triage" in line
    )
    path.write_text("{not json")
    done = runner.invoke(app, ["triage", RUN_ID, "--artifact-root", root])
    assert done.exit_code == 1 and len(done.stderr.splitlines()) == 1


def test_the_installed_command_gates_a_release(store: tuple[str, RunLayout]) -> None:
    root, layout = store
    week(layout, CASES)
    gate = subprocess.run(
        [sys.executable, "-m", "avsim.cli", "triage", RUN_ID, "--artifact-root", root],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert gate.returncode == 1, gate.stderr
    assert any(line.split()[:2] == ["regression", "reg-1"] for line in gate.stdout.splitlines())
