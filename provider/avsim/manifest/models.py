"""The weekly manifest: pydantic models.

Every model is strict (``extra="forbid"``) and frozen. Rules that span several
fields live in validators; rules that span the whole document (references,
cycles, unique ids) live in :mod:`avsim.manifest.validation`, so that every
error of a document is collected and reported at once with its path.
"""

from __future__ import annotations

import datetime as dt
import re
from enum import Enum
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

#: A name usable as an Airflow task id / group id fragment.
NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_]{0,62}$"
#: A case id: used in object keys and report links.
CASE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
#: An OCI image reference pinned by digest.
IMAGE_DIGEST_RE = re.compile(r"^(?P<repo>[a-z0-9][a-z0-9._/:-]*)@(?P<digest>sha256:[0-9a-f]{64})$")
ISO_WEEK_RE = re.compile(r"^(?P<year>\d{4})-W(?P<week>\d{2})$")
MEMORY_RE = re.compile(r"^(?P<num>\d+(\.\d+)?)(?P<unit>Ki|Mi|Gi|Ti)?$")

Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
CaseId = Annotated[str, StringConstraints(pattern=CASE_ID_PATTERN)]

#: Upper bounds that keep a manifest from asking for absurd values.
MAX_GPUS_PER_PHASE = 16
MAX_CPUS_PER_PHASE = 256
MAX_PHASE_SECONDS = 7 * 24 * 3600
MAX_RETRIES = 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, str_strip_whitespace=True)


class RunClass(str, Enum):
    WEEKLY = "weekly"
    ADHOC = "adhoc"


class ResourceClass(str, Enum):
    GPU = "gpu"
    CPU = "cpu"


#: Default base priority per run class; the weekly run outranks ad-hoc work.
DEFAULT_BASE_PRIORITY = {RunClass.WEEKLY: 10_000, RunClass.ADHOC: 1_000}


def parse_memory(value: str) -> int:
    """Kubernetes-style quantity (``512Mi``, ``4Gi``) to bytes."""
    m = MEMORY_RE.match(value)
    if not m:
        raise ValueError(f"memory {value!r} is not a quantity; write it like '512Mi' or '4Gi'")
    scale = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[m.group("unit")]
    return int(float(m.group("num")) * scale)


class Build(_Strict):
    """The simulator build under test, pinned by image digest."""

    build_id: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    image: str = Field(description="OCI image pinned by digest: repo@sha256:<64 hex>")

    @field_validator("image")
    @classmethod
    def _pinned(cls, v: str) -> str:
        if not IMAGE_DIGEST_RE.match(v):
            raise ValueError(
                f"image {v!r} is not pinned by digest; write it as 'registry/repo@sha256:<64 hex digits>'"
            )
        return v

    @property
    def digest(self) -> str:
        m = IMAGE_DIGEST_RE.match(self.image)
        assert m is not None
        return m.group("digest")


class RunSpec(_Strict):
    name: Name
    iso_week: str = Field(description="ISO week, e.g. 2026-W49")
    run_class: RunClass = RunClass.WEEKLY
    base_priority: int | None = Field(default=None, ge=0, le=1_000_000)
    deadline: dt.datetime
    build: Build

    @field_validator("iso_week")
    @classmethod
    def _iso_week(cls, v: str) -> str:
        m = ISO_WEEK_RE.match(v)
        if not m:
            raise ValueError(f"iso_week {v!r} is not an ISO week; write it like '2026-W49'")
        year, week = int(m.group("year")), int(m.group("week"))
        try:
            dt.date.fromisocalendar(year, week, 1)
        except ValueError:
            raise ValueError(f"iso_week {v!r}: {year} has no week {week}") from None
        return v

    @field_validator("deadline")
    @classmethod
    def _aware(cls, v: dt.datetime) -> dt.datetime:
        if v.tzinfo is None:
            raise ValueError("deadline has no time zone; add one, e.g. '2026-12-06T18:00:00Z'")
        return v

    @property
    def priority_base(self) -> int:
        return self.base_priority if self.base_priority is not None else DEFAULT_BASE_PRIORITY[self.run_class]


