"""The manifest reference (``docs/manifest.md``), rendered from the code that defines the manifest.

Nothing here lists fields by hand. :func:`render_models` walks the pydantic models from
:class:`~avsim.manifest.models.Manifest` down (every model reachable through a field, in field
order) and writes, per model, its docstring, where it is used, and a table of its fields (YAML key,
type, default, constraints, description) followed by its rules: the validators of the model and of
its bases, each shown by its docstring and the error messages it raises (read from its source, also
through helper functions of the same module it calls). Enumerations and the named string types
(``Name = Annotated[str, ...]`` in the models' module) get their own sections. The document-level
checks, the loading gates and the check against the deployed graph catalog come from the docstrings
and error messages of :mod:`avsim.manifest.validation`, :mod:`avsim.manifest.loader` and
:mod:`avsim.plan.shards`; the outcome table from :mod:`avsim.phases.contract`.

:func:`render_reference` adds the introduction and a complete example (a small
:func:`~avsim.manifest.sample.sample_manifest`, validated while rendering), so
``avsim manifest reference -o docs/manifest.md`` regenerates the page after a model change and a
unit test fails while the committed page differs from what this module renders.
"""

from __future__ import annotations

import ast
import datetime as dt
import inspect
import json
import re
import sys
import textwrap
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

import annotated_types as at
from pydantic import BaseModel, StringConstraints
from pydantic.fields import FieldInfo

from avsim_docgen.sources import (
    doc_body,
    doc_comments,
    field_key,
    function_of,
    md_cell,
    md_code,
    md_number,
    messages_of,
    rst_to_markdown,
    rules_of,
)

#: The command that rewrites the committed reference.
REGENERATE = "avsim manifest reference -o docs/manifest.md"
#: The example's week and size: fixed, so the page does not change with the calendar.
EXAMPLE_WEEK = "2026-W49"
EXAMPLE_CASES = 3

_SCALARS: tuple[tuple[type, str], ...] = (
    (bool, "boolean"),  # before int: bool is an int
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (dt.datetime, "date-time (ISO 8601)"),
    (dt.date, "date (ISO 8601)"),
)


# ------------------------------------------------------------------------------------ the walk


@dataclass
class _Catalog:
    """What a walk from the root model found, in first-seen order."""

    models: dict[type[BaseModel], list[str]] = field(default_factory=dict)  # model -> "Parent.field" uses
    enums: dict[type[Enum], list[str]] = field(default_factory=dict)
    aliases: dict[str, Any] = field(default_factory=dict)  # alias name -> Annotated object
    used_aliases: dict[str, list[str]] = field(default_factory=dict)


def _field_hints(model: type[BaseModel]) -> dict[str, Any]:
    """Field annotations as written (named ``Annotated`` aliases kept), falling back to pydantic's."""
    try:
        hints = get_type_hints(model, include_extras=True)
    except Exception:  # a forward reference this module cannot resolve: pydantic's view is enough
        hints = {}
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if name in hints:
            out[name] = hints[name]
        elif info.metadata:
            out[name] = Annotated[(info.annotation, *info.metadata)]
        else:
            out[name] = info.annotation
    return out


def _module_aliases(module_name: str) -> dict[str, Any]:
    module = sys.modules.get(module_name)
    if module is None:
        return {}
    return {
        name: obj
        for name, obj in vars(module).items()
        if not name.startswith("_") and get_origin(obj) is Annotated
    }


def _alias_name(tp: Any, aliases: Mapping[str, Any]) -> str | None:
    if get_origin(tp) is not Annotated:
        return None
    for name, obj in aliases.items():
        try:
            if obj == tp:
                return name
        except TypeError:  # unhashable/uncomparable metadata
            continue
    return None


def _leaves(tp: Any) -> Iterable[Any]:
    """Every type a value of ``tp`` may hold somewhere (through unions, containers, Annotated)."""
    yield tp
    for arg in get_args(tp):
        if arg is Ellipsis or isinstance(arg, (str, int, float, bool)) or not _is_type_like(arg):
            continue
        yield from _leaves(arg)


