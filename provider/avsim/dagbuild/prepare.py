"""``prepare``: the week's manifest checked and snapshotted, its canary picked, its cases cut into
shard runs and described (:func:`prepare_week`), and how the week admits them (:func:`week_admission`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from avsim.artifacts import RunLayout, canary_run_id, run_key_for, shard_run_id, week_index_uri
from avsim.contracts import RunDescriptor, ShardConf
from avsim.contracts.week import CanaryPlan
from avsim.manifest.models import RunClass
from avsim.manifest.source import ManifestSource
from avsim.plan.model import WeeklyPlan
from avsim.plan.shards import ShardPlan, assign_families, cut_shards
from avsim.settings import AvsimSettings
from avsim.storage import exists, read_json, write_json

if TYPE_CHECKING:
    from avsim.contracts import AdmissionPlan
    from avsim.manifest.models import Manifest

log = logging.getLogger(__name__)


def prepare_week(
    *,
    source: str | ManifestSource,
    plan: WeeklyPlan,
    settings: AvsimSettings,
    dag_id: str,
    run_id: str,
    pool_slots: Callable[[], tuple[int | None, int | None]] | None = None,
) -> dict[str, Any]:
    """Load and check the manifest, snapshot it, pick the canary, cut the rest into shards, and
    describe the shard runs.

    Idempotent: a retry finds the same snapshot and shard files and returns the same answer;
    a different manifest under the same run is refused (the snapshot is immutable).

    ``pool_slots`` reads the GPU spot and CPU pools' slots (None each when unknown): admitting by
    cases in flight, the week's target and shard size come from them (:func:`week_admission`).
    """
    from avsim.manifest.bounded import load_manifest_bounded
    from avsim.manifest.policy import check_prepare, policy_from_settings
    from avsim.manifest.snapshot import write_snapshot

    # Parsed and validated in a child process with a memory and CPU ceiling (manifest/bounded.py):
    # a manifest built to exhaust the validator is refused there, and this worker keeps serving.
    given = ManifestSource.of(source)  # a location, or the text pasted into the trigger's conf
    loaded = load_manifest_bounded(given, policy_from_settings(settings))
    manifest = loaded.manifest
    check_prepare(
        manifest, settings, given.name
    )  # the run's URI rules, limits and deadline (manifest/policy.py)
    layout = RunLayout(settings.resolved_artifact_root, run_key_for(dag_id, run_id))
    snapshot = write_snapshot(loaded, layout)
    cut = _cut_week(manifest, plan, settings, layout, pool_slots)
    run = _descriptor(manifest, plan, layout, dag_id, run_id, given.name, snapshot.sha256, cut)
    weekly = plan.run_class is RunClass.WEEKLY and manifest.run.run_class is RunClass.WEEKLY
    if weekly and not manifest.run.rerun_of:
        _record_week(layout, manifest, dag_id, run_id, snapshot.sha256)
    canary = _canary_plan(cut, plan, manifest, run, run_id)
    _log_week(manifest, cut, plan, snapshot.sha256)
    # The shards' summaries, then the canary's: the run-level phases' inputs.
    ordered = [*cut.shards, *([cut.canary_shard] if cut.canary_shard else [])]
    shard_inputs = {f"shard_{s.index:05d}": layout.shard_dir(s.index) for s in ordered}
    return {
        "run": run,
        # XCom ``canary``: the plan's JSON, ``{}`` for a week without a canary stage (contracts.week.canary_plan).
        "canary": canary.to_json() if canary is not None else {},
        "shards": [
            {
                "shard": s.index,
                "trigger_run_id": shard_run_id(run_id, s.index),
                "conf": ShardConf.model_validate({"run": run, "shard": s.index}).to_json(),
            }
            for s in cut.shards
        ],
        "shard_inputs": shard_inputs,
    }


@dataclasses.dataclass(frozen=True)
class _CutWeek:
    """How ``prepare`` cut the week: its admission, shard size, canary shard and shards."""

    admission: AdmissionPlan | None
    shard_size: int
    canary_shard: ShardPlan | None
    shards: list[ShardPlan]
    canary_cases: int

    @property
    def all_shards(self) -> list[ShardPlan]:
        return ([self.canary_shard] if self.canary_shard else []) + self.shards


def _cut_week(
    manifest: Manifest,
    plan: WeeklyPlan,
    settings: AvsimSettings,
    layout: RunLayout,
    pool_slots: Callable[[], tuple[int | None, int | None]] | None,
) -> _CutWeek:
    """Pick the canary, decide admission and the shard size, write each shard's cases (once) and the
    week's planned work."""
    from avsim.plan.canary import select_canary
    from avsim.plan.shards import planned_work

    families = assign_families(manifest, plan)
    spec = manifest.run.canary
    canary_ix = (
        select_canary([c.id for c in manifest.cases], families, spec.share, spec.min_cases)
        if spec.enabled
        else []
    )
    admission, shard_size = week_admission(
        manifest, plan, settings, len(manifest.cases) - len(canary_ix), pool_slots
    )
    first = layout.shard_cases(1)
    if exists(first):  # a retry finds the week cut: shard 1 holds S cases (or all, when it is the only one)
        shard_size = ShardPlan.from_json(read_json(first)).case_count or shard_size
    canary_shard, shards = cut_shards(manifest, families, shard_size, canary_ix)
    cut = _CutWeek(admission, shard_size, canary_shard, shards, len(canary_ix))
    for shard in cut.all_shards:
        uri = layout.shard_cases(shard.index)
        if not exists(uri):
            write_json(uri, shard.to_json())
    work = planned_work(manifest, families)
    write_json(
        layout.plan_uri,
        {**work, "canary_cases": len(canary_ix), "shards": len(shards), "shard_size": shard_size},
    )
    return cut


