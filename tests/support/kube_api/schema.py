"""Kubernetes objects checked against the real API server's OpenAPI schemas (kubernetes-validate).

No real API server runs here, so the schemas it publishes stand in for it: ``kubernetes-validate``
bundles them per Kubernetes version, in a strict form (``additionalProperties: false``: an unknown
field is an error, as with ``kubectl --validate=strict`` or ``fieldValidation=Strict``).

:data:`SUPPORTED_VERSIONS` are the cluster versions docs/deployment.md supports. The floor is 1.30:
avsim's pod sets ``securityContext.appArmorProfile``, a field that first exists in 1.30.

The same check serves the unit tests (every pod and Lease avsim builds) and the loopback API
(every object it receives), so a spec a real cluster would refuse fails the tests.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

SUPPORTED_VERSIONS: tuple[str, ...] = tuple(f"1.{minor}" for minor in range(30, 38))


@functools.lru_cache(maxsize=64)
def _validator(version: str, kind: str, api_version: str) -> Any:
    """A compiled strict validator for one kind at one version (loading the schema is the slow part)."""
    import jsonschema
    from kubernetes_validate.utils import all_versions, major_minor, schema_contents
    from referencing import Registry, Resource

    bundled = [v for v in all_versions() if major_minor(v) == version]
    if not bundled:
        raise LookupError(f"kubernetes-validate bundles no schemas for Kubernetes {version}")
    folder = f"kubernetes-json-schema/v{bundled[-1]}-local-strict"
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = schema_contents(f"{folder}/{kind.lower()}-{group}.json", version)
    definitions = schema_contents(f"{folder}/_definitions.json", version)
    registry: Any = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def violations(obj: Mapping[str, Any], versions: Iterable[str] = SUPPORTED_VERSIONS) -> list[str]:
    """What the API servers of ``versions`` would refuse in ``obj`` (JSON, as sent on the wire):
    one line per error, ``<version>: <field path>: <message>``; empty when every version accepts it."""
    kind, api_version = str(obj.get("kind") or ""), str(obj.get("apiVersion") or "")
    if not kind or not api_version:
        return ["kind and apiVersion are required to choose a schema"]
    found = []
    for version in versions:
        validator = _validator(version, kind, api_version)
        for error in sorted(validator.iter_errors(dict(obj)), key=lambda e: list(e.absolute_path)):
            found.append(f"{version}: {field_path(error.absolute_path)}: {error.message}")
    return found


def field_path(path: Iterable[Any]) -> str:
    """``spec.containers[0].bogus``: the API server's way of naming a field."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"