def _is_type_like(obj: Any) -> bool:
    return isinstance(obj, type) or get_origin(obj) is not None or obj is Any


def walk(root: type[BaseModel]) -> _Catalog:
    """Every model, enumeration and named alias reachable from ``root``, in first-seen order."""
    cat = _Catalog()

    def visit(model: type[BaseModel], used_at: str) -> None:
        seen = model in cat.models
        cat.models.setdefault(model, [])
        if used_at:
            cat.models[model].append(used_at)
        if seen:
            return
        cat.aliases.update(_module_aliases(model.__module__))
        for name, tp in _field_hints(model).items():
            where = f"{model.__name__}.{field_key(model, name)}"
            nested: list[type[BaseModel]] = []
            for leaf in _leaves(tp):
                alias = _alias_name(leaf, cat.aliases)
                if alias is not None:
                    cat.used_aliases.setdefault(alias, []).append(where)
                if isinstance(leaf, type) and issubclass(leaf, BaseModel) and leaf not in nested:
                    nested.append(leaf)
                elif isinstance(leaf, type) and issubclass(leaf, Enum):
                    cat.enums.setdefault(leaf, []).append(where)
            for sub in nested:
                visit(sub, where)

    visit(root, "")
    return cat


# ----------------------------------------------------------------------------------- rendering


def _anchor(name: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "", name.lower())


def _link(name: str) -> str:
    return f"[{name}](#{_anchor(name)})"


def _constraints(metadata: Iterable[Any], noun: str | None = None) -> list[str]:
    """Constraints in words; ``noun`` ("items", "entries") for the length of a container."""
    out: list[str] = []
    for meta in metadata:
        if isinstance(meta, at.Gt):
            out.append(f"> {md_number(meta.gt)}")
        elif isinstance(meta, at.Ge):
            out.append(f"≥ {md_number(meta.ge)}")
        elif isinstance(meta, at.Lt):
            out.append(f"< {md_number(meta.lt)}")
        elif isinstance(meta, at.Le):
            out.append(f"≤ {md_number(meta.le)}")
        elif isinstance(meta, at.MultipleOf):
            out.append(f"multiple of {md_number(meta.multiple_of)}")
        elif isinstance(meta, at.MinLen):
            out.append(f"at least {_count(meta.min_length, noun)}" if noun else f"length ≥ {meta.min_length}")
        elif isinstance(meta, at.MaxLen):
            out.append(f"at most {_count(meta.max_length, noun)}" if noun else f"length ≤ {meta.max_length}")
        elif isinstance(meta, StringConstraints):
            out.extend(_constraints(_string_constraints(meta)))
        else:
            out.extend(_general_constraints(meta))
    return out


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n != 1 else f"1 {noun.removesuffix('s').replace('entrie', 'entry')}"


def _string_constraints(meta: StringConstraints) -> list[Any]:
    parts: list[Any] = []
    if meta.min_length is not None:
        parts.append(at.MinLen(meta.min_length))
    if meta.max_length is not None:
        parts.append(at.MaxLen(meta.max_length))
    parts.extend(
        _Note(note)
        for note, on in (
            (f"matches {md_code(str(meta.pattern))}", meta.pattern is not None),
            ("strict (no type conversion)", bool(meta.strict)),
            ("upper-cased", bool(meta.to_upper)),
            ("lower-cased", bool(meta.to_lower)),
            ("ASCII only", bool(meta.ascii_only)),
        )
        if on
    )
    return parts


@dataclass(frozen=True)
class _Note:
    text: str