def _descriptor(
    manifest: Manifest,
    plan: WeeklyPlan,
    layout: RunLayout,
    dag_id: str,
    run_id: str,
    source: str,
    sha256: str,
    cut: _CutWeek,
) -> dict[str, Any]:
    """The run descriptor every later task reads, as JSON."""
    return RunDescriptor(
        run_key=layout.run_key,
        artifact_root=layout.root,
        dag_id=dag_id,
        run_id=run_id,
        manifest_source=source,
        manifest_sha256=sha256,
        build_id=manifest.run.build.build_id,
        image=manifest.run.build.image,
        # The DAG's class decides priority and PriorityClass: an ad-hoc run of a weekly manifest is ad-hoc.
        run_class=plan.run_class,
        iso_week=manifest.run.iso_week,
        case_count=len(manifest.cases),
        shard_count=len(cut.shards),
        canary_count=cut.canary_cases,
        rerun_of=manifest.run.rerun_of,
        shard_size=cut.shard_size,
        admission=cut.admission,
    ).to_json()


def _record_week(layout: RunLayout, manifest: Manifest, dag_id: str, run_id: str, sha256: str) -> None:
    """The week index entry of this ISO week: the report compares the next week with it."""
    write_json(
        week_index_uri(layout.root, manifest.run.iso_week),
        {
            "run_key": layout.run_key,
            "run_id": run_id,
            "dag_id": dag_id,
            "build_id": manifest.run.build.build_id,
            "image": manifest.run.build.image,
            "manifest_sha256": sha256,
            "prepared_at": dt.datetime.now(dt.UTC).isoformat(),
        },
    )


def _canary_plan(
    cut: _CutWeek, plan: WeeklyPlan, manifest: Manifest, run: dict[str, Any], run_id: str
) -> CanaryPlan | None:
    from avsim.plan.shards import CANARY_SHARD

    if cut.canary_shard is None:
        return None
    return CanaryPlan(
        shard=CANARY_SHARD,
        threshold=manifest.run.canary.max_failure_rate,
        cases={
            c["case_id"]: tuple(plan.family(fam).phase_names)
            for fam, entries in cut.canary_shard.by_family.items()
            for c in entries
        },
        trigger_run_id=canary_run_id(run_id),
        conf=ShardConf.model_validate({"run": run, "shard": CANARY_SHARD}),
    )


def _log_week(manifest: Manifest, cut: _CutWeek, plan: WeeklyPlan, sha256: str) -> None:
    admission = cut.admission
    log.info(
        "week %s: %d cases, canary %d, %d shards of at most %d, %s (build %s, manifest sha256 %s)",
        manifest.run.iso_week,
        len(manifest.cases),
        cut.canary_cases,
        len(cut.shards),
        cut.shard_size,
        f"admitted by cases in flight: target {admission.target} (pools: {admission.spot_gpus} spot GPUs, "
        f"{admission.cpus} CPU slots; configured {admission.configured or 'no'})"
        if admission
        else f"a window of {plan.max_active_shards} shard runs",
        manifest.run.build.build_id,
        sha256,
    )


def week_admission(
    manifest: Manifest,
    plan: WeeklyPlan,
    settings: AvsimSettings,
    cases: int,
    pool_slots: Callable[[], tuple[int | None, int | None]] | None,
) -> tuple[AdmissionPlan | None, int]:
    """How the week admits its shard runs, and its shard size (``cases``: the cases outside the canary).

    ``[avsim] admission = window``: none, and shard runs of ``shard_size``. Else the target of cases in
    flight from ``[avsim] cases_in_flight`` or the pools' slots and the manifest's estimates
    (:func:`avsim.plan.admission.admission_plan`), and shard runs of about a third of it
    (:func:`avsim.plan.admission.admission_shard_size`). When the slots cannot be read, the window's W x S
    and shard runs of ``shard_size``: the week runs as the window would have run it."""
    from avsim.plan.admission import admission_plan, admission_shard_size
    from avsim.plan.inflight import comfortable_cases
    from avsim.planner.workload import workload_from_manifest

    if settings.admission == "window":
        return None, plan.shard_size
    spot = cpus = None
    if pool_slots is not None and not settings.cases_in_flight:
        try:
            spot, cpus = pool_slots()
        except Exception as exc:  # the week still runs: admitted by the configured or the window's figure
            log.warning("the pools' slots could not be read (%s): admitting by the window's W x S", exc)
    load = workload_from_manifest(manifest).case_load()
    admission = admission_plan(
        load,
        spot_gpus=spot,
        cpus=cpus,
        configured=settings.cases_in_flight,
        fallback=plan.shard_size * plan.max_active_shards,
        floor=comfortable_cases(load, settings.scheduler_ms_per_task_instance),
    )
    if not settings.cases_in_flight and (spot is None or cpus is None):
        return admission, plan.shard_size  # the window's figure as the target: the window's shard runs
    return admission, admission_shard_size(cases, admission.target, plan.shard_size)
