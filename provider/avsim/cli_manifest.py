"""``avsim manifest`` (sample, validate, reference) and ``avsim catalog write``."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from avsim.cli_common import finite, new_typer
from avsim.errors import AvsimError

manifest_app = new_typer("Write and check weekly manifests.")
catalog_app = new_typer("The graph catalog that shapes the weekly DAGs.")

CATALOG_HEADER = """\
# The avsim graph catalog: the phase graphs the weekly DAGs are built from.
# It shapes the DAGs (one mapped task group per graph, one task per phase). Weekly
# manifests restate these graphs and may change commands, arguments, durations,
# timeouts and memory, but not phases, dependencies, resource classes, GPU counts or
# retries: those need a change here, reviewed and deployed with the DAG files.
"""


def write_sample_to(out: str, **kw: object) -> None:
    """Write a sample manifest to a path or an object-storage URI (``s3://conn@bucket/key``)."""
    from avsim.manifest.sample import write_sample
    from avsim.storage import local_path, path

    local = local_path(out)
    try:
        if local is not None:
            write_sample(local, **kw)  # type: ignore[arg-type]
            return
        with tempfile.TemporaryDirectory(prefix="avsim-sample-") as tmp:
            written = write_sample(Path(tmp) / Path(out).name, **kw)  # type: ignore[arg-type]
            # No mkdir: an object store has no folders, and s3fs's would create a missing bucket.
            try:
                path(out).write_bytes(written.read_bytes())
            except OSError as exc:
                raise AvsimError(f"cannot write {out}: {exc}") from None
    except ValueError as exc:
        raise AvsimError(str(exc)) from None


@manifest_app.command("sample")
def manifest_sample(
    out: str = typer.Option(
        ...,
        "--out",
        "-o",
        help="Where to write it: a path or an object-storage URI such as "
        "s3://conn_id@bucket/manifests/week.yaml (named .yaml, .yml or .json).",
    ),
    cases: int = typer.Option(
        200, "--cases", "-n", min=1, help="How many cases (at most [avsim] max_manifest_cases)."
    ),
    seed: int = typer.Option(7, help="Seed of the generator (the manifest is deterministic)."),
    time_scale: float = typer.Option(
        0.001,
        callback=finite,
        help="Fake-simulator seconds per estimated second (0.001: a 30-minute phase runs 1.8 s).",
    ),
    scenario_fail_rate: float = typer.Option(
        0.03, min=0, max=1, callback=finite, help="Share of scenarios the software fails."
    ),
    crash_rate: float = typer.Option(
        0.0, min=0, max=1, callback=finite, help="Share of attempts that crash (infrastructure)."
    ),
    iso_week: str = typer.Option(None, help="ISO week, e.g. 2026-W49 (default: this week)."),
) -> None:
    """Write a realistic sample manifest of N cases, within the limits validate applies."""
    from avsim.manifest.policy import deployment_policy

    policy = deployment_policy()
    write_sample_to(
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
    typer.echo(f"wrote {out} ({cases} cases)")


@manifest_app.command("validate")
def manifest_validate(
    source: str = typer.Argument(..., help="Path or URI of the manifest."),
    catalog: Annotated[
        Path | None, typer.Option(help="Also check it against this graph catalog (the deployed DAG).")
    ] = None,
) -> None:
    """Check a manifest; print every problem with its path and the fix."""
    from avsim.manifest.bounded import load_manifest_bounded

    # In a child process with the memory and CPU bounds of the weekly run's prepare (docs/security.md).
    loaded = load_manifest_bounded(source)
    families = None
    if catalog is not None:
        from avsim.plan.build import build_plan
        from avsim.plan.catalog import load_catalog
        from avsim.plan.shards import assign_families
        from avsim.settings import AvsimSettings

        families = assign_families(loaded.manifest, build_plan(load_catalog(catalog), AvsimSettings()))
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
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write it here (default: print it).")
    ] = None,
    check: bool = typer.Option(
        False, "--check", help="Do not write: exit 1 if the file given with -o differs from the models."
    ),
) -> None:
    """Render the manifest reference (docs/manifest.md) from the manifest's models (from a checkout)."""
    if out is None and check:
        raise AvsimError("--check needs the file to compare: -o docs/manifest.md")
    try:
        # A development tool: in a source checkout, not in the wheel (provider/avsim_docgen).
        from avsim_docgen.manifest_reference import REGENERATE, render_reference
    except ModuleNotFoundError as exc:
        if exc.name != "avsim_docgen":
            raise
        raise AvsimError(
            "the reference generator is not installed with the package; run this from a checkout"
        ) from None

    text = render_reference()
    if out is None:
        typer.echo(text, nl=False)
    elif check:
        if not out.exists() or out.read_text(encoding="utf-8") != text:
            raise AvsimError(f"{out} is not what the manifest's models render; regenerate it: {REGENERATE}")
        typer.echo(f"{out} is up to date")
    else:
        out.write_text(text, encoding="utf-8")
        typer.echo(f"wrote {out}")


@catalog_app.command("write")
def catalog_write(
    out: Annotated[Path, typer.Argument(help="Where to write the catalog (YAML).")],
    from_manifest: str = typer.Option(
        None, "--from", help="Take the graphs of this manifest (default: the sample's)."
    ),
) -> None:
    """Write a graph catalog: the graphs and run-level phases of a manifest."""
    import yaml

    if from_manifest:
        from avsim.manifest.bounded import load_manifest_bounded

        doc = load_manifest_bounded(from_manifest).manifest.model_dump(
            mode="json", by_alias=True, exclude_defaults=True
        )
    else:
        from avsim.manifest.sample import sample_manifest

        doc = sample_manifest(1)
    catalog = {"apiVersion": "avsim/v1", "graphs": doc["graphs"], "run_phases": doc.get("run_phases", {})}
    out.write_text(CATALOG_HEADER + yaml.safe_dump(catalog, sort_keys=False))
    typer.echo(f"wrote {out} ({len(catalog['graphs'])} graphs)")