def _general_constraints(meta: Any) -> list[str]:
    if isinstance(meta, _Note):
        return [meta.text]
    values = dict(vars(meta)) if hasattr(meta, "__dict__") else {}
    if not values and hasattr(meta, "__dataclass_fields__"):
        values = {k: getattr(meta, k) for k in meta.__dataclass_fields__}
    out: list[str] = []
    if values.get("strict"):
        out.append("strict (no type conversion)")
    if values.get("pattern") is not None:
        out.append(f"matches {md_code(str(values['pattern']))}")
    if values.get("allow_inf_nan") is False:
        out.append("finite")
    return out


def _enum_values(enum: type[Enum]) -> str:
    return " or ".join(md_code(str(m.value)) for m in enum)


def render_type(tp: Any, aliases: Mapping[str, Any] | None = None) -> str:
    """A field type in words, with links to the model, enumeration and alias sections."""
    aliases = aliases or {}
    if tp is type(None):
        return "null"
    if tp is Any:
        return "any value"
    alias = _alias_name(tp, aliases)
    if alias is not None:
        return _link(alias)
    origin = get_origin(tp)
    args = get_args(tp)
    if origin is Annotated:
        base, *meta = args
        notes = _constraints(meta)
        return render_type(base, aliases) + (f" ({', '.join(notes)})" if notes else "")
    if origin in (Union, types.UnionType):
        present = [a for a in args if a is not type(None)]
        text = " or ".join(render_type(a, aliases) for a in present)
        return f"{text} or null" if len(present) < len(args) else text
    if origin is Literal:
        return "one of " + ", ".join(md_code(json.dumps(a)) for a in args)
    if origin in (list, tuple, set, frozenset, Sequence) or (
        isinstance(origin, type) and issubclass(origin, (list, tuple, set, frozenset))
    ):
        items = [a for a in args if a is not Ellipsis]
        if origin is tuple and items and Ellipsis not in args:
            return "list of exactly " + ", ".join(render_type(a, aliases) for a in items)
        return "list of " + render_type(items[0], aliases) if items else "list"
    if origin in (dict, Mapping) or (isinstance(origin, type) and issubclass(origin, dict)):
        if len(args) == 2:
            return f"mapping of {render_type(args[0], aliases)} to {render_type(args[1], aliases)}"
        return "mapping"
    if isinstance(tp, type):
        if issubclass(tp, BaseModel):
            return _link(tp.__name__)
        if issubclass(tp, Enum):
            return f"{_link(tp.__name__)}: {_enum_values(tp)}"
        for scalar, words in _SCALARS:
            if issubclass(tp, scalar):
                return words
    return md_code(getattr(tp, "__name__", repr(tp)))


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "**required**"
    if info.default_factory is not None:
        value = info.get_default(call_default_factory=True, validated_data={})
    else:
        value = info.default
    if isinstance(value, BaseModel):
        changed = value.model_dump(mode="json", by_alias=True, exclude_defaults=True)
        if not changed:
            return f"the defaults of {_link(type(value).__name__)}"
        return md_code(json.dumps(changed))
    if isinstance(value, Enum):
        value = value.value
    if value is None or isinstance(value, (bool, int, float)):
        return md_code(json.dumps(value) if not isinstance(value, float) else md_number(value))
    if isinstance(value, str):
        return md_code(value) if value else '`""` (empty)'
    try:
        return md_code(json.dumps(value, default=str))
    except TypeError:
        return md_code(repr(value))


def _container_noun(tp: Any) -> str | None:
    """The word for a container's length ("items", "entries") when every non-null type of ``tp`` is a list or a mapping."""
    nouns = set()
    for arg in get_args(tp) if get_origin(tp) in (Union, types.UnionType) else (tp,):
        if arg is type(None):
            continue
        origin = get_origin(arg) or arg
        if isinstance(origin, type) and issubclass(origin, (list, tuple, set, frozenset)):
            nouns.add("items")
        elif isinstance(origin, type) and issubclass(origin, dict):
            nouns.add("entries")
        else:
            return None
    return nouns.pop() if len(nouns) == 1 else None


