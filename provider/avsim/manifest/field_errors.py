"""Pydantic's validation errors, rewritten: a ``cases[412].seed``-style path and a message with the fix."""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Hashable, Iterable, Mapping
from functools import lru_cache
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from avsim.manifest.ids import case_id_problem, name_problem
from avsim.manifest.models import CASE_ID_PATTERN, NAME_PATTERN, Manifest

Loc = tuple[Hashable, ...]
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "bool": "true or false",
    "mapping": "a mapping",
    "list": "a list",
    "datetime": "a date-time with a time zone, like '2026-12-06T18:00:00Z'",
}
_ERROR_TYPE_WORD = {
    "int_type": "int",
    "int_parsing": "int",
    "int_from_float": "int",
    "float_type": "float",
    "float_parsing": "float",
    "finite_number": "float",
    "string_type": "str",
    "bool_type": "bool",
    "bool_parsing": "bool",
    "model_type": "mapping",
    "model_attributes_type": "mapping",
    "dict_type": "mapping",
    "tuple_type": "list",
    "list_type": "list",
    "datetime_type": "datetime",
    "datetime_parsing": "datetime",
    "datetime_from_date_parsing": "datetime",
    "datetime_object_invalid": "datetime",
}
_BOUND_TYPES = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "string_too_long"}


def format_path(loc: Iterable[Hashable], data: object = None) -> str:
    """``("cases", 412, "graph")`` -> ``cases[412].graph``; list indexes in brackets, keys dotted.

    With ``data`` (the raw document) an int segment is shown as a key when it indexes a mapping.
    """
    out: list[str] = []
    node: Any = data
    for seg in loc:
        if isinstance(seg, int) and not isinstance(seg, bool) and not isinstance(node, dict):
            out.append(f"[{seg}]")
        else:
            key = str(seg)
            if _PLAIN_KEY.match(key) or isinstance(seg, int):
                out.append(f".{key}" if out else key)
            else:
                out.append(f"[{key!r}]")
        node = child(node, seg)
    return "".join(out)


# ------------------------------------------------------------------------- pydantic error rewrite


def pydantic_problems(exc: ValidationError, data: dict[str, Any]) -> list[tuple[Loc, str]]:
    errors = exc.errors(include_url=False)
    # pydantic counts only valid items for min_length, so a list whose every item failed also
    # gets a bogus "needs at least 1 item"; drop length errors on anything that has child errors.
    parents: set[Loc] = set()
    for err in errors:
        loc = tuple(err["loc"])
        for k in range(len(loc)):
            parents.add(loc[:k])
    out: list[tuple[Loc, str]] = []
    for err in errors:
        loc = tuple(err["loc"])
        if err["type"] == "too_short" and loc in parents:
            continue
        if loc and loc[-1] == "[key]":  # a mapping key failed (graph or phase name)
            loc = loc[:-1]
        out.append((loc, _rewrite(err, tuple(err["loc"]))))
    return out


