"""The graph catalog: the phase graphs the weekly DAGs are built from.

The catalog is what *shapes* the DAGs (one mapped task group per graph, one task
per phase, pools, retries). It ships with the DAG files and changes by review;
a weekly manifest brings the cases and may restate graphs, which must then match
a deployed graph's shape (see :func:`shape_fingerprint`). Reading the catalog is
all the DAG file does at parse time, so parse time does not grow with cases.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from avsim.errors import ManifestError, Problem
from avsim.manifest.models import GraphSpec, Name, PhaseSpec, RunPhaseSpec


class GraphCatalog(BaseModel):
    """The catalog file: frozen, and any key it does not know is an error (as in the manifest)."""

    api_version: str = Field(default="avsim/v1", alias="apiVersion")
    graphs: dict[Name, GraphSpec] = Field(min_length=1)
    run_phases: dict[Name, RunPhaseSpec] = Field(default_factory=dict)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def shape_fingerprint(phases: Mapping[str, PhaseSpec]) -> str:
    """Hash of the fields that shape the DAG: phase names, dependencies, resource class, GPUs, retry budgets.

    Commands, arguments, durations, timeouts, memory and checkpointing are read at run time
    from the run's manifest snapshot and may differ from the catalog.
    """
    shape = {
        name: {
            "depends_on": sorted(p.depends_on),
            "class": p.resources.resource_class.value,
            "gpus": p.resources.gpus,
            "retries": p.retry.infrastructure,
            "preemptions": p.retry.preemption,
            "on_demand_after": p.retry.on_demand_after_preemptions,
        }
        for name, p in phases.items()
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


def describe_shape(phases: Mapping[str, PhaseSpec]) -> str:
    """A one-line human description of a graph's shape, for error messages."""
    parts = []
    for name, p in phases.items():
        cls = p.resources.resource_class.value
        after = f" after {'+'.join(p.depends_on)}" if p.depends_on else ""
        parts.append(f"{name}[{cls}]{after}")
    return ", ".join(parts)


def parse_catalog(data: object, source: str) -> GraphCatalog:
    """Check a catalog with the manifest's own checks (types, references, cycles), all problems at once."""
    from avsim.manifest.validation import validate_document

    return validate_document(data, GraphCatalog, f"graph catalog {source}", "a graph catalog")


#: Catalogs already checked in this process, by their file's text (at most a few: one per catalog file).
#: A catalog is frozen and a pure function of its text, so a process forked from one that read it
#: (a LocalExecutor task forked after the scheduler's preload) reuses it once it has read the same text.
_CHECKED: dict[str, GraphCatalog] = {}
_CHECKED_MAX = 8


def load_catalog(path: str | Path) -> GraphCatalog:
    """Read a catalog file (YAML or JSON). Raises ManifestError naming the file and the field.

    The file is read every time; checking it (YAML, then every model and reference) is done once per
    text in a process: a phase task parses its DAG file, and so the catalog, at every start.
    """
    p = Path(path)
    text = _read_catalog_text(p)
    if (checked := _CHECKED.get(text)) is not None:
        return checked
    catalog = _check_catalog_text(text, p)
    if len(_CHECKED) >= _CHECKED_MAX:
        _CHECKED.clear()
    _CHECKED[text] = catalog
    return catalog


def _read_catalog_text(p: Path) -> str:
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError(
            [
                Problem(
                    "",
                    f"file not found; write one with `avsim catalog write {p}` or set [avsim] graph_catalog",
                )
            ],
            source=f"graph catalog {p}",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError([Problem("", str(exc))], source=f"graph catalog {p}") from None
    return text


def _check_catalog_text(text: str, p: Path) -> GraphCatalog:
    import yaml

    try:
        # libyaml's loader when PyYAML has it: a phase task parses the catalog at every start
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise ManifestError(
            [Problem("", f"not valid YAML/JSON: {exc}")], source=f"graph catalog {p}"
        ) from None
    return parse_catalog(data, str(p))
