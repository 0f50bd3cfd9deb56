"""The verbs on each resource: what the API server does for get/list/create/update/patch/delete,
independent of HTTP. Watches and log streams are driven by the HTTP layer (``server.py``)."""

from __future__ import annotations

import base64
import copy
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .kubelet import Kubelet
from .objects import LEASES, PODS, ApiError, ResourceInfo, rfc3339
from .patch import apply_patch
from .schema import violations
from .selectors import parse_field_selector, parse_label_selector
from .store import Obj, Store

_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_MUTABLE_POD_SPEC = ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds")
#: Objects checked against the real API server's schemas (schema.py) when a client writes them.
_SCHEMA_CHECKED = (PODS, LEASES)


def check_schema(res: ResourceInfo, obj: Obj) -> None:
    """Refuse, as the API server would (422 Invalid, one cause per field), an object that the schemas
    of the supported Kubernetes versions reject: unknown fields included (strict)."""
    if res not in _SCHEMA_CHECKED:
        return
    body = {"apiVersion": res.api_version, "kind": res.kind, **obj}
    found = violations(body)
    if not found:
        return
    name = str((obj.get("metadata") or {}).get("name") or "")
    causes = []
    for line in found:
        version, field, message = line.split(": ", 2)
        cause = {
            "reason": "FieldValueInvalid",
            "message": f"{message} (Kubernetes {version})",
            "field": field,
        }
        if cause not in causes:
            causes.append(cause)
    first = causes[0]
    raise ApiError(
        422,
        "Invalid",
        f'{res.kind} "{name}" is invalid: {first["field"]}: {first["message"]}',
        {"name": name, **({"group": res.group} if res.group else {}), "kind": res.kind, "causes": causes},
    )


def truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1", "")


def int_param(query: Mapping[str, str], name: str) -> int | None:
    if name not in query or query[name] == "":
        return None
    try:
        return int(query[name])
    except ValueError:
        raise ApiError.bad_request(f"invalid value for {name}: {query[name]!r}") from None


@dataclass
class ListPage:
    items: list[Obj]
    resource_version: int
    continue_token: str | None
    remaining: int | None