def _field_row(model: type[BaseModel], name: str, tp: Any, aliases: Mapping[str, Any]) -> str:
    info = model.model_fields[name]
    key = md_code(field_key(model, name))
    by_name = model.model_config.get("populate_by_name") or model.model_config.get("validate_by_name")
    if info.alias and info.alias != name and by_name:
        key += f" (or {md_code(name)})"
    shown_meta: list[Any] = list(get_args(tp)[1:]) if get_origin(tp) is Annotated else []
    extra = [m for m in info.metadata if m not in shown_meta]
    container = _container_noun(info.annotation)
    cells = [
        key,
        render_type(tp, aliases),
        _default(info),
        ", ".join(_constraints(extra, container)),
        info.description or "",
    ]
    return "| " + " | ".join(md_cell(c) for c in cells) + " |"


# ------------------------------------------------------------------------------ model reference


def render_models(root: type[BaseModel]) -> str:
    """The reference of every model reachable from ``root``: fields, rules, enumerations, string types."""
    cat = walk(root)
    out: list[str] = ["## Models", ""]
    out.append(" · ".join(_link(m.__name__) for m in cat.models))
    out.append("")
    policies = {(m.model_config.get("extra"), bool(m.model_config.get("frozen"))) for m in cat.models}
    if policies == {("forbid", True)}:
        out += ["Every model rejects keys it does not define (a typo is an error, not ignored).", ""]
    for model in cat.models:
        out += _model_section(model, cat)
    if cat.enums:
        out += ["## Enumerations", ""]
        for enum in cat.enums:
            out += _enum_section(enum, cat)
    if cat.used_aliases:
        out += ["## String types", "", "| name | what it is | used in |", "|---|---|---|"]
        for name in cat.used_aliases:
            alias = cat.aliases[name]
            base, *meta = get_args(alias)
            words = render_type(base) + (f" ({', '.join(_constraints(meta))})" if meta else "")
            used = ", ".join(md_code(u) for u in dict.fromkeys(cat.used_aliases[name]))
            out.append(f'| <a id="{_anchor(name)}"></a>{md_code(name)} | {md_cell(words)} | {used} |')
        out.append("")
    return "\n".join(out)


def _model_section(model: type[BaseModel], cat: _Catalog) -> list[str]:
    out = [f"### {model.__name__}", ""]
    doc = inspect.getdoc(model) if model.__doc__ else None
    if doc:
        out += [rst_to_markdown(doc, inspect.getmodule(model)), ""]
    used = cat.models[model]
    if used:
        out += ["Used in: " + ", ".join(md_code(u) for u in dict.fromkeys(used)) + ".", ""]
    else:
        out += ["The document's top level.", ""]
    out += ["| key | type | default | constraints | description |", "|---|---|---|---|---|"]
    for name, tp in _field_hints(model).items():
        out.append(_field_row(model, name, tp, cat.aliases))
    out.append("")
    rules = rules_of(model)
    if rules:
        out += ["Rules:", ""]
        for fields, doc, msgs in rules:
            head = f"- {fields}" + (f": {' '.join(doc.split())}" if doc else "")
            if len(msgs) == 1 and not doc:
                out.append(f"{head}: {msgs[0]}")
                continue
            out.append(head)
            out += [f"  - {m}" for m in msgs]
        out.append("")
    out += _extra_tables(model)
    return out


def _names_read(func: Callable[..., Any]) -> set[str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return set()
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}


def _extra_tables(model: type[BaseModel]) -> list[str]:
    """Tables of the module-level ``{str: str}`` mappings a model's validators read (the forbidden pod
    fields and their reasons, say), titled by their ``#:`` comment."""
    module = inspect.getmodule(model)
    comments = doc_comments(module)
    decorators = model.__pydantic_decorators__
    names: set[str] = set()
    validators: list[Any] = [*decorators.field_validators.values(), *decorators.model_validators.values()]
    for dec in validators:
        func = function_of(dec.func)
        if func is not None:
            names |= _names_read(func)
    out: list[str] = []
    for name in sorted(names):
        value = getattr(module, name, None)
        if not (isinstance(value, dict) and value):
            continue
        if all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            out += [rst_to_markdown(comments.get(name, md_code(name))), "", "| key | why |", "|---|---|"]
            out += [f"| {md_code(k)} | {md_cell(v)} |" for k, v in value.items()]
            out.append("")
    return out


