"""The chaos run, longer: more cases and higher fault rates than tests/integration/test_chaos.py.

One weekly run on the real Airflow components (scheduler, dag-processor, triggerer, api-server,
LocalExecutor, metadata database on a private PostgreSQL cluster), local backend, with faults at
the stated rates: crashes and hangs without heartbeat on every phase, preemptions on GPU phases,
scenario failures on driving phases (the fake simulator's seeded draws), one forced fault of each
kind, and zombie workers' late and duplicate reports injected at the ledger boundary while the run
goes. It prints the figures and the invariants as checks (PASS/FAIL); there is no timing target. It
ends with ``chaos: cases=N attempts=N retries=N failed_checks=N seconds=S`` (0 failed checks: all hold).

    python bench/chaos.py [--cases 300] [--crash 0.12] [--preempt 0.2] [--hang 0.04]
        [--scenario-fail 0.1] [--seed 5150] [--time-scale 0.0005] [--keep]
    python bench/chaos.py --quick      # 30 cases in shard runs of 15

Run it under the machine's lock for heavy work:
``flock /tmp/avsim-heavy.lock timeout 3600 .venv/bin/python bench/chaos.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--crash", type=float, default=0.12, help="crash probability per attempt (every phase)")
    ap.add_argument("--preempt", type=float, default=0.20, help="preemption probability per GPU attempt")
    ap.add_argument("--hang", type=float, default=0.04, help="hang probability per attempt (every phase)")
    ap.add_argument("--scenario-fail", type=float, default=0.10, help="per driving phase")
    ap.add_argument("--seed", type=int, default=5150)
    ap.add_argument("--time-scale", type=float, default=0.0005, help="fake seconds per planned second")
    ap.add_argument("--lease", type=float, default=10.0, help="lease seconds (a hang is found after this)")
    ap.add_argument("--shard-size", type=int, default=50)
    ap.add_argument("--max-active-shards", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=8, help="GPU spot pool slots")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--keep", action="store_true", help="keep the Airflow home for inspection")
    ap.add_argument("--quick", action="store_true", help="30 cases in shard runs of 15, 2 at a time")
    args = ap.parse_args()
    if args.quick:
        args.cases, args.shard_size, args.max_active_shards = 30, 15, 2

    from tests.support.airflow_run import trigger, wait_for_run
    from tests.support.chaos import ChaosRates, ZombieReporter, chaos_manifest
    from tests.support.chaos_audit import audit_week
    from tests.support.stacks import weekly_stack

    from avsim.artifacts import RunLayout, run_key_for

    rates = ChaosRates(
        crash=args.crash, preempt=args.preempt, hang=args.hang, scenario_fail=args.scenario_fail
    )
    doc = chaos_manifest(
        args.cases,
        rates,
        seed=args.seed,
        time_scale=args.time_scale,
        heartbeat_seconds=1,
        lease_seconds=args.lease,
    )
    base = Path(tempfile.mkdtemp(prefix="avsim-bench-chaos-"))
    with weekly_stack(
        base,
        shard_size=args.shard_size,
        max_active_shards=args.max_active_shards,
        gpus=args.gpus,
        cpus=2 * args.gpus,
        extra_env={
            "AIRFLOW__CORE__MAX_MAP_LENGTH": str(max(1024, args.shard_size)),
            "AIRFLOW__AVSIM__DEADLINE_INTERVAL_SECONDS": "5",
        },
    ) as stack:
        path = stack.home / "chaos.json"
        path.write_text(json.dumps(doc))
        run_id = "bench__chaos"
        layout = RunLayout(f"file://{stack.home / 'artifacts'}", run_key_for("avsim_weekly", run_id))
        reporter = ZombieReporter(layout, interval=1.0).start()
        started = time.monotonic()
        try:
            trigger(stack, "avsim_weekly", run_id, {"manifest": str(path)})
            state = wait_for_run(stack, "avsim_weekly", run_id, timeout=args.timeout)
        finally:
            reporter.stop()
        seconds = time.monotonic() - started
        print(f"weekly run {run_id}: {state}")
        audit = audit_week(stack, run_id, layout, doc, reporter, seconds=seconds, rates=rates)
    print("\n".join(audit.lines()))
    if not audit.ok:
        print(audit.problems(limit=50))
    f = audit.figures
    failed = sum(not c.ok for c in audit.checks.values())
    print(
        f"chaos: cases={f['cases']} attempts={f['attempts']} retries={f['retries']} "
        f"failed_checks={failed} seconds={f['seconds']:.0f}"
    )
    if args.keep:
        print(f"Airflow home kept: {base}")
    else:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    return 0 if audit.ok else 1


if __name__ == "__main__":
    sys.exit(main())
