"""Validate a parsed manifest document and report every problem with its path and the fix.

:func:`validate_manifest` runs two passes over the same document and merges what they find:

* the pydantic models (:mod:`avsim.manifest.models`): types, required and unknown fields,
  per-field rules; their errors are rewritten into ``cases[412].seed``-style paths and
  messages that say what to do;
* document-level checks on the raw dict, which pydantic cannot express: unique case ids,
  every case ``graph`` defined under ``graphs``, every ``depends_on`` naming a phase of the
  same graph, acyclic graphs. They are best effort and skip parts that are malformed (those
  are reported by the first pass), so one run reports everything at once;
* checks of every string and of the free-form parts: no credentials anywhere
  (:mod:`avsim.manifest.secrets`: credentials come from Airflow connections), no NUL character
  or lone UTF-16 surrogate (neither can reach a phase's environment or arguments), no non-finite
  number, and a case's ``parameters`` nested at most :data:`MAX_PARAMETER_DEPTH` levels deep, keyed
  by strings and holding only JSON values (a phase gets them as one JSON object, byte for byte);
* identifiers unique without regard to letter case (:mod:`avsim.manifest.ids`): case ids, graph
  names, phase names of one graph, run phase names;
* with a :class:`~avsim.manifest.policy.ManifestPolicy`, the deployment's limits and URI allow-list.

Nothing is stripped or normalised: a value reaches the run as written, or the manifest is refused.

A forbidden pod field is reported at its own path (``...pod.hostPath``), each one of them.
Problems come out in document order, at most :data:`MAX_PROBLEMS` of them. No message repeats
a credential: the credential-shaped part of every path and message is masked (``****``), and a
document that is not a mapping is described by its type, not its content.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from avsim.errors import ManifestError, Problem
from avsim.manifest.field_errors import Loc, child, describe, format_path, pydantic_problems
from avsim.manifest.ids import fold
from avsim.manifest.links import Link, unlink
from avsim.manifest.models import FORBIDDEN_POD_FIELDS, NAME_PATTERN, POD_FIELDS_ALLOWED, Manifest
from avsim.manifest.phase_graph import dependency_problems
from avsim.manifest.secrets import mask_secrets, secret_problems

if TYPE_CHECKING:
    from avsim.manifest.policy import ManifestPolicy

_M = TypeVar("_M", bound=BaseModel)

#: Problems kept in one ManifestError; the rest are counted.
MAX_PROBLEMS = 1000
#: Levels of nesting a case's ``parameters`` may have (a phase gets them as one JSON object).
MAX_PARAMETER_DEPTH = 32

_NAME_RE = re.compile(NAME_PATTERN)


# ----------------------------------------------------------------------------------------- public


def validate_manifest(
    data: object, source: str = "manifest", policy: ManifestPolicy | None = None
) -> Manifest:
    """Validate a parsed manifest document; raise :class:`ManifestError` with every problem found.

    ``policy``: the deployment's limits and URI allow-list too (None: only the rules every
    deployment shares)."""
    return validate_document(data, Manifest, source, "a manifest", policy)


def validate_document(
    data: object, model: type[_M], source: str, what_it_is: str, policy: ManifestPolicy | None = None
) -> _M:
    """Validate a manifest-shaped document (a manifest, or a graph catalog: its ``graphs`` and
    ``run_phases`` without cases) against ``model`` and the document-level checks."""
    if not isinstance(data, dict):
        # Only the type: the loader may have been pointed at a file that is no manifest (and holds secrets).
        what = (
            "nothing (the document is empty)"
            if data is None
            else describe(data)
            if isinstance(data, list | tuple)
            else f"a {type(data).__name__}"
        )
        raise ManifestError(
            [
                Problem(
                    "", f"{what_it_is} is a mapping (YAML mapping / JSON object) at the top level, got {what}"
                )
            ],
            source=source,
        )
    found: list[tuple[Loc, str]] = []
    validated: _M | None = None
    try:
        validated = model.model_validate(data)
    except ValidationError as exc:
        found.extend(_each_forbidden_pod_field(pydantic_problems(exc, data), data))
    found.extend(_document_problems(data))
    # Walks that would find more than can be shown stop there (a path costs its depth).
    secrets, texts = (
        secret_problems(data, limit=MAX_PROBLEMS + 1),
        _text_problems(data, limit=MAX_PROBLEMS + 1),
    )
    capped = max(len(secrets), len(texts)) > MAX_PROBLEMS
    found.extend(secrets)
    found.extend(texts)
    if policy is not None:
        found.extend(policy.problems(data))
    if found:
        raise ManifestError(_ordered(found, data, capped), source=source)
    assert validated is not None
    return validated


def _document_problems(data: dict[str, Any]) -> list[tuple[Loc, str]]:
    out: list[tuple[Loc, str]] = []
    graphs = data.get("graphs", {})
    graph_names: list[str] | None = None
    if isinstance(graphs, dict):
        graph_names = [k for k in graphs if isinstance(k, str) and _NAME_RE.match(k)]
        _case_collisions(("graphs",), graphs, "graph name", out.append)
        for gname, graph in graphs.items():
            if isinstance(graph, dict) and isinstance(graph.get("phases"), dict):
                _graph_problems(("graphs", gname, "phases"), graph["phases"], "phase", out.append)
    run_phases = data.get("run_phases")
    if isinstance(run_phases, dict):
        _case_collisions(("run_phases",), run_phases, "run phase", out.append)
        _graph_problems(("run_phases",), run_phases, "run phase", out.append)
    cases = data.get("cases")
    if isinstance(cases, list):
        _case_problems(cases, graph_names, out.append)
    return out


def _case_problems(
    cases: list[Any], graph_names: list[str] | None, add: Callable[[tuple[Loc, str]], None]
) -> None:
    known = set(graph_names or ())
    first_index: dict[str, int] = {}
    unknown_msg: dict[str, str] = {}
    for i, case in enumerate(cases):
        if not isinstance(case, dict):
            continue
        cid = case.get("id")
        if isinstance(cid, str):
            j = first_index.setdefault(fold(cid), i)
            if j != i:
                other = cases[j]["id"]
                if other == cid:
                    text = f"duplicate case id {cid!r} (also cases[{j}]); give each case a unique id"
                else:
                    text = (
                        f"case id {cid!r} differs from cases[{j}].id {other!r} only in letter case; ids become "
                        "artifact paths and labels, which may not tell case apart: give each case a distinct id"
                    )
                add((("cases", i, "id"), text))
        graph = case.get("graph")
        if isinstance(graph, str) and graph_names is not None:
            name = graph
            if name not in known and _NAME_RE.match(name):
                if name not in unknown_msg:
                    unknown_msg[name] = _unknown_graph(name, graph_names)
                add((("cases", i, "graph"), unknown_msg[name]))
        phases = case.get("phases")
        if isinstance(phases, dict):
            _graph_problems(("cases", i, "phases"), phases, "phase", add)
        parameters = case.get("parameters")
        if isinstance(parameters, dict):
            for loc, message in _parameter_problems(parameters):
                add((("cases", i, "parameters", *loc), message))
        if isinstance(parameters, dict | list):
            too_deep = _too_deep(parameters, MAX_PARAMETER_DEPTH)
            if too_deep is not None:
                add(
                    (
                        ("cases", i, "parameters", *too_deep),
                        f"parameters are nested more than {MAX_PARAMETER_DEPTH} levels deep here; "
                        "flatten them (a phase gets them as one JSON object)",
                    )
                )


def _case_collisions(
    base: Loc, mapping: dict[Any, Any], kind: str, add: Callable[[tuple[Loc, str]], None]
) -> None:
    """Names of one mapping that differ only in letter case: one task id or path on a case-blind store."""
    first: dict[str, str] = {}
    for name in mapping:
        if not isinstance(name, str):
            continue
        other = first.setdefault(fold(name), name)
        if other != name:
            add(
                (
                    (*base, name),
                    f"{kind} {name!r} differs from {other!r} only in letter case; names become task ids and "
                    "artifact paths, which may not tell case apart: rename one",
                )
            )


_JSON_SCALARS = (str, int, float, bool, type(None))


def _parameter_problems(parameters: dict[Any, Any]) -> list[tuple[Loc, str]]:
    """What a phase could not get back byte for byte from the JSON object of its parameters."""
    out: list[tuple[Loc, str]] = []
    stack: list[tuple[Any, Link]] = [(parameters, None)]
    while stack and len(out) < 200:
        node, link = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            here = (link, key)
            if isinstance(node, dict) and not isinstance(key, str):
                out.append(
                    (
                        unlink(here),
                        f"the key {key!r} is {describe(key)}, not text; a phase gets parameters as JSON, where "
                        f"it would become {_json_key(key)!r}: quote the key",
                    )
                )
            if isinstance(value, dict | list):
                stack.append((value, here))
            elif not isinstance(value, _JSON_SCALARS):
                out.append(
                    (
                        unlink(here),
                        f"{type(value).__name__} is no JSON value; a phase gets parameters as JSON: write a string, "
                        "number, true/false, null, list or mapping (quote a date to keep it as text)",
                    )
                )
    return out


def _json_key(key: Any) -> str:
    import json

    try:
        return str(json.dumps({key: 0})[2:].rsplit('":', 1)[0])
    except TypeError:
        return str(key)


def _too_deep(node: Any, limit: int) -> Loc | None:
    """Where (relative to ``node``) the first container more than ``limit`` levels deep is, else None."""
    stack: list[tuple[Any, Loc]] = [(node, ())]
    while stack:
        current, loc = stack.pop()
        if len(loc) >= limit:
            return loc
        items = current.items() if isinstance(current, dict) else enumerate(current)
        for key, value in items:
            if isinstance(value, dict | list):
                stack.append((value, (*loc, key)))
    return None


def _each_forbidden_pod_field(found: list[tuple[Loc, str]], data: Any) -> list[tuple[Loc, str]]:
    """The model names the first forbidden field of a pod at the pod; name each one at its own path."""
    out: list[tuple[Loc, str]] = []
    for loc, message in found:
        node: Any = data
        for seg in loc:
            node = child(node, seg)
        bad = [k for k in node if k in FORBIDDEN_POD_FIELDS] if isinstance(node, dict) else []
        if not (message.startswith("pod field ") and bad):
            out.append((loc, message))
            continue
        for key in bad:
            out.append(
                (
                    (*loc, key),
                    f"pod field {key!r} is not allowed: {FORBIDDEN_POD_FIELDS[key]}; {POD_FIELDS_ALLOWED}",
                )
            )
    return out


def _text_problems(data: Any, limit: int | None = None) -> list[tuple[Loc, str]]:
    """Strings no phase could be given: a NUL character ends a C string, a lone surrogate is no text.

    ``limit``: stop after that many (a path is built for each: a million of them, 200 levels deep,
    would cost O(problems x depth); one more than the shown maximum says that there are more)."""
    out: list[tuple[Loc, str]] = []
    stack: list[tuple[Any, Link]] = [(data, None)]
    while stack and (limit is None or len(out) < limit):
        node, link = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            here = (link, key)
            if isinstance(key, str) and not key.isascii():
                out.extend((unlink(here), f"the key {m}") for m in _bad_text(key))
            if isinstance(value, str):
                if not value.isascii() or "\x00" in value:
                    out.extend((unlink(here), m) for m in _bad_text(value))
            elif isinstance(value, dict | list):
                stack.append((value, here))
            elif isinstance(value, float) and not math.isfinite(value):
                out.append((unlink(here), _NOT_FINITE))
    return out


_NOT_FINITE = "is not a finite number (NaN or infinity); write a finite number"


def _bad_text(text: str) -> list[str]:
    out = []
    if "\x00" in text:
        out.append("holds a NUL character (\\u0000), which no process argument or variable can; remove it")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        out.append(
            f"holds a lone UTF-16 surrogate ({text[exc.start]!a} at character {exc.start}), which is not "
            "text; write the character itself or its complete surrogate pair"
        )
    return out


def _unknown_graph(name: str, graph_names: list[str]) -> str:
    if not graph_names:
        return (
            f"unknown graph {name!r} (no graphs are defined); define it under graphs or give the case phases"
        )
    close = difflib.get_close_matches(name, graph_names, n=1)
    guess = f"did you mean {close[0]!r}?" if close else "name one of them or define it under graphs"
    return f"unknown graph {name!r} (known: {', '.join(graph_names)}); {guess}"


def _graph_problems(
    base: Loc, phases: dict[Any, Any], kind: str, add: Callable[[tuple[Loc, str]], None]
) -> None:
    """Dependency checks of one phase mapping; cached by the graph's shape, then re-rooted at ``base``."""
    shape: list[tuple[Any, tuple[tuple[int, str], ...]]] = []
    for name, phase in phases.items():
        deps = phase.get("depends_on") if isinstance(phase, dict) else None
        entries = (
            tuple((k, d) for k, d in enumerate(deps) if isinstance(d, str)) if isinstance(deps, list) else ()
        )
        shape.append((name, entries))
    try:
        found = dependency_problems(tuple(shape), kind)
    except TypeError:  # an unhashable key (YAML allows lists as keys): pydantic reports that part
        return
    _case_collisions(base, phases, kind, add)
    for rel, message in found:
        add(((*base, *rel), message))


