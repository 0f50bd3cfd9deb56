"""What a rerun's report says about the run it reruns: which run, which build, what changed.

``avsim rerun-failed`` starts a run over the failed cases of another run and records that run's key
as ``run.rerun_of`` in the rerun's manifest (so in its snapshot head). The rerun keeps the original's
pinned build unless ``--build`` named a new one. :func:`rerun_section` reads the original run's
snapshot head (its build) and, when it has one, its report (its Airflow run id and ``cases.csv``),
and says whether this run's build is the same pinned build (same image digest) or a new one, and
how the rerun's cases ended against their outcome in the original run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from avsim.artifacts import RunLayout, safe_key
from avsim.phases.contract import RESULTS as RESULT_OUTCOMES
from avsim.phases.contract import values
from avsim.report.cases import from_csv

#: Case outcomes that are results: a rerun case that ends in one no longer needs rerunning.
RESULTS = values(RESULT_OUTCOMES)
SAME, NEW, UNKNOWN = "same", "new", "unknown"


def original_report_link(run_key: str) -> str:
    """The original run's report page, relative to this run's ``report/report.html``.

    Both are under ``runs/<run key>/report/`` in the artifact store and in the avsim app
    (``/avsim/runs/<run key>/report/``), so the same relative link works in both places.
    """
    return f"../../{quote(safe_key(run_key), safe='')}/report/report.html"


def _doc(text: str | None) -> dict[str, Any] | None:
    try:
        doc = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _build_of(head: Mapping[str, Any]) -> dict[str, Any]:
    run = head.get("run") if isinstance(head.get("run"), Mapping) else {}
    build = run.get("build") if isinstance(run, Mapping) and isinstance(run.get("build"), Mapping) else {}
    assert isinstance(build, Mapping)
    return {"build_id": build.get("build_id"), "image": build.get("image")}


def _outcomes(current: Sequence[Mapping[str, Any]], original: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """How each case of the rerun ended against its outcome in the original run."""
    before = {str(r.get("case_id")): str(r.get("outcome") or "") for r in original}
    transitions: dict[str, int] = {}
    resolved = still_failing = not_in_original = 0
    for row in current:
        now = str(row.get("outcome") or "")
        was = before.get(str(row.get("case_id")))
        if was is None:
            not_in_original += 1
            continue
        key = f"{was} -> {now}"
        transitions[key] = transitions.get(key, 0) + 1
        if now in RESULTS:
            resolved += 1
        else:
            still_failing += 1
    return {
        "cases": len(current),
        "resolved": resolved,
        "still_failing": still_failing,
        "not_in_original": not_in_original,
        "transitions": dict(sorted(transitions.items())),
    }


def rerun_section(
    root: str,
    rerun_of: str,
    build: Mapping[str, Any],
    current: Sequence[Mapping[str, Any]],
    read_text: Callable[[str], str | None],
) -> dict[str, Any]:
    """The ``rerun`` section of a rerun's report.

    ``build`` is this run's (``build_id``, ``image``); ``current`` its case rows; ``read_text(uri)``
    returns a document's text, or None when it does not exist.
    """
    original_layout = RunLayout(root, rerun_of)
    original: dict[str, Any] = {
        "run_key": rerun_of,
        "run_id": None,
        "build_id": None,
        "image": None,
        "report": original_report_link(rerun_of),
    }
    section: dict[str, Any] = {
        "of": rerun_of,
        "build": UNKNOWN,
        "this_build": {"build_id": build.get("build_id"), "image": build.get("image")},
        "original": original,
        "outcomes": None,
    }
    head = _doc(read_text(original_layout.head_uri))
    if head is None:
        section["message"] = (
            f"the original run's manifest snapshot {original_layout.head_uri} cannot be read, so whether "
            "this rerun used the same build is not known"
        )
    else:
        original.update(_build_of(head))
        same = bool(original["image"]) and original["image"] == build.get("image")
        section["build"] = SAME if same else NEW
        section["message"] = (
            f"the same pinned build {build.get('build_id')} ({build.get('image')})"
            if same
            else f"a new build {build.get('build_id')} ({build.get('image')}), not the original's "
            f"{original['build_id']} ({original['image']})"
        )
    report = _doc(read_text(f"{original_layout.report_dir}/report.json"))
    if report is not None:
        original["run_id"] = report.get("run_id")
    rows = read_text(f"{original_layout.report_dir}/cases.csv")
    if rows is not None:
        section["outcomes"] = _outcomes(current, from_csv(rows))
    return section
