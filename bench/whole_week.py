"""A whole week, from trigger to report, on the real scheduler: the shipped defaults against a tuned sweep.

Issue 29, item 4: a 2,000-case week with the shipped defaults must run at least 0.9 x the phases a
second of the best hand-tuned window (S, W) of a small sweep in the same run, with a longest scheduler
loop at most 1.2 x that of the 250-case week, and keep its pace from its first shard runs to its end.

Each configuration runs on a stack of its own (scheduler, dag-processor, triggerer, api-server,
LocalExecutor with parallelism 16, the metadata database on a private PostgreSQL cluster), with the
shipped canary (1 % of the cases, at least 20, then the gate) and fast fake phases (``--time-scale
0.00005``: a 30-minute simulate works 0.09 s). The weeks of one configuration are triggered on its
stack one after the other (each as the weekly run, with a run id of its own, until its ``report``
has ended):

- **shipped**: no ``[avsim]`` override (whatever the provider ships: admission by cases in flight,
  or before it the window S = 250, W = 6); the small week (250 cases), then the large one (2,000);
- **window S, W**: ``[avsim] admission = window``, ``shard_size = S``, ``max_active_shards = W``
  (whole shard runs of S, at most W active); the large week only. The sweep: (50, 5), (25, 10),
  (100, 3).

Measured per week (``bench/week_runs.py``): phase task instances per second over the whole week
(every shard run's phase task instances that ran, the canary's included: first phase start -> last
phase end) and over its first 4 shard runs (first phase start -> the 4th shard run's end); the
scheduler's loop (``scheduler.scheduler_loop_duration`` over StatsD), longest and median, from the
trigger to the report's end; the unfinished task instances of the week's running shard runs, sampled
every 3 s (the scheduler's load), at most; the parent run's and the week's XCom, the database's
size, and the weekly-run page's API time. Then one line::

    whole_week: cases=N throughput_ratio=R loop_ratio=R shipped_vs_tuned=R

- ``throughput_ratio``: the large shipped week's phases/s over the whole week / over its first 4
  shard runs (goal >= 0.9);
- ``loop_ratio``: the large shipped week's longest scheduler loop / the small shipped week's (<= 1.2);
- ``shipped_vs_tuned``: the large shipped week's phases/s / the best of the sweep's (>= 0.9).

    flock /tmp/avsim-heavy.lock .venv/bin/python bench/whole_week.py           # 250 + 2,000, 3 x 2,000: hours
    flock /tmp/avsim-heavy.lock .venv/bin/python bench/whole_week.py --quick   # 40 + 120, S = 10, W = 5 at 120

``--quick`` (under 10 minutes; a stack starts in ~20 s from the migrated template database): the
shipped stack runs 40 and 120 cases, one tuned stack (S = 10, W = 5) the 120; each week stops at
``--timeout`` (300 s there, 4 h otherwise), measured as far as it got, and a stack whose week did
not end runs no further week.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from week_runs import Week, report, run_week, week_stack  # noqa: E402

SWEEP = ((50, 5), (25, 10), (100, 3))
QUICK_SWEEP = ((10, 5),)


@dataclass(frozen=True)
class Config:
    """A stack's ``[avsim]`` shape: the shipped defaults (no window), or a hand-tuned window S, W."""

    window: tuple[int, int] | None = None

    @property
    def label(self) -> str:
        return "shipped" if self.window is None else f"window S={self.window[0]}, W={self.window[1]}"

    @property
    def env(self) -> dict[str, str]:
        if self.window is None:
            return {}
        shard_size, max_active_shards = self.window
        return {
            "AIRFLOW__AVSIM__ADMISSION": "window",
            "AIRFLOW__AVSIM__SHARD_SIZE": str(shard_size),
            "AIRFLOW__AVSIM__MAX_ACTIVE_SHARDS": str(max_active_shards),
        }


def parse_sweep(text: str) -> tuple[tuple[int, int], ...]:
    """``"50x5,25x10"`` -> ((50, 5), (25, 10)); ``""``: no sweep."""
    pairs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        s, _, w = item.partition("x")
        pairs.append((int(s), int(w)))
    return tuple(pairs)


