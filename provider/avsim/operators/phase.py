"""Phase operators: one task instance = one phase of one case (or one run-level phase).

:class:`AvsimPhaseOperator` is a ``BaseOperator`` that takes the phase's arguments
(:func:`avsim.operators.lifecycle.phase_keywords`) and runs its task's one sequence through the
:class:`avsim.operators.lifecycle.PhaseLifecycle` it holds; a backend supplies the launch and the
watch (:meth:`AvsimPhaseOperator.launch`). :class:`LocalPhaseOperator` (the embedded default) runs
the attempt as a local process and watches its heartbeat. The Kubernetes backend
(:mod:`avsim.operators.kubernetes`) is a ``KubernetesPodOperator`` with the same lifecycle.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from avsim.attempt import PhaseAttempt
from avsim.links import PHASE_LINKS
from avsim.operators.exceptions import PhaseKilled
from avsim.operators.lifecycle import AttemptResult, HeldLifecycle, PhaseLifecycle, phase_keywords
from avsim.phases import contract
from avsim.phases.contract import Detail, Outcome, classify_exit_code
from avsim.phases.heartbeat import lease_age
from avsim.phases.policy import Role

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["AvsimPhaseOperator", "LocalPhaseOperator", "resolve_command"]

#: The lines of a phase's output kept for the ledger's ``reason`` when it fails.
REASON_TAIL_LINES = 5


class AvsimPhaseOperator(BaseOperator):
    """Runs one phase under the avsim phase contract. Subclasses implement :meth:`launch`.

    Takes :class:`avsim.attempt.args.PhaseArgs`'s fields as keywords (``phase``, ``case``, ``run``,
    ``upstream_phases``, ``inputs``, ``role``, ``gpus``, ``reuse_outputs``); the rest go to
    ``BaseOperator``.
    """

    template_fields: Sequence[str] = ("case", "run", "inputs")
    ui_color = "#d8ecf3"
    #: From a phase task instance to its case page and its artifacts (avsim.links).
    operator_extra_links = PHASE_LINKS
    role: Role
    #: The try's lifecycle, built from the rendered fields when the task runs.
    lifecycle = HeldLifecycle()

    @phase_keywords
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)

    def execute(self, context: Context) -> dict[str, Any]:
        self.lifecycle = PhaseLifecycle.of(self, context)
        return self.lifecycle.execute(context, self)

    # -- the backend seam ---------------------------------------------------------------------
    def runs(self, attempt: PhaseAttempt) -> str:
        return " ".join(attempt.argv)

    def launch(self, attempt: PhaseAttempt, started: dt.datetime, context: Context) -> AttemptResult:
        raise NotImplementedError


def resolve_command(argv: Sequence[str]) -> list[str]:
    """Find the phase's executable on PATH or next to this interpreter (a virtual environment's bin)."""
    exe = argv[0]
    if os.sep not in exe:
        found = shutil.which(exe) or shutil.which(exe, path=os.path.dirname(sys.executable))
        if found:
            exe = found
    return [exe, *argv[1:]]


class LocalPhaseOperator(AvsimPhaseOperator):
    """The embedded backend: the phase runs as a process on the worker, in its own process group.

    The worker watches three things: the process's exit (classified by the contract's exit codes;
    SIGTERM, which is how a spot reclaim or a drain ends a process, is a preemption), the phase's
    timeout, and its heartbeat file (``AVSIM_HEARTBEAT_FILE``): a phase that stops renewing it for
    ``lease_seconds`` is killed and ends as ``lease_expired``, an infrastructure failure.
    """

    _proc: subprocess.Popen[str] | None = None
    #: Set by :meth:`on_kill`: a user (or Airflow) ended the task while it ran.
    _killed: threading.Event | None = None
    #: How often the worker looks at the process and its heartbeat, in seconds.
    watch_interval: float = 0.5

    def launch(self, attempt: PhaseAttempt, started: dt.datetime, context: Context) -> AttemptResult:
        hb_dir = tempfile.mkdtemp(prefix="avsim-heartbeat-")
        hb_file = Path(hb_dir) / f"{attempt.case_id}.{attempt.phase}.{attempt.attempt}"
        try:
            return self._run(
                attempt.with_attempt(attempt.attempt, extra_env={contract.ENV_HEARTBEAT_FILE: str(hb_file)}),
                hb_file,
            )
        finally:
            shutil.rmtree(hb_dir, ignore_errors=True)

    def _run(self, attempt: PhaseAttempt, hb_file: Path) -> AttemptResult:
        killed = self._killed_event()
        if killed.is_set():
            raise PhaseKilled(f"{self.lifecycle.args.where(attempt.attempt)} was killed before it started")
        env = {**os.environ, **attempt.environment()}
        # The task process's parent is its worker (Airflow's supervisor). Airflow 3 gives the task
        # process nothing that ends it with its supervisor, so a worker killed with -9 would leave
        # it (and through it this phase) running unwatched; being re-parented means the worker died.
        supervisor = os.getppid()
        try:
            argv, preexec = die_with_parent(resolve_command(attempt.argv))
            self._proc = proc = subprocess.Popen(
                argv,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
                preexec_fn=preexec,
            )
        except OSError as exc:
            return AttemptResult(
                Outcome.INFRA_FAILED, 127, f"could not start {attempt.argv[0]!r}: {exc}", Detail.SPAWN
            )
        runner = f"pid {proc.pid} on {os.uname().nodename}"
        tail: list[str] = []

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self.log.info("[%s] %s", attempt.phase, line.rstrip())
                tail.append(line.strip())
                del tail[:-REASON_TAIL_LINES]

        reader = threading.Thread(target=pump, name="avsim-phase-output", daemon=True)
        reader.start()
        runtime = attempt.runtime
        started = time.monotonic()
        try:
            while True:
                if killed.is_set():  # also when on_kill came between the start and self._proc
                    self._kill(proc)
                    break
                try:
                    code = proc.wait(timeout=self.watch_interval)
                    break
                except subprocess.TimeoutExpired:
                    pass
                stop = self._must_stop(supervisor, started, hb_file, runtime)
                if stop is not None:
                    reason, detail = stop
                    self._kill(proc)
                    reader.join(timeout=5)
                    return AttemptResult(Outcome.INFRA_FAILED, -9, reason, detail, runner)
        finally:
            self._proc = None
        # The leader is gone; what it started in its group goes with it (as a pod's containers end
        # with the pod), whether the phase exited, was killed or its worker was lost.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if killed.is_set():
            # Not an end of the attempt to record: the task is no longer the phase's to run. Nothing
            # is committed, the breaker is not fed; the next try records the attempt as lost.
            reader.join(timeout=5)
            raise PhaseKilled(
                f"{self.lifecycle.args.where(attempt.attempt)} was killed ({runner}): nothing recorded"
            )
        reader.join(timeout=30)
        outcome = classify_exit_code(code)
        reason = " | ".join(t for t in tail if t) if code else ""
        how: str = (
            Detail.TERMINATED
            if outcome is Outcome.PREEMPTED
            else (Detail.CRASH if outcome is Outcome.INFRA_FAILED else "")
        )
        return AttemptResult(outcome, code, reason[-500:], how, runner)

    @staticmethod
    def _must_stop(supervisor: int, started: float, hb_file: Path, runtime: Any) -> tuple[str, Detail] | None:
        """(reason, detail) when the running phase must be killed now, else None."""
        if os.getppid() != supervisor:
            return (
                f"the worker (pid {supervisor}) that supervised this task died; the phase was killed",
                Detail.WORKER_LOST,
            )
        if time.monotonic() - started > runtime.timeout_seconds:
            return f"timed out after {runtime.timeout_seconds:g}s and was killed", Detail.TIMEOUT
        silent = _heartbeat_age(hb_file, started)
        if runtime.lease_seconds and silent > runtime.lease_seconds:
            return (
                f"no heartbeat for {silent:.0f}s (lease {runtime.lease_seconds:g}s): the phase hung and was killed",
                Detail.LEASE_EXPIRED,
            )
        return None

    @staticmethod
    def _kill(proc: subprocess.Popen[str]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def _killed_event(self) -> threading.Event:
        if self._killed is None:
            self._killed = threading.Event()
        return self._killed

    def on_kill(self) -> None:
        """Airflow's task runner calls this from its SIGTERM handler: a user marked the running task
        failed or success, or cleared it (the worker's heartbeat got 409), or the worker is shutting
        down. SIGKILL the phase's whole process group now; the task's thread sees the flag and ends
        without recording the attempt. No wait here: the handler interrupts that thread, which may hold
        the process's wait lock."""
        self._killed_event().set()
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def die_with_parent(argv: list[str]) -> tuple[list[str], Callable[[], None] | None]:
    """The phase's command line, and what its process runs before it execs, so that it is killed when
    the worker process that started it dies.

    The phase runs in its own session (so a timeout or lease expiry can kill its whole group), which
    also cuts it off from the worker's signals; without this a worker killed with -9 would leave its
    phase running, an attempt nobody watches, burning the GPU that the retry needs. On Linux the
    process asks for ``PR_SET_PDEATHSIG`` (SIGKILL): through util-linux's ``setpriv --pdeathsig``,
    which execs the phase in its place, when it is installed (it is on every Debian-based image), else
    in a ``preexec_fn``. The first lets Python start the process with ``vfork``; a ``preexec_fn``
    makes it ``fork`` the whole task process, about 4 ms of CPU more per phase. Elsewhere: nothing.
    """
    if not sys.platform.startswith("linux"):
        return argv, None
    setpriv = _setpriv()
    if setpriv and os.path.isabs(argv[0]) and os.access(argv[0], os.X_OK):
        # Only for a command that exists: a missing one must fail to start (OSError), not exit 127.
        return [setpriv, "--pdeathsig", "KILL", "--", *argv], None
    return argv, _pdeathsig_kill


@functools.cache
def _setpriv() -> str | None:
    return shutil.which("setpriv")


def _pdeathsig_kill() -> None:
    """In the phase process, before exec: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _heartbeat_age(path: Path, started: float) -> float:
    """Seconds since the phase last renewed its heartbeat file (since it started, before the first
    beat); ``started`` is on the monotonic clock."""
    now = time.time()
    try:
        renewed: float | None = path.stat().st_mtime
    except FileNotFoundError:
        renewed = None
    return lease_age(now, renewed=renewed, started=now - (time.monotonic() - started))