def _enum_section(enum: type[Enum], cat: _Catalog) -> list[str]:
    out = [f"### {enum.__name__}", ""]
    if enum.__doc__ and inspect.getdoc(enum) != inspect.getdoc(Enum):
        out += [rst_to_markdown(inspect.getdoc(enum) or ""), ""]
    out += ["Used in: " + ", ".join(md_code(u) for u in dict.fromkeys(cat.enums[enum])) + ".", ""]
    module = sys.modules.get(enum.__module__)
    comments = doc_comments(module)
    columns: list[tuple[str, Mapping[Any, Any]]] = []
    notes: list[str] = []
    for name, value in sorted(vars(module).items()) if module else ():
        if isinstance(value, dict) and value and all(isinstance(k, enum) for k in value):
            title = name.lower().replace("_", " ")
            columns.append((title, value))
            if name in comments:
                notes.append(f"*{title}* ({md_code(name)}): {rst_to_markdown(comments[name])}")
    header = ["value", *(title for title, _ in columns)]
    out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for member in enum:
        row = [md_code(str(member.value))]
        row += [md_code(md_number(mapping[member])) if member in mapping else "" for _, mapping in columns]
        out.append("| " + " | ".join(row) + " |")
    out.append("")
    out += [*notes, ""] if notes else []
    return out


# ------------------------------------------------------------------------------------ the page


def _outcome_table() -> list[str]:
    from avsim.phases import contract

    codes = {name: getattr(contract, name) for name in dir(contract) if name.startswith("EXIT_")}
    by_outcome: dict[Any, list[str]] = {}
    for _, code in sorted(codes.items(), key=lambda kv: kv[1]):
        by_outcome.setdefault(contract.classify_exit_code(code), []).append(str(code))
    listed = set(codes.values())
    fallback = contract.classify_exit_code(next(c for c in range(1, 256) if c not in listed))
    by_outcome.setdefault(fallback, []).append("any other code, a signal, a timeout")
    out = [
        "| exit code | outcome | downstream phases of the case run | retried |",
        "|---|---|---|---|",
    ]
    for outcome in contract.Outcome:
        code = ", ".join(by_outcome.get(outcome, [])) or "(set by avsim, not by an exit code)"
        yes_no = ("yes" if outcome.produced_output else "no", "yes" if outcome.retriable else "no")
        out.append(f"| {code} | {md_code(outcome.value)} | {yes_no[0]} | {yes_no[1]} |")
    return [*out, ""]


def _example() -> tuple[str, int]:
    import yaml

    from avsim.manifest.sample import sample_manifest
    from avsim.manifest.validation import validate_manifest

    doc = sample_manifest(EXAMPLE_CASES, iso_week=EXAMPLE_WEEK)
    validate_manifest(doc, source="the reference's example")

    class _Compact(yaml.SafeDumper):
        """Short lists and small mappings of scalars on one line, the way people write them."""

    def scalar(v: Any) -> bool:
        return isinstance(v, (str, int, float, bool)) or v is None

    def seq(dumper: yaml.SafeDumper, v: list[Any]) -> yaml.Node:
        return dumper.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=all(map(scalar, v)))

    def mapping(dumper: yaml.SafeDumper, v: dict[Any, Any]) -> yaml.Node:
        flow = len(v) <= 5 and all(map(scalar, v.values())) and len(json.dumps(v)) <= 72
        node = dumper.represent_mapping("tag:yaml.org,2002:map", v.items(), flow_style=flow)
        return node

    _Compact.add_representer(list, seq)
    _Compact.add_representer(dict, mapping)
    text = yaml.dump(doc, Dumper=_Compact, sort_keys=False, width=110)
    return text, len(doc["cases"])