def _rewrite(err: Mapping[str, Any], loc: Loc) -> str:
    etype: str = err["type"]
    msg: str = err["msg"]
    value = err.get("input")
    ctx = err.get("ctx") or {}
    label = _label(loc)
    if etype == "missing":
        return "required field missing; add it"
    if etype == "extra_forbidden":
        field = str(loc[-1])
        allowed = _allowed_fields(_type_path(loc[:-1]))
        hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
        close = difflib.get_close_matches(field, allowed, n=1)
        guess = f"; did you mean {close[0]!r}?" if close else ""
        return f"unknown field {field!r}; remove it{hint}{guess}"
    if etype == "value_error":
        return msg.removeprefix("Value error, ")
    if etype in _ERROR_TYPE_WORD:
        word = _ERROR_TYPE_WORD[etype]
        text = f"{label} must be {_TYPE_WORDS[word]}, got {describe(value)}"
        if word == "str" and isinstance(value, int | float) and not isinstance(value, bool):
            text += f"; quote it: '{_cut(str(value))}'"
        elif word == "list" and isinstance(value, str):
            text += f"; write it as a list: [{_cut(value)}]"
        return text
    if etype == "enum":
        return f"{label} must be {ctx.get('expected', 'one of the allowed values')}, got {describe(value)}"
    if etype == "string_pattern_mismatch":
        pattern = ctx.get("pattern")
        what = label
        if loc and loc[-1] == "[key]":
            container = str(loc[-3]) if len(loc) >= 3 else ""
            what = {"graphs": "graph name", "phases": "phase name", "run_phases": "run phase name"}.get(
                container, "name"
            )
        if pattern == NAME_PATTERN and isinstance(value, str):
            return name_problem(value, what) or f"{what} {value!r} is not a valid name"
        if pattern == CASE_ID_PATTERN and isinstance(value, str):
            return case_id_problem(value) or f"{what} {value!r} is not a valid case id"
        return f"{what} {value!r} does not match the pattern {pattern!r}"
    if etype == "too_short":
        n = ctx.get("min_length", 1)
        return f"{label} needs at least {n} item{'s' if n != 1 else ''}; add {'one' if n == 1 else 'more'}"
    if etype == "string_too_short":
        return f"{label} must not be empty"
    if etype in _BOUND_TYPES:
        return f"{label}: {msg[0].lower()}{msg[1:]}, got {short(value)}"
    return f"{msg}, got {describe(value)}" if not isinstance(value, dict | list) else msg


def _label(loc: Loc) -> str:
    """The field an error is about, for the message: ``seed``, ``depends_on[0]``."""
    parts = [seg for seg in loc if seg != "[key]"]
    if not parts:
        return "value"
    last = parts[-1]
    if isinstance(last, int) and len(parts) > 1:
        return f"{parts[-2]}[{last}]"
    return str(last)


def describe(value: object) -> str:
    if isinstance(value, dict):
        return f"a mapping of {len(value)} key{'s' if len(value) != 1 else ''}"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)} item{'s' if len(value) != 1 else ''}"
    if value is None:
        return "null"
    return f"{type(value).__name__} {short(value)}"


def _cut(text: str, limit: int = 60) -> str:
    """A value echoed in advice, cut to a readable length (issue 28: a 30,000-character string is no hint)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------- the model type at an error path


def _type_path(loc: Loc) -> tuple[str, ...]:
    """An error location with indexes and mapping keys normalised, so it can be cached per shape."""
    out: list[str] = []
    tp: Any = Manifest
    for seg in loc:
        tp = _unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            out.append(str(seg))
            tp = _field_type(tp, str(seg))
        else:
            out.append("*")
            origin = get_origin(tp)
            args = get_args(tp)
            tp = args[-1] if origin is dict and args else args[0] if args else None
    return tuple(out)


@lru_cache(maxsize=256)
def _allowed_fields(type_path: tuple[str, ...]) -> tuple[str, ...]:
    tp: Any = Manifest
    for seg in type_path:
        tp = _unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            tp = _field_type(tp, seg)
        else:
            origin, args = get_origin(tp), get_args(tp)
            tp = args[-1] if origin is dict and args else args[0] if args else None
    tp = _unwrap(tp)
    if not (isinstance(tp, type) and issubclass(tp, BaseModel)):
        return ()
    return tuple(f.alias or name for name, f in tp.model_fields.items())


def _field_type(model: type[BaseModel], key: str) -> Any:
    for name, field in model.model_fields.items():
        if key in (name, field.alias):
            return field.annotation
    return None


def _unwrap(tp: Any) -> Any:
    """Strip ``Annotated`` and ``X | None`` down to the type that has the children."""
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
        elif origin is Union or origin is types.UnionType:
            args = [a for a in get_args(tp) if a is not type(None)]
            tp = args[0] if args else None
        else:
            return tp


# ------------------------------------------------------------------------ document-level checks


def child(node: Any, seg: Hashable) -> Any:
    try:
        if isinstance(node, dict):
            return node.get(seg)
        if isinstance(node, list) and isinstance(seg, int):
            return node[seg] if -len(node) <= seg < len(node) else None
    except TypeError:
        return None
    return None
