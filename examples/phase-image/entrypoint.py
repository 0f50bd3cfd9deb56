#!/usr/bin/env python3
"""A minimal phase that follows avsim's phase contract (docs/writing-a-phase.md).

It plays a toy simulation: a car follows a lead car for STEPS steps; the gap between them
varies with the case's SEED. The scenario fails when the gap falls under the case parameter
``min_gap_m``. Standard library only (fsspec is used for non-file stores when installed).

    avsim-example-phase PHASE_KIND [--steps N] [--step-seconds S]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

EXIT_PASSED, EXIT_SCENARIO_FAILED, EXIT_BAD_INPUT, EXIT_TERMINATED = 0, 3, 65, 143
CHECKPOINT_EVERY = 10  # steps


class BadInput(Exception):
    """The phase's input is malformed: exit 65, avsim does not retry."""


# -- storage: file:// and plain paths with the standard library, anything else with fsspec ------
def _local(uri: str) -> str | None:
    if uri.startswith("file://"):
        return uri[len("file://") :]
    return None if "://" in uri else uri


def _fsspec_uri(uri: str) -> str:
    # avsim's URIs may name an Airflow connection (s3://conn_id@bucket/key); the pod has no
    # Airflow, its credentials come from its environment (service account, AWS_* variables).
    return re.sub(r"^([a-z0-9+.-]+)://[^/@]*@", r"\1://", uri)


def read_text(uri: str) -> str:
    local = _local(uri)
    if local is not None:
        return Path(local).read_text()
    import fsspec

    with fsspec.open(_fsspec_uri(uri), "r") as f:
        return str(f.read())


def write_text(uri: str, text: str) -> None:
    local = _local(uri)
    if local is None:
        import fsspec

        with fsspec.open(_fsspec_uri(uri), "w") as f:
            f.write(text)
        return
    path = Path(local)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # a reader never sees half a file


def read_json(uri: str) -> Any:
    return json.loads(read_text(uri))


# -- heartbeat ------------------------------------------------------------------------------------
class Heartbeat:
    """Renews the attempt's heartbeat at most every AVSIM_HEARTBEAT_SECONDS: the mtime of
    AVSIM_HEARTBEAT_FILE (local backend) or the Lease AVSIM_LEASE_NAME (Kubernetes)."""

    SA = Path("/var/run/secrets/kubernetes.io/serviceaccount")

    def __init__(self, env: dict[str, str]) -> None:
        self.interval = float(env.get("AVSIM_HEARTBEAT_SECONDS") or 60)
        self.file = env.get("AVSIM_HEARTBEAT_FILE", "")
        self.lease = env.get("AVSIM_LEASE_NAME", "")
        self.namespace = env.get("AVSIM_LEASE_NAMESPACE", "")
        self.api = (
            f"https://{env.get('KUBERNETES_SERVICE_HOST', '')}:{env.get('KUBERNETES_SERVICE_PORT', '443')}"
        )
        self.last = 0.0

    def beat(self) -> None:
        if time.monotonic() - self.last < self.interval:
            return
        self.last = time.monotonic()
        try:
            if self.file:
                Path(self.file).touch()
            elif self.lease:
                self._renew_lease()
        except OSError as exc:  # one missed renewal is not fatal; the lease allows several
            print(f"heartbeat: renewal failed: {exc}", file=sys.stderr, flush=True)

    def _renew_lease(self) -> None:
        import datetime as dt
        import ssl
        import urllib.request

        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        url = f"{self.api}/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.lease}"
        body = json.dumps({"spec": {"renewTime": now}}).encode()
        req = urllib.request.Request(url, data=body, method="PATCH")
        req.add_header("Content-Type", "application/merge-patch+json")
        req.add_header("Authorization", f"Bearer {(self.SA / 'token').read_text().strip()}")
        context = ssl.create_default_context(cafile=str(self.SA / "ca.crt"))
        with urllib.request.urlopen(req, timeout=10, context=context) as resp:
            resp.read()


# -- the contract's environment -------------------------------------------------------------------
def read_env(env: dict[str, str]) -> dict[str, Any]:
    def required(name: str) -> str:
        value = env.get(name, "").strip()
        if not value:
            raise BadInput(f"environment variable {name} is missing or empty")
        return value

    def json_object(name: str, raw: str) -> dict[str, Any]:
        try:
            value = json.loads(raw)
        except ValueError as exc:
            raise BadInput(f"{name} is not valid JSON ({exc})") from None
        if not isinstance(value, dict):
            raise BadInput(f"{name} must be a JSON object")
        return value

    try:
        attempt, seed = int(required("ATTEMPT")), int(required("SEED"))
    except ValueError as exc:
        raise BadInput(f"ATTEMPT and SEED must be integers ({exc})") from None
    return {
        "run_id": required("RUN_ID"),
        "case_id": required("CASE_ID"),
        "phase": required("PHASE"),
        "attempt": attempt,
        "seed": seed,
        "inputs": json_object("INPUT_URIS", env.get("INPUT_URIS") or "{}"),
        "parameters": json_object("PARAMETERS", env.get("PARAMETERS") or "{}"),
        "scenario": {"uri": env.get("SCENARIO_URI", ""), "version": env.get("SCENARIO_VERSION", "")},
        "output_uri": required("OUTPUT_URI").rstrip("/"),
        "checkpoint_uri": env.get("CHECKPOINT_URI", "").strip().rstrip("/"),
        "build_id": env.get("BUILD_ID", ""),
    }