def render_reference() -> str:
    """The whole of ``docs/manifest.md``."""
    from avsim.manifest import loader, validation
    from avsim.manifest.models import Manifest
    from avsim.phases import contract
    from avsim.plan import catalog, shards
    from avsim.settings import OPTIONS

    example, n_cases = _example()
    max_bytes = int(OPTIONS["max_manifest_bytes"][0])
    parts = [
        "# The weekly manifest: reference",
        "",
        f"<!-- Generated from avsim.manifest.models by `{REGENERATE}`. Do not edit by hand:",
        "     change the models (docstrings, Field descriptions, validator messages) and regenerate.",
        "     tests/unit/avsim_docgen/test_manifest_reference.py fails while this page differs from the code. -->",
        "",
        "A manifest describes one run: the simulator build under test, its deadline and run class,",
        "the phase graphs, the cases (each a scenario with a seed and parameters, run through a graph)",
        "and the run-level phases that run once after every case. The weekly DAG `avsim_weekly` reads",
        'it when a run starts: the manifest given in the trigger\'s conf (`{"manifest": URI}`), else',
        "`[avsim] default_manifest` with `{iso_week}` replaced by the run's ISO week.",
        "",
        "- **Format**: YAML or JSON (told by the extension, `.yaml`/`.yml`/`.json`, else sniffed),",
        "  from a local path or any ObjectStoragePath URI (`file://...`, `s3://conn_id@bucket/key`).",
        f"  At most `[avsim] max_manifest_bytes` ({max_bytes:,} bytes by default).",
        "- **Write one**: `avsim manifest sample --cases 200 --out week.yaml` writes a realistic one.",
        "- **Check one**: `avsim manifest validate week.yaml --catalog dags/avsim_graphs.yaml` prints",
        "  every problem at once with its path and the fix, e.g.",
        "  `cases[412].graph: unknown graph 'perception_v2' (known: standard, with_render, perception);",
        "  did you mean 'perception'?`. With `--catalog` it also checks the graphs against the deployed DAG.",
        "- **Immutable once started**: the run snapshots the validated manifest (canonical JSON and",
        "  its sha256) on its first try; a retry reads the snapshot, and a different manifest under",
        "  the same run is refused.",
        "",
        "## How a manifest is read",
        "",
        doc_body(loader),
        "",
        "## Checks across the whole document",
        "",
        doc_body(validation),
        "",
        "## Checks against the deployed graph catalog",
        "",
        "The weekly DAGs are built from the graph catalog (`dags/avsim_graphs.yaml`), so a run's graphs",
        "must have the shape of deployed ones. The shape (`avsim.plan.catalog.shape_fingerprint`):",
        "",
        rst_to_markdown(inspect.getdoc(catalog.shape_fingerprint) or "", catalog),
        "",
        "When `prepare` starts a run, it refuses a manifest that does not fit the deployed DAG:",
        "",
        *[f"- {m}" for m in messages_of(shards.assign_families)],
        "",
        "## Outcomes of a phase",
        "",
        "A phase's exit code decides the outcome of its attempt (the phase contract,",
        "`avsim.phases.contract`); the `retry` settings of the phase budget the retried ones.",
        "",
        *_outcome_table(),
        doc_body(contract.Outcome),
        "",
        "## A complete example",
        "",
        f"A week of {n_cases} cases over the three graphs of the sample (`avsim manifest sample",
        f"--cases {n_cases} --iso-week {EXAMPLE_WEEK}` writes the same document).",
        "",
        "```yaml",
        example.rstrip("\n"),
        "```",
        "",
        render_models(Manifest),
    ]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(parts)).rstrip("\n") + "\n"
