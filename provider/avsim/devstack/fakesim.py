"""The fake simulator: a stand-in for the simulator container that honours the phase contract.

``avsim-fakesim KIND [options]`` reads the contract's environment, works in small sleeps (checkpointing,
resuming, renewing its heartbeat) and writes ``result.json`` plus one artifact under ``OUTPUT_URI``,
without Airflow. Its draws are seeded by the case, so a retry gets the same result; ``PARAMETERS`` may
force an outcome or a fault per phase (``{"fakesim": {"simulate": "crash_once"}}``). The seeding and
every fault form: docs/design.md, "The local stack and the fake simulator".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from avsim.devstack.fakesim_artifacts import DRIVING_KINDS, produce
from avsim.phases import contract
from avsim.phases.heartbeat import Heartbeat

KINDS = ("prepare", "simulate", "perceive", "evaluate", "render", "report", "summary")
FORCED = ("scenario_failed", "bad_input")
FAULTS = ("crash", "preempt", "hang")
#: The phase exits as if it passed (or failed its scenario) but writes none of its outputs.
LOST_WRITE = "no_output"
#: Length of one sleep of the work loop, in seconds.
STEP_SECONDS = 0.05
_CKPT_RE = re.compile(r"ckpt-(\d+)\.json$")
_DIGEST_PREFIX_RE = re.compile(r"^sha256:[0-9a-f]{6,64}$")
_USERINFO_RE = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://[^/@]*@(?P<rest>.*)$")


class PhaseExit(Exception):
    """Ends the phase with an exit code of the contract and a message for stderr."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def bad_input(message: str) -> NoReturn:
    raise PhaseExit(contract.EXIT_BAD_INPUT, f"bad input: {message}")


# -- environment -------------------------------------------------------------------------------
@dataclass(frozen=True)
class PhaseEnv:
    run_id: str
    case_id: str
    phase: str
    attempt: int
    seed: int
    inputs: dict[str, str]
    scenario_uri: str
    scenario_version: str
    output_uri: str
    checkpoint_uri: str
    parameters: dict[str, Any]
    build_id: str
    image: str

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> PhaseEnv:
        def required(name: str) -> str:
            value = environ.get(name, "").strip()
            if not value:
                bad_input(f"environment variable {name} is missing or empty")
            return value

        def integer(name: str, minimum: int) -> int:
            raw = required(name)
            try:
                value = int(raw)
            except ValueError:
                bad_input(f"{name}={raw!r} is not an integer")
            if value < minimum:
                bad_input(f"{name}={value} is below {minimum}")
            return value

        def json_object(name: str, raw: str) -> dict[str, Any]:
            try:
                value = json.loads(raw)
            except ValueError as exc:
                bad_input(f"{name} is not valid JSON ({exc})")
            if not isinstance(value, dict):
                bad_input(f"{name} must be a JSON object, got {type(value).__name__}")
            return value

        inputs = json_object(contract.ENV_INPUT_URIS, required(contract.ENV_INPUT_URIS))
        wrong = sorted(k for k, v in inputs.items() if not isinstance(v, str) or not v)
        if wrong:
            bad_input(f"{contract.ENV_INPUT_URIS} entries {wrong} are not URIs")
        return cls(
            run_id=required(contract.ENV_RUN_ID),
            case_id=required(contract.ENV_CASE_ID),
            phase=required(contract.ENV_PHASE),
            attempt=integer(contract.ENV_ATTEMPT, 1),
            seed=integer(contract.ENV_SEED, 0),
            inputs=inputs,
            scenario_uri=environ.get(contract.ENV_SCENARIO_URI, ""),
            scenario_version=environ.get(contract.ENV_SCENARIO_VERSION, ""),
            output_uri=required(contract.ENV_OUTPUT_URI).rstrip("/"),
            checkpoint_uri=environ.get(contract.ENV_CHECKPOINT_URI, "").strip().rstrip("/"),
            parameters=json_object(contract.ENV_PARAMETERS, environ.get(contract.ENV_PARAMETERS) or "{}"),
            build_id=environ.get(contract.ENV_BUILD_ID, ""),
            image=environ.get(contract.ENV_IMAGE, ""),
        )

    def rng(self, purpose: str, *extra: object) -> random.Random:
        key = "\0".join(str(p) for p in (self.seed, self.case_id, self.phase, purpose, *extra))
        return random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big"))

    @property
    def forced_parts(self) -> list[str]:
        table = self.parameters.get("fakesim")
        value = table.get(self.phase, "") if isinstance(table, dict) else ""
        return [v.strip() for v in value.split("+")] if isinstance(value, str) else []

    @property
    def forced(self) -> str:
        """``scenario_failed`` or ``bad_input`` when the parameters force one, else empty.
        ``bad_input_until:URI`` forces bad input while URI does not exist (an input missing from its
        store until someone restores it)."""
        for part in self.forced_parts:
            if part in FORCED:
                return part
            prefix = "bad_input_until:"
            if part.startswith(prefix) and not _exists(part[len(prefix) :]):
                return "bad_input"
        return ""

    def fails_on_build(self) -> bool:
        """``scenario_failed_on:DIGEST``: the scenario fails when the image's digest starts with DIGEST
        (``sha256:`` and 6 to 64 hex digits), so a case can fail on build B and pass on build A."""
        digest = self.image.rpartition("@")[2] if "@" in self.image else ""
        for part in self.forced_parts:
            prefix = "scenario_failed_on:"
            if part.startswith(prefix):
                wanted = part[len(prefix) :]
                if not _DIGEST_PREFIX_RE.match(wanted):
                    bad_input(f"{part!r}: name the build as sha256: and 6 to 64 hex digits")
                if digest.startswith(wanted):
                    return True
        return False

    def flakes(self) -> bool:
        """``flake:P``: the scenario fails with probability P, drawn per attempt scope (the seed, the
        case, the phase and ``OUTPUT_URI``): the same attempt gives the same result, another attempt or
        rerun of the case may not."""
        for part in self.forced_parts:
            if part.startswith("flake:"):
                try:
                    rate = float(part[len("flake:") :])
                except ValueError:
                    rate = -1.0
                if not 0.0 <= rate <= 1.0:
                    bad_input(f"{part!r}: the flake rate is a probability between 0 and 1")
                return flake_draw(self.seed, self.case_id, self.phase, self.output_uri) < rate
        return False

    def fault_forced(self, fault: str) -> bool:
        """Whether the parameters inject ``fault`` (crash, preempt, hang) into this attempt."""
        for part in self.forced_parts:
            if part == fault or (part == f"{fault}_once" and self.attempt == 1):
                return True
            prefix = f"{fault}_before:"
            if part.startswith(prefix) and part[len(prefix) :].isdigit():
                return self.attempt < int(part[len(prefix) :])
            prefix = f"{fault}_until:"
            if part.startswith(prefix):
                return not _exists(part[len(prefix) :])
            prefix = f"{fault}_in:"
            if part.startswith(prefix) and part[len(prefix) :] and part[len(prefix) :] in self.output_uri:
                return True
        return False


