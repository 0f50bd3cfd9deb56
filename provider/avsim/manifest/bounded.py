"""Validate a manifest in a child process with a memory and a CPU-time ceiling.

:func:`load_manifest_bounded` reads the bytes here and hands them to ``python -m avsim.manifest.bounded``,
which lowers its own limits, then parses and validates exactly as
:func:`avsim.manifest.loader.parse_manifest_text` does and answers with the problems (raised here as
:class:`~avsim.errors.ManifestError`) or the canonical JSON. The bounds (``MEMORY_*``, ``TIME_*``,
:data:`WALL_FACTOR`, a resident-memory watchdog every :data:`POLL_SECONDS`) and why a child process:
docs/design.md, "Validating a manifest in a bounded process".
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any

from avsim.errors import ManifestError, Problem

if TYPE_CHECKING:
    from avsim.manifest.loader import Format, LoadedManifest
    from avsim.manifest.policy import ManifestPolicy
    from avsim.manifest.source import ManifestSource

MiB = 2**20
#: Resident memory any validation may take, whatever its size (the interpreter and its imports).
MEMORY_BASE = 256 * MiB
#: Resident bytes per input byte: a parsed document, its models and its canonical JSON (YAML's
#: node graph makes a YAML manifest cost more than the same manifest in JSON).
MEMORY_PER_BYTE: dict[str, int] = {"json": 32, "yaml": 64}
#: The child's address space is capped at twice the resident bound plus this, a backstop for where
#: the watchdog cannot read the resident memory (no /proc); the child maps ~45 MiB to start.
ADDRESS_SLACK = 0
#: CPU seconds: a base for the interpreter and its imports, then per MiB of input.
TIME_BASE = 60.0
TIME_PER_MIB = 4.0
#: Wall-clock time the child may take, in multiples of its CPU bound (a loaded machine stretches it).
WALL_FACTOR = 3.0
#: How often the watchdog reads the child's resident memory.
POLL_SECONDS = 0.01
#: The watchdog kills the child this far below the bound: more than a validation allocates between
#: two reads and the kill (pydantic building a million errors overshot a 32 MiB margin read every
#: 50 ms by 11 MiB), so the peak stays under the bound.
WATCHDOG_MARGIN = 64 * MiB

_OK, _REFUSED = "ok", "refused"


def memory_bound(size: int, fmt: str | None) -> int:
    """Resident bytes the validation of a ``size``-byte manifest may take."""
    return MEMORY_BASE + MEMORY_PER_BYTE.get(fmt or "yaml", MEMORY_PER_BYTE["yaml"]) * size


def time_bound(size: int) -> float:
    return TIME_BASE + TIME_PER_MIB * size / MiB


def load_manifest_bounded(
    source: str | ManifestSource, policy: ManifestPolicy | None = None
) -> LoadedManifest:
    """:func:`~avsim.manifest.loader.load_manifest`, with the parsing and validation bounded.

    ``source``: a path or URI, or a run's :class:`~avsim.manifest.source.ManifestSource` (a location
    or the text pasted into the trigger's conf); its bytes are read here, up to ``policy.max_bytes``."""
    from avsim.manifest.policy import deployment_policy
    from avsim.manifest.source import ManifestSource

    policy = policy or deployment_policy()
    given = ManifestSource.of(source)
    return parse_bounded(given.read(policy.max_bytes), given.name, given.fmt, policy)