def read_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """Each upstream phase's result.json. One that is missing will not appear on a retry: bad input."""
    docs = {}
    for name, uri in sorted(inputs.items()):
        where = f"{str(uri).rstrip('/')}/result.json"
        try:
            docs[name] = read_json(where)
        except (OSError, ValueError) as exc:
            raise BadInput(f"input {name!r}: cannot read {where} ({exc})") from None
    return docs


# -- the work -------------------------------------------------------------------------------------
def drive(ctx: dict[str, Any], steps: int, step_seconds: float) -> tuple[list[float], int]:
    """The gaps of every step, resumed from the phase's checkpoint, and the step it resumed from.

    Each step is a pure function of (SEED, CASE_ID, step), so a retry or a resume computes the same
    trace. The checkpoint (every CHECKPOINT_EVERY steps, and on SIGTERM) holds the gaps so far."""
    ckpt = f"{ctx['checkpoint_uri']}/checkpoint.json" if ctx["checkpoint_uri"] else ""
    gaps: list[float] = []
    if ckpt:
        with contextlib.suppress(OSError, ValueError, KeyError):  # no checkpoint yet: step 0
            gaps = [float(g) for g in read_json(ckpt)["gaps"]][:steps]
    resumed_from = len(gaps)

    def save() -> None:
        if ckpt:
            write_text(ckpt, json.dumps({"step": len(gaps), "gaps": gaps}))

    def on_sigterm(*_: object) -> None:  # a spot reclaim or a drain: save, then exit as preempted
        save()
        print(f"SIGTERM at step {len(gaps)}: checkpoint saved", file=sys.stderr, flush=True)
        os._exit(EXIT_TERMINATED)

    signal.signal(signal.SIGTERM, on_sigterm)
    heartbeat = Heartbeat(dict(os.environ))
    heartbeat.beat()
    while len(gaps) < steps:
        rng = random.Random(f"{ctx['seed']}/{ctx['case_id']}/{len(gaps)}")
        gaps.append(round(10.0 + rng.gauss(0.0, 2.0), 3))  # one append: a checkpoint is never torn
        time.sleep(step_seconds)
        heartbeat.beat()
        if len(gaps) % CHECKPOINT_EVERY == 0:
            save()
    return gaps, resumed_from


def simulate(ctx: dict[str, Any], steps: int, step_seconds: float) -> int:
    """Run (or resume) the toy simulation; write the trace, then result.json; return the exit code."""
    min_gap = ctx["parameters"].get("min_gap_m", 2.0)
    if not isinstance(min_gap, (int, float)):
        raise BadInput(f"parameter min_gap_m={min_gap!r} is not a number")
    upstream = read_inputs(ctx["inputs"])
    gaps, resumed_from = drive(ctx, steps, step_seconds)
    failed = min(gaps) < float(min_gap)
    out = ctx["output_uri"]
    write_text(f"{out}/trace.csv", "step,gap_m\n" + "".join(f"{i},{g}\n" for i, g in enumerate(gaps)))
    result = {
        "outcome": "scenario_failed" if failed else "passed",
        "artifacts": ["trace.csv"],  # every file listed here must exist, or the attempt is retried
        "metrics": {"min_gap_m": min(gaps), "steps": steps, "resumed_from_step": resumed_from},
        "case_id": ctx["case_id"],
        "phase": ctx["phase"],
        "attempt": ctx["attempt"],
        "inputs": {name: doc.get("outcome") for name, doc in upstream.items()},
        "scenario": ctx["scenario"],
        "build_id": ctx["build_id"],
    }
    # Written last: it declares the other outputs, which are all in place by now.
    write_text(f"{out}/result.json", json.dumps(result, indent=1, sort_keys=True))
    print(f"{ctx['phase']} of {ctx['case_id']}: {result['outcome']} (min gap {min(gaps)} m)", flush=True)
    return EXIT_SCENARIO_FAILED if failed else EXIT_PASSED


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        # The arguments come from the manifest: a retry cannot fix them, so they are bad input.
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: bad input: {message}\n")


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog="avsim-example-phase")
    p.add_argument("kind", help="what the phase does (unused by the toy: every kind simulates)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--step-seconds", type=float, default=0.02)
    args = p.parse_args(argv)
    try:
        return simulate(read_env(dict(os.environ)), max(1, args.steps), max(0.0, args.step_seconds))
    except BadInput as exc:
        print(f"bad input: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
