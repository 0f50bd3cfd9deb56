"""What the manifest reference reads from source: validators' error messages and docstrings.

:func:`messages_of` finds the error messages a validator raises by reading its source (the string
and f-string arguments of ``raise``/``ValueError``, also through helper functions of the same module
it calls), with the values it formats shown as placeholders; :func:`doc_body` and
:func:`doc_comments` turn docstrings and ``#:`` comments into Markdown (Sphinx roles to code,
simple reST tables to Markdown tables). :mod:`avsim_docgen.manifest_reference` renders the page from them.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel

# --------------------------------------------------------------------------- Markdown primitives


def field_key(model: type[BaseModel], name: str) -> str:
    info = model.model_fields[name]
    return info.alias or name


def md_code(text: str) -> str:
    ticks = "``" if "`" in text else "`"
    pad = " " if ticks == "``" else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def md_cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def md_number(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


# ------------------------------------------------------------------- rules from validator sources


def _placeholder(node: ast.expr, value_names: set[str], constants: Mapping[str, Any]) -> str:
    if isinstance(node, ast.Name) and node.id not in value_names:
        value = constants.get(node.id)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)  # a module constant: its value reads better than its name
        return "{" + node.id + "}"
    return "…"


def _message(node: ast.expr, value_names: set[str], constants: Mapping[str, Any]) -> str | None:
    """The text of a message argument: a string, an f-string (placeholders shown), or a concatenation."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts: list[str] = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue):
                parts.append(_placeholder(value.value, value_names, constants))
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left = _message(node.left, value_names, constants)
        right = _message(node.right, value_names, constants)
        if left is not None and right is not None:
            return left + right
    return None


def function_of(obj: Any) -> Callable[..., Any] | None:
    func = getattr(obj, "__func__", obj)
    return func if inspect.isfunction(func) else None


def messages_of(obj: Any, _seen: set[Any] | None = None) -> list[str]:
    """The error messages a function raises (``raise X(msg)``) or reports (``Problem(path, msg)``),
    also through the functions of its own module that it calls. Placeholders: ``{name}``, or ``…``
    for the value being validated and for expressions."""
    func = function_of(obj)
    seen = _seen if _seen is not None else set()
    if func is None or func in seen:
        return []
    seen.add(func)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return []
    definition = tree.body[0]
    params = [a.arg for a in definition.args.args] if isinstance(definition, ast.FunctionDef) else []
    # The value being validated is the first parameter after cls/self: shown as "…".
    first = 1 if params[:1] in (["cls"], ["self"]) else 0
    value_names = set(params[first : first + 1])
    module_globals: dict[str, Any] = getattr(func, "__globals__", {})
    constants = {k: v for k, v in module_globals.items() if k.isupper()}
    found: list[tuple[int, int, list[str]]] = []
    for node in ast.walk(tree):
        texts: list[str] = []
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            text = _message(node.exc.args[0], value_names, constants)
            texts = [text] if text else []
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "Problem" and len(node.args) >= 2:
                where = _message(node.args[0], value_names, constants)
                text = _message(node.args[1], value_names, constants)
                texts = [f"{md_code(where)}: {text}" if where else text] if text else []
            else:
                callee = module_globals.get(node.func.id)
                if inspect.isfunction(callee) and callee.__module__ == func.__module__:
                    texts = messages_of(callee, seen)
        if texts:
            found.append((getattr(node, "lineno", 0), getattr(node, "col_offset", 0), texts))
    found.sort(key=lambda item: item[:2])
    return list(dict.fromkeys(text for *_, texts in found for text in texts))


def rules_of(model: type[BaseModel]) -> list[tuple[str, str, list[str]]]:
    """(fields, docstring, messages) of each validator of ``model`` (its bases' included), in source order."""
    decorators = model.__pydantic_decorators__
    found: list[tuple[tuple[str, int], str, list[str], str]] = []
    for fdec in decorators.field_validators.values():
        fields = ", ".join(md_code(field_key(model, f)) for f in fdec.info.fields if f in model.model_fields)
        found.append((*_rule_parts(fdec.func), fields))
    for mdec in decorators.model_validators.values():
        found.append((*_rule_parts(mdec.func), "the whole object"))
    found.sort(key=lambda item: item[0])
    return [(fields, doc, msgs) for _, doc, msgs, fields in found]


def _rule_parts(obj: Any) -> tuple[tuple[str, int], str, list[str]]:
    func = function_of(obj)
    if func is None:
        return ("", 0), "", []
    try:
        position = (inspect.getsourcefile(func) or "", inspect.getsourcelines(func)[1])
    except (OSError, TypeError):
        position = ("", 0)
    return position, rst_to_markdown(inspect.getdoc(func) or ""), messages_of(func)


# --------------------------------------------------------------------------- docstring to markdown


_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def rst_to_markdown(text: str, module: Any = None) -> str:
    """Docstring text as markdown: ``code`` and :role:`target` become code spans."""

    def role(m: re.Match[str]) -> str:
        target = m.group(1)
        short = target.rsplit(".", 1)[-1] if m.group(0).startswith((":data:", ":attr:")) else target
        value = getattr(module, short, None) if module is not None else None
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            return f"{md_code(short)} ({md_number(value)})"
        return md_code(target if not target.startswith("~") else target[1:])

    text = _ROLE.sub(role, _simple_tables(text))  # tables first: they are laid out by column
    return re.sub(r"``([^`]+)``", r"`\1`", text)


_TABLE_RULE = re.compile(r"^\s*=+(\s+=+)+\s*$")


def _simple_tables(text: str) -> str:
    """RST simple tables (``===  ===`` rules; a row whose first cell is blank continues the one above)
    as markdown tables."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        rules = [j for j in range(i, len(lines)) if _TABLE_RULE.match(lines[j])][:3]
        if not _TABLE_RULE.match(lines[i]) or len(rules) < 3:
            out.append(lines[i])
            i += 1
            continue
        starts = [m.start() for m in re.finditer(r"=+", lines[i])]

        def cells(line: str, starts: list[int] = starts) -> list[str]:
            bounds = [*starts[1:], None]
            return [line[a:b].strip() for a, b in zip(starts, bounds, strict=True)]

        header = [
            " ".join(col) for col in zip(*(cells(x) for x in lines[rules[0] + 1 : rules[1]]), strict=True)
        ]
        rows: list[list[str]] = []
        for line in lines[rules[1] + 1 : rules[2]]:
            row = cells(line)
            if rows and not row[0]:
                rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], row, strict=True)]
            elif any(row):
                rows.append(row)
        out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows]
        out.append("")
        i = rules[2] + 1
    return "\n".join(out)


def doc_body(obj: Any) -> str:
    """A docstring without its summary line."""
    doc = inspect.getdoc(obj) or ""
    _, _, body = doc.partition("\n\n")
    return rst_to_markdown(body.strip(), inspect.getmodule(obj))


def doc_comments(module: Any) -> dict[str, str]:
    """``#:`` comments above module-level assignments (Sphinx's convention), by the assigned name."""
    try:
        lines = inspect.getsource(module).splitlines()
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    pending: list[str] = []
    for line in lines:
        if line.startswith("#:"):
            pending.append(line[2:].strip())
            continue
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)\s*(?::[^=]+)?=", line)
        if m and pending:
            out[m.group(1)] = " ".join(pending)
        pending = []
    return out
