"""The capacity planner on a 10,000-case week: how close each ordering gets to the lower bound,
what spot preemption costs, and which run shape (S, W) meets the target.

Everything is simulated by ``avsim.planner`` on the sample manifest (``sample_manifest(N)``) at a
fixed capacity. Reported, each as a ratio measured in the same run:

1. at the configured shape (``AvsimSettings`` S and W): makespan / lower bound of the
   critical-path rule, Airflow's default ``downstream`` rule and FIFO (target: critical path at
   most 1.05 and below ``downstream``), with the seconds each simulation took;
2. shapes: the same ratios over window sizes W, shard sizes S, with and without logical dates
   on shard runs (Airflow orders equal weights by logical date, then map index);
3. at the recommended shape: spot preemption (5 %/GPU-hour) with checkpoints, makespan / the
   same run without preemption (target at most 1.10), and without checkpoints for reference;
   durations spread ±30 %; the shard DAG's per-run task limit;
4. admission by cases in flight (issue 29): the target :mod:`avsim.plan.inflight` derives from the
   pools, small shard runs admitted as finished cases make room, against today's window of whole
   shard runs (S = 250, W = 6), both simulated by the same code, without and with the scheduler's
   loop (``[avsim] scheduler_ms_per_task_instance``, 3 ms here): makespan / bound, the most
   unfinished phase task instances in flight, the twins' share of them; a sweep of the headroom.
   Prints ``admission: makespan_vs_bound=R inflight_tis_vs_today=R twin_share=R ...``.

    python bench/planner.py [--cases 10000] [--gpus 280] [--cpus 200] [--on-demand-gpus 16]
    python bench/planner.py --quick      # section 4 only (a few seconds)
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from avsim.manifest.sample import sample_manifest
from avsim.manifest.validation import validate_manifest
from avsim.planner import (
    STRATEGIES,
    Capacity,
    SimOptions,
    SimResult,
    Workload,
    lower_bound,
    simulate,
    workload_from_manifest,
)
from avsim.settings import AvsimSettings


def ratios(w: Workload, cap: Capacity, opts: SimOptions) -> dict[str, tuple[float, float]]:
    """strategy -> (makespan / lower bound, seconds the simulation took)."""
    bound = lower_bound(w, cap, opts).seconds
    out = {}
    for name in STRATEGIES:
        t0 = time.perf_counter()
        r = simulate(w, cap, replace(opts, strategy=name))
        out[name] = (r.makespan_seconds / bound, time.perf_counter() - t0)
    return out


def shape(opts: SimOptions) -> str:
    dates = "logical dates" if opts.shard_logical_dates else "no logical dates"
    return f"S={opts.shard_size:4d} W={opts.max_active_shards:2d} ({opts.shard_size * opts.max_active_shards:5,d} in flight, {dates})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--gpus", type=int, default=280)
    ap.add_argument("--cpus", type=int, default=200)
    ap.add_argument("--on-demand-gpus", type=int, default=16)
    ap.add_argument("--preemption-rate", type=float, default=0.05)
    ap.add_argument("--checkpoint-seconds", type=float, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--recommended-shard-size", type=int, default=250)
    ap.add_argument("--recommended-max-active-shards", type=int, default=6)
    ap.add_argument("--admission-small-shards", type=int, default=50)
    ap.add_argument("--scheduler-ms-per-task-instance", type=float, default=3.0)
    ap.add_argument("--quick", action="store_true", help="only section 4, admission (its line included)")
    args = ap.parse_args()

    import avsim.priority  # noqa: F401  (imports Airflow once, outside the timings)

    w = workload_from_manifest(validate_manifest(sample_manifest(args.cases)))
    cap = Capacity(gpus=args.gpus, cpus=args.cpus)
    settings = AvsimSettings()
    configured = SimOptions(
        shard_size=settings.shard_size, max_active_shards=settings.max_active_shards, seed=args.seed
    )
    b = lower_bound(w, cap, configured)
    print(
        f"{args.cases:,} cases, {b.gpu_seconds / 3600:,.0f} GPU-hours, {b.cpu_seconds / 3600:,.0f} CPU-hours; "
        f"{args.gpus} GPUs, {args.cpus} CPUs; lower bound {b.seconds / 3600:.2f} h (set by {b.binding})",
        flush=True,
    )

    if args.quick:
        admission(w, cap, args, b.seconds, headrooms=(1.5, 2.0))
        return

    print("\n1. configured shape " + shape(configured))
    got = ratios(w, cap, configured)
    for name, (ratio, secs) in got.items():
        print(f"   {name:14s} makespan / bound {ratio:.3f}   ({secs:.2f} s to simulate)", flush=True)
    cp, down = got["critical_path"][0], got["downstream"][0]
    print(f"   critical path: {cp:.3f} (target <= 1.05), / downstream's {cp / down:.3f} (target < 1)")
    old_limit = max(16, 16 * configured.max_active_shards)  # the shard DAG's max_active_tasks before 2 S
    got = ratios(w, cap, replace(configured, max_active_tasks_per_shard=old_limit))
    print(
        f"   with max_active_tasks = {old_limit} per shard run: "
        + "  ".join(f"{n} {got[n][0]:.3f}" for n in STRATEGIES),
        flush=True,
    )

    print("\n2. shapes (makespan / bound: critical_path  downstream  fifo)")
    shapes = [
        (250, 4, False),
        (250, 4, True),
        (250, 6, False),
        (250, 6, True),
        (250, 8, False),
        (250, 8, True),
        (250, 12, False),
        (125, 16, True),
        (500, 4, True),
    ]
    for s, win, dates in shapes:
        opts = replace(configured, shard_size=s, max_active_shards=win, shard_logical_dates=dates)
        got = ratios(w, cap, opts)
        print(
            f"   {shape(opts)}  " + "  ".join(f"{got[n][0]:.3f}" for n in STRATEGIES),
            flush=True,
        )

    rec = replace(
        configured,
        shard_size=args.recommended_shard_size,
        max_active_shards=args.recommended_max_active_shards,
        shard_logical_dates=True,
    )
    print("\n3. recommended shape " + shape(rec))
    with_od = replace(cap, on_demand_gpus=args.on_demand_gpus)
    base = simulate(w, with_od, rec)
    pre = replace(rec, preemption_rate=args.preemption_rate, checkpoint_seconds=args.checkpoint_seconds)
    ckpt = simulate(w, with_od, pre)
    # Reference: no phase checkpoints (simulate and perceive checkpoint in the sample).
    no_ckpt = simulate(w, with_od, replace(pre, checkpoint_seconds=10**9))
    print(f"   on {args.gpus} spot + {args.on_demand_gpus} on-demand GPUs, critical path:")
    print(f"   no preemption           {base.makespan_seconds / 3600:.2f} h")
    for label, r in (("with checkpoints", ckpt), ("without checkpoints", no_ckpt)):
        print(
            f"   {args.preemption_rate * 100:g} %/h, {label:19s} {r.makespan_seconds / 3600:.2f} h: "
            f"x{r.makespan_seconds / base.makespan_seconds:.3f} the no-preemption makespan, {r.preemptions} "
            f"preemptions, {r.lost_gpu_seconds / 3600:.1f} GPU-h lost, {r.on_demand_attempts} attempts on "
            f"on-demand ({r.on_demand_gpu_seconds / 3600:.0f} GPU-h)",
            flush=True,
        )
    print(f"   with checkpoints: x{ckpt.makespan_seconds / base.makespan_seconds:.3f} (target <= 1.10)")
    spread = ratios(w, cap, replace(rec, duration_spread=0.3))
    print("   durations ±30 %:          " + "  ".join(f"{n} {spread[n][0]:.3f}" for n in STRATEGIES))
    limited = ratios(w, cap, replace(rec, max_active_tasks_per_shard=2 * rec.shard_size))
    print("   max_active_tasks = 2 S:   " + "  ".join(f"{n} {limited[n][0]:.3f}" for n in STRATEGIES))
    first = {n: simulate(w, cap, replace(rec, strategy=n)).first_case_seconds or 0.0 for n in STRATEGIES}
    print("   first case done after:    " + "  ".join(f"{n} {first[n] / 60:.0f} min" for n in STRATEGIES))
    admission(w, cap, args, b.seconds, headrooms=(1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0))


def admission(
    w: Workload, cap: Capacity, args: argparse.Namespace, bound: float, headrooms: tuple[float, ...]
) -> None:
    """Section 4: admission by cases in flight against today's window, by the same simulation."""
    from avsim.plan.admission import admission_shard_size
    from avsim.plan.inflight import (
        HEADROOM,
        Pools,
        binding_pool,
        phase_starts_per_second,
        scheduler_feed,
        target_cases_in_flight,
    )

    load = w.case_load()
    pools = Pools(spot_gpus=cap.gpus, cpus=cap.cpus, on_demand_gpus=cap.on_demand_gpus)
    ms = args.scheduler_ms_per_task_instance
    target = target_cases_in_flight(load, pools)
    print(
        f"\n4. admission by cases in flight: binding pool {binding_pool(load, pools)}, "
        f"{phase_starts_per_second(load, pools):.3f} phase starts/s at full occupancy, Little's law "
        f"{load.littles_law_cases(pools):.0f} cases x headroom {HEADROOM:g} = target {target:,}; "
        f"{load.task_instances:.2f} phase task instances per case ({load.twin_task_instances:.2f} twins); "
        f"loop {ms:g} ms per unfinished task instance",
        flush=True,
    )
    # Today's window and admission in the shipped shape (S = 250 cases per shard run, at most W = 6
    # active), the same simulation; then small shard runs with no cap on how many are active.
    today = SimOptions(shard_size=250, max_active_shards=6, seed=args.seed)
    small = args.admission_small_shards

    def row(label: str, opts: SimOptions) -> tuple[SimResult, SimResult]:
        t0 = time.perf_counter()
        plain = simulate(w, cap, opts)
        looped = simulate(w, cap, replace(opts, scheduler_ms_per_task_instance=ms))
        print(
            f"   {label:34s} makespan / bound {plain.makespan_seconds / bound:.3f}, with the loop "
            f"{looped.makespan_seconds / bound:.3f} (loop mean {looped.mean_loop_seconds:.1f} s, max "
            f"{looped.max_loop_seconds:.1f} s); unfinished phase TIs max {plain.peak_task_instances:,} "
            f"mean {plain.mean_task_instances:,.0f}, twins {plain.twin_share * 100:.1f} %; "
            f"{plain.peak_active_shard_runs} shard runs active at most ({time.perf_counter() - t0:.1f} s)",
            flush=True,
        )
        return plain, looped

    now_plain, now_looped = row("today: S=250 W=6 window", today)
    for h in headrooms:
        n = target_cases_in_flight(load, pools, headroom=h)
        got = row(f"S=250 W=6 {n:,} in flight (x{h:g})", replace(today, cases_in_flight=n))
        if n == target:
            plain, looped = got
    # What the weekly run ships: shard runs of a third of the target (avsim.plan.admission), no cap on
    # the shard runs in progress (W only sizes the window).
    shipped_size = admission_shard_size(len(w.cases), target, 250)
    shipped = replace(today, shard_size=shipped_size, cases_in_flight=target, max_active_shards=100_000)
    plain, looped = row(f"shipped: S={shipped_size} no W {target:,} in flight", shipped)
    row(
        f"S={small} no W {target:,} in flight (x{HEADROOM:g})",
        replace(today, shard_size=small, max_active_shards=100_000, cases_in_flight=target),
    )
    feed = scheduler_feed(load, pools, target, ms_per_task_instance=ms)
    print(
        f"   scheduler at the target: {feed.task_instances:,.0f} task instances, loop {feed.loop_seconds:.1f} s, "
        f"{feed.starts_per_loop:.1f} starts needed per loop of {feed.max_per_loop} queued at most "
        f"({'feeds the pools' if feed.can_feed else 'CANNOT feed the pools'}); today's window "
        f"{now_plain.peak_task_instances:,} task instances "
        f"(Workload.window_task_instances: {w.window_task_instances(250, 6):,})"
    )
    print(
        f"admission: makespan_vs_bound={plain.makespan_seconds / bound:.3f} "
        f"inflight_tis_vs_today={plain.peak_task_instances / now_plain.peak_task_instances:.3f} "
        f"twin_share={plain.twin_share:.3f} inflight_tis={plain.peak_task_instances} "
        f"today_tis={now_plain.peak_task_instances} today_vs_bound={now_plain.makespan_seconds / bound:.3f} "
        f"loop_makespan_vs_bound={looped.makespan_seconds / bound:.3f} "
        f"today_loop_vs_bound={now_looped.makespan_seconds / bound:.3f}",
        flush=True,
    )
    stragglers(w, cap, shipped, target)


def stragglers(w: Workload, cap: Capacity, shipped: SimOptions, target: int) -> None:
    """The shipped admission on a week with tails: 5 % of GPU phases hang on their first attempt until
    their 600 s lease expires, 5 % of phases take 3 x their estimate, and 2 % of attempts fail and
    retry after the policy's backoff. Against the bound of the same work (hung slots included)."""
    tails = replace(shipped, hang_share=0.05, lease_seconds=600.0, slow_share=0.05, slow_factor=3.0)
    tails = replace(tails, failure_rate=0.02)
    t0 = time.perf_counter()
    got = simulate(w, cap, tails)
    bound = lower_bound(w, cap, tails).seconds
    low = got.min_cases_in_flight_waiting
    print(
        f"   with tails (5 % GPU phases hang for their 600 s lease, 5 % at 3 x, 2 % fail and retry): "
        f"makespan / bound {got.makespan_seconds / bound:.3f}, fewest cases in flight while cases wait "
        f"{low} of {target} ({time.perf_counter() - t0:.1f} s)",
        flush=True,
    )
    print(
        f"stragglers: makespan_vs_bound={got.makespan_seconds / bound:.3f} "
        f"inflight_min_vs_target={(low if low is not None else target) / target:.3f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
