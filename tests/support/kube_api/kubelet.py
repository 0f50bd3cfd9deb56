"""The node: runs each pod's first container as a local process group and reports its status.

One thread (the "kubelet loop") owns every pod's runtime state: it starts processes, reads
their output (a selector over the stdout pipes and pidfds), fires timers (start delays,
deadlines, grace periods, scripted faults) and writes status through the store, so every
change is a MODIFIED watch event with a new resourceVersion. Other threads only post work
to it with :meth:`Kubelet.call_soon`.

Not modelled: init containers and sidecars (only ``spec.containers[0]`` runs; the other
containers are reported in the same state), restartPolicy other than Never, probes, volumes,
resource limits (``oom`` is a scripted fault, not a measurement).
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import logging
import os
import re
import secrets
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .faults import FaultBook, FaultRule, container_env
from .objects import EVENTS, PODS, ApiError, now_rfc3339, rfc3339, rfc3339_micro
from .podlog import PodLog, tail_message
from .podstatus import (
    DEADLINE_MESSAGE,
    EVICTED_MESSAGE,
    EVICTION_API_MESSAGE,
    SHUTDOWN_MESSAGE,
    SHUTDOWN_MESSAGE_OLD,
    TAINT_MESSAGE,
    UNKNOWN_CONTAINER_MESSAGE,
    container_statuses,
    image_pull_message,
    qos_class,
    set_condition,
    sort_conditions,
    terminated_state,
)
from .store import Obj, Store

log = logging.getLogger(__name__)
_VAR_REF = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")


@dataclass
class KillPlan:
    """How a termination the fake caused is reported."""

    container_reason: str | None = None  # e.g. OOMKilled; default Completed/Error by exit code
    exit_code: int | None = None  # forced exit code
    pod_reason: str | None = None  # status.reason, e.g. Evicted
    pod_message: str | None = None
    remove: bool = False  # delete the pod from the API once terminated


@dataclass(eq=False)
class PodRuntime:
    namespace: str
    name: str
    uid: str
    spec: Obj
    faults: list[FaultRule]
    log: PodLog
    created: float = field(default_factory=time.monotonic)
    proc: subprocess.Popen[bytes] | None = None
    pidfd: int | None = None
    stdout: Any = None
    started_at: str | None = None
    container_id: str | None = None
    plan: KillPlan | None = None
    state: str = "pending"  # pending, running, terminated, removed, lost (kubelet gone)
    deleting: bool = False
    frozen: bool = False
    kill_at: float | None = None

    @property
    def container(self) -> Obj:
        return self.spec["containers"][0]

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name


class Kubelet:
    def __init__(
        self,
        store: Store,
        faults: FaultBook,
        *,
        base_env: Mapping[str, str],
        injected_env: Mapping[str, str],
        workdir: Path,
        node_name: str = "avsim-fake-node",
        start_delay: float = 0.05,
        record_events: bool = True,
        log_max_bytes: int = 10 * 1024 * 1024,
    ):
        self.store = store
        self.faults = faults
        self.base_env = dict(base_env)
        self.injected_env = dict(injected_env)
        self.workdir = workdir
        self.node_name = node_name
        self.start_delay = start_delay
        self.record_events = record_events
        self.log_max_bytes = log_max_bytes
        self.errors: list[str] = []
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], PodRuntime] = {}
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, self._drain_wake)
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="fake-kubelet", daemon=True)

    # -- threading -----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def call_soon(self, fn: Callable[[], None], delay: float = 0.0) -> None:
        with self._lock:
            heapq.heappush(self._timers, (time.monotonic() + delay, next(self._seq), fn))
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def _drain_wake(self, _key: selectors.SelectorKey) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass

    def _loop(self) -> None:
        while not self._stopping:
            with self._lock:
                timeout = max(0.0, min(0.5, self._timers[0][0] - time.monotonic())) if self._timers else 0.5
            for key, _mask in self._sel.select(timeout):
                self._guard(functools.partial(key.data, key))
            now = time.monotonic()
            while True:
                with self._lock:
                    if not self._timers or self._timers[0][0] > now:
                        break
                    _, _, fn = heapq.heappop(self._timers)
                self._guard(fn)

    def _guard(self, fn: Callable[[], None]) -> None:
        if self._stopping:
            return
        try:
            fn()
        except ApiError as exc:
            if exc.code != 404:  # the pod went away between scheduling and running this step
                self._error(exc)
        except Exception as exc:
            self._error(exc)

    def _error(self, exc: BaseException) -> None:
        log.exception("fake kubelet step failed")
        self.errors.append(f"{type(exc).__name__}: {exc}")

    def stop(self) -> None:
        """Stop the loop, SIGKILL every process group it started and reap them."""
        self._stopping = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        with self._lock:
            runtimes = list(self._pods.values())
            self._pods.clear()
        for rt in runtimes:
            self._kill_group(rt, signal.SIGKILL)
            if rt.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    rt.proc.wait(timeout=5)
            self._close_fds(rt)
            rt.log.finish()
        _wait_groups_dead({rt.proc.pid for rt in runtimes if rt.proc is not None})
        self._sel.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    # -- queries (any thread) -------------------------------------------------------------------
    def runtime(self, namespace: str, name: str) -> PodRuntime | None:
        with self._lock:
            return self._pods.get((namespace, name))

    def runtimes(self) -> list[PodRuntime]:
        with self._lock:
            return list(self._pods.values())

    # -- entry points from the API handlers -------------------------------------------------------
    def pod_created(self, pod: Obj) -> None:
        meta = pod["metadata"]
        rules = self.faults.claim(pod)
        rt = PodRuntime(
            meta["namespace"], meta["name"], meta["uid"], pod["spec"], rules, PodLog(self.log_max_bytes)
        )
        with self._lock:
            self._pods[rt.key] = rt
        self.call_soon(lambda: self._admit(rt))

    def _runtime_of(self, pod: Obj) -> PodRuntime | None:
        rt = self.runtime(pod["metadata"]["namespace"], pod["metadata"]["name"])
        return rt if rt is not None and rt.uid == pod["metadata"]["uid"] else None

    def pod_deleted(self, pod: Obj, grace: float) -> None:
        """A delete request left the pod Terminating: stop its container within ``grace``."""
        rt = self._runtime_of(pod)
        if rt is not None:
            self.call_soon(lambda: self._graceful_stop(rt, grace))

    def pod_force_deleted(self, pod: Obj) -> None:
        """The pod is already gone from the API (grace 0): kill what runs, report nothing."""
        rt = self._runtime_of(pod)
        if rt is not None:
            self.call_soon(lambda: self._discard(rt))

    # -- lifecycle (kubelet thread) -------------------------------------------------------------
    def _alive(self, rt: PodRuntime) -> bool:
        return rt.state in ("pending", "running") and self.runtime(rt.namespace, rt.name) is rt

    def _update(self, rt: PodRuntime, change: Callable[[Obj], None]) -> Obj | None:
        """Write this pod's status; None when the API object is gone (or is another pod now)."""

        def apply(pod: Obj) -> None:
            if pod["metadata"]["uid"] != rt.uid:
                raise ApiError.not_found(PODS, rt.name)
            change(pod)
            sort_conditions(pod.setdefault("status", {}))

        try:
            return self.store.mutate(PODS, rt.namespace, rt.name, apply)
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise

    def _admit(self, rt: PodRuntime) -> None:
        if not self._alive(rt):
            return

        def schedule(pod: Obj) -> None:
            pod["spec"]["nodeName"] = self.node_name
            status = pod.setdefault("status", {})
            status["phase"] = "Pending"
            set_condition(status, "PodReadyToStartContainers", False)
            set_condition(status, "Initialized", True)
            set_condition(status, "Ready", False, "ContainersNotReady", self._not_ready_message(pod))
            set_condition(
                status, "ContainersReady", False, "ContainersNotReady", self._not_ready_message(pod)
            )
            set_condition(status, "PodScheduled", True)
            status["hostIP"] = "127.0.0.1"
            status["hostIPs"] = [{"ip": "127.0.0.1"}]
            status["startTime"] = now_rfc3339()
            status["containerStatuses"] = container_statuses(
                pod,
                {"waiting": {"reason": "ContainerCreating"}},
                ready=False,
                started=False,
                container_id=None,
            )
            status["qosClass"] = qos_class(pod)

        self._update(rt, schedule)
        self._event(
            rt,
            "Normal",
            "Scheduled",
            f"Successfully assigned {rt.namespace}/{rt.name} to {self.node_name}",
            component="default-scheduler",
            field_path=None,
        )
        deadline = rt.spec.get("activeDeadlineSeconds")
        if deadline:
            self.call_soon(lambda: self._deadline(rt), float(deadline))
        delay = self.start_delay
        pull_error = None
        for rule in rt.faults:
            if rule.kind == "slow_start":
                delay = max(delay, rule.after_seconds)
            elif rule.kind == "image_pull_error":
                pull_error = rule
            elif rule.anchor == "create":
                self._arm(rt, rule, rule.after_seconds - (time.monotonic() - rt.created))
        if pull_error is not None:
            self.call_soon(lambda: self._image_pull_failed(rt, pull_error), pull_error.after_seconds)
        else:
            self.call_soon(lambda: self._start(rt), max(0.0, delay - (time.monotonic() - rt.created)))

    @staticmethod
    def _not_ready_message(pod: Obj) -> str:
        names = " ".join(c["name"] for c in pod["spec"].get("containers") or [])
        return f"containers with unready status: [{names}]"

    def _env(self, rt: PodRuntime, pod: Obj) -> dict[str, str]:
        env = dict(self.base_env)
        field_refs = {
            "metadata.name": rt.name,
            "metadata.namespace": rt.namespace,
            "metadata.uid": rt.uid,
            "spec.nodeName": self.node_name,
            "status.podIP": "127.0.0.1",
            "status.hostIP": "127.0.0.1",
        }
        for entry in rt.container.get("env") or []:
            ref = ((entry.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
            if ref in field_refs:
                env[entry["name"]] = field_refs[ref]
        env.update(container_env(pod))
        env.update(self.injected_env)
        env.update({"POD_NAME": rt.name, "POD_NAMESPACE": rt.namespace, "POD_UID": rt.uid})
        return env

    @staticmethod
    def _expand(arg: str, env: Mapping[str, str]) -> str:
        def sub(m: re.Match[str]) -> str:
            if m.group(0) == "$$":
                return "$"
            return env.get(m.group(1), m.group(0))

        return _VAR_REF.sub(sub, arg)

    def _cwd(self, rt: PodRuntime) -> str:
        wanted = rt.container.get("workingDir")
        if wanted and Path(wanted).is_dir():
            return str(wanted)
        path = self.workdir / "pods" / f"{rt.namespace}_{rt.name}_{rt.uid[:8]}"
        path.mkdir(parents=True, exist_ok=True)
        return str(path)

    def _start(self, rt: PodRuntime) -> None:
        if not self._alive(rt) or rt.state != "pending" or rt.deleting:
            return
        pod = self.store.get(PODS, rt.namespace, rt.name)
        env = self._env(rt, pod)
        container_env_only = {**container_env(pod), "POD_NAME": rt.name, "POD_NAMESPACE": rt.namespace}
        argv = [self._expand(a, container_env_only) for a in (rt.container.get("command") or [])]
        argv += [self._expand(a, container_env_only) for a in (rt.container.get("args") or [])]
        rt.started_at = now_rfc3339()
        rt.container_id = "containerd://" + secrets.token_hex(32)
        image = rt.container.get("image", "")
        self._event(rt, "Normal", "Pulled", f'Container image "{image}" already present on machine')
        if not argv:
            self._start_failed(rt, "failed to create containerd task: no command specified: unknown")
            return
        try:
            rt.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self._cwd(rt),
                start_new_session=True,
            )
        except OSError as exc:
            self._start_failed(
                rt,
                f"failed to create containerd task: failed to create shim task: OCI runtime create failed: "
                f'runc create failed: unable to start container process: exec: "{argv[0]}": {exc.strerror}: unknown',
            )
            return
        rt.state = "running"
        assert rt.proc.stdout is not None
        rt.stdout = rt.proc.stdout
        os.set_blocking(rt.stdout.fileno(), False)
        self._sel.register(rt.stdout, selectors.EVENT_READ, lambda _k: self._read_output(rt))
        try:
            rt.pidfd = os.pidfd_open(rt.proc.pid)
            self._sel.register(rt.pidfd, selectors.EVENT_READ, lambda _k: self._exited(rt))
        except (AttributeError, OSError):
            self._poll_exit(rt)
        self._event(rt, "Normal", "Created", f"Created container {rt.container['name']}")
        self._event(rt, "Normal", "Started", f"Started container {rt.container['name']}")

        def running(pod: Obj) -> None:
            status = pod["status"]
            status["phase"] = "Running"
            status["podIP"] = "127.0.0.1"
            status["podIPs"] = [{"ip": "127.0.0.1"}]
            for ctype in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady"):
                set_condition(status, ctype, True)
            status["containerStatuses"] = container_statuses(
                pod,
                {"running": {"startedAt": rt.started_at}},
                ready=True,
                started=True,
                container_id=rt.container_id,
            )

        self._update(rt, running)
        for rule in rt.faults:
            if rule.anchor == "start":
                self._arm(rt, rule, rule.after_seconds)

    def _start_failed(self, rt: PodRuntime, message: str) -> None:
        self._event(rt, "Warning", "Failed", f"Error: {message}")
        self._finish(rt, 128, KillPlan(container_reason="StartError"), message=message)

    def _poll_exit(self, rt: PodRuntime) -> None:
        if rt.proc is not None and rt.state == "running":
            if rt.proc.poll() is not None:
                self._exited(rt)
            else:
                self.call_soon(lambda: self._poll_exit(rt), 0.05)

    def _read_output(self, rt: PodRuntime) -> None:
        try:
            data = rt.stdout.read(65536) if rt.stdout is not None else b""
        except BlockingIOError:
            return
        if data is None:
            return
        if data:
            rt.log.feed(data)
        else:
            self._close_stdout(rt)

    def _close_stdout(self, rt: PodRuntime) -> None:
        if rt.stdout is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(rt.stdout)
            rt.stdout.close()
            rt.stdout = None

    def _close_fds(self, rt: PodRuntime) -> None:
        self._close_stdout(rt)
        if rt.pidfd is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(rt.pidfd)
            os.close(rt.pidfd)
            rt.pidfd = None

    def _drain_output(self, rt: PodRuntime, budget: float = 1.0) -> None:
        """After the process is gone, read what is left in its pipe (bounded in time)."""
        end = time.monotonic() + budget
        while rt.stdout is not None and time.monotonic() < end:
            try:
                data = rt.stdout.read(65536)
            except BlockingIOError:
                time.sleep(0.005)
                continue
            if data is None:
                time.sleep(0.005)
            elif data:
                rt.log.feed(data)
            else:
                break
        self._close_stdout(rt)

    def _kill_group(self, rt: PodRuntime, sig: int) -> None:
        if rt.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(rt.proc.pid, sig)

    def _exited(self, rt: PodRuntime) -> None:
        assert rt.proc is not None
        if rt.state != "running":
            return
        # The leader is a zombie until reaped, so its process group id cannot be reused yet:
        # kill whatever it left behind (a container's processes die with it), then reap.
        self._kill_group(rt, signal.SIGKILL)
        code = rt.proc.wait()
        self._drain_output(rt)
        self._close_fds(rt)
        self._finish(rt, 128 - code if code < 0 else code, rt.plan)

    def _finish(
        self, rt: PodRuntime, exit_code: int, plan: KillPlan | None, message: str | None = None
    ) -> None:
        """The container terminated: write the terminal status, then remove the pod if it is being deleted."""
        if rt.state in ("terminated", "removed"):
            return
        rt.state = "terminated"
        rt.log.finish()
        plan = plan or KillPlan()
        code = plan.exit_code if plan.exit_code is not None else exit_code
        reason = plan.container_reason or ("Completed" if code == 0 else "Error")
        if (
            message is None
            and code != 0
            and rt.container.get("terminationMessagePolicy") == "FallbackToLogsOnError"
        ):
            message = tail_message(rt.log) or None
        failed = code != 0 or plan.pod_reason is not None

        def terminal(pod: Obj) -> None:
            status = pod["status"]
            status["phase"] = "Failed" if failed else "Succeeded"
            if plan.pod_reason:
                status["reason"] = plan.pod_reason
                status["message"] = plan.pod_message or ""
            status.pop("podIP", None)
            status.pop("podIPs", None)
            set_condition(status, "PodReadyToStartContainers", False)
            set_condition(status, "Ready", False, "PodCompleted")
            set_condition(status, "ContainersReady", False, "PodCompleted")
            state = terminated_state(code, reason, rt.started_at, message, rt.container_id)
            status["containerStatuses"] = container_statuses(
                pod, state, ready=False, started=False, container_id=rt.container_id
            )

        self._update(rt, terminal)
        if rt.deleting or plan.remove:
            self._remove(rt)

    def _remove(self, rt: PodRuntime) -> None:
        with self._lock:
            if self._pods.get(rt.key) is rt:
                del self._pods[rt.key]
        rt.state = "removed"
        with contextlib.suppress(ApiError):
            current = self.store.try_get("pods", rt.namespace, rt.name)
            if current is not None and current["metadata"]["uid"] == rt.uid:
                self.store.remove(PODS, rt.namespace, rt.name)

    def _kill_and_close(self, rt: PodRuntime) -> None:
        """Kill the pod's processes and close what the kubelet held for it (output, log)."""
        self._kill_group(rt, signal.SIGKILL)
        if rt.proc is not None:
            rt.proc.wait()
        self._drain_output(rt, budget=0.2)
        self._close_fds(rt)
        rt.log.finish()

    def _discard(self, rt: PodRuntime) -> None:
        """Kill and forget without reporting (the API object is gone already or about to be)."""
        self._kill_and_close(rt)
        rt.state = "removed"
        self._remove(rt)

    def _graceful_stop(self, rt: PodRuntime, grace: float) -> None:
        if rt.state in ("removed", "lost"):  # a lost node's kubelet never confirms a graceful delete
            return
        first = not rt.deleting
        rt.deleting = True
        if rt.state != "running":
            self._remove(rt)
            return
        if first:
            self._event(rt, "Normal", "Killing", f"Stopping container {rt.container['name']}")
        self._terminate_within(rt, grace)

    def _terminate_within(self, rt: PodRuntime, grace: float) -> None:
        """SIGTERM the process group now, SIGKILL it after ``grace`` seconds."""
        if grace <= 0:
            self._kill_group(rt, signal.SIGKILL)
            return
        self._kill_group(rt, signal.SIGTERM)
        kill_at = time.monotonic() + grace
        if rt.kill_at is None or kill_at < rt.kill_at:
            rt.kill_at = kill_at
            self.call_soon(lambda: self._kill_if_running(rt, kill_at), grace)

    def _kill_if_running(self, rt: PodRuntime, kill_at: float) -> None:
        if rt.state == "running" and rt.kill_at == kill_at:
            self._kill_group(rt, signal.SIGKILL)

    def _deadline(self, rt: PodRuntime) -> None:
        if not self._alive(rt):
            return
        self._event(rt, "Warning", "DeadlineExceeded", DEADLINE_MESSAGE, field_path=None)
        plan = KillPlan(pod_reason="DeadlineExceeded", pod_message=DEADLINE_MESSAGE)
        grace = float(rt.spec.get("terminationGracePeriodSeconds", 30) or 0)
        self._stop_with(rt, plan, grace)

    def _stop_with(self, rt: PodRuntime, plan: KillPlan, grace: float) -> None:
        rt.plan = plan
        if rt.state == "running":
            self._terminate_within(rt, grace)
        else:
            code = plan.exit_code if plan.exit_code is not None else 137
            self._finish(
                rt,
                code,
                KillPlan(
                    plan.container_reason or "ContainerStatusUnknown",
                    code,
                    plan.pod_reason,
                    plan.pod_message,
                    plan.remove,
                ),
                message=UNKNOWN_CONTAINER_MESSAGE if plan.container_reason is None else None,
            )

    # -- faults (kubelet thread) ----------------------------------------------------------------
    def _arm(self, rt: PodRuntime, rule: FaultRule, delay: float) -> None:
        self.call_soon(lambda: self._fire(rt, rule), max(0.0, delay))

    def _fire(self, rt: PodRuntime, rule: FaultRule) -> None:
        if not self._alive(rt) or rt.deleting:
            return
        p = rule.params
        cname = rt.container["name"]
        if rule.kind == "evict":
            if p.get("via", "kubelet") == "api":
                self._disrupt(rt, "EvictionByEvictionAPI", EVICTION_API_MESSAGE)
                grace = p.get("grace_seconds", rt.spec.get("terminationGracePeriodSeconds", 30))
                self._delete_via_api(rt, int(grace or 0))
                return
            message = p.get("message") or EVICTED_MESSAGE.format(container=cname)
            self._disrupt(rt, "TerminationByKubelet", message)
            self._event(rt, "Warning", "Evicted", message, field_path=None)
            self._stop_with(
                rt,
                KillPlan(
                    exit_code=137 if not p.get("grace_seconds") else None,
                    pod_reason="Evicted",
                    pod_message=message,
                ),
                float(p.get("grace_seconds", 0)),
            )
        elif rule.kind == "preempt":
            old = p.get("reason") == "Shutdown"
            message = p.get("message") or (SHUTDOWN_MESSAGE_OLD if old else SHUTDOWN_MESSAGE)
            self._disrupt(rt, "TerminationByKubelet", message)
            self._event(rt, "Normal", "Killing", f"Stopping container {cname}")
            self._stop_with(
                rt,
                KillPlan(pod_reason=p.get("reason", "Terminated"), pod_message=message),
                float(p.get("grace_seconds", 2.0)),
            )
        elif rule.kind == "node_loss":
            mark = p.get("mark_seconds")
            if mark is not None:
                reason = p.get("condition_reason", "DeletionByTaintManager")

                def mark_lost(pod: Obj) -> None:
                    set_condition(pod["status"], "Ready", False)
                    set_condition(pod["status"], "DisruptionTarget", True, reason, TAINT_MESSAGE)

                self._update(rt, mark_lost)
                self.call_soon(lambda: self._lose(rt), float(mark))
            else:
                self._lose(rt)
        elif rule.kind == "node_lost_stuck":
            self._lose_kubelet(rt, rule)
        elif rule.kind == "vanish":
            self._lose(rt)
        elif rule.kind == "oom":
            self._stop_with(rt, KillPlan(container_reason="OOMKilled", exit_code=137), 0)
        elif rule.kind == "exit_code":
            code = int(p.get("exit_code", 1))
            self._stop_with(
                rt, KillPlan(container_reason="Completed" if code == 0 else "Error", exit_code=code), 0
            )
        elif rule.kind == "hang" and rt.state == "running":
            rt.frozen = True
            self._kill_group(rt, signal.SIGSTOP)

    def _disrupt(self, rt: PodRuntime, reason: str, message: str) -> None:
        self._update(rt, lambda pod: set_condition(pod["status"], "DisruptionTarget", True, reason, message))

    def _lose(self, rt: PodRuntime) -> None:
        """The node is gone: its processes die, then the pod leaves the API with no final status."""
        if rt.state != "removed":
            self._discard(rt)

    def _lose_kubelet(self, rt: PodRuntime, rule: FaultRule) -> None:
        """The node's kubelet is gone for good: its processes die and nobody writes the pod's status
        again; the control plane marks the pod, then deletes it gracefully, which never completes."""
        self._kill_and_close(rt)
        rt.state = "lost"
        p = rule.params
        reason = p.get("condition_reason", "DeletionByTaintManager")

        def mark_not_ready(pod: Obj) -> None:
            set_condition(pod["status"], "Ready", False)
            set_condition(pod["status"], "DisruptionTarget", True, reason, TAINT_MESSAGE)

        self._update(rt, mark_not_ready)
        grace = int(p.get("grace_seconds", rt.spec.get("terminationGracePeriodSeconds", 30)) or 1)

        def delete_gracefully() -> None:
            when = rfc3339(time.time() + grace)

            def terminating(pod: Obj) -> None:
                meta = pod["metadata"]
                if (
                    meta.get("deletionGracePeriodSeconds") is None
                    or grace < meta["deletionGracePeriodSeconds"]
                ):
                    meta["deletionTimestamp"] = when
                    meta["deletionGracePeriodSeconds"] = grace

            self._update(rt, terminating)

        self.call_soon(delete_gracefully, float(p.get("mark_seconds", 0)))

    def _delete_via_api(self, rt: PodRuntime, grace: int) -> None:
        """What the API server does for an Eviction or DELETE: mark Terminating, then stop."""
        when = rfc3339(time.time() + grace)

        def terminating(pod: Obj) -> None:
            pod["metadata"]["deletionTimestamp"] = when
            pod["metadata"]["deletionGracePeriodSeconds"] = grace

        self._update(rt, terminating)
        if grace <= 0:
            self._lose(rt)
        else:
            self._graceful_stop(rt, grace)

    def _image_pull_failed(self, rt: PodRuntime, rule: FaultRule) -> None:
        if not self._alive(rt) or rt.state != "pending":
            return
        image = rule.params.get("image") or rt.container.get("image", "")
        message = rule.params.get("message") or image_pull_message(image)
        self._event(rt, "Normal", "Pulling", f'Pulling image "{image}"')
        self._event(rt, "Warning", "Failed", f'Failed to pull image "{image}": {message}')
        self._event(rt, "Warning", "Failed", "Error: ErrImagePull")
        self._set_waiting(rt, "ErrImagePull", message)
        backoff = float(rule.params.get("backoff_after_seconds", 1.0))
        self.call_soon(lambda: self._image_backoff(rt, image), backoff)

    def _image_backoff(self, rt: PodRuntime, image: str) -> None:
        if not self._alive(rt) or rt.state != "pending":
            return
        message = f'Back-off pulling image "{image}"'
        self._event(rt, "Normal", "BackOff", message)
        self._event(rt, "Warning", "Failed", "Error: ImagePullBackOff")
        self._set_waiting(rt, "ImagePullBackOff", message)

    def _set_waiting(self, rt: PodRuntime, reason: str, message: str) -> None:
        def waiting(pod: Obj) -> None:
            pod["status"]["containerStatuses"] = container_statuses(
                pod,
                {"waiting": {"reason": reason, "message": message}},
                ready=False,
                started=False,
                container_id=None,
            )

        self._update(rt, waiting)

    # -- events ----------------------------------------------------------------------------------
    def _event(
        self,
        rt: PodRuntime,
        etype: str,
        reason: str,
        message: str,
        *,
        component: str = "kubelet",
        field_path: str | None = "",
    ) -> None:
        if not self.record_events:
            return
        now = time.time()
        pod = self.store.try_get("pods", rt.namespace, rt.name)
        involved: Obj = {
            "kind": "Pod",
            "namespace": rt.namespace,
            "name": rt.name,
            "uid": rt.uid,
            "apiVersion": "v1",
            "resourceVersion": pod["metadata"]["resourceVersion"] if pod else "",
        }
        if field_path is not None:
            involved["fieldPath"] = field_path or f"spec.containers{{{rt.container['name']}}}"
        event = {
            "metadata": {"name": f"{rt.name}.{secrets.token_hex(8)}", "namespace": rt.namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "source": {
                "component": component,
                **({"host": self.node_name} if component == "kubelet" else {}),
            },
            "firstTimestamp": rfc3339(now),
            "lastTimestamp": rfc3339(now),
            "count": 1,
            "type": etype,
            "eventTime": rfc3339_micro(now) if component != "kubelet" else None,
            "reportingComponent": component,
            "reportingInstance": self.node_name if component == "kubelet" else "",
        }
        self.store.create(EVENTS, rt.namespace, event)


def _live_group_members(pgids: set[int]) -> list[int]:
    """Pids in those process groups that are not yet dead (zombies count as dead)."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) in pgids:
            members.append(int(entry.name))
    return members


def _wait_groups_dead(pgids: set[int], timeout: float = 5.0) -> None:
    """SIGKILL is asynchronous: wait until every process of the groups is gone, re-killing stragglers."""
    if not pgids or not os.path.isdir("/proc"):
        return
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        left = _live_group_members(pgids)
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
