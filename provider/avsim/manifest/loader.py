"""Load a weekly manifest from a local path or an ObjectStoragePath URI.

The bytes go through a fixed sequence of gates, each of which rejects with a
:class:`~avsim.errors.ManifestError` that says what is wrong and where:

1. size (``max_bytes``, checked from the file's metadata before it is read, and again while reading);
2. UTF-8 (the byte offset of the first bad byte);
3. syntax (YAML or JSON, line and column);
4. structure, cheaply, before anything is built (:mod:`avsim.manifest.prescan`): nesting depth and
   the case count (YAML from its event stream, before its node graph; JSON on the parsed document);
5. YAML structure (:mod:`avsim.manifest.yaml_nodes`): duplicate mapping keys, alias expansion,
   explicit tags and YAML 1.1 readings that would change a value (line and document path);
   JSON structure (:mod:`avsim.manifest.json_locate`): duplicate keys, non-finite numbers and
   nesting, each with its line, column and document path;
6. the manifest itself (:func:`avsim.manifest.validation.validate_manifest`), with the
   deployment's :class:`~avsim.manifest.policy.ManifestPolicy` (limits, URI allow-list).

YAML anchors and aliases are allowed (``<<: *defaults`` is a common way to share phase
settings) but bounded: ``yaml.safe_load`` shares an aliased node instead of copying it, so
parsing is cheap, but everything after it (validation, the canonical JSON) expands every
alias. A "billion laughs" document of a few hundred bytes would expand to ~10^9 nodes, so
the loader counts the expanded size of the node graph before constructing Python objects and
refuses documents that expand to more than :data:`MAX_EXPANSION_FACTOR` times their written
size (and at least :data:`MIN_EXPANSION_LIMIT` nodes are always allowed). Recursive aliases
are refused outright.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from avsim.errors import ManifestError, Problem
from avsim.manifest.json_locate import json_problems
from avsim.manifest.policy import DEFAULT_MAX_BYTES, ManifestPolicy
from avsim.manifest.prescan import json_structure_problems, yaml_structure_problems
from avsim.manifest.validation import validate_manifest
from avsim.manifest.yaml_nodes import MAX_EXPANSION_FACTOR, MIN_EXPANSION_LIMIT, check_nodes

if TYPE_CHECKING:
    from avsim.manifest.models import Manifest

__all__ = [
    "DEFAULT_MAX_BYTES",
    "MAX_EXPANSION_FACTOR",
    "MIN_EXPANSION_LIMIT",
    "LoadedManifest",
    "load_manifest",
    "parse_manifest_text",
    "read_manifest_bytes",
]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
Format = Literal["yaml", "json"]


@dataclass(frozen=True)
class LoadedManifest:
    """A validated manifest with what it was parsed from and its content hash."""

    manifest: Manifest
    raw: dict[str, Any]
    source: str
    sha256: str
    canonical_json: bytes

    @property
    def case_count(self) -> int:
        return len(self.manifest.cases)


def canonical_json(manifest: Manifest) -> bytes:
    """The manifest's canonical JSON: every field (defaults included), aliases, sorted keys, no spaces."""
    doc = manifest.model_dump(mode="json", by_alias=True)
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def load_manifest(
    source: str | os.PathLike[str], *, max_bytes: int | None = None, policy: ManifestPolicy | None = None
) -> LoadedManifest:
    """Read, parse and validate a manifest from a path, ``file://`` or any ObjectStoragePath URI.

    ``policy`` None: this deployment's (:func:`~avsim.manifest.policy.deployment_policy`), so that
    ``avsim manifest validate`` and the run refuse the same manifests; ``max_bytes`` overrides its limit.
    """
    from avsim.manifest.policy import deployment_policy

    policy = policy or deployment_policy()
    name = os.fspath(source)
    data = read_manifest_bytes(name, max_bytes if max_bytes is not None else policy.max_bytes)
    return parse_manifest_text(data, source=name, fmt=format_from_name(name), policy=policy)


def parse_manifest_text(
    text_or_bytes: str | bytes,
    source: str = "manifest",
    fmt: Format | None = None,
    policy: ManifestPolicy | None = None,
) -> LoadedManifest:
    """Parse and validate manifest text.

    ``fmt`` None: by the extension of ``source`` (``.json``, ``.yaml``/``.yml``), else sniffed: JSON
    if the text starts with ``{`` (falling back to YAML, a superset), otherwise YAML. ``policy``
    None: only the rules every deployment shares (a snapshot is read back so).
    """
    text = _decode(text_or_bytes, source) if isinstance(text_or_bytes, bytes) else text_or_bytes
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise _error("the file is empty; a manifest needs run and cases", source)
    fmt = fmt or format_from_name(source)
    max_cases = policy.max_cases if policy is not None else None
    if fmt is None and text.lstrip().startswith("{"):
        try:
            data = _parse_json(text, source, max_cases)
        except ManifestError as json_error:
            if json_error.problems and "JSON syntax error" not in json_error.problems[0].message:
                raise  # well-formed JSON refused by a limit: no YAML reading would take it
            # Sniffed, not declared: flow-style YAML also starts with "{".
            try:
                data = _parse_yaml(text, source, max_cases)
            except ManifestError:
                raise json_error from None
    elif fmt == "json":
        data = _parse_json(text, source, max_cases)
    else:
        data = _parse_yaml(text, source, max_cases)
    if data is None:
        raise _error(
            "the document is empty (only comments or an explicit null); a manifest needs run and cases",
            source,
        )
    manifest = validate_manifest(data, source=source, policy=policy)
    body = canonical_json(manifest)
    return LoadedManifest(
        manifest=manifest,
        raw=data,
        source=source,
        sha256=hashlib.sha256(body).hexdigest(),
        canonical_json=body,
    )