def run_config(config: Config, sizes: list[int], args: argparse.Namespace) -> list[Week]:
    """Every week of ``sizes`` on one stack of ``config``, one after the other."""
    env = {**dict(kv.split("=", 1) for kv in args.env), **config.env}
    weeks = []
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="avsim-week-") as tmp,
        week_stack(env, args, Path(tmp)) as (stack, sink),
    ):
        print(f"[{config.label}] stack up in {time.monotonic() - started:.0f} s", flush=True)
        for i, cases in enumerate(sizes):
            load = os.getloadavg()[0]
            week = run_week(stack, sink, config.label, cases, f"week{i}__{cases}", args)
            weeks.append(week)
            report(week)
            print(f"    (load average {load:.1f} -> {os.getloadavg()[0]:.1f})", flush=True)
            if week.state not in ("success", "failed"):  # still running: it would load the next week
                print(f"    [{config.label}] the weeks after it on this stack are not run", flush=True)
                break
    print(f"[{config.label}] {time.monotonic() - started:.0f} s with the stack's start and stop", flush=True)
    return weeks


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=0, help="the large week (2,000; 120 --quick)")
    ap.add_argument("--small", type=int, default=0, help="the small shipped week (250; 40 --quick)")
    ap.add_argument("--quick", action="store_true", help="40 + 120 shipped, window S = 10, W = 5 at 120")
    ap.add_argument(
        "--sweep", default=None, help='hand-tuned windows "SxW,..." (default 50x5,25x10,100x3; 10x5 --quick)'
    )
    ap.add_argument("--parallelism", type=int, default=16)
    ap.add_argument("--time-scale", type=float, default=0.00005)
    ap.add_argument(
        "--timeout", type=float, default=0, help="seconds a week may take (0: 4 h; 300 s --quick)"
    )
    ap.add_argument(
        "--env",
        action="append",
        default=[],
        help="extra KEY=VALUE for every stack (repeatable; a window's S, W win)",
    )
    args = ap.parse_args()
    from bytecode import ensure_bytecode

    ensure_bytecode()  # measure what a deployment pays (bench/bytecode.py)
    args.cases = args.cases or (120 if args.quick else 2000)
    args.small = args.small or (40 if args.quick else 250)
    sweep = parse_sweep(args.sweep) if args.sweep is not None else (QUICK_SWEEP if args.quick else SWEEP)
    args.timeout = args.timeout or (300 if args.quick else 4 * 3600)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the stacks and clean up, as Ctrl-C does
    started = time.monotonic()

    shipped = run_config(Config(), [args.small, args.cases], args)
    small = shipped[0]
    large = shipped[1] if len(shipped) > 1 else None
    tuned: list[Week] = []
    for window in sweep:
        tuned += run_config(Config(window), [args.cases], args)
        if large and len(sweep) > 1:  # a sweep cut short still says how far it got
            best = max(tuned, key=lambda w: w.rate if not math.isnan(w.rate) else -1.0)
            print(
                f"  so far ({len(tuned)} of {len(sweep)} windows): shipped / best tuned "
                f"({best.config}) = {ratio(large.rate, best.rate):.3f}",
                flush=True,
            )

    print(
        f"\n{'week':>6} {'config':<22} {'state':<10} {'phases/s':>8} {'loop max':>9} {'median':>7} {'TIs at most':>11}"
    )
    for w in [*shipped, *tuned]:
        print(
            f"{w.cases:>6} {w.config:<22} {w.state[:10]:<10} {w.rate:>8.2f} {w.max_loop:>7.0f}ms "
            f"{w.median_loop:>5.0f}ms {w.peak_unfinished:>11}"
        )
    best = max(tuned, key=lambda w: w.rate if not math.isnan(w.rate) else -1.0, default=None)
    throughput = ratio(large.rate, large.first4_rate) if large else float("nan")
    loop = ratio(large.max_loop, small.max_loop) if large else float("nan")
    vs_tuned = ratio(large.rate, best.rate) if large and best else float("nan")
    if large:
        print(
            f"throughput, whole {large.cases}-case week / its first 4 shards: {throughput:.3f}  (goal >= 0.9)"
        )
        print(f"longest scheduler loop, {large.cases} / {small.cases} cases: {loop:.3f}  (goal <= 1.2)")
        print(
            f"median scheduler loop, {large.cases} / {small.cases} cases: {ratio(large.median_loop, small.median_loop):.3f}"
        )
    if large and best:
        print(
            f"phases/s, shipped / best tuned ({best.config}, {best.rate:.2f}/s): {vs_tuned:.3f}  (goal >= 0.9)"
        )
    print(f"({time.monotonic() - started:.0f} s in all)")
    print(
        f"whole_week: cases={args.cases} throughput_ratio={throughput:.3f} loop_ratio={loop:.3f} "
        f"shipped_vs_tuned={vs_tuned:.3f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