class Resources(_Strict):
    resource_class: ResourceClass = Field(alias="class")
    # validate_default: the class/gpus rule below must also see an omitted ``gpus``.
    gpus: int = Field(default=0, ge=0, le=MAX_GPUS_PER_PHASE, validate_default=True)
    cpus: float = Field(default=1, gt=0, le=MAX_CPUS_PER_PHASE)
    memory: str = "2Gi"

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: str) -> str:
        parse_memory(v)
        return v

    @field_validator("gpus")
    @classmethod
    def _gpu_count(cls, v: int, info: ValidationInfo) -> int:
        # A field validator (not a model validator) so that the error's path ends in ``.gpus``.
        rc = info.data.get("resource_class")
        if rc is ResourceClass.GPU and v < 1:
            raise ValueError("a gpu phase needs gpus >= 1; set gpus or use class: cpu")
        if rc is ResourceClass.CPU and v:
            raise ValueError(f"a cpu phase cannot take gpus ({v}); set gpus: 0 or use class: gpu")
        return v

    @property
    def memory_bytes(self) -> int:
        return parse_memory(self.memory)


class RetrySpec(_Strict):
    """Retry budget for infrastructure failures (crash, OOM, node loss)."""

    infrastructure: int = Field(default=2, ge=0, le=MAX_RETRIES)
    delay_seconds: float = Field(default=30, ge=0, le=24 * 3600)
    backoff: float = Field(default=2.0, ge=1.0, le=10.0)
    max_delay_seconds: float = Field(default=1800, ge=0, le=24 * 3600)


def _check_timeout(timeout: float, info: ValidationInfo) -> float:
    """``timeout_seconds`` (declared after the estimate) must cover ``estimated_duration_seconds``."""
    estimate = info.data.get("estimated_duration_seconds")
    if estimate is not None and timeout < estimate:
        raise ValueError(
            f"timeout_seconds ({timeout:g}) is below estimated_duration_seconds ({estimate:g}); "
            "raise the timeout"
        )
    return timeout


def _check_no_dupes(v: tuple[str, ...]) -> tuple[str, ...]:
    dupes = sorted({d for d in v if v.count(d) > 1})
    if dupes:
        raise ValueError(f"depends_on lists {', '.join(dupes)} more than once; list each phase once")
    return v


class _RunnableSpec(_Strict):
    """What a phase and a run-level phase share: what runs, on what, for how long, retried how."""

    depends_on: tuple[Name, ...] = ()
    resources: Resources
    estimated_duration_seconds: float = Field(gt=0, le=MAX_PHASE_SECONDS)
    timeout_seconds: float = Field(gt=0, le=MAX_PHASE_SECONDS)
    retry: RetrySpec = RetrySpec()
    command: tuple[Annotated[str, StringConstraints(min_length=1)], ...] = Field(min_length=1)
    args: tuple[str, ...] = ()

    @field_validator("timeout_seconds")
    @classmethod
    def _timeout_covers_estimate(cls, v: float, info: ValidationInfo) -> float:
        return _check_timeout(v, info)

    @field_validator("depends_on")
    @classmethod
    def _no_dupes(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _check_no_dupes(v)


class PhaseSpec(_RunnableSpec):
    """One phase of a case's graph."""

    checkpoint: bool = False


class GraphSpec(_Strict):
    description: str = ""
    phases: dict[Name, PhaseSpec] = Field(min_length=1)


class ScenarioInput(_Strict):
    uri: Annotated[str, StringConstraints(min_length=1, max_length=2048)]
    version: Annotated[str, StringConstraints(min_length=1, max_length=128)]


class CaseSpec(_Strict):
    id: CaseId
    graph: Name | None = None
    phases: dict[Name, PhaseSpec] | None = Field(default=None, min_length=1)
    scenario: ScenarioInput
    seed: int = Field(ge=0, le=2**63 - 1, strict=True)
    parameters: dict[str, Any] = Field(default_factory=dict)
    tags: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _graph_or_phases(self) -> CaseSpec:
        if self.graph is not None and self.phases is not None:
            raise ValueError(
                "a case names a graph template (graph: NAME) or defines its own phases, not both; remove one"
            )
        if self.graph is None and self.phases is None:
            raise ValueError("a case needs a graph template (graph: NAME) or its own phases; add one")
        return self


class RunPhaseSpec(_RunnableSpec):
    """A run-level phase (the weekly summary): runs after every case; depends_on names run phases."""


class Manifest(_Strict):
    api_version: str = Field(default="avsim/v1", alias="apiVersion")
    run: RunSpec
    graphs: dict[Name, GraphSpec] = Field(default_factory=dict)
    cases: tuple[CaseSpec, ...] = Field(min_length=1)
    run_phases: dict[Name, RunPhaseSpec] = Field(default_factory=dict)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("api_version")
    @classmethod
    def _api(cls, v: str) -> str:
        if v != "avsim/v1":
            raise ValueError(f"apiVersion {v!r} is not supported; use 'avsim/v1'")
        return v
