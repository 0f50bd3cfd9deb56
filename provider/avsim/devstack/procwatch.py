"""Nothing a stack starts outlives it: a watcher process per stack, and the ``/proc`` look-ups it uses.

The stack's owner tells the watcher, through a pipe only the owner writes to, which sessions,
environment marks and paths to end; when the pipe closes (the owner stopped or died, however it died),
the watcher signals the sessions, waits up to :data:`GRACE_SECONDS`, kills what is left with SIGKILL and
removes the paths. Linux only. Why sessions and marks: docs/design.md, "The local stack and the fake
simulator".
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

GRACE_SECONDS = 20.0
TRACK_SECONDS = 2.0
KILL_WAIT_SECONDS = 5.0


def _pids() -> Iterator[int]:
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if name.isdigit():
            yield int(name)


def stat_fields(pid: int) -> tuple[str, int, int, int] | None:
    """(state, parent pid, process group, session) of a live process, from ``/proc/PID/stat``."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: the fields after it follow the last ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    return rest[0], int(rest[1]), int(rest[2]), int(rest[3])


def environ_entries(pid: int) -> set[str]:
    """The ``NAME=VALUE`` entries of the environment a process was started with (empty when unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return set()
    return {entry.decode(errors="replace") for entry in raw.split(b"\0") if entry}


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, already dead and waiting for its parent, does not count)."""
    fields = stat_fields(pid)
    if fields is not None:
        return fields[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not sys.platform.startswith("linux")


def ancestors(pid: int) -> set[int]:
    """``pid``'s parent, its parent's parent, and so on up to init."""
    found = set()
    while (fields := stat_fields(pid)) is not None and fields[1] > 0 and fields[1] not in found:
        pid = fields[1]
        found.add(pid)
    return found


def marked_processes(marks: Iterable[str], exclude: Iterable[int] = ()) -> list[int]:
    """Live processes started with one of ``marks`` (``NAME=VALUE``) in their environment."""
    wanted = set(marks)
    skip = {os.getpid(), *exclude}
    if not wanted:
        return []
    return [pid for pid in _pids() if pid not in skip and wanted & environ_entries(pid) and alive(pid)]


def session_processes(sessions: Iterable[int], exclude: Iterable[int] = ()) -> list[int]:
    """Live processes in any of ``sessions``."""
    wanted = set(sessions)
    skip = {os.getpid(), *exclude}
    found = []
    for pid in _pids():
        fields = stat_fields(pid)
        if pid not in skip and fields and fields[3] in wanted and fields[0] not in ("Z", "X"):
            found.append(pid)
    return found


def _signal(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _open_pidfd(pid: int) -> int | None:
    """A descriptor naming this very process (not whatever reuses its pid later); None if unsupported."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _still_running(pid: int, pidfd: int | None) -> bool:
    if pidfd is None:
        return alive(pid)
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass
class Session:
    """A session the watcher ends: its leader's pid (= the session id) and the signal that stops it.

    pids are reused (32,768 of them by default), so a session id is trusted only while it stays
    taken: while its leader runs, or while members it left run (an id is not given out again while
    any process is in that session). The watcher looks every :data:`TRACK_SECONDS` once the leader
    has gone; a session found empty then is retired for good, whatever later has its id.
    """

    sid: int
    stop_signal: int
    pidfd: int | None
    retired: bool = False

    def led(self) -> bool:
        return not self.retired and _still_running(self.sid, self.pidfd)


@dataclass
class Targets:
    """What one stack asked to be ended: sessions with their stop signal, environment marks, paths."""

    sessions: list[Session] = field(default_factory=list)
    marks: set[str] = field(default_factory=set)
    paths: list[str] = field(default_factory=list)

    def add(self, line: str) -> None:
        kind, _, value = line.strip().partition(" ")
        if kind == "session":
            sid, _, signame = value.partition(" ")
            stop_signal = int(getattr(signal, signame or "SIGTERM"))
            self.sessions.append(Session(int(sid), stop_signal, _open_pidfd(int(sid))))
        elif kind == "mark":
            self.marks.add(value)
        elif kind == "remove":
            self.paths.append(value)

    def live_sessions(self) -> list[Session]:
        return [s for s in self.sessions if not s.retired]

    def track(self) -> None:
        """Retire the sessions that have neither leader nor members left."""
        leaderless = [s for s in self.live_sessions() if not s.led()]
        if not leaderless:
            return
        populated = {
            fields[3]
            for pid in session_processes(s.sid for s in leaderless)
            if (fields := stat_fields(pid)) is not None
        }
        for session in leaderless:
            session.retired = session.sid not in populated

    def remaining(self, exclude: Iterable[int] = ()) -> list[int]:
        sids = [s.sid for s in self.live_sessions()]
        return sorted({*session_processes(sids, exclude), *marked_processes(self.marks, exclude)})


def end(targets: Targets, *, grace: float = GRACE_SECONDS, exclude: Iterable[int] = ()) -> list[int]:
    """Stop everything ``targets`` names: stop signals, ``grace`` seconds, then SIGKILL.

    A session whose leader runs gets its stop signal through the leader's process group (as a
    terminal's Ctrl-C would reach it); the members a gone leader left get it one by one.
    Returns the pids that had to be killed with SIGKILL.
    """
    skip = set(exclude)
    targets.track()
    for session in targets.live_sessions():
        if session.led():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(session.sid, session.stop_signal)
        else:
            _signal(session_processes([session.sid], skip), session.stop_signal)
    _signal(marked_processes(targets.marks, skip), signal.SIGTERM)
    deadline = time.monotonic() + grace
    while (left := targets.remaining(skip)) and time.monotonic() < deadline:
        time.sleep(0.2)
        targets.track()
    killed = left
    deadline = time.monotonic() + KILL_WAIT_SECONDS
    while left and time.monotonic() < deadline:
        for session in targets.live_sessions():
            if session.led():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(session.sid, signal.SIGKILL)
        _signal(left, signal.SIGKILL)
        time.sleep(0.1)
        left = targets.remaining(skip)
    for path in targets.paths:
        shutil.rmtree(path, ignore_errors=True)
    return killed


class _Stop(Exception):
    pass


def _stop_now(signum: int, frame: object) -> None:
    raise _Stop


def read_targets(fd: int, targets: Targets) -> None:
    """Add the lines read from ``fd`` to ``targets`` until end-of-file; track the sessions meanwhile."""
    pending = b""
    while True:
        ready, _, _ = select.select([fd], [], [], TRACK_SECONDS)
        if not ready:
            targets.track()
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            return
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            targets.add(line.decode())


def watch(fd: int, owner: int, grace: float = GRACE_SECONDS) -> list[int]:
    """The watcher's life: collect targets until end-of-file (or SIGTERM), then end them (sparing the owner)."""
    targets = Targets()
    with contextlib.suppress(_Stop):
        read_targets(fd, targets)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return end(targets, grace=grace, exclude=(owner,))


class Watcher:
    """The owner's side: starts the watcher process and tells it what to end; :meth:`close` ends it all.

    ``pass_fds``: descriptors the watcher keeps open until it has finished (a lock held on the
    stack's home, so the home counts as busy until its last process is gone).
    """

    def __init__(self, grace: float = GRACE_SECONDS, pass_fds: Iterable[int] = ()) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "avsim.devstack.procwatch", str(grace)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
            pass_fds=tuple(pass_fds),
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _tell(self, line: str) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ValueError):
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()

    def session(self, sid: int, signame: str = "SIGTERM") -> None:
        self._tell(f"session {sid} {signame}")

    def mark(self, entry: str) -> None:
        self._tell(f"mark {entry}")

    def remove(self, path: str | Path) -> None:
        self._tell(f"remove {path}")

    def close(self, timeout: float = GRACE_SECONDS + KILL_WAIT_SECONDS + 10) -> None:
        """End everything it was told about now, and wait for the watcher to finish."""
        if self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout)


def main() -> None:
    # Its own session already keeps terminal signals away, and only the pipe's end says when to act;
    # SIGTERM (a machine shutting down, someone stopping it by hand) ends the targets at once.
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stop_now)
    owner = os.getppid()
    grace = float(sys.argv[1]) if len(sys.argv) > 1 else GRACE_SECONDS
    watch(sys.stdin.fileno(), owner, grace)


if __name__ == "__main__":
    main()
