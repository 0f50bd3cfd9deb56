"""A week's report inputs: a run's head, one shard's summary of four cases with known outcomes and
times, and the shard's case list, written to a file:// run layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from avsim.artifacts import RunLayout
from avsim.contracts.week import ShardSummary
from avsim.report.build import build_report

HEAD: dict[str, Any] = {
    "run": {
        "name": "weekly_regression",
        "iso_week": "2026-W50",
        "deadline": "2026-12-13T18:00:00+00:00",
        "build": {"build_id": "sim-50", "image": "reg/sim@sha256:" + "b" * 64},
    },
    "graphs": {
        "standard": {
            "phases": {
                "prepare": {"resources": {"class": "cpu", "gpus": 0}},
                "simulate": {"resources": {"class": "gpu", "gpus": 2}},
            }
        }
    },
    "run_phases": {"weekly_summary": {}},
    "case_count": 4,
}


def entry(
    outcome: str, seconds: float | None, start: str | None, end: str | None, **kw: Any
) -> dict[str, Any]:
    return {
        "outcome": outcome,
        "attempt": kw.get("attempt", 1),
        "attempts": kw.get("attempts", 1),
        "output_uri": "",
        "reason": kw.get("reason", ""),
        "duration_seconds": seconds,
        "started_at": start,
        "ended_at": end,
    }


def day(h: int, m: int = 0) -> str:
    return f"2026-12-08T{h:02d}:{m:02d}:00+00:00"


SUMMARY = {
    "shard": 0,
    "cases": [
        {
            "case_id": "c-1",
            "graph": "standard",
            "outcome": "passed",
            "phases": {
                "prepare": entry("passed", 60, day(6), day(6, 1)),
                "simulate": entry("passed", 1800, day(6, 1), day(6, 31), attempts=2),
            },
        },
        {
            "case_id": "c-2",
            "graph": "standard",
            "outcome": "scenario_failed",
            "phases": {
                "prepare": entry("passed", 60, day(6), day(6, 1)),
                "simulate": entry("scenario_failed", 900, day(6, 1), day(6, 16), reason="collision"),
            },
        },
        {
            "case_id": "c-3",
            "graph": "standard",
            "outcome": "infra_failed",
            "phases": {
                "prepare": entry("passed", 30, day(7), day(7, 0)),
                "simulate": entry("infra_failed", 10, day(8), day(8, 0), attempts=4, reason="OOMKilled"),
            },
        },
        {
            "case_id": "c-4-renamed",
            "graph": "standard",
            "outcome": "passed",
            "phases": {
                "prepare": entry("passed", 60, day(9), day(9, 1)),
                "simulate": entry("passed", 600, day(9, 1), day(9, 11)),
            },
        },
    ],
}
SHARD_CASES = {
    "shard": 0,
    "by_family": {
        "standard": [
            {"case_id": f"c-{i}", "scenario_uri": f"s3://scn/{i}.json", "scenario_version": "v3"}
            for i in (1, 2, 3)
        ]
        + [{"case_id": "c-4-renamed", "scenario_uri": "s3://scn/4.json", "scenario_version": "v3"}]
    },
}


def write(uri: str, text: str) -> None:
    p = Path(uri.removeprefix("file://"))
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def week_layout(tmp_path: Path) -> RunLayout:
    """The run's layout under ``tmp_path``, with the shard's case list written."""
    layout = RunLayout(f"file://{tmp_path}/art", "avsim_weekly__w50")
    write(layout.shard_cases(0), json.dumps(SHARD_CASES))
    return layout


def build() -> dict[str, Any]:
    return build_report(
        HEAD,
        [ShardSummary.model_validate(SUMMARY)],
        {},
        run_id="w50",
        generated_at="2026-12-09",
        manifest_sha256="5" * 64,
    )


def read(uri: str) -> str:
    return Path(uri.removeprefix("file://")).read_text()
