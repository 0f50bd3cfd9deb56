"""Label and field selectors with the API server's grammar and its error messages.

Label selectors: ``key``, ``!key``, ``key=value``, ``key==value``, ``key!=value``,
``key in (a,b)``, ``key notin (a,b)``, comma-separated (all must hold). ``!=`` and ``notin``
also match objects that lack the label, as on a real cluster.

Field selectors: ``path=value``, ``path==value``, ``path!=value`` over the few fields each
resource supports; any other field is the API server's 400 ``field label not supported``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .objects import ApiError

_KEY = re.compile(r"^([a-z0-9A-Z]([-a-z0-9A-Z_.]*[a-z0-9A-Z])?/)?[a-z0-9A-Z]([-a-z0-9A-Z_.]*[a-z0-9A-Z])?$")
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # exists, !exists, in, notin (= is "in" with one value, != is "notin")
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op == "in":
            return present and labels[self.key] in self.values
        return not present or labels[self.key] not in self.values


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def _bad_label(why: str) -> ApiError:
    return ApiError.bad_request(f"unable to parse requirement: {why}")


def _check_key(selector: str, key: str) -> str:
    if not _KEY.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
        raise _bad_label(f'invalid label key "{key}": name part must consist of alphanumeric characters')
    return key


def _check_value(selector: str, value: str) -> str:
    if len(value) > 63 or not _VALUE.match(value):
        raise _bad_label(f'invalid label value: "{value}": at key: must be a valid label value')
    return value


_SET_RE = re.compile(r"^\s*(\S+)\s+(in|notin)\s*\((.*)\)\s*$")


def parse_label_selector(selector: str | None) -> list[Requirement]:
    """Parse a label selector; an empty or missing one selects everything."""
    if not selector or not selector.strip():
        return []
    requirements = []
    for raw in _split_top_level(selector):
        part = raw.strip()
        if not part:
            raise _bad_label("found '', expected: identifier")
        match = _SET_RE.match(part)
        if match:
            key, op, body = match.group(1), match.group(2), match.group(3)
            values = frozenset(_check_value(selector, v.strip()) for v in body.split(",") if v.strip())
            if not values:
                raise _bad_label(f"for '{op}', 'notin' operators, values set can't be empty")
            requirements.append(Requirement(_check_key(selector, key), op, values))
            continue
        for token, op in (("!=", "notin"), ("==", "in"), ("=", "in")):
            if token in part:
                key, value = (s.strip() for s in part.split(token, 1))
                requirements.append(
                    Requirement(_check_key(selector, key), op, frozenset({_check_value(selector, value)}))
                )
                break
        else:
            if part.startswith("!"):
                requirements.append(Requirement(_check_key(selector, part[1:].strip()), "!exists"))
            else:
                requirements.append(Requirement(_check_key(selector, part), "exists"))
    return requirements


def labels_match(requirements: list[Requirement], obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(r.matches(labels) for r in requirements)


def _dig(obj: Mapping[str, Any], path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return ""
        node = node.get(part)
    return "" if node is None else str(node)


# Fields each resource supports in fieldSelector (the API server's field label conversion funcs).
FIELDS: dict[str, frozenset[str]] = {
    "pods": frozenset(
        {
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        }
    ),
    "events": frozenset(
        {
            "metadata.name",
            "metadata.namespace",
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        }
    ),
    "leases": frozenset({"metadata.name", "metadata.namespace"}),
}


def _event_field(obj: Mapping[str, Any], path: str) -> str:
    if path == "source":
        return _dig(obj, "source.component") or _dig(obj, "reportingComponent")
    return _dig(obj, path)


FieldPredicate = Callable[[Mapping[str, Any]], bool]


def parse_field_selector(resource: str, selector: str | None) -> FieldPredicate:
    """Parse a field selector for ``resource``; raise the API server's 400 on unknown fields."""
    if not selector or not selector.strip():
        return lambda _obj: True
    checks: list[tuple[str, bool, str]] = []
    for raw in selector.split(","):
        part = raw.strip()
        token = next((t for t in ("!=", "==", "=") if t in part), None)
        if token is None:
            raise ApiError.bad_request(f"invalid selector: '{selector}'; can't understand '{part}'")
        field, value = (s.strip() for s in part.split(token, 1))
        positive = token != "!="
        if field not in FIELDS.get(resource, frozenset()):
            raise ApiError.bad_request(f"field label not supported: {field}")
        checks.append((field, positive, value))
    getter = _event_field if resource == "events" else _dig

    def predicate(obj: Mapping[str, Any]) -> bool:
        return all((getter(obj, f) == v) == positive for f, positive, v in checks)

    return predicate
