"""Fresh virtual environments for the install tier, made with uv (its cache makes repeat installs fast)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UV = Path(sys.executable).with_name("uv")


def make_venv(target: Path, *requirements: str, constraints: Path | None = None, seed: bool = False) -> Path:
    """A new venv at ``target`` holding ``requirements`` (uv pip syntax), under ``constraints``;
    ``seed`` also puts pip in it (for steps that use pip as a user would). Returns its ``bin``."""
    subprocess.run(
        [str(UV), "venv", "-q", *(["--seed"] if seed else []), "--python", sys.executable, str(target)],
        check=True,
    )
    install = [
        str(UV),
        "pip",
        "install",
        "-q",
        "--compile-bytecode",
        "--python",
        str(target / "bin" / "python"),
    ]
    if constraints is not None:
        install += ["-c", str(constraints)]
    subprocess.run([*install, *requirements], check=True, cwd=ROOT)
    return target / "bin"


def installed_version(bin_dir: Path, distribution: str) -> str:
    done = subprocess.run(
        [
            str(bin_dir / "python"),
            "-c",
            f"import importlib.metadata as m; print(m.version({distribution!r}))",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()
