"""docs/deployment.md's first-run steps, read from its fenced blocks, and run on the distributed stack.

:func:`first_run_steps` returns the shell commands of the "Start it" and "A first weekly run"
blocks in the doc's order, each with its comment. :class:`DocRunner` runs each as the compose
stack would, on :class:`tests.support.distributed.DistributedStack`: ``docker/new-env.sh`` writes
the ``.env`` the stack then reads its secrets from; ``docker compose up`` starts the stack with
compose's worker and compose's capacity file; ``docker compose exec SERVICE CMD`` runs ``CMD``
with that service's environment and its mounted paths; ``ps`` and ``logs airflow-init`` check
what the doc says they show. A step it does not know fails the run, so the doc cannot grow a
step this runner skips.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import compose
from tests.support.distributed import BIN, DistributedStack
from tests.support.postgres import postgres_cluster

ROOT = compose.ROOT
DOC = ROOT / "docs" / "deployment.md"
SECTIONS = ("### Start it", "### A first weekly run")


@dataclass(frozen=True)
class Step:
    command: str
    comment: str


def first_run_steps(text: str | None = None) -> list[Step]:
    """The commands of the doc's first-run blocks, in order, with their ``# comments``."""
    text = DOC.read_text() if text is None else text
    steps: list[Step] = []
    for heading in SECTIONS:
        section = text.split(heading, 1)[1].split("\n#", 1)[0]
        for block in re.findall(r"^```\n(.*?)^```", section, re.S | re.M):
            for line in block.splitlines():
                command, _, comment = line.partition("  #")
                if command.strip():
                    steps.append(Step(command.strip(), comment.strip()))
    return steps


@dataclass
class DocRunner:
    """Runs the doc's steps on a distributed stack in ``base`` (one compose worker, as compose has)."""

    base: Path
    say: Callable[[str], object] = print
    stack: DistributedStack | None = None
    variables: dict[str, str] = field(default_factory=dict)
    outputs: list[tuple[str, str]] = field(default_factory=list)
    _exit: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def close(self) -> None:
        self._exit.close()

    def run(self, step: Step) -> str:
        self.say(f"$ {step.command}")
        words = shlex.split(step.command)
        if words == ["docker/new-env.sh"]:
            return self._new_env()
        if words == ["docker", "compose", "up", "-d", "--build"]:
            return self._up()
        if words == ["docker", "compose", "ps"]:
            assert self.stack is not None
            down = {n: p.returncode for n, p in self.stack.procs.items() if p.poll() is not None}
            assert not down, f"stopped: {down}"
            return "every service up"
        if words == ["docker", "compose", "logs", "airflow-init"]:
            assert self.stack is not None
            log = (self.stack.base / "logs" / "airflow-init.log").read_text()
            assert "avsim init: done" in log, log[-3000:]
            return log
        if words[:3] == ["docker", "compose", "exec"]:
            return self._exec(words[3], words[4:], step.comment)
        raise AssertionError(f"a step of docs/deployment.md this runner does not know: {step.command}")

    def _new_env(self) -> str:
        env_file = self.base / ".env"  # docker/new-env.sh [PATH]: here, not the checkout's .env
        done = subprocess.run(
            ["bash", str(ROOT / "docker" / "new-env.sh"), str(env_file)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        for line in env_file.read_text().splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.partition("=")
                self.variables[key] = value
        return done.stdout

    def _up(self) -> str:
        url = self._exit.enter_context(postgres_cluster())
        self.stack = DistributedStack(
            base=self.base / "stack",
            database_url=url,
            capacity=None,
            workers={"worker": None},
            env_file=self.variables,
        )
        self._exit.callback(self.stack.stop)
        self.stack.start()
        return "started"

    def _exec(self, service: str, argv: list[str], comment: str) -> str:
        """``docker compose exec SERVICE ARGV``: the service's environment, its mounts' host paths."""
        stack = self.stack
        assert stack is not None, "docker compose exec before docker compose up"
        component = {"airflow-worker": "worker"}.get(service, service.removeprefix("airflow-"))
        mounts = compose.mounts(stack.compose, service)
        args = [self._host_path(a, mounts) for a in argv[1:]]
        program = str(BIN / argv[0])
        # A terminal as wide as a user's: the CLI's tables then keep a run id and its state on one line.
        env = {**stack.component_env(component), "COLUMNS": "250"}
        deadline = time.monotonic() + 600
        while True:
            done = subprocess.run([program, *args], env=env, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, f"{' '.join(argv)}: {done.returncode}\n{done.stdout}\n{done.stderr}"
            if not comment.startswith("repeat until") or self._reached(argv, done.stdout):
                self.outputs.append((" ".join(argv), done.stdout))
                return done.stdout
            assert time.monotonic() < deadline, (
                f"{' '.join(argv)}: not {comment!r} in 10 minutes:\n{done.stdout}"
            )
            time.sleep(10)

    @staticmethod
    def _host_path(arg: str, mounts: dict[str, Path]) -> str:
        for target, source in mounts.items():
            if arg == target or arg.startswith(target + "/"):
                return str(source) + arg[len(target) :]
        return arg

    def _reached(self, argv: list[str], out: str) -> bool:
        """What a "repeat until" comment of the doc waits for."""
        if argv[1:3] == ["dags", "list"]:
            return {"avsim_weekly", "avsim_weekly_shard"} <= set(re.findall(r"\b(avsim_\w+)\b", out))
        if argv[1:3] == ["dags", "list-runs"]:
            row = next((line for line in out.splitlines() if self.triggered_run_id() in line), "")
            assert "failed" not in row, f"the week failed:\n{out}"
            return "success" in row
        raise AssertionError(f"no condition known for repeating {' '.join(argv)}")

    def triggered_run_id(self) -> str:
        for command, _ in self.outputs:
            m = re.search(r"dags trigger \S+ --run-id (\S+)", command)
            if m:
                return m[1]
        raise AssertionError("list-runs before a trigger with --run-id")