# ------------------------------------------------------------------------------------- reading


def format_from_name(name: str) -> Format | None:
    """``"json"`` or ``"yaml"`` when a manifest's name (a path or URI, its query ignored) ends so, else None."""
    lower = name.lower().split("?", 1)[0]
    if lower.endswith((".yaml", ".yml")):
        return "yaml"
    if lower.endswith(".json"):
        return "json"
    return None


def read_manifest_bytes(name: str, max_bytes: int) -> bytes:
    """The bytes of the manifest at ``name`` (a path or ObjectStoragePath URI), at most ``max_bytes``."""
    if _SCHEME.match(name):
        from airflow.sdk import ObjectStoragePath

        path: Any = ObjectStoragePath(name)
    else:
        path = Path(name)
    try:
        if path.is_dir():
            raise _error(f"{name} is a directory; pass the manifest file", name)
        size = path.stat().st_size
    except FileNotFoundError:
        raise _error(f"file not found: {name}; check the path or URI", name) from None
    except PermissionError as exc:
        raise _error(f"cannot read {name}: permission denied ({exc})", name) from None
    if size is not None and size > max_bytes:
        raise _error(_too_big(name, max_bytes, size), name)
    try:
        with path.open("rb") as fh:
            # A size of 0 may be a pipe, whose size stat does not know: read up to the limit then.
            data: bytes = fh.read((min(size, max_bytes) if size else max_bytes) + 1)
    except FileNotFoundError:
        raise _error(f"file not found: {name}; check the path or URI", name) from None
    if len(data) > max_bytes:  # grew since stat, or the store reports no size
        raise _error(_too_big(name, max_bytes, None), name)
    return data


def _too_big(name: str, max_bytes: int, size: int | None) -> str:
    got = f"{size} bytes" if size is not None else "more than that"
    return (
        f"{name} is too large: {got}, the limit is {max_bytes} bytes; split the week into several "
        "manifests or raise [avsim] max_manifest_bytes"
    )


def _decode(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise _error(
            f"the file is not UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start} (line {line}) "
            f"cannot be decoded; save the file as UTF-8",
            source,
        ) from None


def _error(message: str, source: str) -> ManifestError:
    return ManifestError([Problem("", message)], source=source)


# ---------------------------------------------------------------------------------------- JSON


def _parse_json(text: str, source: str, max_cases: int | None = None) -> Any:
    """Fast path: the C parser. A duplicate key, a non-finite number or nesting too deep for it sends
    the text through :func:`json_problems`, which names each problem's line, column and path."""
    suspect = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal suspect
        out = dict(items)
        if len(out) != len(items):
            suspect = True
        return out

    def constant(name: str) -> Any:
        raise ValueError(name)

    def number(text: str) -> float:
        nonlocal suspect
        value = float(text)
        if value in (float("inf"), float("-inf")):
            suspect = True
        return value

    try:
        data = json.loads(text, object_pairs_hook=pairs, parse_constant=constant, parse_float=number)
    except json.JSONDecodeError as exc:
        raise _error(
            f"JSON syntax error at line {exc.lineno}, column {exc.colno}: {exc.msg}", source
        ) from None
    except (ValueError, RecursionError):
        suspect = True
        data = None
    if suspect:
        found = json_problems(text)
        if found:
            raise ManifestError(found, source=source)
        raise _error("JSON error: the document could not be read; check it with a JSON linter", source)
    found = json_structure_problems(data, text, max_cases)
    if found:
        raise ManifestError(found, source=source)
    return data


# ---------------------------------------------------------------------------------------- YAML


def _parse_yaml(text: str, source: str, max_cases: int | None = None) -> Any:
    import yaml

    found = yaml_structure_problems(text, max_cases)
    if found:
        raise ManifestError(found, source=source)

    loader_cls = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loader = loader_cls(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            raise _error(_yaml_syntax(exc), source) from None
        except yaml.reader.ReaderError as exc:  # a character YAML does not take: say where it is
            before = text[: exc.position]
            line, column = before.count("\n") + 1, exc.position - (before.rfind("\n") + 1) + 1
            raise _error(
                f"YAML error at line {line}, column {column}: character #x{exc.character:04x} is not allowed in "
                "YAML (a control character); remove it or write it as an escape in a double-quoted string",
                source,
            ) from None
        except yaml.YAMLError as exc:
            raise _error(f"YAML error: {exc}", source) from None
        if node is None:
            return None
        problems = check_nodes(node, loader.resolve)
        if problems:
            raise ManifestError(problems, source=source)
        try:
            return loader.construct_document(node)
        except yaml.MarkedYAMLError as exc:
            raise _error(_yaml_syntax(exc), source) from None
        except yaml.YAMLError as exc:
            raise _error(f"YAML error: {exc}", source) from None
        except ValueError as exc:  # an impossible date, an integer too long to convert
            raise _error(
                f"YAML error: {exc}: a date or number that cannot be read; quote it to keep it as text",
                source,
            ) from None
    finally:
        loader.dispose()


def _yaml_syntax(exc: Any) -> str:
    import yaml

    mark, cmark = exc.problem_mark, exc.context_mark
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    what = exc.problem or exc.context or "invalid YAML"
    context = ""
    if exc.context and exc.problem:
        started = ""
        if cmark is not None and (mark is None or (cmark.line, cmark.column) != (mark.line, mark.column)):
            started = f" at line {cmark.line + 1}, column {cmark.column + 1}"
        context = f" ({exc.context}{started})"
    if isinstance(exc, yaml.constructor.ConstructorError) and "tag" in str(what):
        return f"YAML error{where}: {what}{context}; a manifest is plain YAML: remove the tag"
    return f"YAML syntax error{where}: {what}{context}"