def flake_draw(seed: int, case_id: str, phase: str, output_uri: str) -> float:
    """``flake:P``'s draw for one attempt scope, in [0, 1): the scope is the output's place under the
    artifact root (``runs/...``), so the same run ids give the same draws wherever the root is."""
    scope = output_uri[output_uri.find("/runs/") + 1 :] if "/runs/" in output_uri else output_uri
    key = f"{seed}\0{case_id}\0{phase}\0flake\0{scope}"
    return random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")).random()


# -- storage (fsspec, no Airflow) --------------------------------------------------------------
# A ``file://`` URI (or a plain path) is read and written with the standard library: importing fsspec
# cost each fake phase process about 0.1 CPU-second, more than the rest of it together.
def fs_uri(uri: str) -> str:
    """The fsspec spelling of an ObjectStoragePath URI: drop ``conn@`` (an Airflow connection id)."""
    m = _USERINFO_RE.match(uri)
    return f"{m.group('scheme')}://{m.group('rest')}" if m else uri


def _local(uri: str) -> str | None:
    if uri.startswith("file://"):
        return uri[len("file://") :]
    return None if "://" in uri else uri


def _fs(uri: str) -> tuple[Any, str]:
    from fsspec.core import url_to_fs

    return url_to_fs(fs_uri(uri))


def _exists(uri: str) -> bool:
    local = _local(uri)
    if local is not None:
        return os.path.exists(local)
    fs, path = _fs(uri)
    return bool(fs.exists(path))


def read_json(uri: str) -> Any:
    local = _local(uri)
    if local is not None:
        with open(local) as f:
            return json.load(f)
    import fsspec

    with fsspec.open(fs_uri(uri), "r") as f:
        return json.load(f)


def write_text(uri: str, text: str) -> None:
    local = _local(uri)
    if local is not None:
        os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
        with open(local, "w") as f:
            f.write(text)
        return
    fs, path = _fs(uri)
    if "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "w") as f:
        f.write(text)


