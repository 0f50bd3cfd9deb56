"""CPU seconds of a set of process trees, read from /proc (for the overhead benches).

A stack's components (scheduler, dag-processor, triggerer, api-server, PostgreSQL's postmaster) are
the roots. Everything they start is counted through them:

- a live process contributes ``utime + stime`` (its own) and ``cutime + cstime`` (its children that
  ended and were reaped by it: Linux adds a reaped child's whole CPU, its own reaped children
  included, to the parent's ``cutime``/``cstime`` when the parent waits for it);
- a process that ended between two samples is therefore still counted, in its parent, as long as the
  parent reaped it; a process re-parented out of the tree (an orphan reaped by init) would be lost,
  and none of Airflow's processes is (the LocalExecutor's workers reap their task processes, the task
  process its phase process, the dag-processor its parsing processes, the postmaster its backends).

Each sample splits the scheduler's tree by role: the LocalExecutor workers (found by their process
title, ``airflow worker -- LocalExecutor...``; each is the supervisor of the task processes it forks)
are ``supervisors``, everything below them and their reaped children are ``task processes`` (the DAG
file's parse, the operator, whatever it starts), and the rest is ``scheduler`` (its loop, and a
multiprocessing forkserver when ``mp_start_method`` is ``forkserver``). Other roots are reported
whole.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    own: float  # utime + stime, seconds
    reaped: float  # cutime + cstime, seconds


def read_stat(pid: int) -> ProcStat | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command may contain spaces and parentheses: the fields start after the last ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    # rest[0] is field 3 (state): ppid is field 4, utime..cstime fields 14..17.
    ppid = int(rest[1])
    utime, stime, cutime, cstime = (int(x) for x in rest[11:15])
    return ProcStat(pid, ppid, (utime + stime) / TICKS, (cutime + cstime) / TICKS)


def all_stats() -> dict[int, ProcStat]:
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = read_stat(int(name))
            if st is not None:
                stats[st.pid] = st
    return stats


def tree_cpu(roots: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds so far of each root's tree, split as described in the module's docstring.

    Keys: ``<root>`` (depth 0: own and reaped), and for the root named ``scheduler`` also
    ``supervisors`` (the LocalExecutor workers' own CPU) and ``task processes`` (the workers' reaped
    children and every live process below them).
    """
    stats = all_stats()
    children: dict[int, list[int]] = {}
    for st in stats.values():
        children.setdefault(st.ppid, []).append(st.pid)
    out: dict[str, float] = {}
    for name, root in roots.items():
        top = stats.get(root)
        if top is None:
            continue
        if name == "scheduler":
            out["scheduler"] = out.get("scheduler", 0.0) + top.own + top.reaped
            stack = list(children.get(root, []))
            while stack:
                pid = stack.pop()
                st = stats[pid]
                if "LocalExecutor" in _title(pid):
                    out["supervisors"] = out.get("supervisors", 0.0) + st.own
                    out["task processes"] = (
                        out.get("task processes", 0.0) + st.reaped + _below(pid, stats, children)
                    )
                else:
                    # a forkserver (its reaped children are workers that ended) or a helper process
                    out["scheduler"] = out.get("scheduler", 0.0) + st.own + st.reaped
                    stack.extend(children.get(pid, []))
            continue
        out[name] = out.get(name, 0.0) + top.own + top.reaped + _below(root, stats, children)
    return out


def _title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _below(pid: int, stats: Mapping[int, ProcStat], children: Mapping[int, list[int]]) -> float:
    total = 0.0
    stack = list(children.get(pid, []))
    while stack:
        p = stack.pop()
        st = stats.get(p)
        if st is None:
            continue
        total += st.own + st.reaped
        stack.extend(children.get(p, []))
    return total


def delta(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in sorted(set(after) | set(before))}
