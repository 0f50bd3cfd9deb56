"""The Airflow pools of avsim, from a capacity file: ``avsim pools sync CAPACITY_FILE``.

A capacity file (``apiVersion: avsim/v1``, ``kind: Capacity``) gives ``gpu_spot: {gpus: N}``,
``gpu_on_demand: {gpus: N}`` and ``cpu: {slots: N}``; pool names come from ``[avsim]``, and a GPU phase
takes as many slots as it has GPUs. Every pool has ``include_deferred = true``: a deferred phase still
holds its GPU (docs/operations.md, "Meeting the deadline: details").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from avsim import airflow_internals
from avsim.errors import ConfigError, Problem
from avsim.settings import AvsimSettings

MAX_SLOTS = 1_000_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class GpuPoolSpec(_Strict):
    gpus: int = Field(ge=0, le=MAX_SLOTS, description="GPUs of this node class: the pool's slots.")
    description: str | None = Field(default=None, max_length=500)


class CpuPoolSpec(_Strict):
    slots: int = Field(ge=0, le=MAX_SLOTS, description="CPU phases that may run at once.")
    description: str | None = Field(default=None, max_length=500)


class Capacity(_Strict):
    """A capacity file: the slots of avsim's three pools."""

    api_version: Literal["avsim/v1"] = Field(alias="apiVersion")
    kind: Literal["Capacity"]
    gpu_spot: GpuPoolSpec
    gpu_on_demand: GpuPoolSpec
    cpu: CpuPoolSpec


