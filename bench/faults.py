"""Partial faults of a real cluster, injected into weeks on the production topology.

Runs weeks on :class:`tests.support.faults.FaultStack` (CeleryExecutor, Redis, S3, PostgreSQL, two
triggerers, the Kubernetes backend on the loopback Kubernetes API) and injects: the API server frozen
for 120 s, PostgreSQL stopped for 30 s, the object store answering errors for 60 s, one triggerer
frozen until its triggers move, a Celery worker killed -9, and 5 % of GPU attempts hanging until
their lease expires. ``--quick`` injects each once into one week; the full run gives each fault a
week of its own, then one week all of them. Prints one line:

    faults: injected=N survived=N lost=0 duplicated=0 false_bad_build=0 live_pods_deleted=0

Usage: ``python bench/faults.py [--quick] [--cases N] [--keep DIR]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    from tests.support.faults import FAULTS, fault_stack, run_week, summary_line

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one week with each fault once")
    parser.add_argument("--cases", type=int, default=40, help="cases per week (default 40)")
    parser.add_argument("--keep", type=Path, default=None, help="keep the stack's folder here")
    args = parser.parse_args(argv)
    base = args.keep or Path(tempfile.mkdtemp(prefix="avsim-faults-"))
    plan = [list(FAULTS)] if args.quick else [[f] for f in FAULTS] + [list(FAULTS)]
    weeks = []
    began = time.monotonic()
    with fault_stack(base) as stack:
        for n, faults in enumerate(plan, 1):
            week = run_week(stack, f"bench__faults_{n}", faults, cases=args.cases)
            weeks.append(week)
            print(
                f"week {n} ({', '.join(faults)}): {week.state} in {week.seconds:.0f}s, "
                f"cases {week.case_classes}; " + "; ".join(f"{i.fault}: {i.note}" for i in week.injected),
                flush=True,
            )
            print(f"  attempts: {dict(sorted(week.attempt_classes.items()))}", flush=True)
            for problem in week.problems[:20]:
                print(f"  problem: {problem}", flush=True)
    print(f"stack folder: {base}; {time.monotonic() - began:.0f}s in all")
    print(summary_line(weeks), flush=True)
    return 0 if all(w.survived for w in weeks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