def parse_bounded(
    data: bytes, source: str, fmt: Format | None, policy: ManifestPolicy | None
) -> LoadedManifest:
    """:func:`~avsim.manifest.loader.parse_manifest_text` of ``data`` in a bounded child process."""
    from avsim.manifest.loader import parse_manifest_text

    size = len(data)
    sniffed = fmt or ("json" if data.lstrip()[:1] == b"{" else "yaml")
    memory, seconds = memory_bound(size, sniffed), time_bound(size)
    request = {
        "source": source,
        "fmt": fmt,
        "policy": _policy_json(policy),
        # A backstop only: the watchdog below holds the resident bound. A failed allocation inside
        # native code (pydantic-core) can leave the child asleep on a lock instead of raising.
        "address_space": 2 * memory + ADDRESS_SLACK,
        "cpu_seconds": int(seconds) + 1,
    }
    # The bytes reach the child as an unlinked temporary file: a pipe would need a writer beside the
    # watchdog (Popen.communicate cannot resume sending input after a timeout).
    with tempfile.TemporaryFile() as given:
        given.write(data)
        given.seek(0)
        proc = subprocess.Popen(
            [sys.executable, "-m", "avsim.manifest.bounded", json.dumps(request)],
            stdin=given,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err, stopped = _watch(proc, memory, WALL_FACTOR * seconds)
    status, _, body = out.partition(b"\n")
    if stopped is None and proc.returncode == 0 and status == _OK.encode():
        # Valid, and within its limits: reading its canonical JSON again is linear and bounded.
        return parse_manifest_text(body, source=source, fmt="json", policy=policy)
    if stopped is None and proc.returncode == 0 and status == _REFUSED.encode():
        problems = [Problem(path, message) for path, message in json.loads(body)]
        raise ManifestError(problems, source=source)
    said = (
        "memory" if stopped == "memory" else "time" if stopped == "time" else status.decode(errors="replace")
    )
    raise ManifestError(
        [Problem("", _died(said, proc.returncode, err, size, sniffed, memory, seconds))], source=source
    )


def _watch(
    proc: subprocess.Popen[bytes], memory: int, wall_seconds: float
) -> tuple[bytes, bytes, str | None]:
    """Collect the child's answer, killing it when its resident memory passes ``memory`` ("memory")
    or it runs longer than ``wall_seconds`` ("time")."""
    deadline = time.monotonic() + wall_seconds
    stopped: str | None = None
    while True:
        try:
            out, err = proc.communicate(timeout=POLL_SECONDS)
            return out, err, stopped
        except subprocess.TimeoutExpired:
            pass
        if stopped is None:
            if _resident(proc.pid) > memory - WATCHDOG_MARGIN:
                stopped = "memory"
            elif time.monotonic() > deadline:
                stopped = "time"
            if stopped is not None:
                proc.kill()


def _resident(pid: int) -> int:
    """The resident memory of a process (Linux ``/proc``; 0 where there is none: the backstop holds)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _died(
    said: str, returncode: int | None, stderr: bytes, size: int, fmt: str, memory: int, seconds: float
) -> str:
    bound = f"{MEMORY_BASE // MiB} MiB + {MEMORY_PER_BYTE.get(fmt, 64)} x its {size} bytes"
    out_of_memory = (b"MemoryError", b"failed to map segment", b"Cannot allocate memory")
    if said == "memory" or any(sign in stderr for sign in out_of_memory):
        return (
            f"validating this {fmt.upper()} manifest needs more than {memory // MiB} MiB, the bound for its size "
            f"({bound}); it holds more nodes than a manifest of its size should: look for a list or mapping "
            "with very many items, or aliases repeated many times, and write it out smaller"
        )
    if said == "time" or returncode in (-24, -9):  # the wall clock, or SIGXCPU then SIGKILL at the hard limit
        return (
            f"validating this manifest took more than {seconds:.0f} CPU seconds, the bound for its size "
            f"({TIME_BASE:.0f} s + {TIME_PER_MIB:.0f} s per MiB); write it out smaller"
        )
    tail = stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
    return f"the manifest validator failed (exit {returncode}: {tail[0][:200]}); report this as a bug"


def _policy_json(policy: ManifestPolicy | None) -> dict[str, Any] | None:
    if policy is None:
        return None
    return {
        "max_bytes": policy.max_bytes,
        "max_cases": policy.max_cases,
        "uri_schemes": sorted(policy.uri_schemes),
        "uri_prefixes": list(policy.uri_prefixes),
        "artifact_root": policy.artifact_root,
        "allow_past_deadline": policy.allow_past_deadline,
    }


def _limit(address_space: int, cpu_seconds: int) -> None:
    """Lower this process's limits; never above a hard limit it inherited (a container's, a
    ``ulimit``), which a process may not raise."""
    import resource

    for which, soft, hard in (
        (resource.RLIMIT_AS, address_space, address_space),
        (resource.RLIMIT_CPU, cpu_seconds, cpu_seconds + 5),
    ):
        _, inherited = resource.getrlimit(which)
        if inherited != resource.RLIM_INFINITY:
            soft, hard = min(soft, inherited), min(hard, inherited)
        resource.setrlimit(which, (soft, hard))


def main(argv: list[str]) -> int:
    """The child: limits first, then read stdin, parse and validate, answer on stdout."""
    request = json.loads(argv[0])
    _limit(int(request["address_space"]), int(request["cpu_seconds"]))
    out = sys.stdout.buffer
    try:
        from avsim.manifest.loader import parse_manifest_text
        from avsim.manifest.policy import ManifestPolicy

        raw = request["policy"]
        policy = None
        if raw is not None:
            policy = ManifestPolicy(
                max_bytes=raw["max_bytes"],
                max_cases=raw["max_cases"],
                uri_schemes=frozenset(raw["uri_schemes"]),
                uri_prefixes=tuple(raw["uri_prefixes"]),
                artifact_root=raw["artifact_root"],
                allow_past_deadline=raw["allow_past_deadline"],
            )
        data = sys.stdin.buffer.read()
        try:
            loaded = parse_manifest_text(data, source=request["source"], fmt=request["fmt"], policy=policy)
        except ManifestError as exc:
            out.write(
                _REFUSED.encode() + b"\n" + json.dumps([[p.path, p.message] for p in exc.problems]).encode()
            )
            return 0
        out.write(_OK.encode() + b"\n" + loaded.canonical_json)
        return 0
    except MemoryError:
        out.write(b"memory\n")
        return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
