"""The manifest reference: docs/manifest.md is what the models render now, and the renderer walks models.

The synthetic models below stand in for a future version of the manifest: a field, a constraint,
a validator or an enumeration added to them must show up in the rendered reference without any
change to the renderer.
"""

from __future__ import annotations

import difflib
import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationInfo, field_validator
from pydantic import model_validator as pyd_model_validator
from typer.testing import CliRunner

from avsim.cli import app
from avsim.manifest.models import Manifest
from avsim.manifest.sample import sample_manifest
from avsim.manifest.validation import validate_manifest
from avsim_docgen.manifest_reference import (
    EXAMPLE_CASES,
    EXAMPLE_WEEK,
    REGENERATE,
    messages_of,
    render_models,
    render_reference,
)

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "manifest.md"


# ------------------------------------------------------------------------ the committed page


def test_committed_reference_is_what_the_models_render() -> None:
    rendered = render_reference()
    committed = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    if committed != rendered:
        diff = "".join(
            list(
                difflib.unified_diff(
                    committed.splitlines(keepends=True),
                    rendered.splitlines(keepends=True),
                    "docs/manifest.md (committed)",
                    "docs/manifest.md (rendered now)",
                    n=1,
                )
            )[:40]
        )
        pytest.fail(
            "docs/manifest.md is out of date with the manifest's models; regenerate it with\n"
            f"    {REGENERATE}\nand commit it. First differences:\n{diff}",
            pytrace=False,
        )


def test_the_example_on_the_page_is_a_valid_manifest() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    assert blocks, "docs/manifest.md has no yaml example"
    doc = yaml.safe_load(blocks[0])
    manifest = validate_manifest(doc, source="docs/manifest.md example")
    assert len(manifest.cases) == EXAMPLE_CASES
    # The page says `avsim manifest sample --cases N --iso-week W` writes the same document.
    assert doc == sample_manifest(EXAMPLE_CASES, iso_week=EXAMPLE_WEEK)
    assert f"--cases {EXAMPLE_CASES} --iso-week {EXAMPLE_WEEK}" in " ".join(DOC.read_text().split())


