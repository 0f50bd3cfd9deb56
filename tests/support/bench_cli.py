"""Run a bench under ``bench/`` as a user would (``python bench/<name>.py ...``) and read its line.

Every bench ends with one line ``<name>: key=value key=value ...`` whose values are numbers;
:func:`summary` finds the last such line and returns its figures.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bench(name: str, *args: str, timeout: float) -> str:
    """The bench's standard output; fails with its output's tail when it exits non-zero."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / f"{name}.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise AssertionError(
            f"bench/{name}.py {' '.join(args)} exited {done.returncode}\n"
            f"--- stdout (tail)\n{done.stdout[-4000:]}\n--- stderr (tail)\n{done.stderr[-6000:]}"
        )
    return done.stdout


def summary(stdout: str, name: str) -> dict[str, float]:
    """The figures of the last ``<name>: k=v ...`` line of ``stdout``; every value must be a number."""
    lines = [line for line in stdout.splitlines() if line.startswith(f"{name}: ")]
    if not lines:
        raise AssertionError(f"no '{name}: ...' line in the output:\n{stdout[-3000:]}")
    figures: dict[str, float] = {}
    for pair in lines[-1][len(name) + 2 :].split():
        key, sep, value = pair.partition("=")
        if not sep:
            raise AssertionError(f"not key=value: {pair!r} in {lines[-1]!r}")
        figures[key] = float(value)  # raises on anything but a number ("nan" parses: see finite)
    return figures


def finite(figures: dict[str, float], *keys: str) -> None:
    """Each of ``keys`` is present and a finite number (a measured ratio, not nan or inf)."""
    for key in keys:
        assert key in figures, f"{key} missing from {figures}"
        assert math.isfinite(figures[key]), f"{key} is not a finite number: {figures}"
