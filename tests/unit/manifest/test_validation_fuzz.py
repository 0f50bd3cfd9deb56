"""Property-based fuzzing of manifest validation and loading (hypothesis).

Whatever goes in (a valid manifest with fields dropped, replaced, retyped or added; random JSON
anywhere; random bytes; random edits of a valid file's text), what comes out is a valid
:class:`Manifest` or a :class:`ManifestError` whose every problem has a message and a path into the
document: the path of a node of the document, or of a field the models know under a mapping of it
(a missing field). Never another exception.

Bounded and deterministic (the ``avsim-fuzz`` profile): a few seconds. For a longer, random search
set ``AVSIM_FUZZ_EXAMPLES`` (e.g. 20000) and ``AVSIM_FUZZ_RANDOM=1``.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from tests.support.problems import assert_located  # every refusal names where

from avsim.errors import ManifestError
from avsim.manifest.field_errors import _unwrap, format_path
from avsim.manifest.loader import parse_manifest_text
from avsim.manifest.models import Manifest
from avsim.manifest.sample import sample_manifest
from avsim.manifest.secrets import mask_secrets
from avsim.manifest.validation import validate_manifest

settings.register_profile(
    "avsim-fuzz",
    max_examples=int(os.environ.get("AVSIM_FUZZ_EXAMPLES", "100")),
    deadline=None,
    database=None,
    derandomize=os.environ.get("AVSIM_FUZZ_RANDOM") != "1",
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FUZZ = settings.get_profile("avsim-fuzz")

BASE = sample_manifest(3, iso_week="2026-W49")
GOOD_TEXT = (Path(__file__).parents[1] / "corpus" / "good_minimal.yaml").read_text()
Loc = tuple[Hashable, ...]


def _field_names(model: type[BaseModel], seen: set[type[BaseModel]] | None = None) -> set[str]:
    """Every field name and alias of the manifest's models (what a 'missing field' path may end in)."""
    seen = seen if seen is not None else set()
    if model in seen:
        return set()
    seen.add(model)
    names: set[str] = set()
    for name, field in model.model_fields.items():
        names |= {name, field.alias or name}
        stack = [field.annotation]
        while stack:
            tp = _unwrap(stack.pop())
            if isinstance(tp, type) and issubclass(tp, BaseModel):
                names |= _field_names(tp, seen)
            elif get_origin(tp) is not None:
                stack.extend(a for a in get_args(tp) if a is not Ellipsis)
    return names


FIELD_NAMES = sorted(_field_names(Manifest))


def _locs(node: Any, loc: Loc = ()) -> Iterator[tuple[Loc, Any]]:
    stack: list[tuple[Loc, Any]] = [(loc, node)]
    while stack:
        here, current = stack.pop()
        yield here, current
        if isinstance(current, dict):
            stack.extend(((*here, k), v) for k, v in current.items())
        elif isinstance(current, list):
            stack.extend(((*here, i), v) for i, v in enumerate(current))


def points_into(path: str, doc: Any) -> bool:
    """Whether ``path`` names a node of ``doc``, or a field the models know under a mapping of it."""
    dicts = []
    for loc, node in _locs(doc):
        if path in (format_path(loc, doc), mask_secrets(format_path(loc, doc))):
            return True
        if isinstance(node, dict):
            dicts.append(loc)
    for name in (n for n in FIELD_NAMES if n in path):
        for loc in dicts:
            if path == format_path((*loc, name), doc):
                return True
    return False


def check_outcome(doc: Any, run: Any, *, parsed_here: bool = False) -> None:
    """``run()`` validates ``doc``; it returns a Manifest or raises a ManifestError about ``doc``.

    ``parsed_here``: ``run`` parses text, so problems of the whole file (syntax, encoding, duplicate
    JSON keys) have no path; a parsed document's problems have one, except the count of those left out.
    """
    try:
        result = run()
    except ManifestError as exc:
        problems = exc.problems
        assert problems, "a ManifestError without problems"
        for p in problems:
            assert p.message.strip(), p
            assert_located(p)
            if p.path:
                assert points_into(p.path, doc), f"{p.path!r} does not point into the document ({p})"
            else:
                whole = parsed_here or not isinstance(doc, dict)
                assert whole or p.message.startswith("... and "), f"no path: {p}"
        return
    manifest = getattr(result, "manifest", result)
    assert isinstance(manifest, Manifest)


# ----------------------------------------------------------------------------------- strategies

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=24)
    | st.sampled_from(["", "standard", "prepare", "cpu", "gpu", "2Gi", "2026-W49", "1e308", "case-00001"])
)
json_values = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=4),
    max_leaves=12,
)


def _retype(value: Any) -> Any:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return [value] if len(value) % 2 else len(value)
    if isinstance(value, list):
        return {str(i): v for i, v in enumerate(value)}
    if isinstance(value, dict):
        return list(value.values())
    return {}


def _mutate(doc: dict[str, Any], data: st.DataObject) -> None:
    """One mutation somewhere in ``doc``: drop, replace, retype, add a key, or repeat a list item."""
    locs = [(loc, node) for loc, node in _locs(doc) if loc]
    loc, node = data.draw(st.sampled_from(locs), label="where")
    parent: Any = doc
    for seg in loc[:-1]:
        parent = parent[seg]
    key = loc[-1]
    op = data.draw(st.sampled_from(["drop", "replace", "retype", "add_key", "repeat"]), label="op")
    if op == "drop":
        del parent[key]
    elif op == "replace":
        parent[key] = data.draw(json_values, label="value")
    elif op == "retype":
        parent[key] = _retype(node)
    elif op == "add_key" and isinstance(node, dict):
        node[data.draw(st.text(max_size=16), label="key")] = data.draw(json_values, label="value")
    elif op == "repeat" and isinstance(parent, list):
        parent.insert(int(key), copy.deepcopy(node))
    else:
        parent[key] = None


