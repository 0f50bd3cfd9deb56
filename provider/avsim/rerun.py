"""Rerun only the failed cases of a run, cheaply and reproducibly (``avsim rerun-failed``).

The rerun is a new weekly run over a manifest cut from the run's snapshot: the cases whose outcome is
not a result, with the same pins (image digest, seeds, scenario versions, parameters, phase specs), so
every phase that committed a result before reuses it through its cache key. ``--build`` names a new
build (by digest): everything recomputes, and the manifest and the report say so.
docs/design.md, "Artifacts and reproducibility".
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from avsim.artifacts import RunLayout
from avsim.errors import AvsimError
from avsim.phases.contract import RESULTS


@dataclass(frozen=True)
class RerunPlan:
    source_run_key: str
    manifest_uri: str
    run_id: str
    cases: list[str]
    build_id: str
    image: str
    new_build: bool


def failed_cases(layout: RunLayout) -> list[str]:
    """Case ids of the run whose outcome is not a result, from its shard summaries (in case order)."""
    from avsim.ledger.store import Ledger

    summaries = Ledger(layout).shard_summaries()
    if not summaries:
        raise AvsimError(
            f"run {layout.run_key!r} has no shard summaries under {layout.ledger}/shards: it has not finished "
            "a shard yet; wait for it, or clear its failed tasks in the Airflow UI instead"
        )
    return [c.case_id for s in summaries for c in s.cases if c.outcome not in RESULTS]  # results are kept


def rerun_manifest(
    layout: RunLayout, *, image: str | None = None, build_id: str | None = None
) -> tuple[dict[str, Any], list[str]]:
    """The rerun's manifest document and the failed case ids it holds."""
    from avsim.manifest.snapshot import read_snapshot

    loaded = read_snapshot(layout)
    doc = loaded.manifest.model_dump(mode="json", by_alias=True)
    failed = set(failed_cases(layout))
    if not failed:
        raise AvsimError(f"run {layout.run_key!r} has no failed case: nothing to rerun")
    doc["cases"] = [c for c in doc["cases"] if c["id"] in failed]
    run = doc["run"]
    run["rerun_of"] = layout.run_key
    if image:
        if image == run["build"]["image"]:
            raise AvsimError(
                f"--build {image} is the run's own build; leave --build out to rerun with the same pins"
            )
        run["build"] = {"build_id": build_id or f"{run['build']['build_id']}+rebuild", "image": image}
    elif build_id:
        raise AvsimError(
            "--build-id names a new build: give its image with --build IMAGE@sha256:<digest> too"
        )
    # A handful of cases: the canary stage would be the whole rerun; the breaker still guards it.
    run["canary"] = {**run.get("canary", {}), "enabled": False}
    return doc, [c["id"] for c in doc["cases"]]


def plan_rerun(
    layout: RunLayout,
    *,
    image: str | None = None,
    build_id: str | None = None,
    now: dt.datetime | None = None,
) -> tuple[RerunPlan, dict[str, Any]]:
    """Validate the rerun's manifest and say where it goes and what its run is called."""
    from avsim.manifest.validation import validate_manifest

    doc, cases = rerun_manifest(layout, image=image, build_id=build_id)
    validate_manifest(doc, source=f"rerun of {layout.run_key}")
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%SZ")
    uri = f"{layout.root.rstrip('/')}/reruns/{layout.run_key}/{stamp}.json"
    plan = RerunPlan(
        source_run_key=layout.run_key,
        manifest_uri=uri,
        run_id=f"rerun__{stamp}",
        cases=cases,
        build_id=doc["run"]["build"]["build_id"],
        image=doc["run"]["build"]["image"],
        new_build=bool(image),
    )
    return plan, doc


def start_rerun(plan: RerunPlan, doc: dict[str, Any], dag_id: str) -> None:
    """Write the rerun's manifest to the artifact store and trigger the weekly DAG with it."""
    from avsim.storage import write_json

    write_json(plan.manifest_uri, doc)
    from avsim.airflow_internals import trigger_dag_run

    trigger_dag_run(
        dag_id,
        run_id=plan.run_id,
        conf={"manifest": plan.manifest_uri},
        note=f"rerun of the failed cases of {plan.source_run_key}"
        + (f" on build {plan.build_id}" if plan.new_build else " with the same pins"),
    )
