"""The Python callables behind the weekly DAGs' non-phase tasks.

Each is a plain function of explicit arguments, so tests call it without Airflow's
scheduler; :mod:`avsim.dagbuild.weekly` wraps them as TaskFlow tasks.
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
from avsim.errors import AvsimError, ManifestError, Problem
from avsim.manifest.models import RunClass
from avsim.manifest.source import ManifestSource, check_location
from avsim.plan.model import WeeklyPlan
from avsim.plan.shards import ShardPlan, assign_families, cut_shards
from avsim.settings import AvsimSettings
from avsim.storage import exists, read_json, write_json
from avsim.verdict import CASE_OUTCOMES, shard_verdict

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
    (:func:`avsim.plan.admit.admission_plan`), and shard runs of about a third of it
    (:func:`avsim.plan.admit.admission_shard_size`). When the slots cannot be read, the window's W x S
    and shard runs of ``shard_size``: the week runs as the window would have run it."""
    from avsim.plan.admission import comfortable_cases
    from avsim.plan.admit import admission_plan, admission_shard_size
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


def load_shard(conf: dict[str, Any], plan: WeeklyPlan) -> dict[str, Any]:
    """A shard run's first task: check its conf and hand each family group its cases."""
    checked = shard_conf(conf)
    shard = ShardPlan.from_json(read_json(checked.run.layout.shard_cases(checked.shard)))
    unknown = set(shard.by_family) - set(plan.family_names)
    if unknown:
        raise AvsimError(
            f"shard {shard.index} has cases of families {sorted(unknown)} that this DAG version does not "
            f"deploy ({', '.join(plan.family_names)}); the graph catalog changed since the week started"
        )
    out: dict[str, Any] = {"run": checked.run.to_json(), "shard": shard.index}
    for fam in plan.families:
        out[f"cases_{fam.name}"] = shard.by_family.get(fam.name, [])
    return out


def shard_conf(conf: Any) -> ShardConf:
    """A shard run's conf, checked: its run descriptor and its shard index.

    Raises :class:`ManifestError` naming each bad field (``conf.run.run_key``, ``conf.shard``...): a
    shard run started by hand with a conf the weekly run did not write, or for a shard it never cut.
    """
    from pydantic import ValidationError

    where = "shard DAG run conf"
    started_by = "shard runs are started by the weekly run (avsim_weekly), which writes their cases first"
    if not isinstance(conf, dict):
        raise ManifestError([Problem("conf", f"must be a mapping; {started_by}")], source=where)
    problems = []  # the two fields every hand-written conf gets wrong, in words; the model checks the rest
    run = conf.get("run")
    keys = ("run_key", "artifact_root")
    if not isinstance(run, dict) or not all(isinstance(run.get(k), str) and run[k].strip() for k in keys):
        problems.append(
            Problem("conf.run", f"missing or incomplete (needs run_key and artifact_root); {started_by}")
        )
    shard = conf.get("shard")
    if not isinstance(shard, int) or isinstance(shard, bool) or shard < 0:
        shown = f"{type(shard).__name__} {shard!r}"[:80]
        problems.append(Problem("conf.shard", f"must be an integer shard index (>= 0), got {shown}"))
    if problems:
        raise ManifestError(problems, source=where)
    try:
        checked = ShardConf.model_validate(conf)
    except ValidationError as exc:
        problems = [
            Problem(
                ".".join(["conf", *(str(p) for p in err["loc"])]),
                f"{err['msg'].lower()} (got {str(err.get('input'))[:60]!r}); {started_by}",
            )
            for err in exc.errors()
        ]
        raise ManifestError(problems, source=where) from None
    run, index = checked.run, checked.shard
    check_location(run.artifact_root, "conf.run.artifact_root")
    if not exists(run.layout.shard_cases(index)):
        raise ManifestError(
            [
                Problem(
                    "conf.shard",
                    f"run {run.run_key!r} has no shard {index} under {run.layout.root}; {started_by}",
                )
            ],
            source=where,
        )
    return checked