# ------------------------------------------------------------------------------------- the tests


@FUZZ
@given(data=st.data(), mutations=st.integers(min_value=1, max_value=4))
def test_a_mutated_manifest_is_valid_or_refused_with_paths_into_it(
    data: st.DataObject, mutations: int
) -> None:
    doc = copy.deepcopy(BASE)
    for _ in range(mutations):
        _mutate(doc, data)
    check_outcome(doc, lambda: validate_manifest(doc, source="fuzz.json"))


@FUZZ
@given(value=json_values)
def test_any_json_document_is_valid_or_refused(value: Any) -> None:
    check_outcome(value, lambda: validate_manifest(value, source="fuzz.json"))


@FUZZ
@given(raw=st.binary(max_size=512), fmt=st.sampled_from(["yaml", "json", None]))
def test_random_bytes_are_refused_with_a_message(raw: bytes, fmt: Any) -> None:
    with pytest.raises(ManifestError) as exc:
        parse_manifest_text(raw, source="fuzz", fmt=fmt)
    assert exc.value.problems and all(p.message.strip() for p in exc.value.problems)
    for p in exc.value.problems:
        assert_located(p)


def _parsed(text: str, fmt: str) -> Any:
    """The document as the loader's parser sees it (for the paths), or None when it does not parse."""
    try:
        if fmt == "json":
            return json.loads(text)
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except Exception:
        return None


@FUZZ
@given(
    start=st.integers(min_value=0, max_value=len(GOOD_TEXT)),
    length=st.integers(min_value=0, max_value=40),
    insert=st.text(alphabet=st.characters(codec="utf-8"), max_size=30),
)
def test_a_valid_file_edited_at_random_is_valid_or_refused(start: int, length: int, insert: str) -> None:
    text = GOOD_TEXT[:start] + insert + GOOD_TEXT[start + length :]
    check_outcome(
        _parsed(text, "yaml"), lambda: parse_manifest_text(text, source="fuzz.yaml"), parsed_here=True
    )


@FUZZ
@given(data=st.data())
def test_a_json_manifest_edited_at_random_is_valid_or_refused(data: st.DataObject) -> None:
    text = json.dumps(BASE)
    start = data.draw(st.integers(min_value=0, max_value=len(text)), label="start")
    length = data.draw(st.integers(min_value=0, max_value=20), label="length")
    insert = data.draw(st.text(alphabet='{}[]":,0123456789.-eEtruefalsn \\u', max_size=12), label="insert")
    edited = text[:start] + insert + text[start + length :]
    check_outcome(
        _parsed(edited, "json"), lambda: parse_manifest_text(edited, source="fuzz.json"), parsed_here=True
    )


# ------------------------------------------------------------- bombs at random places (issue 28)

#: Where a bomb goes: a case's parameters (free-form), a typed field, a phase's args, the top level.
BOMB_SITES = ["parameters", "tags", "args", "top"]


def _bomb(kind: str, size: int, fmt: str) -> str:
    """One of the issue's shapes, in JSON or flow-style YAML text."""
    if kind == "depth_map":
        return ('{"a":' if fmt == "json" else "{a: ") * size + "1" + "}" * size
    if kind == "depth_list":
        return "[" * size + "]" * size
    if kind == "width_map":
        return "{" + ",".join(f'"k{i}":{i}' for i in range(size)) + "}"
    if kind == "width_list":
        return "[" + ",".join("0" for _ in range(size)) + "]"
    if kind == "duplicate_keys":
        return "{" + ",".join('"k":1' for _ in range(size)) + "}"
    if kind == "long_string":
        return json.dumps("x" * size)
    return "9" * size  # a huge number


@FUZZ
@given(
    kind=st.sampled_from(
        ["depth_map", "depth_list", "width_map", "width_list", "duplicate_keys", "long_string", "huge_number"]
    ),
    size=st.integers(min_value=150, max_value=30_000),
    site=st.sampled_from(BOMB_SITES),
    fmt=st.sampled_from(["json", "yaml"]),
)
def test_a_bomb_anywhere_is_valid_or_refused_with_a_short_located_message(
    kind: str, size: int, site: str, fmt: str
) -> None:
    """Whatever the shape, size and place: a Manifest, or a ManifestError whose every problem is
    located, whose path is at most the depth limit long and whose message is readable; never another
    exception (a RecursionError, a MemoryError)."""
    from avsim.manifest.prescan import MAX_DEPTH

    doc = copy.deepcopy(yaml.safe_load(GOOD_TEXT))
    doc["run"]["deadline"] = "2026-12-06T18:00:00Z"
    marker = "@BOMB@"
    if site == "parameters":
        doc["cases"][0]["parameters"] = {"bomb": marker}
    elif site == "tags":
        doc["cases"][0]["tags"] = marker
    elif site == "args":
        doc["graphs"]["standard"]["phases"]["prepare"]["args"] = marker
    else:
        doc["bomb"] = marker
    text = json.dumps(doc).replace(json.dumps(marker), _bomb(kind, size, fmt))
    try:
        parse_manifest_text(text, source=f"fuzz.{fmt}", fmt="json" if fmt == "json" else "yaml")
    except ManifestError as exc:
        assert exc.problems
        for p in exc.problems:
            assert_located(p)
            assert p.path.count(".") + p.path.count("[") < MAX_DEPTH, p.path[:200]
            assert len(p.message) < 600, p.message[:200]