def _models_under(model: type[BaseModel], seen: dict[type[BaseModel], None]) -> None:
    """Every model reachable from ``model`` through its fields (independently of the renderer)."""
    if model in seen:
        return
    seen[model] = None

    def types_in(tp: Any) -> list[Any]:
        return [tp, *(t for arg in get_args(tp) for t in types_in(arg))]

    for info in model.model_fields.values():
        for tp in types_in(info.annotation):
            if isinstance(tp, type) and issubclass(tp, BaseModel):
                _models_under(tp, seen)


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n### {heading}\n")
    end = text.find("\n### ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_every_model_and_every_field_of_the_manifest_has_a_row() -> None:
    text = render_reference()
    models: dict[type[BaseModel], None] = {}
    _models_under(Manifest, models)
    assert len(models) >= 10
    for model in models:
        section = _section(text, model.__name__)
        for name, info in model.model_fields.items():
            key = info.alias or name
            assert re.search(rf"^\| `{re.escape(key)}`", section, flags=re.M), (model.__name__, key)
            if info.description:
                assert " ".join(info.description.split()) in section


def test_cross_field_rules_and_tables_come_from_the_code() -> None:
    from avsim.manifest import models
    from avsim.phases import contract

    text = render_reference()
    breaker = _section(text, "BreakerSpec")
    assert "min_finished (…) is above window ({window}); the breaker could never trip" in breaker
    case = _section(text, "CaseSpec")
    assert "a case needs a graph template (graph: NAME) or its own phases; add one" in case
    pods = _section(text, "PodOverrides")
    for key, why in models.FORBIDDEN_POD_FIELDS.items():
        assert f"| `{key}` | {why} |" in pods
    run_class = _section(text, "RunClass")
    for klass in models.RunClass:
        assert f"| `{klass.value}` |" in run_class
    assert "every weekly phase outranks every ad-hoc one" in run_class
    assert f"| {contract.EXIT_BAD_INPUT} | `bad_input` | no | no |" in text
    assert f"| {contract.EXIT_SCENARIO_FAILED} | `scenario_failed` | yes | no |" in text


# ------------------------------------------------------------------ the renderer is generic


LIMIT = 9


class Colour(str, Enum):
    RED = "red"
    BLUE = "blue"


#: Extra cost per colour.
COLOUR_COST = {Colour.RED: 3, Colour.BLUE: 5}

Slug = Annotated[str, StringConstraints(pattern=r"^[a-z]+$")]


class Leaf(BaseModel):
    """A leaf of the synthetic tree."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    low: int = Field(default=1, ge=0)
    high: int = Field(default=2, le=100, description="upper bound, inclusive")
    colour: Colour = Field(default=Colour.RED, alias="hue")

    @field_validator("high")
    @classmethod
    def _ordered(cls, v: int, info: ValidationInfo) -> int:
        low = info.data.get("low")
        if low is not None and v < low:
            raise ValueError(f"high ({v}) is below low ({low}); raise high or lower low")
        return v


class Root(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Slug
    leaves: dict[Slug, Leaf] = Field(min_length=1)
    spare: list[Leaf] = Field(default_factory=list, max_length=LIMIT)
    note: str | None = None

    @pyd_model_validator(mode="after")
    def _not_too_many(self) -> Root:
        """Leaves and spares together stay within the limit."""
        if len(self.leaves) + len(self.spare) > LIMIT:
            raise ValueError(f"more than {LIMIT} leaves and spares; drop some")
        return self


def test_render_models_walks_a_model_tree_it_has_never_seen() -> None:
    text = render_models(Root)
    assert "[Root](#root) · [Leaf](#leaf)" in text
    root = _section(text, "Root")
    assert "| `name` | [Slug](#slug) | **required** |  |  |" in root
    assert (
        "| `leaves` | mapping of [Slug](#slug) to [Leaf](#leaf) | **required** | at least 1 entry |  |"
        in root
    )
    assert "| `spare` | list of [Leaf](#leaf) | `[]` | at most 9 items |  |" in root
    assert "| `note` | string or null | `null` |  |  |" in root
    # A model validator: its docstring, then its message with the module constant's value filled in.
    assert "- the whole object: Leaves and spares together stay within the limit." in root
    assert "  - more than 9 leaves and spares; drop some" in root
    leaf = _section(text, "Leaf")
    assert "A leaf of the synthetic tree." in leaf
    assert "Used in: `Root.leaves`, `Root.spare`." in leaf
    assert "| `low` | integer | `1` | ≥ 0 |  |" in leaf
    assert "| `high` | integer | `2` | ≤ 100 | upper bound, inclusive |" in leaf
    assert "| `hue` (or `colour`) | [Colour](#colour): `red` or `blue` | `red` |  |  |" in leaf
    # A cross-field rule: the value being checked is "…", the other field a named placeholder.
    assert "- `high`: high (…) is below low ({low}); raise high or lower low" in leaf
    colour = _section(text, "Colour")
    assert "| value | colour cost |" in colour and "| `blue` | `5` |" in colour
    assert "Extra cost per colour." in colour
    assert re.search(r'<a id="slug"></a>`Slug` \| string \(matches `\^\[a-z\]\+\$`\) \|', text)
    assert "Every model rejects keys it does not define" in text


def test_a_new_field_shows_up_without_touching_the_renderer() -> None:
    class Grown(Leaf):
        weight: float = Field(default=0.5, gt=0, lt=1, description="share of the budget")

    section = _section(render_models(Grown), "Grown")
    assert "| `weight` | number | `0.5` | > 0, < 1 | share of the budget |" in section
    assert "- `high`: high (…) is below low" in section  # validators of the base come along


def test_messages_of_follows_helpers_of_the_same_module() -> None:
    from avsim.manifest.models import Resources

    # Resources._memory calls parse_memory, whose message is the one a user sees.
    msgs = messages_of(Resources.__pydantic_decorators__.field_validators["_memory"].func)
    assert msgs == ["memory … is not a quantity; write it like '512Mi' or '4Gi'"]


def test_string_aliases_keep_their_identity_through_optional() -> None:
    text = render_reference()
    assert "| `graph` | [Name](#name) or null | `null` |" in _section(text, "CaseSpec")
    assert get_origin(Slug) is Annotated  # the synthetic alias really is one


# ------------------------------------------------------------------------------- the command


def test_command_writes_the_page_and_check_catches_a_stale_one(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "manifest.md"
    done = runner.invoke(app, ["manifest", "reference", "-o", str(out)])
    assert done.exit_code == 0, done.output
    assert out.read_text(encoding="utf-8") == render_reference()
    assert runner.invoke(app, ["manifest", "reference", "-o", str(out), "--check"]).exit_code == 0
    out.write_text(out.read_text() + "hand edit\n")
    stale = runner.invoke(app, ["manifest", "reference", "-o", str(out), "--check"])
    assert stale.exit_code == 1
    assert REGENERATE in stale.output
