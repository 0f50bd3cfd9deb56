"""The ``avsim`` command: its groups, the demo, and the entry point.

The commands live beside it (``cli_manifest``, ``cli_plan``, ``cli_runs``); :mod:`avsim.cli_common`
turns a domain error of any of them into one line on stderr and exit status 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from avsim.cli_common import MAX_CASES, AvsimGroup, finite
from avsim.cli_manifest import catalog_app, manifest_app
from avsim.cli_plan import plan
from avsim.cli_runs import breaker_app, pools_app, report, rerun_failed, service_role_app, triage
from avsim.errors import AvsimError

app = typer.Typer(
    cls=AvsimGroup,
    help="avsim: the weekly simulation regression run on Apache Airflow.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(manifest_app, name="manifest")
app.add_typer(catalog_app, name="catalog")
app.add_typer(pools_app, name="pools")
app.add_typer(breaker_app, name="breaker")
app.add_typer(service_role_app, name="service-role")
app.command("report")(report)
app.command("triage")(triage)
app.command("plan")(plan)
app.command("rerun-failed")(rerun_failed)


@app.command("demo")
def demo(
    cases: int = typer.Option(200, "--cases", "-n", min=1, max=MAX_CASES, help="Cases in the demo week."),
    home: Path = typer.Option(Path(".avsim/demo"), help="Airflow home the demo prepares and uses."),
    shard_size: int = typer.Option(50, help="Cases per shard run (S)."),
    max_active_shards: int = typer.Option(2, help="Shard runs active at once (W)."),
    crash_rate: float = typer.Option(
        0.02, min=0, max=1, callback=finite, help="Share of attempts that crash and are retried."
    ),
    exit_when_done: bool = typer.Option(False, help="Stop Airflow once the report is written."),
) -> None:
    """Run a whole weekly run on this machine with the real Airflow components."""
    from avsim.settings import AvsimSettings

    AvsimSettings(shard_size=shard_size, max_active_shards=max_active_shards)  # refuses a bad S or W
    if home.exists() and not home.is_dir():
        raise AvsimError(f"--home {home} is a file; name a folder for the demo's Airflow home")
    from avsim.devstack.demo import run_demo

    code = run_demo(
        cases=cases,
        home=home,
        shard_size=shard_size,
        max_active_shards=max_active_shards,
        crash_rate=crash_rate,
        exit_when_done=exit_when_done,
    )
    raise typer.Exit(code=code)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