def write_json(uri: str, data: Any) -> None:
    write_text(uri, json.dumps(data, indent=1, sort_keys=True) + "\n")


def _glob(uri: str, pattern: str) -> list[str]:
    """Names (last path segment) under ``uri`` matching ``pattern``."""
    local = _local(uri)
    if local is not None:
        import glob

        return [os.path.basename(p) for p in glob.glob(os.path.join(glob.escape(local), pattern))]
    fs, path = _fs(uri)
    try:
        return [n.rsplit("/", 1)[-1] for n in fs.glob(f"{path}/{pattern}")]
    except FileNotFoundError:
        return []


def latest_checkpoint(uri: str) -> float:
    """The progress of the newest checkpoint under ``uri`` (0.0 when there is none)."""
    names = _glob(uri, "ckpt-*.json")
    found = sorted((int(m.group(1)), n) for n in names if (m := _CKPT_RE.search(n)))
    if not found:
        return 0.0
    try:
        progress = float(read_json(f"{uri}/{found[-1][1]}")["progress"])
    except (OSError, ValueError, KeyError, TypeError):
        progress = found[-1][0] / 1000
    return min(max(progress, 0.0), 1.0)


# -- inputs ------------------------------------------------------------------------------------
def read_inputs(env: PhaseEnv) -> dict[str, Any]:
    """Each input's ``result.json``; a missing or unreadable one is bad input (a retry cannot fix it)."""
    found: dict[str, Any] = {}
    for name, uri in sorted(env.inputs.items()):
        where = f"{uri.rstrip('/')}/{contract.RESULT_FILE}"
        try:
            doc = read_json(where)
        except FileNotFoundError:
            bad_input(f"input {name!r} has no {contract.RESULT_FILE}: {where} does not exist")
        except (ValueError, UnicodeDecodeError) as exc:
            bad_input(f"input {name!r}: {where} is not valid JSON ({exc})")
        if not isinstance(doc, dict):
            bad_input(f"input {name!r}: {where} is not a JSON object")
        found[name] = doc
    return found


# -- the work ----------------------------------------------------------------------------------
def work(
    env: PhaseEnv,
    total: float,
    resumed: float,
    every: float,
    crash_at: float | None,
    heartbeat: Heartbeat | None = None,
) -> float:
    """Do the fraction ``1 - resumed`` of ``total`` seconds of work; return the progress reached.

    Stops early (returning the progress) when it reaches ``crash_at``. Beats ``heartbeat`` as it goes.
    """
    progress = resumed
    if heartbeat is not None:
        heartbeat.beat(force=True)
    if total <= 0:
        return 1.0
    step = STEP_SECONDS / total
    ckpt_step = every / total if env.checkpoint_uri and every > 0 else 0.0
    next_ckpt = (int(progress / ckpt_step) + 1) * ckpt_step if ckpt_step else 2.0
    while progress < 1.0:
        target = min(1.0, progress + step)
        if crash_at is not None and target >= crash_at:
            time.sleep(max(0.0, crash_at - progress) * total)
            return crash_at
        time.sleep((target - progress) * total)
        progress = target
        if heartbeat is not None:
            heartbeat.beat()
        if progress >= next_ckpt and progress < 1.0:
            permille = int(progress * 1000)
            write_json(
                f"{env.checkpoint_uri}/ckpt-{permille:04d}.json",
                {"progress": progress, "attempt": env.attempt},
            )
            next_ckpt += ckpt_step
    return 1.0


