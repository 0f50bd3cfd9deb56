"""A discrete-event simulation of one run on given capacity, in the shape of the real run.

It models shard runs (by window or by cases in flight), the pools, Airflow's order and the
scheduler's loop, the orchestrator's cost per phase, spot preemptions with checkpoints, the real
failure policy's retries and on-demand fallback, and tails (hangs, slow phases). One event heap, no
time steps; every draw is keyed by (seed, task, attempt)
(docs/design.md, "The capacity planner's model").
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Any

from avsim.phases.contract import NODE_CPU, NODE_ON_DEMAND, NODE_SPOT, Outcome
from avsim.phases.policy import Action, Role, decide, node_class_for
from avsim.plan.inflight import loop_seconds
from avsim.planner.options import (
    SALT_FAIL,
    SALT_FAIL_AT,
    SALT_PREEMPT,
    Capacity,
    PlannerError,
    SimOptions,
    hangs,
    phase_duration,
    unit,
)
from avsim.planner.result import SimResult
from avsim.planner.workload import PhaseWork, Workload

SPOT, ON_DEMAND, CPU = 0, 1, 2
POOL_NAMES = ("GPU spot", "GPU on-demand", "CPU")
#: The pool of each node class the failure policy places an attempt on.
POOL_OF_NODE = {NODE_SPOT: SPOT, NODE_ON_DEMAND: ON_DEMAND, NODE_CPU: CPU}
# Event kinds; at equal times, completions are handled before retries become ready.
_END, _PREEMPT, _FAIL, _READY, _SHARD, _QUEUE, _LOOP, _HANG = 0, 1, 2, 3, 4, 5, 6, 7


def check_capacity(workload: Workload, capacity: Capacity, options: SimOptions) -> None:
    """Refuse capacity some phase could never get (Airflow would leave it waiting forever)."""
    phases = [p for c in workload.cases for p in c.phases] + list(workload.run_phases)
    gpu = [p for p in phases if p.is_gpu]
    widest = max((p.gpus for p in gpu), default=0)
    if widest > capacity.gpus:
        raise PlannerError(
            f"a GPU phase takes {widest} GPUs but the spot GPU pool has {capacity.gpus} slots: it would "
            "wait forever; raise --gpus"
        )
    if any(not p.is_gpu for p in phases) and capacity.cpus < 1:
        raise PlannerError("the CPU pool has no slots and some phases run on CPU; raise --cpus")
    if options.preemption_rate > 0:
        falls_back = [p.gpus for p in gpu if p.retry.preemption >= p.retry.on_demand_after_preemptions]
        if falls_back and max(falls_back) > capacity.on_demand_gpus:
            raise PlannerError(
                f"with preemption, GPU phases move to the on-demand pool after a few preemptions, and "
                f"one takes {max(falls_back)} GPUs but that pool has {capacity.on_demand_gpus}: it would "
                "wait forever; raise --on-demand-gpus"
            )


def simulate(
    workload: Workload,
    capacity: Capacity,
    options: SimOptions | None = None,
    *,
    stop_after: float | None = None,
) -> SimResult:
    """Simulate the run; ``stop_after``: give up (``complete=False``) once past that many seconds."""
    options = options or SimOptions()
    check_capacity(workload, capacity, options)
    return _Simulation(workload, capacity, options).run(stop_after)


class _Simulation:
    """The flattened run: one entry per task in parallel lists, indexed by task number."""

    def __init__(self, workload: Workload, capacity: Capacity, options: SimOptions) -> None:
        from avsim.plan.priority_rule import phase_priority

        self.capacity = capacity
        self.options = options
        cases = workload.cases
        keys = sorted(
            {c.shard if c.shard is not None else i // options.shard_size for i, c in enumerate(cases)}
        )
        renumber = {k: n for n, k in enumerate(keys)}
        self.n_shards = len(keys)
        self.run_shard = self.n_shards  # the run-level phases: a shard of their own, after all others
        self.shard_cases: list[list[int]] = [[] for _ in range(self.n_shards + 1)]
        self.case_shard: list[int] = []
        self.case_left: list[int] = []
        self.case_failed: list[bool] = []
        self.case_roots: list[list[int]] = []
        self.case_tasks: list[range] = []
        self.task_case: list[int] = []
        self.duration: list[float] = []
        self.gpus: list[int] = []
        self.slots: list[int] = []
        self.checkpoint: list[bool] = []
        self.phase: list[PhaseWork] = []
        self.down: list[list[int]] = []
        self.n_up: list[int] = []
        self.prefix: list[tuple[int, ...]] = []
        #: Task instances of each phase in its shard run (2 with a twin; run-level phases: 0, not counted).
        self.tis: list[int] = []
        weight_cache: dict[int, int] = {}
        strategy = options.strategy
        map_counter: dict[tuple[int, str], int] = {}

        def weight(p: PhaseWork) -> int:
            w = weight_cache.get(id(p))
            if w is None:
                if strategy == "critical_path":
                    w = phase_priority(workload.run_class, p.path_seconds)
                else:  # downstream: Airflow's default rule, every task's own weight being 1
                    w = 1 + p.downstream_tasks
                weight_cache[id(p)] = w
            return w

        # One template per distinct phase graph (cases of a family share theirs): relative edges,
        # slots and weights computed once, then laid out at each case's first task number.
        templates: dict[int, tuple[list[list[int]], list[int], list[int], list[int], list[int]]] = {}

        def template(
            phases: tuple[PhaseWork, ...],
        ) -> tuple[list[list[int]], list[int], list[int], list[int], list[int]]:
            found = templates.get(id(phases))
            if found is None:
                at = {p.name: i for i, p in enumerate(phases)}
                ups = [[at[u] for u in p.upstream if u in at] for p in phases]
                down: list[list[int]] = [[] for _ in phases]
                for i, us in enumerate(ups):
                    for u in us:
                        down[u].append(i)
                weights = [0 if strategy == "fifo" else -weight(p) for p in phases]
                roots = [i for i, us in enumerate(ups) if not us]
                found = templates[id(phases)] = (
                    down,
                    [len(us) for us in ups],
                    roots,
                    weights,
                    [p.gpus for p in phases],
                )
            return found

        def add_case(phases: tuple[PhaseWork, ...], shard: int, map_index: int) -> None:
            c = len(self.case_shard)
            first = len(self.duration)
            down, n_up, roots, weights, gpus = template(phases)
            self.case_shard.append(shard)
            self.shard_cases[shard].append(c)
            self.case_left.append(len(phases))
            self.case_failed.append(False)
            self.case_roots.append([first + r for r in roots])
            self.case_tasks.append(range(first, first + len(phases)))
            self.task_case.extend([c] * len(phases))
            self.duration.extend(phase_duration(p.seconds, first + i, options) for i, p in enumerate(phases))
            self.gpus.extend(gpus)
            self.slots.extend(g if g else 1 for g in gpus)
            self.checkpoint.extend(p.checkpoint for p in phases)
            self.phase.extend(phases)
            self.tis.extend(0 if shard == self.run_shard else p.tasks for p in phases)
            self.down.extend([first + d for d in ds] for ds in down)
            self.n_up.extend(n_up)
            if strategy == "fifo":
                self.prefix.extend(() for _ in phases)
            elif shard == self.run_shard:
                self.prefix.extend(((0, shard, 0) if options.shard_logical_dates else (0, 0)) for _ in phases)
            elif options.shard_logical_dates:
                self.prefix.extend((w, shard, map_index) for w in weights)
            else:
                self.prefix.extend((w, map_index) for w in weights)

        for i, case in enumerate(cases):
            shard = renumber[case.shard if case.shard is not None else i // options.shard_size]
            slot = (shard, case.family)
            index = map_counter.get(slot, 0)
            map_counter[slot] = index + 1
            add_case(case.phases, shard, index)
        self.n_cases = len(cases)
        if workload.run_phases:
            add_case(workload.run_phases, self.run_shard, 0)
        n = len(self.duration)
        self.progress = [0.0] * n  # work saved by checkpoints
        self.started = [0.0] * n
        self.pool = [0] * n
        self.tries = [0] * n
        # The failure policy's view of each phase: its task's role (a GPU phase starts as the spot
        # task and may be handed to its on-demand twin) and the failures of that task's attempts.
        self.role = [Role.SPOT if g else Role.REGULAR for g in self.gpus]
        self.history: list[list[Outcome]] = [[] for _ in range(n)]
        self.dead = [False] * n

    # -- the loop -------------------------------------------------------------------------------

    def run(self, stop_after: float | None) -> SimResult:
        o = self.options
        self.events: list[tuple[float, int, int, int]] = []
        self.now = 0.0
        self.held = o.held_overhead_seconds
        self.latency = o.phase_overhead_seconds - self.held
        self.seq = 0
        self.free = [self.capacity.gpus, self.capacity.on_demand_gpus, self.capacity.cpus]
        self.queues: dict[int, list[list[Any]]] = {}
        self.running = [0] * (self.n_shards + 1)
        self.shard_left = [len(cs) for cs in self.shard_cases]
        self.next_shard = 0
        self.active_runs = 0
        self.open_cases = 0  # admitted and not ended
        self.min_waiting = math.inf  # the fewest open cases while some cases wait to start
        self.shards_done = 0
        # What the scheduler's loop carries, integrated over time.
        self.open_tis = self.open_twins = 0
        self.tis_area = self.twins_area = 0.0
        self.counted_at = 0.0
        self.peaks = {"tis": 0, "cases": 0, "runs": 0}
        self.pending: deque[tuple[float, int]] = deque()
        self.looping = o.scheduler_ms_per_task_instance > 0
        self.loop_start = 0.0
        self.loop_lengths: list[float] = []
        self.end_time = 0.0
        self.case_ends: list[float] = []
        self.stats = {
            "gpu": 0.0,
            "od": 0.0,
            "cpu": 0.0,
            "lost": 0.0,
            "att": 0,
            "pre": 0,
            "fail": 0,
            "odatt": 0,
        }
        in_use: list[tuple[float, int]] = [(0.0, 0)]
        self._admit(0.0)
        if self.looping:
            self._next_loop(0.0)
        if self.n_shards == 0 and self.shard_cases[self.run_shard]:
            self._push(0.0, _SHARD, self.run_shard)
        events = self.events
        total_gpus = self.capacity.gpus + self.capacity.on_demand_gpus
        while events:
            now = self.now = events[0][0]
            if stop_after is not None and now > stop_after:
                return self._result(False, in_use)
            loop_ends = False
            while events and events[0][0] == now:
                _, _, kind, a = heapq.heappop(events)
                if kind == _LOOP:
                    loop_ends = True
                elif kind == _READY:
                    self._ready(a)
                elif kind == _QUEUE:
                    self._queued(a)
                elif kind == _SHARD:
                    self._start_shard(a)
                else:
                    self._attempt_over(a, kind, now)
            if not self.looping:
                self._dispatch(now)
            elif loop_ends:
                self._loop_over(now)
            if self.next_shard < self.n_shards and self.open_cases < self.min_waiting:
                self.min_waiting = self.open_cases  # cases wait to start while these are in flight
            used = total_gpus - self.free[SPOT] - self.free[ON_DEMAND]
            if used != in_use[-1][1]:
                in_use.append((now, used))
        if self.shards_done < self.n_shards or any(self.case_left):
            raise PlannerError("the simulation stalled with work left (a phase could never get its slots)")
        return self._result(True, in_use)

    def _push(self, at: float, kind: int, a: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, a))

    def _admit(self, now: float) -> None:
        """Start the next shard runs the window (and the cases-in-flight target) leave room for."""
        o = self.options
        while self.next_shard < self.n_shards and self.active_runs < o.max_active_shards:
            # Admitting by cases: the next shard run refills the week while fewer than the target are
            # unfinished (avsim.plan.admission.admit).
            if o.cases_in_flight is not None and self.active_runs and self.open_cases >= o.cases_in_flight:
                break
            size = len(self.shard_cases[self.next_shard])
            self.active_runs += 1
            self.open_cases += size
            self.peaks["runs"] = max(self.peaks["runs"], self.active_runs)
            self.peaks["cases"] = max(self.peaks["cases"], self.open_cases)
            self._push(now + o.shard_start_seconds, _SHARD, self.next_shard)
            self.next_shard += 1

    def _count(self, tis: int, twins: int) -> None:
        """The unfinished task instances change by ``tis`` (of them ``twins`` twins) now."""
        span = self.now - self.counted_at
        self.tis_area += self.open_tis * span
        self.twins_area += self.open_twins * span
        self.counted_at = self.now
        self.open_tis += tis
        self.open_twins += twins
        if self.open_tis > self.peaks["tis"]:
            self.peaks["tis"] = self.open_tis

    def _next_loop(self, now: float) -> None:
        length = loop_seconds(self.open_tis, self.options.scheduler_ms_per_task_instance)
        self.loop_start = now
        self.loop_lengths.append(length)
        self._push(now + length, _LOOP, 0)

    def _loop_over(self, now: float) -> None:
        """A loop ends: what was ready before it began is scheduled, then at most
        ``max_tis_per_loop`` are queued (the scheduler's critical section); the next loop begins."""
        pending = self.pending
        while pending and pending[0][0] <= self.loop_start:
            self._queue(pending.popleft()[1])
        self._dispatch(now, self.options.max_tis_per_loop)
        if self.events or pending or any(h for hs in self.queues.values() for h in hs):
            self._next_loop(now)

    def _start_shard(self, s: int) -> None:
        self.queues[s] = [[], [], []]
        if s != self.run_shard:
            cases = self.shard_cases[s]
            tis = [self.tis[t] for c in cases for t in self.case_tasks[c]]
            self._count(sum(tis), sum(1 for n in tis if n == 2))
        for c in self.shard_cases[s]:
            for t in self.case_roots[c]:
                self._ready(t)

    def _ready(self, t: int) -> None:
        """``t`` may run now; it is queued after the orchestrator's latency."""
        latency = self.latency
        if latency > 0:
            self._push(self.now + latency, _QUEUE, t)
        else:
            self._queued(t)

    def _queued(self, t: int) -> None:
        """``t`` is ready for the scheduler: queued now, or seen by the next loop that begins."""
        if self.looping:
            self.pending.append((self.now, t))
        else:
            self._queue(t)

    def _queue(self, t: int) -> None:
        pool = self.pool[t] = POOL_OF_NODE[node_class_for(self.gpus[t], self.role[t])]
        self.seq += 1
        heapq.heappush(self.queues[self.case_shard[self.task_case[t]]][pool], (*self.prefix[t], self.seq, t))

    def _dispatch(self, now: float, most: int | None = None) -> None:
        """Start what fits, in Airflow's order; at most ``most`` (one loop's queueing) when given."""
        free, running, slots = self.free, self.running, self.slots
        cap = self.options.max_active_tasks_per_shard
        limit = self.options.parallelism
        heads = [(s, p, h) for s, hs in self.queues.items() for p, h in enumerate(hs)]
        aside: list[tuple[list[Any], Any]] = []
        started = 0
        while (limit is None or sum(running) < limit) and (most is None or started < most):
            best = None
            best_key = None
            for s, p, h in heads:
                if not h or free[p] <= 0:
                    continue
                if cap is not None and running[s] >= cap and s != self.run_shard:
                    continue
                if best_key is None or h[0] < best_key:
                    best, best_key = (s, p, h), h[0]
            if best is None:
                break
            s, p, h = best
            item = heapq.heappop(h)
            t = item[-1]
            if slots[t] > free[p]:
                aside.append((h, item))  # does not fit now; smaller tasks behind it may
                continue
            self._start(t, p, s, now)
            started += 1
        for h, item in aside:
            heapq.heappush(h, item)

    def _start(self, t: int, pool: int, shard: int, now: float) -> None:
        o = self.options
        self.free[pool] -= self.slots[t]
        self.running[shard] += 1
        self.started[t] = now
        attempt = self.tries[t]
        self.tries[t] += 1
        self.stats["att"] += 1
        if pool == ON_DEMAND:
            self.stats["odatt"] += 1
        work = self.duration[t] - self.progress[t]
        begin = now + self.held  # the work starts after the orchestrator's part in the slot
        end, kind = begin + work, _END
        if pool == SPOT and o.preemption_rate > 0:
            u = unit(o.seed, t, attempt, SALT_PREEMPT)
            after = -math.log1p(-u) * 3600.0 / (o.preemption_rate * self.gpus[t])
            if after < work:
                end, kind = begin + after, _PREEMPT
        if o.failure_rate > 0 and unit(o.seed, t, attempt, SALT_FAIL) < o.failure_rate:
            at = begin + work * unit(o.seed, t, attempt, SALT_FAIL_AT)
            if at < end:
                end, kind = at, _FAIL
        if hangs(t, attempt, self.gpus[t], o):  # no progress, its slots held until the lease expires
            end, kind = begin + o.lease_seconds, _HANG
        self._push(end, kind, t)

    def _attempt_over(self, t: int, kind: int, now: float) -> None:
        pool = self.pool[t]
        self.free[pool] += self.slots[t]
        shard = self.case_shard[self.task_case[t]]
        self.running[shard] -= 1
        elapsed = now - self.started[t]
        if pool == CPU:
            self.stats["cpu"] += elapsed
        else:
            self.stats["gpu"] += elapsed * self.gpus[t]
            if pool == ON_DEMAND:
                self.stats["od"] += elapsed * self.gpus[t]
        if kind == _END:
            self._finish(t, True, now)
            return
        # Preempted or crashed: keep what the last checkpoint saved, lose the rest (a hang did nothing).
        done = self.progress[t] + (0.0 if kind == _HANG else max(0.0, elapsed - self.held))
        saved = 0.0
        if self.checkpoint[t]:
            step = self.options.checkpoint_seconds
            saved = math.floor(done / step) * step
        if self.gpus[t]:
            self.stats["lost"] += (done - saved) * self.gpus[t]
        self.progress[t] = saved
        outcome = Outcome.PREEMPTED if kind == _PREEMPT else Outcome.INFRA_FAILED
        self.stats["pre" if kind == _PREEMPT else "fail"] += 1
        decision = decide(self.history[t], outcome, self.phase[t].retry, self.role[t], gpus=self.gpus[t])
        self.history[t].append(outcome)
        if decision.action is Action.HAND_OVER:  # the twin starts at once, with budgets of its own
            self.role[t], self.history[t] = Role.ON_DEMAND, []
            self._push(now, _READY, t)
        elif decision.action is Action.RETRY:
            self._push(now + decision.delay_seconds, _READY, t)
        else:
            self._finish(t, False, now)

    def _finish(self, t: int, ok: bool, now: float) -> None:
        c = self.task_case[t]
        ended = 1
        tis = self.tis[t]
        twins = 1 if tis == 2 else 0
        if ok:
            for d in self.down[t]:
                self.n_up[d] -= 1
                if self.n_up[d] == 0 and not self.dead[d]:
                    self._ready(d)
        else:  # out of budget: every phase downstream of it is upstream_failed
            self.case_failed[c] = True
            stack = list(self.down[t])
            while stack:
                d = stack.pop()
                if not self.dead[d]:
                    self.dead[d] = True
                    ended += 1
                    tis += self.tis[d]
                    twins += 1 if self.tis[d] == 2 else 0
                    stack.extend(self.down[d])
        if tis:
            self._count(-tis, -twins)
        self.case_left[c] -= ended
        if self.case_left[c] == 0:
            shard = self.case_shard[c]
            if shard != self.run_shard:
                self.case_ends.append(now)
                self.open_cases -= 1
            self.shard_left[shard] -= 1
            if self.shard_left[shard] == 0:
                self._shard_over(shard, now)  # admits what the window leaves room for
            elif self.options.cases_in_flight is not None and shard != self.run_shard:
                self._admit(now)  # the case made room

    def _shard_over(self, s: int, now: float) -> None:
        del self.queues[s]
        self.end_time = now
        if s == self.run_shard:
            return
        self.shards_done += 1
        self.active_runs -= 1
        if self.next_shard < self.n_shards:
            self._admit(now)
        elif self.shards_done == self.n_shards and self.shard_cases[self.run_shard]:
            self._push(now + self.options.run_phases_start_seconds, _SHARD, self.run_shard)

    def _result(self, complete: bool, in_use: list[tuple[float, int]]) -> SimResult:
        st = self.stats
        self._count(0, 0)
        span = self.counted_at
        return SimResult(
            strategy=self.options.strategy,
            capacity=self.capacity,
            options=self.options,
            complete=complete,
            makespan_seconds=self.end_time if complete else math.inf,
            cases=self.n_cases,
            cases_failed=sum(1 for c in range(self.n_cases) if self.case_failed[c]),
            case_end_seconds=tuple(self.case_ends),
            gpu_busy_seconds=float(st["gpu"]),
            on_demand_gpu_seconds=float(st["od"]),
            cpu_busy_seconds=float(st["cpu"]),
            lost_gpu_seconds=float(st["lost"]),
            attempts=int(st["att"]),
            preemptions=int(st["pre"]),
            infra_failures=int(st["fail"]),
            on_demand_attempts=int(st["odatt"]),
            gpus_in_use=tuple(in_use),
            peak_task_instances=self.peaks["tis"],
            mean_task_instances=self.tis_area / span if span > 0 else 0.0,
            mean_twin_task_instances=self.twins_area / span if span > 0 else 0.0,
            peak_cases_in_flight=self.peaks["cases"],
            peak_active_shard_runs=self.peaks["runs"],
            min_cases_in_flight_waiting=None if math.isinf(self.min_waiting) else int(self.min_waiting),
            loops=len(self.loop_lengths),
            mean_loop_seconds=sum(self.loop_lengths) / len(self.loop_lengths) if self.loop_lengths else 0.0,
            max_loop_seconds=max(self.loop_lengths, default=0.0),
        )
