"""A container's log as the kubelet keeps it: timestamped lines, readable while being written."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from .objects import rfc3339_nano


@dataclass
class LogQuery:
    """The ``pods/{name}/log`` query parameters that shape the output."""

    timestamps: bool = False
    tail_lines: int | None = None
    since_ns: int | None = None  # from sinceSeconds / sinceTime
    limit_bytes: int | None = None


class PodLog:
    """Lines with their arrival time in ns; ``finished`` once the container has terminated.

    Keeps at most ``max_bytes`` (the kubelet rotates at 10 MiB by default): older lines drop.
    """

    def __init__(self, max_bytes: int = 10 * 1024 * 1024):
        self._lines: deque[tuple[int, bytes]] = deque()
        self._dropped = 0  # lines dropped from the front, so readers' offsets stay valid
        self._size = 0
        self._max = max_bytes
        self._partial = b""
        self.cond = threading.Condition()
        self.finished = False

    def feed(self, data: bytes) -> None:
        """Bytes from the container's stdout/stderr pipe; complete lines become log entries."""
        if not data:
            return
        now = time.time_ns()
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        with self.cond:
            for line in complete:
                self._append(now, line + b"\n")
            self.cond.notify_all()

    def _append(self, ts: int, line: bytes) -> None:
        self._lines.append((ts, line))
        self._size += len(line)
        while self._size > self._max and len(self._lines) > 1:
            _, old = self._lines.popleft()
            self._size -= len(old)
            self._dropped += 1

    def finish(self) -> None:
        with self.cond:
            if self._partial:
                self._append(time.time_ns(), self._partial)
                self._partial = b""
            self.finished = True
            self.cond.notify_all()

    def snapshot(self) -> tuple[list[tuple[int, bytes]], int]:
        """All kept lines and the absolute index just past the last one."""
        with self.cond:
            return list(self._lines), self._dropped + len(self._lines)

    def since(self, index: int) -> tuple[list[tuple[int, bytes]], int]:
        with self.cond:
            start = max(0, index - self._dropped)
            return list(self._lines)[start:], self._dropped + len(self._lines)

    def text(self) -> str:
        return b"".join(line for _, line in self.snapshot()[0]).decode(errors="replace")

    def wait(self, index: int, timeout: float) -> bool:
        """Block until a line past ``index`` exists or the log is finished; False on timeout."""
        with self.cond:
            return self.cond.wait_for(
                lambda: self.finished or self._dropped + len(self._lines) > index, timeout=timeout
            )


def render(lines: list[tuple[int, bytes]], query: LogQuery) -> Iterator[bytes]:
    """Apply sinceSeconds/sinceTime, tailLines and timestamps to ``lines``."""
    if query.since_ns is not None:
        lines = [entry for entry in lines if entry[0] >= query.since_ns]
    if query.tail_lines is not None:
        lines = lines[-query.tail_lines :] if query.tail_lines > 0 else []
    for ts, line in lines:
        yield (rfc3339_nano(ts).encode() + b" " + line) if query.timestamps else line


def tail_message(log: PodLog, max_lines: int = 80, max_bytes: int = 2048) -> str:
    """What ``terminationMessagePolicy: FallbackToLogsOnError`` puts in ``terminated.message``."""
    lines, _ = log.snapshot()
    data = b"".join(line for _, line in lines[-max_lines:])
    return data[-max_bytes:].decode(errors="replace")