def _sweep_leftover_pods(run: RunDescriptor, case_ids: list[str], began: dt.datetime) -> None:
    """On the Kubernetes backend, delete the pods of the shard's cases that no phase task owns any more
    (:mod:`avsim.kube.pod_sweep`: a phase marked failed or success while deferred, before a
    triggerer took its trigger). A failure to sweep is logged: the summary is still written."""
    from avsim.settings import load_settings

    settings = load_settings()
    if settings.backend != "kubernetes":
        return
    from avsim.kube.pod_sweep import sweep_leftover_pods

    try:
        swept = sweep_leftover_pods(settings.kubernetes, run.run_key, case_ids, began)
    except Exception as exc:  # the cluster's API: the summary matters more than the sweep
        log.error("could not sweep the shard's leftover pods (%s): check the namespace by hand", exc)
        return
    if swept:
        log.warning("deleted %d leftover phase pod(s) of this shard: %s", len(swept), ", ".join(swept))


def _summary_cases(shard: ShardPlan, plan: WeeklyPlan) -> list[dict[str, Any]]:
    """The shard's cases as the summary reads them: id, graph, phases and their dependencies."""
    cases = []
    for fam, entries in shard.by_family.items():
        family = plan.family(fam)
        depends_on = {p.name: list(p.upstream) for p in family.phases}
        phases = list(family.phase_names)
        cases += [
            {"case_id": c["case_id"], "graph": fam, "phases": phases, "depends_on": depends_on}
            for c in entries
        ]
    return cases


def summarize(conf: dict[str, Any], plan: WeeklyPlan) -> dict[str, Any]:
    """A shard run's last task (runs whatever happened): write the shard's summary to the ledger.

    A run whose conf ``load_shard`` refused has nothing to summarize: it fails at once, without retries.
    """
    from avsim.ledger.store import Ledger
    from avsim.ledger.summaries import summarize_shard

    began = dt.datetime.now(dt.UTC)
    try:
        checked = shard_conf(conf)
    except ManifestError as exc:
        from avsim.operators.exceptions import RunRejected

        raise RunRejected(str(exc)) from None
    layout = checked.run.layout
    shard = ShardPlan.from_json(read_json(layout.shard_cases(checked.shard)))
    cases = _summary_cases(shard, plan)
    _sweep_leftover_pods(checked.run, [c["case_id"] for c in cases], began)
    ledger = Ledger(layout)
    summary = summarize_shard(ledger, shard.index, cases)
    counts = dict.fromkeys(CASE_OUTCOMES, 0)
    for case in summary.cases:
        counts[case.outcome_name] = counts.get(case.outcome_name, 0) + 1
    verdict = shard_verdict(summary)
    summary = summary.model_copy(
        update={
            "counts": {"cases": len(summary.cases), **counts},
            "verdict": verdict.line(),
            # The canary gate takes a summary written before its round began as the last round's.
            "written_at": dt.datetime.now(dt.UTC).isoformat(),
        }
    )
    ledger.write_shard_summary(summary)
    log.info("shard %d: %s", shard.index, summary.counts)
    if exists(f"{layout.report_dir}/report.json"):
        # The week already has its report, so this is a rerun (an engineer cleared failed phases of
        # this shard): bring the weekly report up to date with it.
        log.info("the week's report exists: refreshing it with shard %d's rerun", shard.index)
        from avsim.dagbuild.week_end import write_week_report

        head = read_json(layout.head_uri)
        write_week_report(checked.run.to_json(), list(head.get("run_phases", {})))
    if verdict.needs_attention:
        # The summary (and the report) are written: the shard run ends failed so the failure shows on
        # the weekly run, and "Clear → Only failed" there reruns these cases (avsim.verdict).
        from avsim.operators.exceptions import ShardNeedsAttention

        raise ShardNeedsAttention(verdict.line())
    log.info("%s", verdict.line())
    return dict(summary.counts)


def start_triage(
    run: dict[str, Any], plan: WeeklyPlan, settings: AvsimSettings, shard_dag_id: str
) -> list[str]:
    """``triage_start``: decide the round (:func:`avsim.triage.start.start_round`) and start its shard
    runs (one already there is left as it is); returns every triage run's id."""
    from avsim.airflow_internals import start_dag_run_from_task
    from avsim.triage.runs import shard_conf
    from avsim.triage.start import start_round

    week = RunDescriptor.model_validate(run)
    _, runs = start_round(week, plan, settings.triage)
    for r in runs:
        created = start_dag_run_from_task(
            shard_dag_id, r.run_id, conf=shard_conf(week, r), note=f"triage of {week.run_key}: {r.label}"
        )
        log.info(
            "triage run %s %s (%s build)", r.run_id, "started" if created else "already there", r.build.value
        )
    return [r.run_id for r in runs]
