"""The commands on a deployment's runs and state: report, triage, rerun-failed, pools, breaker, service-role."""

from __future__ import annotations

import difflib
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any

import typer

from avsim.cli_common import new_typer
from avsim.errors import AvsimError

pools_app = new_typer("The Airflow pools the weekly run's phases use.")
breaker_app = new_typer("The circuit breaker of a simulator build.")
service_role_app = new_typer(
    "The least-privilege role of the account avsim's own REST calls log in as (FAB auth manager)."
)

ArtifactRoot = typer.Option(None, help="Artifact root URI (default: [avsim] artifact_root).")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_DAG_ID = re.compile(r"[\w.-]{1,250}")


def _root(artifact_root: str | None) -> str:
    from avsim.settings import load_settings

    return artifact_root or load_settings().resolved_artifact_root


def run_layout(run: str, artifact_root: str | None, dag_id: str) -> Any:
    """The artifact layout of a run named by its run key or its (parent) run id."""
    from avsim.artifacts import RunLayout, run_key_for
    from avsim.storage import exists

    root = _root(artifact_root)
    for key in (run, run_key_for(dag_id, run)):
        layout = RunLayout(root, key)
        if exists(layout.head_uri):
            return layout
    raise AvsimError(
        f"no run {run!r} under {root}: neither it nor its run key {run_key_for(dag_id, run)!r} "
        f"has a manifest snapshot (looked for {RunLayout(root, run).head_uri})"
    )


def report(
    run: str = typer.Argument(
        ..., help="The run key (runs/<run key>/ in the artifact store) or parent run id."
    ),
    artifact_root: str = ArtifactRoot,
    dag_id: str = typer.Option("avsim_weekly", help="The weekly DAG, to turn a run id into its run key."),
) -> None:
    """Regenerate a run's weekly report from its ledger."""
    from avsim.dagbuild.week_end import write_week_report
    from avsim.storage import exists, path, read_json

    layout = run_layout(run, artifact_root, dag_id)
    head = read_json(layout.head_uri)
    descriptor = {
        "run_key": layout.run_key,
        "artifact_root": layout.root,
        "run_id": run,
        "manifest_sha256": path(layout.digest_uri).read_text().strip() if exists(layout.digest_uri) else None,
    }
    uris = write_week_report(descriptor, list(head.get("run_phases", {})))
    typer.echo(json.dumps(uris, indent=2))


def triage(
    run: str = typer.Argument(..., help="The run key or parent run id whose triage to print."),
    artifact_root: str = ArtifactRoot,
    dag_id: str = typer.Option("avsim_weekly", help="The weekly DAG, to turn a run id into its run key."),
) -> None:
    """Print the verdicts on a week's newly failing cases (report/triage.json); exit 1 when any is a
    regression, so a release gate can run it."""
    from avsim.triage.store import read_triage
    from avsim.triage.text import render

    found = read_triage(run_layout(run, artifact_root, dag_id))
    typer.echo(render(found))
    if found.regressions:
        raise typer.Exit(code=1)


def rerun_failed(
    run: str = typer.Argument(..., help="The run key or parent run id whose failed cases to rerun."),
    build: str = typer.Option(
        None,
        "--build",
        help="A new build's image, pinned by digest (repo@sha256:...). Default: the run's own.",
    ),
    build_id: str = typer.Option(None, help="The new build's id (with --build)."),
    artifact_root: str = ArtifactRoot,
    dag_id: str = typer.Option("avsim_weekly", help="The weekly DAG: the run's and the rerun's."),
    dry_run: bool = typer.Option(False, help="Print what would rerun; trigger nothing."),
) -> None:
    """Start a run over only the failed cases: same pins unless --build names a new build; committed
    results are reused, not recomputed."""
    from avsim.rerun import plan_rerun, start_rerun

    layout = run_layout(run, artifact_root, dag_id)
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


@pools_app.command("sync")
def pools_sync(
    capacity_file: Annotated[
        Path, typer.Argument(help="The capacity file (YAML), e.g. dags/avsim_capacity.yaml.")
    ],
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would change; change nothing."),
) -> None:
    """Create or update the GPU spot, GPU on-demand and CPU pools from a capacity file."""
    from avsim.pools import desired_pools, load_capacity, sync_pools
    from avsim.settings import load_settings

    changes = sync_pools(desired_pools(load_capacity(capacity_file), load_settings()), dry_run=dry_run)
    for change in changes:
        typer.echo(("(dry run) " if dry_run else "") + str(change))


