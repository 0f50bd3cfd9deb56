"""The ``avsim`` command."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import typer

from avsim.errors import AvsimError, ManifestError

app = typer.Typer(help="avsim: the weekly simulation regression run on Apache Airflow.", no_args_is_help=True)
manifest_app = typer.Typer(help="Write and check weekly manifests.", no_args_is_help=True)
catalog_app = typer.Typer(help="The graph catalog that shapes the weekly DAGs.", no_args_is_help=True)
app.add_typer(manifest_app, name="manifest")
app.add_typer(catalog_app, name="catalog")
pools_app = typer.Typer(help="The Airflow pools the weekly run's phases use.", no_args_is_help=True)
app.add_typer(pools_app, name="pools")


#: The most slots (GPUs, CPUs, shard runs, tasks) a command takes: more is a typo, and the planner's
#: simulation would allocate for each (issue 28: a bad argument is a clear error, not a stalled machine).
MAX_SLOTS = 100_000
#: Cases of a demo week and of one shard: [avsim] max_manifest_cases's default (avsim.manifest.policy).
MAX_CASES = 100_000


def _finite(value: float | None) -> float | None:
    """Refuse nan and inf, which click's FloatRange lets through (nan compares false with any bound)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number; give a number such as 0.5")
    return value


def _fail(exc: Exception) -> None:
    typer.secho(str(exc), fg=typer.colors.RED, err=True)
    raise typer.Exit(code=1)


@manifest_app.command("sample")
def manifest_sample(
    out: Path = typer.Option(..., "--out", "-o", help="Where to write it (.yaml, .yml or .json)."),
    cases: int = typer.Option(
        200, "--cases", "-n", min=1, help="How many cases (at most [avsim] max_manifest_cases)."
    ),
    seed: int = typer.Option(7, help="Seed of the generator (the manifest is deterministic)."),
    time_scale: float = typer.Option(
        0.001,
        callback=_finite,
        help="Fake-simulator seconds per estimated second (0.001: a 30-minute phase runs 1.8 s).",
    ),
    scenario_fail_rate: float = typer.Option(
        0.03, min=0, max=1, callback=_finite, help="Share of scenarios the software fails."
    ),
    crash_rate: float = typer.Option(
        0.0, min=0, max=1, callback=_finite, help="Share of attempts that crash (infrastructure)."
    ),
    iso_week: str = typer.Option(None, help="ISO week, e.g. 2026-W49 (default: this week)."),
) -> None:
    """Write a realistic sample manifest of N cases, within the limits validate applies."""
    from avsim.manifest.policy import deployment_policy
    from avsim.manifest.sample import write_sample

    policy = deployment_policy()
    try:
        write_sample(
            out,
            max_cases=policy.max_cases,
            max_bytes=policy.max_bytes,
            cases=cases,
            seed=seed,
            time_scale=time_scale,
            scenario_fail_rate=scenario_fail_rate,
            crash_rate=crash_rate,
            iso_week=iso_week,
        )
    except (ValueError, AvsimError) as exc:
        _fail(exc)
        return
    typer.echo(f"wrote {out} ({cases} cases)")


