"""The page's finish-against-deadline words: "no estimate yet" without an estimate, never "-0 min"."""

from __future__ import annotations

import json
from pathlib import Path

from avsim.artifacts import RunLayout
from avsim.ui.run_docs import deadline, finish_verdict


def test_no_estimate_says_so() -> None:
    assert finish_verdict(None) == {"state": "none", "text": "no estimate yet"}


def test_minutes_are_whole_and_never_minus_zero() -> None:
    assert finish_verdict(3600.0) == {"state": "late", "text": "60 min late"}
    assert finish_verdict(-5400.0) == {"state": "early", "text": "90 min early"}
    assert finish_verdict(150_000.0)["text"] == "2,500 min late"
    for small in (0.0, -0.0, -29.0, 29.0):
        v = finish_verdict(small)
        assert v == {"state": "on_time", "text": "on time"}
        assert "-0" not in v["text"]


def _layout(tmp_path: Path) -> RunLayout:
    return RunLayout(f"file://{tmp_path}", "avsim_weekly__manual__w49")


def test_a_tracker_document_without_an_estimated_finish_is_no_estimate(tmp_path: Path) -> None:
    """The defect: the tracker had written latest.json with no estimated finish; the page printed
    "estimated finish - (-0 min early)"."""
    layout = _layout(tmp_path)
    target = Path(layout.deadline_latest.removeprefix("file://"))
    target.parent.mkdir(parents=True)
    target.write_text(
        json.dumps({"at": "2026-12-01T10:00:00+00:00", "estimated_finish": None, "deadline": None})
    )
    doc = deadline(layout, "2026-12-06T18:00:00+00:00")
    assert doc["available"] and doc["seconds_late"] is None
    assert doc["deadline"] == "2026-12-06T18:00:00+00:00"
    assert doc["verdict"] == {"state": "none", "text": "no estimate yet"}


def test_without_a_tracker_document_the_verdict_is_no_estimate(tmp_path: Path) -> None:
    doc = deadline(_layout(tmp_path), "2026-12-06T18:00:00+00:00")
    assert doc["available"] is False and doc["verdict"]["state"] == "none"
