"""A rerun's report says which run it reruns, whether on that run's pinned build or a new one, and how
its cases ended there and now.

The runs are made as the platform makes them: the original's manifest snapshot from a sample
manifest, the rerun's from :func:`avsim.rerun.plan_rerun` (which sets ``run.rerun_of``), shard
summaries in each run's ledger, and both reports written by ``avsim report``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from avsim.artifacts import RunLayout, run_key_for
from avsim.contracts.week import ShardSummary
from avsim.ledger.store import Ledger
from avsim.manifest.loader import parse_manifest_text
from avsim.manifest.sample import sample_manifest
from avsim.manifest.snapshot import read_head, write_snapshot
from avsim.report.build import build_report, rerun_of
from avsim.report.html import render_html
from avsim.report.rerun import original_report_link, rerun_section
from avsim.rerun import plan_rerun

#: Outcome of each case of the original run, by position in the manifest.
ORIGINAL = ("passed", "infra_failed", "bad_input", "scenario_failed", "preempted")
#: Outcome in the rerun of each case the rerun holds (the original's failures).
RERUN = {1: "passed", 2: "bad_input", 4: "scenario_failed"}
NEW_IMAGE = "registry.example.com/avsim/simulator@sha256:" + "e" * 64


def summary(cases: list[tuple[str, str]]) -> ShardSummary:
    phase = lambda outcome: {"outcome": outcome, "attempt": 1, "duration_seconds": 5.0}  # noqa: E731
    return ShardSummary.model_validate(
        {
            "shard": 1,
            "cases": [
                {"case_id": cid, "graph": "standard", "outcome": out, "phases": {"simulate": phase(out)}}
                for cid, out in cases
            ],
        }
    )


def snapshot(layout: RunLayout, doc: dict[str, Any]) -> None:
    write_snapshot(parse_manifest_text(json.dumps(doc), source="test.json"), layout)


def regenerate(layout: RunLayout) -> dict[str, Any]:
    from avsim.cli import app

    done = CliRunner().invoke(app, ["report", layout.run_key, "--artifact-root", layout.root])
    assert done.exit_code == 0, done.output
    return json.loads(Path(layout.report_dir.removeprefix("file://"), "report.json").read_text())


def html(layout: RunLayout) -> str:
    return Path(layout.report_dir.removeprefix("file://"), "report.html").read_text()


@pytest.fixture
def original(tmp_path: Path) -> tuple[RunLayout, list[str]]:
    """A finished weekly run with its report: one passed case, four that did not pass."""
    layout = RunLayout(f"file://{tmp_path}/art", run_key_for("avsim_weekly", "scheduled__2026-12-07"))
    doc = sample_manifest(len(ORIGINAL), iso_week="2026-W50")
    snapshot(layout, doc)
    ids = [c["id"] for c in doc["cases"]]
    Ledger(layout).write_shard_summary(summary(list(zip(ids, ORIGINAL, strict=True))))
    regenerate(layout)
    return layout, ids


def rerun_of_original(
    original: tuple[RunLayout, list[str]], **build: str
) -> tuple[RunLayout, dict[str, Any]]:
    """``avsim rerun-failed`` up to the trigger: the rerun's manifest snapshotted as its prepare
    does, its cases ended as :data:`RERUN` says, and its report regenerated."""
    layout, ids = original
    plan, doc = plan_rerun(layout, **build)
    rerun = RunLayout(layout.root, run_key_for("avsim_weekly", plan.run_id))
    snapshot(rerun, doc)
    assert rerun_of(read_head(rerun)) == layout.run_key, "the snapshot head names the run it reruns"
    Ledger(rerun).write_shard_summary(summary([(ids[i], out) for i, out in RERUN.items()]))
    return rerun, regenerate(rerun)


def test_a_rerun_on_the_same_pinned_build(original: tuple[RunLayout, list[str]]) -> None:
    layout, _ids = original
    rerun, report = rerun_of_original(original)
    head = read_head(layout)["run"]["build"]
    section = report["rerun"]
    assert section["of"] == layout.run_key and section["build"] == "same"
    assert section["this_build"] == {"build_id": head["build_id"], "image": head["image"]}
    assert (section["original"]["build_id"], section["original"]["image"]) == (
        head["build_id"],
        head["image"],
    )
    assert section["original"]["run_id"] == layout.run_key, "the run id the original's report was made under"
    assert section["outcomes"] == {
        "cases": 3,
        "resolved": 2,
        "still_failing": 1,
        "not_in_original": 0,
        "transitions": {
            "bad_input -> bad_input": 1,
            "infra_failed -> passed": 1,
            "preempted -> scenario_failed": 1,
        },
    }
    page = html(rerun)
    assert (
        f'This run reruns the failed cases of run <a href="{original_report_link(layout.run_key)}">' in page
    )
    assert 'data-rerun-build="same">the same pinned build</b>' in page and head["image"] in page
    assert "2 of 3 rerun cases now have a result" in page and "1 still fail" in page
    assert f"rerun of <code>{layout.run_key}</code>" in page
    # The link is relative to the rerun's report.html and lands on the original's report, both in
    # the artifact store and under the avsim app (/avsim/runs/<key>/report/...).
    here = Path(rerun.report_dir.removeprefix("file://"))
    target = (here / original_report_link(layout.run_key)).resolve()
    assert target == Path(layout.report_dir.removeprefix("file://"), "report.html").resolve()
    assert target.exists()


def test_a_rerun_on_a_new_build_names_both_builds(original: tuple[RunLayout, list[str]]) -> None:
    layout, _ids = original
    rerun, report = rerun_of_original(original, image=NEW_IMAGE, build_id="sim-2026.50.2")
    old = read_head(layout)["run"]["build"]
    section = report["rerun"]
    assert section["build"] == "new"
    assert section["this_build"] == {"build_id": "sim-2026.50.2", "image": NEW_IMAGE}
    assert section["original"]["image"] == old["image"] != NEW_IMAGE
    page = html(rerun)
    assert 'data-rerun-build="new">a new build</b>' in page
    for needle in ("sim-2026.50.2", NEW_IMAGE, old["build_id"], old["image"]):
        assert needle in page, needle


def test_a_rerun_whose_original_run_is_gone_says_the_build_is_not_known(tmp_path: Path) -> None:
    root = f"file://{tmp_path}/art"
    build = {"build_id": "sim-9", "image": "reg/sim@sha256:" + "a" * 64}
    section = rerun_section(root, "avsim_weekly__gone", build, [], lambda uri: None)
    assert section["build"] == "unknown" and section["outcomes"] is None
    assert "runs/avsim_weekly__gone/manifest/head.json cannot be read" in section["message"]
    head = {"run": {"build": build, "rerun_of": "avsim_weekly__gone"}}
    report = build_report(head, [], {}, run_id="rerun__x", generated_at="now")
    assert report["rerun"] == {"of": "avsim_weekly__gone"}
    page = render_html({**report, "rerun": section})
    assert 'data-rerun-build="unknown"' in page and "cannot be read" in page
    assert "The original run has no cases.csv: outcomes not compared." in page


def test_a_weekly_run_is_not_a_rerun(original: tuple[RunLayout, list[str]]) -> None:
    layout, _ids = original
    report = json.loads(Path(layout.report_dir.removeprefix("file://"), "report.json").read_text())
    assert report["rerun"] is None
    assert rerun_of(read_head(layout)) is None
    page = html(layout)
    assert "<h2>Rerun</h2>" not in page and "rerun of" not in page