class CapacityError(ConfigError):
    """A capacity file was rejected; carries every problem found, each with its field path."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = tuple(problems)
        lines = "\n".join(f"  {p}" for p in problems)
        n = len(problems)
        super().__init__(f"capacity file {source} was rejected: {n} problem{'s' if n != 1 else ''}\n{lines}")


def _path(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc)


def _known_fields(loc: tuple[Any, ...]) -> list[str]:
    """The fields a capacity-file mapping at ``loc`` accepts (for "unknown field" messages)."""
    model: Any = Capacity
    for part in loc:
        field = model.model_fields.get(str(part)) if _is_model(model) else None
        model = field.annotation if field is not None else None
    if not _is_model(model):
        return []
    return sorted(f.alias or name for name, f in model.model_fields.items())


def _is_model(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, BaseModel)


def _problem(err: Any) -> Problem:
    loc = tuple(err["loc"])
    kind = err["type"]
    path = _path(loc)
    ctx = err.get("ctx") or {}
    if kind == "missing":
        return Problem(path, "required; add it (see dags/avsim_capacity.yaml)")
    if kind == "extra_forbidden":
        return Problem(path, f"unknown field; known: {', '.join(_known_fields(loc[:-1]))}")
    if kind == "literal_error":
        return Problem(path, f"must be {ctx.get('expected')}, got {err.get('input')!r}")
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return Problem(path, f"must be a whole number, got {err.get('input')!r}")
    if kind in ("greater_than_equal", "less_than_equal"):
        return Problem(path, f"must be between 0 and {MAX_SLOTS}, got {err.get('input')!r}")
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return Problem(path, f"must be a mapping, got {type(err.get('input')).__name__}")
    return Problem(path, str(err.get("msg")))


def parse_capacity(data: Any, source: str = "<capacity>") -> Capacity:
    """Validate a loaded capacity document; every problem is reported with its field path."""
    if not isinstance(data, dict):
        raise CapacityError(source, [Problem("", f"must be a mapping, got {type(data).__name__}")])
    try:
        return Capacity.model_validate(data)
    except ValidationError as exc:
        raise CapacityError(source, [_problem(e) for e in exc.errors(include_url=False)]) from None


def load_capacity(path: str | Path) -> Capacity:
    """Read and validate a capacity file (YAML or JSON)."""
    import yaml

    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise CapacityError(str(p), [Problem("", f"cannot be read: {exc.strerror or exc}")]) from None
    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise CapacityError(str(p), [Problem("", f"is not valid YAML: {exc}")]) from None
    return parse_capacity(data, str(p))


@dataclass(frozen=True)
class PoolSpec:
    """One Airflow pool as avsim wants it."""

    name: str
    slots: int
    description: str
    include_deferred: bool = True


def desired_pools(capacity: Capacity, settings: AvsimSettings) -> tuple[PoolSpec, ...]:
    """The three pools a capacity file asks for, named by ``[avsim]``."""
    from avsim.plan.build import pools_for

    slots = {
        "gpu-spot": (capacity.gpu_spot.gpus, capacity.gpu_spot.description),
        "gpu-on-demand": (capacity.gpu_on_demand.gpus, capacity.gpu_on_demand.description),
        "cpu": (capacity.cpu.slots, capacity.cpu.description),
    }
    out = []
    for pool in pools_for(settings):
        n, description = slots[pool.node_class]
        out.append(PoolSpec(pool.name, n, description or pool.description))
    return tuple(out)


@dataclass(frozen=True)
class PoolChange:
    """What syncing did to one pool: ``created``, ``updated`` (with the fields) or ``unchanged``."""

    name: str
    action: str
    changes: tuple[tuple[str, Any, Any], ...] = ()

    def __str__(self) -> str:
        if self.action == "updated":
            what = ", ".join(f"{f} {old!r} -> {new!r}" for f, old, new in self.changes)
            return f"updated {self.name}: {what}"
        if self.action == "created":
            what = ", ".join(f"{f} {new!r}" for f, _, new in self.changes)
            return f"created {self.name}: {what}"
        return f"unchanged {self.name}"


def sync_pools(
    specs: tuple[PoolSpec, ...], *, dry_run: bool = False, session: Any = None
) -> list[PoolChange]:
    """Create or update the pools in Airflow's metadata database, in one transaction.

    Idempotent: a second sync with the same specs reports every pool ``unchanged`` and writes
    nothing. Pools not named in ``specs`` are left alone. Runs where the ``airflow`` command
    runs (it needs the metadata database); workers change pool slots through the REST API
    instead (:mod:`avsim.deadline.actions`).
    """

    if session is None:
        with airflow_internals.create_session() as own:
            changes = _sync(specs, own)
            if dry_run:
                own.rollback()
            return changes
    changes = _sync(specs, session)
    if dry_run:
        session.rollback()
    return changes


def _sync(specs: tuple[PoolSpec, ...], session: Any) -> list[PoolChange]:
    Pool = airflow_internals.models()["Pool"]
    from sqlalchemy import select

    changes: list[PoolChange] = []
    for spec in specs:
        pool = session.scalar(select(Pool).where(Pool.pool == spec.name))
        want = {
            "slots": spec.slots,
            "description": spec.description,
            "include_deferred": spec.include_deferred,
        }
        if pool is None:
            session.add(Pool(pool=spec.name, **want))
            changes.append(PoolChange(spec.name, "created", tuple((k, None, v) for k, v in want.items())))
            continue
        diff = tuple((k, getattr(pool, k), v) for k, v in want.items() if getattr(pool, k) != v)
        for k, _, v in diff:
            setattr(pool, k, v)
        changes.append(PoolChange(spec.name, "updated" if diff else "unchanged", diff))
    session.flush()
    return changes


def api_pool_slots(conn_id: str, gpu_spot_pool: str, cpu_pool: str) -> tuple[int | None, int | None]:
    """The GPU spot and CPU pools' slots now, through Airflow's REST API (connection ``conn_id``,
    ``[avsim] airflow_api_conn_id``): what a worker reads, having no database (None for a pool that
    does not exist). Admission sizes a week's cases in flight from them (:mod:`avsim.plan.admission`)."""
    from avsim.hooks.airflow_api import AirflowApiHook

    hook = AirflowApiHook(conn_id)
    return hook.pool_slots(gpu_spot_pool), hook.pool_slots(cpu_pool)