def run(kind: str, args: argparse.Namespace, env: PhaseEnv) -> int:
    docs = read_inputs(env)
    forced = env.forced
    if forced == "bad_input" or env.rng("bad_input").random() < args.bad_input_rate:
        bad_input(f"{kind} of case {env.case_id!r} rejected its scenario {env.scenario_uri or '(none)'}")
    failed = (
        forced == "scenario_failed"
        or env.fails_on_build()
        or env.flakes()
        or (kind in DRIVING_KINDS and env.rng("scenario").random() < args.scenario_fail_rate)
    )
    crash_rng = env.rng("crash", env.attempt)
    fault = next((f for f in FAULTS if env.fault_forced(f)), "")
    if not fault:
        draw = crash_rng.random()
        for name, rate in (
            ("crash", args.crash_rate),
            ("preempt", args.preempt_rate),
            ("hang", args.hang_rate),
        ):
            if draw < rate:
                fault = name
                break
            draw -= rate
    total = max(0.0, args.duration * (1.0 + args.jitter * env.rng("duration").uniform(-1.0, 1.0)))
    every = args.checkpoint_every if args.checkpoint_every is not None else args.duration / 5
    resumed = latest_checkpoint(env.checkpoint_uri) if env.checkpoint_uri else 0.0
    crash_at = resumed + crash_rng.uniform(0.05, 0.95) * (1.0 - resumed) if fault else None
    print(
        f"fakesim {kind}: case {env.case_id} phase {env.phase} attempt {env.attempt}, "
        f"{total:.2f}s of work, resuming from {resumed:.0%}",
        flush=True,
    )
    artifact, content, metrics = produce(kind, env, docs, failed)
    text = content if isinstance(content, str) else json.dumps(content, indent=1, sort_keys=True) + "\n"
    reached = work(env, total, resumed, every, crash_at, Heartbeat.from_environ())
    if crash_at is not None:
        write_text(f"{env.output_uri}/{artifact}", text[: max(1, int(len(text) * reached))])
        inject(fault, reached, env)
    outcome = "scenario_failed" if failed else "passed"
    if env.fault_forced(LOST_WRITE):
        print(f"fakesim {kind}: {outcome}, but its outputs were never written (lost write)", flush=True)
        return contract.EXIT_SCENARIO_FAILED if failed else contract.EXIT_PASSED
    write_text(f"{env.output_uri}/{artifact}", text)
    result = {
        "run_id": env.run_id,
        "case_id": env.case_id,
        "phase": env.phase,
        "kind": kind,
        "attempt": env.attempt,
        "seed": env.seed,
        "outcome": outcome,
        "metrics": metrics,
        "inputs": {
            name: {"uri": env.inputs[name], "outcome": doc.get("outcome")} for name, doc in docs.items()
        },
        "artifacts": [artifact],
        "work_seconds": round(total * (1.0 - resumed), 3),
        "total_work_seconds": round(total, 3),
        "resumed_from": round(resumed, 4),
        "build_id": env.build_id,
        "image": env.image,
        "scenario": {"uri": env.scenario_uri, "version": env.scenario_version},
    }
    write_json(f"{env.output_uri}/{contract.RESULT_FILE}", result)
    print(f"fakesim {kind}: {outcome} ({artifact}, {result['work_seconds']}s of work)", flush=True)
    return contract.EXIT_SCENARIO_FAILED if failed else contract.EXIT_PASSED


def inject(fault: str, reached: float, env: PhaseEnv) -> NoReturn:
    """End the attempt the way ``fault`` does (see the module docstring)."""
    where = f"at {reached:.0%} of the work (attempt {env.attempt})"
    if fault == "preempt":
        print(f"fakesim: simulated preemption {where}: SIGTERM", file=sys.stderr, flush=True)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)  # the signal ends the process before this returns
    if fault == "hang":
        print(f"fakesim: simulated hang {where}: no progress, no heartbeat", file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)
    raise PhaseExit(1, f"simulated crash {where}")


# -- command line ------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # The arguments come from the manifest: a retry cannot fix them, so they are bad input.
        self.print_usage(sys.stderr)
        self.exit(contract.EXIT_BAD_INPUT, f"{self.prog}: bad input: {message}\n")


def _rate(value: str) -> float:
    p = float(value)
    if not 0.0 <= p <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} is not a probability between 0 and 1")
    return p


def _seconds(value: str) -> float:
    s = float(value)
    if s < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return s


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="avsim-fakesim", description="A deterministic fake simulator phase (avsim phase contract)."
    )
    p.add_argument("kind", choices=KINDS)
    p.add_argument(
        "--duration", type=_seconds, default=0.5, metavar="SECONDS", help="work time (default 0.5)"
    )
    p.add_argument("--jitter", type=_rate, default=0.2, metavar="FRACTION", help="duration varies by ±this")
    p.add_argument("--scenario-fail-rate", type=_rate, default=0.0, metavar="P")
    p.add_argument("--crash-rate", type=_rate, default=0.0, metavar="P")
    p.add_argument("--preempt-rate", type=_rate, default=0.0, metavar="P", help="attempts ended by SIGTERM")
    p.add_argument("--hang-rate", type=_rate, default=0.0, metavar="P", help="attempts that hang")
    p.add_argument("--bad-input-rate", type=_rate, default=0.0, metavar="P")
    p.add_argument(
        "--checkpoint-every",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="seconds of work between checkpoints (default duration/5)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return run(args.kind, args, PhaseEnv.from_environ(os.environ))
    except PhaseExit as exc:
        print(f"avsim-fakesim {args.kind}: {exc}", file=sys.stderr, flush=True)
        return exc.code


if __name__ == "__main__":
    sys.exit(main())