# ---------------------------------------------------------------------------------------- breaker


def build_digest(reference: str) -> str:
    """The digest of ``sha256:<64 hex>`` or of an image reference pinned by it."""
    if "@" in reference:
        from avsim.manifest.image_ref import parse_image

        try:
            return parse_image(reference).digest
        except ValueError as exc:
            raise AvsimError(str(exc)) from None
    if not _DIGEST.fullmatch(reference):
        raise AvsimError(
            f"{reference!r} is not a build's digest: give sha256: and 64 lowercase hex digits, "
            "or the image reference repo@sha256:..."
        )
    return reference


def _breaker_names(root: str) -> list[str]:
    """The names of the breaker documents under ``root`` (one per build that finished a phase)."""
    from avsim.storage import local_path, path

    folder = f"{root.rstrip('/')}/breakers"
    local = local_path(folder)
    try:
        names = os.listdir(local) if local is not None else [p.name for p in path(folder).iterdir()]
    except FileNotFoundError:
        return []
    return sorted(n.removesuffix(".json") for n in names if n.endswith(".json"))


def known_breaker(reference: str, artifact_root: str | None) -> Any:
    """The breaker of a build that has one; a digest no phase of any run has finished with is refused."""
    from avsim.artifacts import safe_key
    from avsim.ledger.breaker import Breaker

    root = _root(artifact_root)
    digest = build_digest(reference)
    breaker = Breaker(root, digest)
    if breaker.document() is not None:
        return breaker
    close = difflib.get_close_matches(safe_key(digest), _breaker_names(root), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(c.replace('_', ':', 1) for c in close)}?" if close else ""
    raise AvsimError(f"no build {digest} under {root}: no phase of it has finished there{hint}")


@breaker_app.command("show")
def breaker_show(
    digest: str = typer.Argument(..., help="The build's image digest (sha256:...) or image reference."),
    artifact_root: str = ArtifactRoot,
) -> None:
    """Print a build's breaker: state, failures in the window, why it opened."""
    typer.echo(json.dumps(known_breaker(digest, artifact_root).document(), indent=2))


@breaker_app.command("reset")
def breaker_reset(
    digest: str = typer.Argument(..., help="The build's image digest (sha256:...) or image reference."),
    artifact_root: str = ArtifactRoot,
) -> None:
    """Close a build's breaker (after fixing what failed); clear the failed tasks to run them again."""
    import getpass

    doc = known_breaker(digest, artifact_root).reset(by=getpass.getuser())
    typer.echo(f"breaker of {digest} closed (it was {doc['resets'][-1]['was']})")


# ----------------------------------------------------------------------------------- service role


def _dag_ids(values: list[str] | None) -> list[str] | None:
    for value in values or []:
        if not _DAG_ID.fullmatch(value):
            raise AvsimError(f"--dag-id {value!r} is not a DAG id (letters, digits, '_', '.', '-')")
    return values


DagIds = typer.Option(
    None, "--dag-id", callback=_dag_ids, help="A DAG the repair clears (default: avsim's four)."
)


@service_role_app.command("show")
def service_role_show(dag_id: list[str] = DagIds) -> None:
    """Print the permissions the role gets: the repair's, the deadline tracker's, the pool scaling's."""
    from avsim.service_role import AVSIM_DAG_IDS, service_permissions

    for permission in service_permissions(dag_id or AVSIM_DAG_IDS):
        typer.echo(str(permission))


@service_role_app.command("sync")
def service_role_sync(
    role: str = typer.Option("avsim-service", help="The FAB role to create or update."),
    dag_id: list[str] = DagIds,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would change; change nothing."),
) -> None:
    """Create or update the FAB role so that it holds exactly those permissions (docs/deployment.md)."""
    from avsim.service_role import AVSIM_DAG_IDS, service_permissions, sync_role
    from avsim.settings import airflow_config

    manager = airflow_config("core", "auth_manager", "")
    if not manager.endswith(".FabAuthManager"):
        raise AvsimError(
            f"[core] auth_manager is {manager or 'not set'}: roles are the FAB auth manager's "
            "(airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager)"
        )
    changes = sync_role(role, service_permissions(dag_id or AVSIM_DAG_IDS), dry_run=dry_run)
    for line in changes.lines():
        typer.echo(("(dry run) " if dry_run else "") + line)
