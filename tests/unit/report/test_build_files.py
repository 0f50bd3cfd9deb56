"""The report's files: cases.csv, the SVG plots, the comparison with the previous week, `avsim report`."""

from __future__ import annotations

import csv
import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from tests.support.report_week import HEAD, SUMMARY, build, day, read, week_layout, write
from typer.testing import CliRunner

from avsim.artifacts import RunLayout, week_index_uri
from avsim.contracts.week import ShardSummary
from avsim.report.build import write_report
from avsim.report.cases import from_csv, to_csv
from avsim.report.compare import compare_cases, previous_iso_week

#: Last week: c-1 failed (now passes), c-2 passed (now fails), case 4 under its old id, c-9 dropped.
PREVIOUS_CSV = [
    {"case_id": "c-1", "scenario_uri": "s3://scn/1.json", "outcome": "infra_failed"},
    {"case_id": "c-2", "scenario_uri": "s3://scn/2.json", "outcome": "passed"},
    {"case_id": "c-3", "scenario_uri": "s3://scn/3.json", "outcome": "infra_failed"},
    {"case_id": "c-4", "scenario_uri": "s3://scn/4.json", "outcome": "bad_input"},
    {"case_id": "c-9", "scenario_uri": "s3://scn/9.json", "outcome": "passed"},
]


@pytest.fixture
def layout(tmp_path: Path) -> RunLayout:
    return week_layout(tmp_path)


def with_previous_week(layout: RunLayout) -> None:
    prev = RunLayout(layout.root, "avsim_weekly__w49")
    index = {"run_key": prev.run_key, "run_id": "w49", "dag_id": "avsim_weekly", "build_id": "sim-49"}
    write(week_index_uri(layout.root, "2026-W49"), json.dumps({**index, "manifest_sha256": "9" * 64}))
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=["case_id", "scenario_uri", "outcome"])
    w.writeheader()
    w.writerows(PREVIOUS_CSV)
    write(f"{prev.report_dir}/cases.csv", out.getvalue())


def test_cases_csv_has_one_row_per_case_with_scenario_failing_phase_and_durations(layout: RunLayout) -> None:
    uris = write_report(layout, build())
    rows = {r["case_id"]: r for r in csv.DictReader(io.StringIO(read(uris["csv"])))}
    assert list(rows) == ["c-1", "c-2", "c-3", "c-4-renamed"]
    c3 = rows["c-3"]
    assert (c3["outcome"], c3["failing_phase"], c3["failing_class"], c3["reason"]) == (
        "infra_failed",
        "simulate",
        "infra_failed",
        "OOMKilled",
    )
    assert (c3["attempts"], c3["retried_phases"]) == ("5", "1")
    assert (c3["scenario_uri"], c3["scenario_version"]) == ("s3://scn/3.json", "v3")
    c1 = rows["c-1"]
    assert (c1["failing_phase"], c1["prepare_seconds"], c1["simulate_seconds"]) == ("", "60.0", "1800.0")
    assert c1["gpu_seconds"] == "3600.0", "simulate holds 2 GPUs for 1800 s (from the head's graph)"
    assert (c1["started_at"], c1["finished_at"]) == (day(6), day(6, 31))


def test_gpu_seconds_and_timeline() -> None:
    r = build()
    assert r["gpu_seconds"] == {"total": 2 * (1800 + 900 + 10 + 600), "by_graph": {"standard": 6620.0}}
    assert r["timeline"] == [[day(6, 16), 1], [day(6, 31), 2], [day(8), 3], [day(9, 11), 4]]


def test_plots_are_svg_documents_of_the_data(layout: RunLayout) -> None:
    uris = write_report(layout, build())
    for key in ("progress", "durations", "failures"):
        root = ET.fromstring(read(uris[key]))
        assert root.tag.endswith("svg"), key
    assert "cases finished" in read(uris["progress"]) and "deadline" in read(uris["progress"])
    assert "simulate (4)" in read(uris["durations"])
    failures = read(uris["failures"])
    assert "scenario_failed" in failures and "infra_failed" in failures and "bad_input" not in failures


def test_comparison_with_the_previous_week(layout: RunLayout) -> None:
    with_previous_week(layout)
    uris = write_report(layout, build())
    comp = json.loads(read(uris["json"]))["comparison"]
    assert comp["available"] and comp["week"] == "2026-W49"
    assert comp["previous"]["build_id"] == "sim-49" and comp["previous"]["manifest_sha256"] == "9" * 64
    assert [(e["case_id"], e["previous_outcome"], e["outcome"]) for e in comp["newly_failing"]] == [
        ("c-2", "passed", "scenario_failed")
    ]
    assert [(e["case_id"], e["previous_case_id"], e["matched_by"]) for e in comp["newly_passing"]] == [
        ("c-1", "c-1", "case_id"),
        ("c-4-renamed", "c-4", "scenario_uri"),
    ]
    assert comp["counts"] == {
        "matched": 4,
        "by_case_id": 3,
        "by_scenario_uri": 1,
        "new": 0,
        "still_failing": 1,
        "dropped": 1,
        "newly_failing": 1,
        "newly_passing": 2,
    }
    page = read(uris["html"])
    for needle in ("sim-49", "9" * 64, "sim-50", "5" * 64, "Newly failing (1)", "s3://scn/2.json"):
        assert needle in page, needle


def test_no_previous_week_says_why(layout: RunLayout) -> None:
    uris = write_report(layout, build())
    comp = json.loads(read(uris["json"]))["comparison"]
    assert comp["available"] is False and "no weekly run recorded for 2026-W49" in comp["message"]
    assert "No comparison: no weekly run recorded for 2026-W49" in read(uris["html"])


def test_previous_iso_week_across_years() -> None:
    assert previous_iso_week("2026-W50") == "2026-W49"
    assert previous_iso_week("2026-W01") == "2025-W52"
    assert previous_iso_week("2021-W01") == "2020-W53"
    assert previous_iso_week("not a week") is None


def test_csv_round_trip_keeps_every_column() -> None:
    rows = build()["cases"]
    back = from_csv(to_csv(rows))
    assert [r["case_id"] for r in back] == [r["case_id"] for r in rows]
    assert compare_cases(rows, back)["counts"]["newly_failing"] == 0


def test_avsim_report_regenerates_every_file(layout: RunLayout, monkeypatch: pytest.MonkeyPatch) -> None:
    from avsim.cli import app
    from avsim.ledger.store import Ledger

    write(layout.head_uri, json.dumps(HEAD))
    write(layout.digest_uri, "5" * 64 + "\n")
    Ledger(layout).write_shard_summary(ShardSummary.model_validate(SUMMARY))
    with_previous_week(layout)
    done = CliRunner().invoke(app, ["report", layout.run_key, "--artifact-root", layout.root])
    assert done.exit_code == 0, done.output
    folder = Path(layout.report_dir.removeprefix("file://"))
    assert sorted(p.name for p in folder.iterdir()) == [
        "cases.csv",
        "durations.svg",
        "failures.svg",
        "progress.svg",
        "report.html",
        "report.json",
    ]
    doc = json.loads((folder / "report.json").read_text())
    assert doc["manifest_sha256"] == "5" * 64 and doc["comparison"]["counts"]["newly_passing"] == 2