# ------------------------------------------------------------------------------- ordering, limit


def _ordered(found: list[tuple[Loc, str]], data: dict[str, Any], capped: bool = False) -> list[Problem]:
    positions: dict[int, dict[Any, int]] = {}
    keyed = [(_order_key(loc, data, positions), seq, loc, msg) for seq, (loc, msg) in enumerate(found)]
    keyed.sort(key=lambda item: (item[0], item[1]))
    problems: list[Problem] = []
    seen: set[tuple[str, str]] = set()
    for _, _, loc, raw in keyed:
        # A credential in a key or in a value echoed by a type error is masked here as well.
        path, msg = mask_secrets(format_path(loc, data)), mask_secrets(_readable(raw))
        if (path, msg) in seen:
            continue
        seen.add((path, msg))
        problems.append(Problem(path, msg))
    if len(problems) > MAX_PROBLEMS:
        extra = len(problems) - MAX_PROBLEMS
        problems = problems[:MAX_PROBLEMS]
        more = f"at least {extra}" if capped else str(extra)
        problems.append(Problem("", f"... and {more} more problems not shown; fix these and validate again"))
    return problems


#: A message longer than this is cut (every message names its value shortened; this is the backstop).
MAX_MESSAGE = 1000


def _readable(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 30] + " ... (message cut)"


def _order_key(loc: Loc, data: object, positions: dict[int, dict[Any, int]]) -> tuple[int, ...]:
    """Position of ``loc`` in the document: key positions in mappings, indexes in lists.

    ``positions``: each mapping's key positions, built once per mapping (a million problems in one
    mapping of a million keys cost a million look-ups, not 10^12 steps)."""
    key: list[int] = []
    node: Any = data
    for seg in loc:
        if isinstance(node, dict):
            where = positions.get(id(node))
            if where is None:
                where = positions[id(node)] = {k: i for i, k in enumerate(node)}
            try:
                key.append(where.get(seg, len(node)))
            except TypeError:
                key.append(len(node))
        elif isinstance(node, list) and isinstance(seg, int):
            key.append(seg)
        else:
            key.append(0)
        node = child(node, seg)
    return tuple(key)