class ResourceAPI:
    def __init__(self, store: Store, kubelet: Kubelet):
        self.store = store
        self.kubelet = kubelet

    # -- list -----------------------------------------------------------------------------------
    def list_page(self, res: ResourceInfo, namespace: str | None, query: Mapping[str, str]) -> ListPage:
        labels = parse_label_selector(query.get("labelSelector"))
        fields = parse_field_selector(res.name, query.get("fieldSelector"))
        rv = int_param(query, "resourceVersion")
        match = query.get("resourceVersionMatch")
        if rv:
            self._wait_for_rv(rv)
            if match == "Exact" and rv != self.store.resource_version:
                raise ApiError.gone(rv, self.store.resource_version)
        items, current = self.store.select(res.name, namespace, labels, fields)
        start = 0
        if query.get("continue"):
            try:
                token = json.loads(base64.urlsafe_b64decode(query["continue"]))
                start, current = int(token["start"]), int(token["rv"])
            except (ValueError, KeyError, TypeError):
                raise ApiError.bad_request("continue key is not valid") from None
        limit = int_param(query, "limit")
        if limit and limit > 0 and len(items) - start > limit:
            page = items[start : start + limit]
            token_data = json.dumps({"rv": current, "start": start + limit}).encode()
            return ListPage(
                page, current, base64.urlsafe_b64encode(token_data).decode(), len(items) - start - limit
            )
        return ListPage(items[start:], current, None, None)

    def _wait_for_rv(self, rv: int, budget: float = 3.0) -> None:
        """A list "not older than" a future resourceVersion waits for it, as the watch cache does."""
        end = time.monotonic() + budget
        while self.store.resource_version < rv:
            if time.monotonic() > end:
                raise ApiError.too_large_rv(rv, self.store.resource_version)
            time.sleep(0.02)

    # -- create ---------------------------------------------------------------------------------
    def create(self, res: ResourceInfo, namespace: str, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise ApiError.bad_request(f"the body of the request for {res.kind} must be a JSON object")
        name = (body.get("metadata") or {}).get("name")
        if name and not _DNS1123_SUBDOMAIN.match(name):
            raise ApiError.invalid(
                res,
                name,
                "metadata.name",
                "FieldValueInvalid",
                f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower case '
                "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            )
        check_schema(res, body)
        if res is PODS:
            body = self._default_pod(body)
        obj = self.store.create(res, namespace, body)
        if res is PODS:
            self.kubelet.pod_created(obj)
        return obj

    @staticmethod
    def _default_pod(body: Obj) -> Obj:
        pod = copy.deepcopy(body)
        name = (pod.get("metadata") or {}).get("name", "")
        spec = pod.get("spec")
        containers = (spec or {}).get("containers") or []
        if not containers:
            raise ApiError.invalid(PODS, name, "spec.containers", "FieldValueRequired", "Required value")
        for i, container in enumerate(containers):
            for required in ("name", "image"):
                if not container.get(required):
                    raise ApiError.invalid(
                        PODS, name, f"spec.containers[{i}].{required}", "FieldValueRequired", "Required value"
                    )
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            image = container["image"]
            container.setdefault(
                "imagePullPolicy",
                "Always" if image.endswith(":latest") or ":" not in image else "IfNotPresent",
            )
            container.setdefault("resources", {})
        assert spec is not None
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("serviceAccountName", "default")
        spec.setdefault("securityContext", {})
        spec.setdefault("enableServiceLinks", True)
        spec.setdefault("priority", 0)
        pod["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        return pod

    # -- update / patch -------------------------------------------------------------------------
    def replace(self, res: ResourceInfo, namespace: str, name: str, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise ApiError.bad_request(f"the body of the request for {res.kind} must be a JSON object")
        check_schema(res, body)
        if res is PODS:
            current = self.store.get(res, namespace, name)
            body = self._check_pod_update(current, body)
        return self.store.replace(res, namespace, name, body)

    def patch(self, res: ResourceInfo, namespace: str, name: str, content_type: str, body: Any) -> Obj:
        def change(obj: Obj) -> Obj:
            patched = apply_patch(content_type, obj, body)
            wanted = (patched.get("metadata") or {}).get("resourceVersion")
            if wanted and wanted != obj["metadata"]["resourceVersion"]:
                raise ApiError.conflict(res, name)
            check_schema(res, patched)
            if res is PODS:
                patched = self._check_pod_update(obj, patched)
            return patched

        return self.store.mutate(res, namespace, name, change, client=True)

    @staticmethod
    def _check_pod_update(current: Obj, new: Obj) -> Obj:
        """Pods allow metadata changes and a few spec fields; status goes through pods/status."""
        new = copy.deepcopy(new)
        new["status"] = copy.deepcopy(current.get("status", {}))
        old_spec = {k: v for k, v in current["spec"].items() if k not in _MUTABLE_POD_SPEC}
        new_spec = {k: v for k, v in (new.get("spec") or {}).items() if k not in _MUTABLE_POD_SPEC}
        if new_spec != old_spec:
            name = current["metadata"]["name"]
            raise ApiError.invalid(
                PODS,
                name,
                "spec",
                "FieldValueForbidden",
                "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
                "`spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` "
                "(only additions to existing tolerations), `spec.terminationGracePeriodSeconds`",
            )
        return new

    # -- delete ---------------------------------------------------------------------------------
    def delete(
        self, res: ResourceInfo, namespace: str, name: str, query: Mapping[str, str], body: Any
    ) -> Obj:
        """Returns the response body: the pod (Terminating, or as deleted), else a Status."""
        options = body if isinstance(body, dict) else {}
        current = self.store.get(res, namespace, name)
        pre = options.get("preconditions") or {}
        if (pre.get("uid") and pre["uid"] != current["metadata"]["uid"]) or (
            pre.get("resourceVersion") and pre["resourceVersion"] != current["metadata"]["resourceVersion"]
        ):
            raise ApiError.conflict(res, name)
        if res is not PODS:
            removed = self.store.remove(res, namespace, name)
            details: dict[str, Any] = {"name": name}
            if res.group:
                details["group"] = res.group
            details |= {"kind": res.name, "uid": removed["metadata"]["uid"]}
            return {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": details,
            }
        grace = int_param(query, "gracePeriodSeconds")
        if grace is None and options.get("gracePeriodSeconds") is not None:
            grace = int(options["gracePeriodSeconds"])
        if grace is None:
            grace = int(current["spec"].get("terminationGracePeriodSeconds", 30))
        if grace <= 0 or not self._has_runtime(current):
            removed = self.store.remove(res, namespace, name)
            self.kubelet.pod_force_deleted(current)
            return removed
        existing = current["metadata"].get("deletionGracePeriodSeconds")
        if existing is None or grace < existing:
            when = rfc3339(time.time() + grace)

            def terminating(pod: Obj) -> None:
                pod["metadata"]["deletionTimestamp"] = when
                pod["metadata"]["deletionGracePeriodSeconds"] = grace

            current = self.store.mutate(res, namespace, name, terminating)
        self.kubelet.pod_deleted(current, grace)
        return current

    def _has_runtime(self, pod: Obj) -> bool:
        rt = self.kubelet.runtime(pod["metadata"]["namespace"], pod["metadata"]["name"])
        return rt is not None and rt.uid == pod["metadata"]["uid"]

    def delete_collection(
        self, res: ResourceInfo, namespace: str | None, query: Mapping[str, str], body: Any
    ) -> list[Obj]:
        page = self.list_page(
            res, namespace, {k: v for k, v in query.items() if k in ("labelSelector", "fieldSelector")}
        )
        deleted = []
        for obj in page.items:
            meta = obj["metadata"]
            try:
                result = self.delete(res, meta["namespace"], meta["name"], query, body)
            except ApiError as exc:
                if exc.code == 404:
                    continue
                raise
            deleted.append(result if result.get("kind") != "Status" else obj)
        return deleted
