"""Benches measure what a deployment pays: with every module's bytecode already written.

A deployment's image has its packages' bytecode (pip writes it at install; ``make install`` asks uv
for it with ``--compile-bytecode``). Without it, and with ``PYTHONDONTWRITEBYTECODE`` set as on
these machines, every Airflow process compiles what it imports from source each time: a
Kubernetes phase task compiled the 883 modules of ``kubernetes_asyncio`` at each start, ~2 CPU-s,
and the stock operator the same. :func:`ensure_bytecode` brings avsim's own bytecode (editable, so
it changes) up to date and refuses to measure when the installed packages have none.
"""

from __future__ import annotations

import compileall
import importlib.util
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Packages whose modules every phase task imports; a sample of the installed ones.
_SAMPLED = ("airflow", "kubernetes_asyncio", "kubernetes", "pydantic")


def _missing(package_dir: Path) -> int:
    return sum(
        1 for f in package_dir.rglob("*.py") if not Path(importlib.util.cache_from_source(str(f))).exists()
    )


def ensure_bytecode() -> None:
    for folder in (ROOT / "provider" / "avsim", ROOT / "dags", ROOT / "plugins"):
        compileall.compile_dir(str(folder), quiet=1)
    site = Path(sysconfig.get_paths()["purelib"])
    missing = {p: n for p in _SAMPLED if (site / p).is_dir() and (n := _missing(site / p))}
    if missing:
        sys.exit(
            f"bench: installed packages without bytecode ({missing}): every process would compile them "
            "from source, which no deployment does. Run `make install` (uv --compile-bytecode), or "
            f"`{sys.executable} -m compileall -q {site}`"
        )
