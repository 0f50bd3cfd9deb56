"""API machinery shapes: Status errors, timestamps, resource descriptions and discovery documents."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import Any

SERVER_VERSION = {
    "major": "1",
    "minor": "31",
    "gitVersion": "v1.31.0-avsim.fake",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-08-13T00:00:00Z",
    "goVersion": "go1.22.5",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def now_rfc3339() -> str:
    """Second-precision UTC time as the API server writes ``metav1.Time``."""
    return dt.datetime.now(tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_micro(ts: float) -> str:
    """``metav1.MicroTime`` as events and leases carry it."""
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc3339_nano(ts_ns: int) -> str:
    """RFC3339Nano with nine digits, as the kubelet prefixes log lines with ``timestamps=true``."""
    seconds, nanos = divmod(ts_ns, 1_000_000_000)
    base = dt.datetime.fromtimestamp(seconds, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{nanos:09d}Z"


def time_ns() -> int:
    return time.time_ns()


@dataclass(frozen=True)
class ResourceInfo:
    """One served resource: where it lives and what the API server calls it in messages."""

    name: str  # plural, e.g. "pods"
    kind: str  # "Pod"
    group: str  # "" for core
    version: str
    short_names: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``pods`` or ``leases.coordination.k8s.io``, as in NotFound messages."""
        return f"{self.name}.{self.group}" if self.group else self.name


PODS = ResourceInfo("pods", "Pod", "", "v1", ("po",))
EVENTS = ResourceInfo("events", "Event", "", "v1", ("ev",))
LEASES = ResourceInfo("leases", "Lease", "coordination.k8s.io", "v1")
RESOURCES = {r.name: r for r in (PODS, EVENTS, LEASES)}


class ApiError(Exception):
    """An error the handler turns into a ``Status`` body with the API server's code and reason."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        return status_body(self.code, self.reason, self.message, self.details)

    @classmethod
    def not_found(cls, res: ResourceInfo, name: str) -> ApiError:
        return cls(404, "NotFound", f'{res.qualified} "{name}" not found', _details(res, name))

    @classmethod
    def already_exists(cls, res: ResourceInfo, name: str) -> ApiError:
        return cls(409, "AlreadyExists", f'{res.qualified} "{name}" already exists', _details(res, name))

    @classmethod
    def conflict(cls, res: ResourceInfo, name: str) -> ApiError:
        return cls(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {res.qualified} "{name}": the object has been modified; '
            "please apply your changes to the latest version and try again",
            _details(res, name),
        )

    @classmethod
    def invalid(cls, res: ResourceInfo, name: str, field: str, cause_reason: str, detail: str) -> ApiError:
        return cls(
            422,
            "Invalid",
            f'{res.kind} "{name}" is invalid: {field}: {detail}',
            {
                "name": name,
                **({"group": res.group} if res.group else {}),
                "kind": res.kind,
                "causes": [{"reason": cause_reason, "message": detail, "field": field}],
            },
        )

    @classmethod
    def gone(cls, requested: int, oldest: int) -> ApiError:
        return cls(410, "Expired", f"too old resource version: {requested} ({oldest})")

    @classmethod
    def bad_request(cls, message: str) -> ApiError:
        return cls(400, "BadRequest", message)

    @classmethod
    def unknown_path(cls) -> ApiError:
        return cls(404, "NotFound", "the server could not find the requested resource", {})

    @classmethod
    def method_not_allowed(cls) -> ApiError:
        return cls(
            405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {}
        )

    @classmethod
    def unsupported_media(cls, content_type: str) -> ApiError:
        return cls(
            415,
            "UnsupportedMediaType",
            f"the body of the request was in an unknown format - accepted media types include: "
            f"application/json-patch+json, application/merge-patch+json, "
            f"application/strategic-merge-patch+json (got {content_type!r})",
        )

    @classmethod
    def unauthorized(cls) -> ApiError:
        return cls(401, "Unauthorized", "Unauthorized")

    @classmethod
    def too_large_rv(cls, requested: int, current: int) -> ApiError:
        return cls(
            504,
            "Timeout",
            f"Too large resource version: {requested}, current: {current}",
            {
                "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                "retryAfterSeconds": 1,
            },
        )


def _details(res: ResourceInfo, name: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name}
    if res.group:
        details["group"] = res.group
    details["kind"] = res.name
    return details


def status_body(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def _resource_entry(name: str, kind: str, verbs: list[str], short: tuple[str, ...] = ()) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "singularName": "" if "/" in name else kind.lower(),
        "namespaced": True,
        "kind": kind,
        "verbs": verbs,
    }
    if short:
        entry["shortNames"] = list(short)
    return entry


def core_v1_resources() -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            _resource_entry("events", "Event", _VERBS, EVENTS.short_names),
            _resource_entry("pods", "Pod", _VERBS, PODS.short_names) | {"categories": ["all"]},
            _resource_entry("pods/eviction", "Eviction", ["create"]) | {"group": "policy", "version": "v1"},
            _resource_entry("pods/log", "Pod", ["get"]),
            _resource_entry("pods/status", "Pod", ["get", "patch", "update"]),
        ],
    }


def coordination_v1_resources() -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "coordination.k8s.io/v1",
        "resources": [_resource_entry("leases", "Lease", _VERBS)],
    }


def coordination_group() -> dict[str, Any]:
    version = {"groupVersion": "coordination.k8s.io/v1", "version": "v1"}
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": "coordination.k8s.io",
        "versions": [version],
        "preferredVersion": version,
    }


def api_group_list() -> dict[str, Any]:
    group = coordination_group()
    del group["kind"], group["apiVersion"]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]}


def api_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }
