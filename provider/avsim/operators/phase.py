"""Phase operators: one task instance = one phase of one case (or one run-level phase).

:class:`AvsimPhaseOperator` does everything the contract asks of every backend:
resolve the phase's runtime spec from the run's manifest snapshot, find the committed
outputs of upstream phases, build the environment, record the attempt in the ledger,
classify the exit code and commit the outcome. A backend overrides one seam,
:meth:`AvsimPhaseOperator.launch`, which runs the phase and returns its exit code.
:class:`LocalPhaseOperator` (the embedded default) runs it as a local process.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator

from avsim.artifacts import RUN_LEVEL_CASE, RunLayout
from avsim.phases.attempt import PhaseAttempt, PhaseRuntime, phase_spec_for
from avsim.phases.contract import Outcome, classify_exit_code
from avsim.storage import read_json

#: The lines of a phase's output kept for the ledger's ``reason`` when it fails.
REASON_TAIL_LINES = 5


@dataclass(frozen=True)
class LaunchResult:
    exit_code: int
    reason: str = ""


class AvsimPhaseOperator(BaseOperator):
    """Runs one phase under the avsim phase contract. Subclasses implement :meth:`launch`.

    :param phase: the phase name (as in the graph).
    :param case: the case entry (a dict; usually the mapped group's argument).
    :param run: the run descriptor (``run_key``, ``artifact_root``, ``build_id``, ``image``),
        usually an XComArg of the task that prepared the run.
    :param upstream_phases: upstream phase name -> task id, whose committed outputs are inputs.
    :param inputs: fixed inputs (name -> URI), for run-level phases.
    """

    template_fields: Sequence[str] = ("case", "run", "inputs")
    ui_color = "#d8ecf3"

    def __init__(
        self,
        *,
        phase: str,
        case: Any,
        run: Any,
        upstream_phases: Mapping[str, str] | None = None,
        inputs: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.phase = phase
        self.case = case
        self.run = run
        self.upstream_phases = dict(upstream_phases or {})
        self.inputs = inputs

    # -- what every backend shares ------------------------------------------------------------
    @cached_property
    def layout(self) -> RunLayout:
        return RunLayout(self.run["artifact_root"], self.run["run_key"])

    @cached_property
    def ledger(self) -> Any:
        from avsim.ledger.store import Ledger

        return Ledger(self.layout)

    def resolve_inputs(self, context: Any) -> dict[str, str]:
        if self.inputs:
            return dict(self.inputs)
        ti = context["ti"]
        found: dict[str, str] = {}
        for up_phase, task_id in self.upstream_phases.items():
            value = ti.xcom_pull(task_ids=task_id, map_indexes=ti.map_index)
            if not value or "output_uri" not in value:
                raise self._bad_input(f"upstream phase {up_phase!r} ({task_id}) left no committed output")
            found[up_phase] = value["output_uri"]
        return found

    def build_attempt(self, context: Any) -> PhaseAttempt:
        case = dict(self.case)
        if case.get("case_id") == RUN_LEVEL_CASE:
            head = read_json(self.layout.head_uri)
            spec = dict(head["run_phases"][self.phase])
        else:
            spec = phase_spec_for(read_json(self.layout.head_uri), case, self.phase)
        return PhaseAttempt(
            layout=self.layout,
            case=case,
            phase=self.phase,
            attempt=int(context["ti"].try_number),
            runtime=PhaseRuntime.from_spec(spec),
            build_id=str(self.run.get("build_id", "")),
            image=str(self.run.get("image", "")),
            inputs=self.resolve_inputs(context),
        )

    def execute(self, context: Any) -> dict[str, Any]:
        from avsim.ledger.records import AttemptRecord, OutcomeRecord

        attempt = self.build_attempt(context)
        ti = context["ti"]
        started = dt.datetime.now(dt.UTC)
        t0 = time.monotonic()
        self.log.info(
            "avsim phase %s of case %s, attempt %d: %s",
            attempt.phase,
            attempt.case_id,
            attempt.attempt,
            " ".join(attempt.argv),
        )
        result = self.launch(attempt, context)
        outcome = classify_exit_code(result.exit_code)
        duration = time.monotonic() - t0
        ended = dt.datetime.now(dt.UTC)
        self.ledger.record_attempt(
            AttemptRecord(
                run_key=self.layout.run_key,
                case_id=attempt.case_id,
                phase=attempt.phase,
                attempt=attempt.attempt,
                started_at=started.isoformat(),
                ended_at=ended.isoformat(),
                exit_code=result.exit_code,
                outcome=outcome,
                reason=result.reason,
                output_uri=attempt.output_uri,
                host=socket.gethostname(),
                duration_seconds=duration,
            )
        )
        final_try = int(ti.try_number) > int(getattr(ti, "max_tries", self.retries) or 0)
        if outcome.produced_output or outcome is Outcome.BAD_INPUT or final_try:
            self.ledger.commit(
                OutcomeRecord(
                    run_key=self.layout.run_key,
                    case_id=attempt.case_id,
                    phase=attempt.phase,
                    attempt=attempt.attempt,
                    outcome=outcome,
                    output_uri=attempt.output_uri if outcome.produced_output else "",
                    committed_at=ended.isoformat(),
                    reason=result.reason,
                    result=self._small_result(attempt) if outcome.produced_output else {},
                )
            )
        where = f"phase {attempt.phase!r} of case {attempt.case_id!r} (attempt {attempt.attempt})"
        if outcome is Outcome.BAD_INPUT:
            raise self._bad_input(f"{where} rejected its input: {result.reason or 'exit code 65'}")
        if outcome is Outcome.INFRA_FAILED:
            from avsim.operators.exceptions import PhaseInfrastructureError

            raise PhaseInfrastructureError(
                f"{where} failed on infrastructure (exit code {result.exit_code}): {result.reason}"
            )
        if outcome is Outcome.SCENARIO_FAILED:
            self.log.warning("%s: the driving software failed the scenario (recorded as a result)", where)
        return {
            "case_id": attempt.case_id,
            "phase": attempt.phase,
            "outcome": outcome.value,
            "output_uri": attempt.output_uri,
            "attempt": attempt.attempt,
        }

    def _small_result(self, attempt: PhaseAttempt) -> dict[str, Any]:
        try:
            data = read_json(f"{attempt.output_uri}/result.json")
        except (FileNotFoundError, OSError, ValueError):
            return {}
        metrics = data.get("metrics", {}) if isinstance(data, dict) else {}
        return {"metrics": metrics} if isinstance(metrics, dict) else {}

    def _bad_input(self, message: str) -> Exception:
        from avsim.operators.exceptions import PhaseBadInput

        return PhaseBadInput(message)

    # -- the backend seam ---------------------------------------------------------------------
    def launch(self, attempt: PhaseAttempt, context: Any) -> LaunchResult:
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
    """The embedded backend: the phase runs as a process on the worker, in its own process group."""

    _proc: subprocess.Popen[str] | None = None

    def launch(self, attempt: PhaseAttempt, context: Any) -> LaunchResult:
        env = {**os.environ, **attempt.environment()}
        try:
            argv = resolve_command(attempt.argv)
            self._proc = proc = subprocess.Popen(
                argv,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        except OSError as exc:
            return LaunchResult(127, f"could not start {attempt.argv[0]!r}: {exc}")
        tail: list[str] = []

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self.log.info("[%s] %s", attempt.phase, line.rstrip())
                tail.append(line.strip())
                del tail[:-REASON_TAIL_LINES]

        reader = threading.Thread(target=pump, name="avsim-phase-output", daemon=True)
        reader.start()
        try:
            code = proc.wait(timeout=attempt.runtime.timeout_seconds)
        except subprocess.TimeoutExpired:
            self._kill(proc)
            reader.join(timeout=5)
            return LaunchResult(-9, f"timed out after {attempt.runtime.timeout_seconds:g}s and was killed")
        finally:
            self._proc = None
        reader.join(timeout=30)
        reason = " | ".join(t for t in tail if t) if code else ""
        return LaunchResult(code, reason[-500:])

    @staticmethod
    def _kill(proc: subprocess.Popen[str]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def on_kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._kill(self._proc)
