"""A phase's heartbeat: how a running phase tells avsim it is still making progress.

The phase calls :meth:`Heartbeat.beat` from its work loop (rate-limited to ``AVSIM_HEARTBEAT_SECONDS``).
The environment tells where it goes: a Kubernetes Lease renewed by merge-patch (``AVSIM_LEASE_NAME``;
``AVSIM_KUBE_API_URL`` and ``AVSIM_KUBE_TOKEN`` override the in-cluster address and token) or a local
file's modification time (``AVSIM_HEARTBEAT_FILE``). Standard library only: it runs in the simulator's
container. The contract: docs/writing-a-phase.md.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from avsim.phases import contract

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def rfc3339_micro(when: dt.datetime | None = None) -> str:
    """The MicroTime format Leases use: ``2026-12-07T10:00:00.123456Z``."""
    when = when or dt.datetime.now(dt.UTC)
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_age(now: float, *, renewed: float | None, started: float | None) -> float:
    """Seconds a running phase has gone without a heartbeat: since its last renewal, or since it
    started when it has not renewed since (before its first beat); 0 when neither is known.

    The one rule every watcher applies (the local worker to a heartbeat file's mtime, the Kubernetes
    trigger and the operator's watchdog to a Lease's ``renewTime``); the phase's lease has expired when
    this exceeds its ``lease_seconds``. All three times are seconds since the epoch.
    """
    last = max((t for t in (renewed, started) if t is not None), default=0.0)
    return now - last if last else 0.0


class Heartbeat:
    """Renews the attempt's heartbeat at most once per ``interval`` seconds."""

    def __init__(self, interval: float) -> None:
        self.interval = max(0.0, interval)
        # The phase's start is its first sign of life: the trigger counts a Lease's age from the
        # container's start, the local worker a heartbeat file's from the process's; so the first
        # renewal is due one interval in (``beat(force=True)`` renews at once).
        self._last = time.monotonic()
        self.beats = 0
        self.failures = 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Heartbeat | None:
        env = os.environ if environ is None else environ
        interval = float(env.get(contract.ENV_HEARTBEAT_SECONDS) or 60)
        if env.get(contract.ENV_LEASE_NAME):
            return LeaseHeartbeat(
                interval,
                name=env[contract.ENV_LEASE_NAME],
                namespace=env.get(contract.ENV_LEASE_NAMESPACE) or _in_cluster_namespace(),
                holder=env.get("POD_NAME") or env.get("HOSTNAME") or "",
                api_url=env.get("AVSIM_KUBE_API_URL") or _in_cluster_url(env),
                token=env.get("AVSIM_KUBE_TOKEN") or _in_cluster_token(),
            )
        if env.get(contract.ENV_HEARTBEAT_FILE):
            return FileHeartbeat(interval, Path(env[contract.ENV_HEARTBEAT_FILE]))
        return None

    def beat(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        try:
            self._renew()
            self.beats += 1
        except (OSError, ValueError) as exc:
            # A missed renewal is not fatal: the lease tolerates several; a lasting failure expires it.
            self.failures += 1
            print(f"avsim heartbeat: renewal failed: {exc}", file=sys.stderr, flush=True)

    def _renew(self) -> None:
        raise NotImplementedError


class FileHeartbeat(Heartbeat):
    def __init__(self, interval: float, path: Path) -> None:
        super().__init__(interval)
        self.path = path

    def _renew(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()
        os.utime(self.path)


class LeaseHeartbeat(Heartbeat):
    def __init__(
        self, interval: float, *, name: str, namespace: str, holder: str, api_url: str, token: str
    ) -> None:
        super().__init__(interval)
        self.name = name
        self.namespace = namespace
        self.holder = holder
        self.api_url = api_url.rstrip("/")
        self.token = token

    @property
    def url(self) -> str:
        return f"{self.api_url}/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.name}"

    def _renew(self) -> None:
        # Imported here: a phase process on the local backend (a file heartbeat) never needs them.
        import ssl
        import urllib.error
        import urllib.request

        spec: dict[str, object] = {"renewTime": rfc3339_micro()}
        if self.holder:
            spec["holderIdentity"] = self.holder
        body = json.dumps({"spec": spec}).encode()
        req = urllib.request.Request(self.url, data=body, method="PATCH")
        req.add_header("Content-Type", "application/merge-patch+json")
        req.add_header("Accept", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        context = None
        if self.api_url.startswith("https://"):
            ca = SERVICE_ACCOUNT_DIR / "ca.crt"
            context = ssl.create_default_context(cafile=str(ca) if ca.exists() else None)
        try:
            with urllib.request.urlopen(req, timeout=10, context=context) as resp:
                resp.read()
        except urllib.error.HTTPError as exc:
            raise OSError(f"PATCH {self.url}: HTTP {exc.code}") from None


def _in_cluster_url(env: Mapping[str, str]) -> str:
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return ""
    if ":" in host:  # IPv6
        host = f"[{host}]"
    return f"https://{host}:{port}"


def _in_cluster_token() -> str:
    try:
        return (SERVICE_ACCOUNT_DIR / "token").read_text().strip()
    except OSError:
        return ""


def _in_cluster_namespace() -> str:
    try:
        return (SERVICE_ACCOUNT_DIR / "namespace").read_text().strip()
    except OSError:
        return "default"