@manifest_app.command("validate")
def manifest_validate(
    source: str = typer.Argument(..., help="Path or URI of the manifest."),
    catalog: Path = typer.Option(None, help="Also check it against this graph catalog (the deployed DAG)."),
) -> None:
    """Check a manifest; print every problem with its path and the fix."""
    from avsim.manifest.bounded import load_manifest_bounded

    try:
        # In a child process with the memory and CPU bounds of the weekly run's prepare (docs/security.md).
        loaded = load_manifest_bounded(source)
        families = None
        if catalog is not None:
            from avsim.plan.build import build_plan
            from avsim.plan.catalog import load_catalog
            from avsim.plan.shards import assign_families
            from avsim.settings import AvsimSettings

            families = assign_families(loaded.manifest, build_plan(load_catalog(catalog), AvsimSettings()))
    except AvsimError as exc:
        _fail(exc)
        return
    m = loaded.manifest
    typer.echo(
        f"{source}: valid. {len(m.cases)} cases, {len(m.graphs)} graphs, build {m.run.build.build_id}, "
        f"week {m.run.iso_week}, sha256 {loaded.sha256}"
    )
    if families is not None:
        counts: dict[str, int] = {}
        for f in families:
            counts[f] = counts.get(f, 0) + 1
        typer.echo("families: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))


@manifest_app.command("reference")
def manifest_reference(
    out: Path = typer.Option(None, "--out", "-o", help="Write it here (default: print it)."),
    check: bool = typer.Option(
        False, "--check", help="Do not write: exit 1 if the file given with -o differs from the models."
    ),
) -> None:
    """Render the manifest reference (docs/manifest.md) from the manifest's models (from a checkout)."""
    try:
        # A development tool: in a source checkout, not in the wheel (provider/avsim_docgen).
        from avsim_docgen.manifest_reference import REGENERATE, render_reference
    except ModuleNotFoundError as exc:
        if exc.name != "avsim_docgen":
            raise
        _fail(
            AvsimError("the reference generator is not installed with the package; run this from a checkout")
        )
        return

    text = render_reference()
    if out is None:
        if check:
            _fail(AvsimError("--check needs the file to compare: -o docs/manifest.md"))
        typer.echo(text, nl=False)
    elif check:
        if not out.exists() or out.read_text(encoding="utf-8") != text:
            _fail(AvsimError(f"{out} is not what the manifest's models render; regenerate it: {REGENERATE}"))
        typer.echo(f"{out} is up to date")
    else:
        out.write_text(text, encoding="utf-8")
        typer.echo(f"wrote {out}")


CATALOG_HEADER = """\
# The avsim graph catalog: the phase graphs the weekly DAGs are built from.
# It shapes the DAGs (one mapped task group per graph, one task per phase). Weekly
# manifests restate these graphs and may change commands, arguments, durations,
# timeouts and memory, but not phases, dependencies, resource classes, GPU counts or
# retries: those need a change here, reviewed and deployed with the DAG files.
"""


@catalog_app.command("write")
def catalog_write(
    out: Path = typer.Argument(..., help="Where to write the catalog (YAML)."),
    from_manifest: str = typer.Option(
        None, "--from", help="Take the graphs of this manifest (default: the sample's)."
    ),
) -> None:
    """Write a graph catalog: the graphs and run-level phases of a manifest."""
    import yaml

    if from_manifest:
        from avsim.manifest.bounded import load_manifest_bounded

        try:
            doc = load_manifest_bounded(from_manifest).manifest.model_dump(
                mode="json", by_alias=True, exclude_defaults=True
            )
        except AvsimError as exc:
            _fail(exc)
            return
    else:
        from avsim.manifest.sample import sample_manifest

        doc = sample_manifest(1)
    catalog = {"apiVersion": "avsim/v1", "graphs": doc["graphs"], "run_phases": doc.get("run_phases", {})}
    out.write_text(CATALOG_HEADER + yaml.safe_dump(catalog, sort_keys=False))
    typer.echo(f"wrote {out} ({len(catalog['graphs'])} graphs)")


@app.command("demo")
def demo(
    cases: int = typer.Option(200, "--cases", "-n", min=1, max=MAX_CASES, help="Cases in the demo week."),
    home: Path = typer.Option(Path(".avsim/demo"), help="Airflow home the demo prepares and uses."),
    shard_size: int = typer.Option(50, help="Cases per shard run (S)."),
    max_active_shards: int = typer.Option(2, help="Shard runs active at once (W)."),
    crash_rate: float = typer.Option(
        0.02, min=0, max=1, callback=_finite, help="Share of attempts that crash and are retried."
    ),
    exit_when_done: bool = typer.Option(False, help="Stop Airflow once the report is written."),
) -> None:
    """Run a whole weekly run on this machine with the real Airflow components."""
    from avsim.devstack.demo import run_demo

    try:
        code = run_demo(
            cases=cases,
            home=home,
            shard_size=shard_size,
            max_active_shards=max_active_shards,
            crash_rate=crash_rate,
            exit_when_done=exit_when_done,
        )
    except AvsimError as exc:
        _fail(exc)
        return
    raise typer.Exit(code=code)


def _run_layout(run: str, artifact_root: str | None, dag_id: str) -> Any:
    """The artifact layout of a run named by its run key or its (parent) run id."""
    from avsim.artifacts import RunLayout, run_key_for
    from avsim.settings import load_settings
    from avsim.storage import exists

    root = artifact_root or load_settings().resolved_artifact_root
    for key in (run, run_key_for(dag_id, run)):
        layout = RunLayout(root, key)
        if exists(layout.head_uri):
            return layout
    _fail(
        ManifestError([], source=f"no run {run!r} under {root} (looked for {RunLayout(root, run).head_uri})")
    )


@app.command("report")
def report(
    run: str = typer.Argument(
        ..., help="The run key (runs/<run key>/ in the artifact store) or parent run id."
    ),
    artifact_root: str = typer.Option(None, help="Artifact root URI (default: [avsim] artifact_root)."),
    dag_id: str = typer.Option("avsim_weekly", help="The weekly DAG, to turn a run id into its run key."),
) -> None:
    """Regenerate a run's weekly report from its ledger."""
    from avsim.dagbuild.week_end import write_week_report
    from avsim.storage import exists, path, read_json

    layout = _run_layout(run, artifact_root, dag_id)
    head = read_json(layout.head_uri)
    descriptor = {
        "run_key": layout.run_key,
        "artifact_root": layout.root,
        "run_id": run,
        "manifest_sha256": path(layout.digest_uri).read_text().strip() if exists(layout.digest_uri) else None,
    }
    uris = write_week_report(descriptor, list(head.get("run_phases", {})))
    typer.echo(json.dumps(uris, indent=2))


@app.command("plan")
def plan(
    manifest: str = typer.Argument(..., help="Path or URI of the manifest."),
    gpus: int = typer.Option(..., "--gpus", min=0, max=MAX_SLOTS, help="Spot GPU slots (the GPU spot pool)."),
    cpus: int = typer.Option(
        ..., "--cpus", min=0, max=MAX_SLOTS, help="CPU slots (the CPU pool; one per CPU phase)."
    ),
    on_demand_gpus: int = typer.Option(
        0, "--on-demand-gpus", min=0, max=MAX_SLOTS, help="On-demand GPU slots."
    ),
    deadline: str = typer.Option(
        None, help="Deadline, ISO with zone (default: the manifest's run.deadline)."
    ),
    deadline_hours: float = typer.Option(
        None, "--deadline-hours", min=0, callback=_finite, help="Deadline in hours after the start."
    ),
    start: str = typer.Option(None, help="The run's start, ISO (default: Monday 06:00 UTC of its week)."),
    preemption_rate: float = typer.Option(
        0.0, min=0, callback=_finite, help="Spot preemptions per GPU-hour (0.05: 5 %/hour)."
    ),
    checkpoint_seconds: float = typer.Option(
        300.0, min=1, callback=_finite, help="Work between checkpoints of a phase."
    ),
    failure_rate: float = typer.Option(
        0.0, min=0, max=0.99, callback=_finite, help="Share of attempts failing (infrastructure)."
    ),
    duration_spread: float = typer.Option(
        0.0, min=0, max=0.99, callback=_finite, help="Durations vary by up to ± this share."
    ),
    shard_size: int = typer.Option(
        None, "--shard-size", min=1, max=MAX_CASES, help="S (default: [avsim] shard_size)."
    ),
    max_active_shards: int = typer.Option(
        None, "--max-active-shards", min=1, max=MAX_SLOTS, help="W (default: [avsim] max_active_shards)."
    ),
    shard_logical_dates: bool = typer.Option(
        True,
        help="Shard runs carry increasing logical dates, as avsim triggers them (Airflow orders equal weights by them).",
    ),
    max_active_tasks_per_shard: int = typer.Option(
        None, min=1, max=MAX_SLOTS, help="The shard DAG's max_active_tasks."
    ),
    parallelism: int = typer.Option(
        None, min=1, max=MAX_SLOTS, help="[core] parallelism: most phases running at once."
    ),
    phase_overhead_seconds: float = typer.Option(
        None,
        "--phase-overhead-seconds",
        min=0,
        callback=_finite,
        help="Orchestrator seconds per phase attempt besides its work (default: [avsim] "
        "planner_phase_overhead_seconds, 0).",
    ),
    phase_overhead_in_slot_seconds: float = typer.Option(
        None,
        "--phase-overhead-in-slot-seconds",
        min=0,
        callback=_finite,
        help="Of the overhead, the part a phase holds its slots for (default: all; the rest is latency).",
    ),
    shard_start_seconds: float = typer.Option(
        0.0,
        min=0,
        callback=_finite,
        help="From a window slot freeing to the next shard run's first phases being ready.",
    ),
    run_phases_start_seconds: float = typer.Option(
        0.0,
        min=0,
        callback=_finite,
        help="From the last shard run's end to the run-level phases being ready.",
    ),
    time_scale: float = typer.Option(
        1.0,
        "--time-scale",
        min=1e-9,
        callback=_finite,
        help="Phases work their estimate x this (a demo's fake phases).",
    ),
    seed: int = typer.Option(0, help="Seed of preemptions, failures and durations."),
    cases_in_flight: int = typer.Option(
        None,
        "--cases-in-flight",
        min=0,
        max=MAX_CASES,
        help="Admit shard runs as finished cases make room, up to this many unfinished cases "
        "(default: [avsim] cases_in_flight; 0 derives it from the pools).",
    ),
    window: bool = typer.Option(
        None,
        "--window/--admission",
        help="--admission: shard runs admitted as finished cases make room, up to --cases-in-flight, "
        "of a third of it each (what the weekly run does with [avsim] admission = cases_in_flight, the "
        "default). --window: W whole shard runs of S, the next when one ends ([avsim] admission = "
        "window). Default: as [avsim] admission says.",
    ),
    scheduler_ms_per_task_instance: float = typer.Option(
        None,
        "--scheduler-ms-per-task-instance",
        min=0,
        max=10_000,
        callback=_finite,
        help="The scheduler loop's milliseconds per unfinished task instance (default: [avsim] "
        "scheduler_ms_per_task_instance, 3, this project's test machine); 0: no loop simulated.",
    ),
    max_tis_per_loop: int = typer.Option(
        None,
        "--max-tis-per-loop",
        min=1,
        max=MAX_SLOTS,
        help="Most task instances one loop queues (default: [scheduler] max_tis_per_query).",
    ),
    search: bool = typer.Option(True, help="Search the smallest GPU count that meets the deadline."),
    plot: Path = typer.Option(None, help="Write a PNG of progress over time per strategy here."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of the table."),
) -> None:
    """Simulate the week on given capacity: makespan, lower bound, GPU-hours, GPUs for the deadline."""
    from avsim.planner.command import configured_phase_overhead, configured_scheduler, run_plan
    from avsim.planner.options import Capacity, SimOptions

    try:
        if phase_overhead_seconds is None:
            phase_overhead_seconds = configured_phase_overhead()
        per_loop_setting = "--max-tis-per-loop"
        ms, per_loop = configured_scheduler()
        if scheduler_ms_per_task_instance is None:
            scheduler_ms_per_task_instance = ms
            ms_setting = f"{ms:g} ms ([avsim] scheduler_ms_per_task_instance)"
        else:
            ms_setting = f"{scheduler_ms_per_task_instance:g} ms (--scheduler-ms-per-task-instance)"
        if max_tis_per_loop is None:
            max_tis_per_loop = per_loop
            per_loop_setting = "[scheduler] max_tis_per_query"
        if shard_size is None or max_active_shards is None or cases_in_flight is None or window is None:
            from avsim.settings import load_settings

            configured = load_settings()
            shard_size = shard_size or configured.shard_size
            max_active_shards = max_active_shards or configured.max_active_shards
            if cases_in_flight is None:
                cases_in_flight = configured.cases_in_flight
            if window is None:
                window = configured.admission == "window"
        output = run_plan(
            manifest,
            Capacity(gpus=gpus, cpus=cpus, on_demand_gpus=on_demand_gpus),
            SimOptions(
                shard_size=shard_size,
                max_active_shards=max_active_shards,
                preemption_rate=preemption_rate,
                checkpoint_seconds=checkpoint_seconds,
                failure_rate=failure_rate,
                duration_spread=duration_spread,
                shard_logical_dates=shard_logical_dates,
                max_active_tasks_per_shard=max_active_tasks_per_shard,
                parallelism=parallelism,
                phase_overhead_seconds=phase_overhead_seconds,
                phase_overhead_in_slot_seconds=phase_overhead_in_slot_seconds,
                shard_start_seconds=shard_start_seconds,
                run_phases_start_seconds=run_phases_start_seconds,
                seed=seed,
                scheduler_ms_per_task_instance=scheduler_ms_per_task_instance,
                max_tis_per_loop=max_tis_per_loop,
            ),
            deadline=deadline,
            deadline_hours=deadline_hours,
            start=start,
            search=search,
            plot=plot,
            as_json=as_json,
            time_scale=time_scale,
            cases_in_flight=None if window else cases_in_flight,
            admission_max_active_shards=max_active_shards,
            ms_setting=ms_setting,
            per_loop_setting=per_loop_setting,
        )
    except AvsimError as exc:
        _fail(exc)
        return
    typer.echo(output.text)


@pools_app.command("sync")
def pools_sync(
    capacity_file: Path = typer.Argument(
        ..., help="The capacity file (YAML), e.g. dags/avsim_capacity.yaml."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would change; change nothing."),
) -> None:
    """Create or update the GPU spot, GPU on-demand and CPU pools from a capacity file."""
    from avsim.pools import desired_pools, load_capacity, sync_pools
    from avsim.settings import load_settings

    try:
        changes = sync_pools(desired_pools(load_capacity(capacity_file), load_settings()), dry_run=dry_run)
    except AvsimError as exc:
        _fail(exc)
        return
    for change in changes:
        typer.echo(("(dry run) " if dry_run else "") + str(change))


@app.command("rerun-failed")
def rerun_failed(
    run: str = typer.Argument(..., help="The run key or parent run id whose failed cases to rerun."),
    build: str = typer.Option(
        None,
        "--build",
        help="A new build's image, pinned by digest (repo@sha256:...). Default: the run's own.",
    ),
    build_id: str = typer.Option(None, help="The new build's id (with --build)."),
    artifact_root: str = typer.Option(None, help="Artifact root URI (default: [avsim] artifact_root)."),
    dag_id: str = typer.Option("avsim_weekly", help="The weekly DAG: the run's and the rerun's."),
    dry_run: bool = typer.Option(False, help="Print what would rerun; trigger nothing."),
) -> None:
    """Start a run over only the failed cases: same pins unless --build names a new build; committed
    results are reused, not recomputed."""
    from avsim.rerun import plan_rerun, start_rerun

    layout = _run_layout(run, artifact_root, dag_id)
    try:
        plan, doc = plan_rerun(layout, image=build, build_id=build_id)
        pins = (
            f"new build {plan.build_id} ({plan.image})"
            if plan.new_build
            else f"same pins (build {plan.build_id})"
        )
        typer.echo(
            f"{len(plan.cases)} failed cases of {layout.run_key}: {', '.join(plan.cases[:20])}"
            + (" ..." if len(plan.cases) > 20 else "")
        )
        typer.echo(f"rerun {plan.run_id} of {dag_id} with {pins}; manifest {plan.manifest_uri}")
        if not dry_run:
            start_rerun(plan, doc, dag_id)
            typer.echo("triggered")
    except AvsimError as exc:
        _fail(exc)


breaker_app = typer.Typer(help="The circuit breaker of a simulator build.", no_args_is_help=True)
app.add_typer(breaker_app, name="breaker")


def _breaker(digest: str, artifact_root: str | None) -> Any:
    from avsim.ledger.breaker import Breaker
    from avsim.settings import load_settings

    return Breaker(artifact_root or load_settings().resolved_artifact_root, digest.rsplit("@", 1)[-1])


@breaker_app.command("show")
def breaker_show(
    digest: str = typer.Argument(..., help="The build's image digest (sha256:...) or image reference."),
    artifact_root: str = typer.Option(None, help="Artifact root URI (default: [avsim] artifact_root)."),
) -> None:
    """Print a build's breaker: state, failures in the window, why it opened."""
    doc = _breaker(digest, artifact_root).document()
    typer.echo(
        json.dumps(doc or {"state": "closed", "note": "no finished phase of this build yet"}, indent=2)
    )


@breaker_app.command("reset")
def breaker_reset(
    digest: str = typer.Argument(..., help="The build's image digest (sha256:...) or image reference."),
    artifact_root: str = typer.Option(None, help="Artifact root URI (default: [avsim] artifact_root)."),
) -> None:
    """Close a build's breaker (after fixing what failed); clear the failed tasks to run them again."""
    import getpass

    doc = _breaker(digest, artifact_root).reset(by=getpass.getuser())
    typer.echo(f"breaker of {digest} closed (it was {doc['resets'][-1]['was']})")


service_role_app = typer.Typer(
    help="The least-privilege role of the account avsim's own REST calls log in as (FAB auth manager).",
    no_args_is_help=True,
)
app.add_typer(service_role_app, name="service-role")


@service_role_app.command("show")
def service_role_show(
    dag_id: list[str] = typer.Option(
        None, "--dag-id", help="A DAG the repair clears (default: avsim's four)."
    ),
) -> None:
    """Print the permissions the role gets: the repair's, the deadline tracker's, the pool scaling's."""
    from avsim.service_role import AVSIM_DAG_IDS, service_permissions

    for permission in service_permissions(dag_id or AVSIM_DAG_IDS):
        typer.echo(str(permission))


@service_role_app.command("sync")
def service_role_sync(
    role: str = typer.Option("avsim-service", help="The FAB role to create or update."),
    dag_id: list[str] = typer.Option(
        None, "--dag-id", help="A DAG the repair clears (default: avsim's four)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would change; change nothing."),
) -> None:
    """Create or update the FAB role so that it holds exactly those permissions (docs/deployment.md)."""
    from avsim.service_role import AVSIM_DAG_IDS, service_permissions, sync_role

    changes = sync_role(role, service_permissions(dag_id or AVSIM_DAG_IDS), dry_run=dry_run)
    for line in changes.lines():
        typer.echo(("(dry run) " if dry_run else "") + line)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
