"""Every ``avsim`` command: its help prints its brackets, a bad input ends in one line and exit 1.

Through typer's runner on the real command functions; the S3 cases write to a real S3 API (moto's
server, the ``s3_server`` fixture) through the Airflow connection ``avsim_s3``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import typer.main
from typer.testing import CliRunner

from avsim.cli import app
from avsim.ledger.breaker import Breaker

runner = CliRunner()
DIGEST = "sha256:" + "ab" * 32


def commands() -> Iterator[tuple[tuple[str, ...], click.Command]]:
    def walk(group: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], click.Command]]:
        for name, command in group.commands.items():
            if hasattr(command, "commands"):  # a group of commands
                yield from walk(command, (*path, name))
            else:
                yield (*path, name), command

    yield from walk(typer.main.get_command(app), ())


def test_every_help_prints_the_brackets_it_was_written_with() -> None:
    seen: set[str] = set()
    for path, command in commands():
        done = runner.invoke(app, [*path, "--help"], terminal_width=100)
        assert done.exit_code == 0, (path, done.output)
        texts = [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]
        for token in {t for text in texts for t in re.findall(r"\[\w+(?:\.\w+)?\]", text)}:
            assert token in done.output, f"avsim {' '.join(path)} --help lost {token}:\n{done.output}"
            seen.add(token)
    assert {"[avsim]", "[core]", "[scheduler]"} <= seen  # the check looked at the sections


@pytest.fixture
def bad_inputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[tuple[str, ...], tuple[list[str], str]]:
    """One bad input per command, and a piece of the line that must say what is wrong."""
    missing = str(tmp_path / "missing.yaml")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    root = ["--artifact-root", str(tmp_path / "store")]
    monkeypatch.setenv(
        "AIRFLOW__CORE__AUTH_MANAGER", "airflow.api_fastapi.auth.managers.simple.SimpleAuthManager"
    )
    return {
        ("manifest", "sample"): (["--out", str(tmp_path / "week.txt")], "cannot tell the format"),
        ("manifest", "validate"): ([missing], "file not found"),
        ("manifest", "reference"): (["--check"], "--check needs the file"),
        ("catalog", "write"): ([str(tmp_path / "g.yaml"), "--from", missing], "file not found"),
        ("demo",): (["--home", str(a_file)], "is a file"),
        ("report",): (["no-such-run", *root], "no run 'no-such-run'"),
        ("triage",): (["no-such-run", *root], "no run 'no-such-run'"),
        ("plan",): ([missing, "--gpus", "1", "--cpus", "1"], "file not found"),
        ("pools", "sync"): ([missing], "cannot be read"),
        ("rerun-failed",): (["no-such-run", *root], "no run 'no-such-run'"),
        ("breaker", "show"): ([DIGEST, *root], f"no build {DIGEST}"),
        ("breaker", "reset"): (["sha256:abc", *root], "is not a build's digest"),
        ("service-role", "show"): (["--dag-id", "not a dag"], "is not a DAG id"),
        ("service-role", "sync"): (["--dry-run"], "roles are the FAB auth manager's"),
    }


def test_a_bad_input_to_any_command_is_one_line_and_exit_1(
    bad_inputs: dict[tuple[str, ...], tuple[list[str], str]],
) -> None:
    assert set(bad_inputs) == {path for path, _ in commands()}, "give every command a bad input here"
    for path, (args, says) in bad_inputs.items():
        done = runner.invoke(app, [*path, *args])
        where = f"avsim {' '.join([*path, *args])}"
        assert done.exit_code == 1, (where, done.output, done.exception)
        assert isinstance(done.exception, SystemExit), (where, done.exception)
        assert "Traceback" not in done.output and "problems" not in done.output, (where, done.output)
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and says in lines[0], (where, done.stderr)
        assert done.stdout == "", (where, done.stdout)


def test_a_manifest_with_problems_lists_them_under_one_summary(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: avsim/v1\nrun: 3\n")
    done = runner.invoke(app, ["manifest", "validate", str(bad)])
    assert done.exit_code == 1 and "Traceback" not in done.output
    head, *problems = done.stderr.splitlines()
    assert head.endswith("problems") and len(problems) >= 2 and all(p.startswith("  ") for p in problems)


def test_admission_is_a_choice(tmp_path: Path) -> None:
    done = runner.invoke(app, ["plan", "week.yaml", "--gpus", "1", "--cpus", "1", "--admission", "windows"])
    assert done.exit_code == 2
    assert "'windows' is not one of 'cases_in_flight', 'window'" in done.output


def test_breaker_reset_refuses_a_build_it_does_not_know_and_writes_nothing(tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    Breaker(root, DIGEST).trip("the canary failed")
    typo = DIGEST[:-1] + "c"
    done = runner.invoke(app, ["breaker", "reset", typo, "--artifact-root", root])
    assert done.exit_code == 1, done.output
    assert done.stderr.strip() == (
        f"no build {typo} under {root}: no phase of it has finished there; did you mean {DIGEST}?"
    )
    assert sorted(p.name for p in (tmp_path / "store" / "breakers").glob("*.json")) == [
        DIGEST.replace(":", "_") + ".json"
    ]
    image = f"registry.example.com/sim@{DIGEST}"
    done = runner.invoke(app, ["breaker", "reset", image, "--artifact-root", root])
    assert done.exit_code == 0, done.output
    assert f"breaker of {image} closed (it was open)" in done.stdout
    shown = runner.invoke(app, ["breaker", "show", DIGEST, "--artifact-root", root])
    assert shown.exit_code == 0 and '"state": "closed"' in shown.stdout


def avsim(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed command in its own process, with this process's environment (the S3 server's)."""
    return subprocess.run(
        [sys.executable, "-m", "avsim.cli", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_sample_writes_to_object_storage(
    s3_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    uri = "s3://avsim_s3@avsim/manifests/first-week.yaml"
    done = avsim("manifest", "sample", "--cases", "5", "--out", uri)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"wrote {uri} (5 cases)"  # after Airflow's own log lines
    checked = avsim("manifest", "validate", uri)
    assert checked.returncode == 0, checked.stderr
    assert f"{uri}: valid. 5 cases" in checked.stdout
    nowhere = avsim("manifest", "sample", "--out", "s3://avsim_s3@no-such-bucket/week.yaml")
    assert nowhere.returncode == 1 and "Traceback" not in nowhere.stderr, nowhere.stderr
    assert len(nowhere.stderr.splitlines()) == 1 and "no-such-bucket" in nowhere.stderr, nowhere.stderr
    assert list(tmp_path.iterdir()) == [], "a URI was written as a local path"


def test_a_database_that_is_not_migrated_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{tmp_path / 'empty.db'}")
    done = avsim("pools", "sync", str(Path(__file__).parents[2] / "docker" / "avsim_capacity.yaml"))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines() == [
        "the Airflow metadata database: no such table: slot_pool; check [database] sql_alchemy_conn, "
        "then airflow db migrate"
    ]
