"""The weekly manifest: pydantic models.

Every model is strict (``extra="forbid"``) and frozen. Rules that span several
fields live in validators; rules that span the whole document (references,
cycles, unique ids) live in :mod:`avsim.manifest.validation`, so that every
error of a document is collected and reported at once with its path.
"""

from __future__ import annotations

import datetime as dt
import re
from enum import Enum, StrEnum
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from avsim.manifest.image_ref import parse_image

#: A name usable as an Airflow task id / group id fragment.
NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_]{0,62}$"
#: A case id: used in object keys and report links.
CASE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
ISO_WEEK_RE = re.compile(r"^(?P<year>\d{4})-W(?P<week>\d{2})$")
#: At most 15 digits before the point: a longer number is no quantity (and no finite float).
MEMORY_RE = re.compile(r"^(?P<num>\d{1,15}(\.\d{1,15})?)(?P<unit>Ki|Mi|Gi|Ti)?$")

Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
CaseId = Annotated[str, StringConstraints(pattern=CASE_ID_PATTERN)]


def _exact_text(v: str) -> str:
    """An identifier-like text reaches the run as written: surrounding whitespace is an error, not a strip."""
    if v != v.strip():
        raise ValueError(f"{v!r} has leading or trailing whitespace; remove it (nothing is stripped)")
    if any(ord(c) < 32 or ord(c) == 127 for c in v):
        raise ValueError(f"{v!r} holds a control character; remove it")
    return v


#: Strict scalars: a boolean is no number, a number or a word no boolean, a quoted number no number.
Int = Annotated[int, Strict()]
Num = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]
#: An identifier-like text: a build id, a scenario version, a tag.
Text = Annotated[str, AfterValidator(_exact_text)]

#: Upper bounds that keep a manifest from asking for absurd values.
MAX_GPUS_PER_PHASE = 16
MAX_CPUS_PER_PHASE = 256
MAX_PHASE_SECONDS = 7 * 24 * 3600
MAX_RETRIES = 20


class _Strict(BaseModel):
    # No str_strip_whitespace: every string reaches the run byte for byte (an identifier with
    # surrounding whitespace is an error naming it, see _exact_text and the id checks). Numbers and
    # booleans are strict (Int, Num, Bool): pydantic's lax mode would read ``gpus: yes`` as 1 and
    # ``checkpoint: 1`` as true.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class RunClass(StrEnum):
    """Which runs a run's phases rank against: every weekly phase outranks every ad-hoc one (a phase's
    priority follows its run class, its week and its critical path)."""

    WEEKLY = "weekly"
    ADHOC = "adhoc"


class ResourceClass(str, Enum):
    GPU = "gpu"
    CPU = "cpu"


def parse_memory(value: str) -> int:
    """Kubernetes-style quantity (``512Mi``, ``4Gi``) to bytes."""
    m = MEMORY_RE.match(value)
    if not m:
        raise ValueError(f"memory {value!r} is not a quantity; write it like '512Mi' or '4Gi'")
    scale = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[m.group("unit")]
    return int(float(m.group("num")) * scale)


class Build(_Strict):
    """The simulator build under test, pinned by image digest."""

    build_id: Annotated[Text, StringConstraints(min_length=1, max_length=128)]
    image: str = Field(
        description="OCI image pinned by digest, without a tag: registry/repo@sha256:<64 hex> "
        "(the OCI distribution reference grammar; a tag next to the digest is refused)"
    )

    @field_validator("image")
    @classmethod
    def _pinned(cls, v: str) -> str:
        parse_image(v)
        return v

    @property
    def digest(self) -> str:
        return parse_image(self.image).digest


class CanarySpec(_Strict):
    """A small share of cases runs first; the rest starts only if the canary's crash rate is low."""

    enabled: Bool = True
    share: Num = Field(default=0.01, gt=0, le=0.5)
    min_cases: Int = Field(default=20, ge=1, le=10_000)
    max_failure_rate: Num = Field(default=0.2, ge=0, le=1)


class BreakerSpec(_Strict):
    """Stops a bad build during the fan-out: a sliding window over finished first phases."""

    enabled: Bool = True
    window: Int = Field(default=50, ge=1, le=100_000)
    min_finished: Int = Field(default=20, ge=1, le=100_000, validate_default=True)
    max_failure_ratio: Num = Field(default=0.5, gt=0, le=1)

    @field_validator("min_finished")
    @classmethod
    def _within_window(cls, v: int, info: ValidationInfo) -> int:
        window = info.data.get("window")
        if window is not None and v > window:
            raise ValueError(f"min_finished ({v}) is above window ({window}); the breaker could never trip")
        return v


#: Why a run's ``base_priority`` is refused, and what to write instead.
_NO_BASE_PRIORITY = PydanticCustomError(
    "value_error",
    "base_priority is not a manifest field: a phase's priority follows its run class, its week and its "
    "critical path; remove base_priority (run_class: adhoc ranks a run below the weekly run)",
)


class RunSpec(_Strict):
    name: Name
    iso_week: str = Field(description="ISO week, e.g. 2026-W49")
    run_class: RunClass = RunClass.WEEKLY
    deadline: dt.datetime
    build: Build
    canary: CanarySpec = CanarySpec()
    breaker: BreakerSpec = BreakerSpec()
    #: Set by ``avsim rerun-failed``: the run key whose failed cases this run reruns.
    rerun_of: Text | None = Field(default=None, max_length=300)

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
    def _aware(cls, v: dt.datetime, info: ValidationInfo) -> dt.datetime:
        if v.tzinfo is None:
            raise ValueError("deadline has no time zone; add one, e.g. '2026-12-06T18:00:00Z'")
        week = info.data.get("iso_week")
        if isinstance(week, str):
            from avsim.manifest.deadline import deadline_vs_week

            problem = deadline_vs_week(v, week)
            if problem:
                raise ValueError(problem)
        return v

    @model_validator(mode="wrap")
    @classmethod
    def _no_base_priority(cls, data: Any, handler: Any) -> Any:
        """``base_priority`` is refused (a phase's priority follows its run class, its week and its critical
        path): remove it; ``run_class: adhoc`` ranks a run below the weekly run."""
        try:
            return handler(data)
        except ValidationError as exc:
            errors = exc.errors()
            if not any(e["type"] == "extra_forbidden" and e["loc"] == ("base_priority",) for e in errors):
                raise
            details: list[Any] = [
                {"type": _NO_BASE_PRIORITY, "loc": e["loc"], "input": e["input"]}
                if e["type"] == "extra_forbidden" and e["loc"] == ("base_priority",)
                else {"type": e["type"], "loc": e["loc"], "input": e["input"], "ctx": e.get("ctx") or {}}
                for e in errors
            ]
            raise ValidationError.from_exception_data(exc.title, details) from None


class Resources(_Strict):
    resource_class: ResourceClass = Field(alias="class")
    # validate_default: the class/gpus rule below must also see an omitted ``gpus``.
    gpus: Int = Field(default=0, ge=0, le=MAX_GPUS_PER_PHASE, validate_default=True)
    cpus: Num = Field(default=1, gt=0, le=MAX_CPUS_PER_PHASE)
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
    """Retry budgets, one per failure class, each with its own backoff.

    An infrastructure failure (crash, OOM, node loss, lease expiry) and a preemption (spot reclaim,
    eviction) are retried, each within its own budget; bad input and a failed scenario never are.
    After ``on_demand_after_preemptions`` preemptions a GPU phase's next attempt runs on on-demand nodes.
    """

    infrastructure: Int = Field(default=2, ge=0, le=MAX_RETRIES)
    delay_seconds: Num = Field(default=30, ge=0, le=24 * 3600)
    backoff: Num = Field(default=2.0, ge=1.0, le=10.0)
    max_delay_seconds: Num = Field(default=1800, ge=0, le=24 * 3600)
    preemption: Int = Field(default=3, ge=0, le=MAX_RETRIES)
    preemption_delay_seconds: Num = Field(default=10, ge=0, le=24 * 3600)
    on_demand_after_preemptions: Int = Field(default=2, ge=1, le=MAX_RETRIES, validate_default=True)

    @field_validator("on_demand_after_preemptions")
    @classmethod
    def _fallback_within_budget(cls, v: int, info: ValidationInfo) -> int:
        budget = info.data.get("preemption")
        if budget is not None and budget and v > budget:
            raise ValueError(
                f"on_demand_after_preemptions ({v}) is above the preemption budget ({budget}): "
                "the fallback to on-demand nodes would never happen; lower it or raise preemption"
            )
        return v


#: Pod fields a manifest may never set, with the reason given in the error.
FORBIDDEN_POD_FIELDS = {
    "privileged": "pods never run privileged",
    "securityContext": "the security context is fixed by avsim (non-root, no privilege escalation)",
    "hostPath": "host paths would expose the node's file system",
    "hostNetwork": "pods never share the node's network",
    "hostPID": "pods never share the node's process namespace",
    "hostIPC": "pods never share the node's IPC namespace",
    "volumes": "volumes are fixed by avsim (scratch and /dev/shm only)",
    "volumeMounts": "volumes are fixed by avsim (scratch and /dev/shm only)",
    "serviceAccountName": "the service account comes from [avsim] kubernetes_service_account",
    "nodeName": "placement comes from the node class of the phase",
    "nodeSelector": "placement comes from the node class of the phase ([avsim] kubernetes_node_classes)",
    "tolerations": "placement comes from the node class of the phase ([avsim] kubernetes_node_classes)",
    "command": "the command is the phase's command",
    "image": "the image is the run's pinned build",
}
#: What the error about a forbidden pod field ends with.
POD_FIELDS_ALLOWED = "a manifest may set only labels, annotations, env, ephemeral_storage and shm_size"
#: Label and annotation keys: an optional DNS prefix, a name of at most 63 characters.
LABEL_KEY_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
#: Prefixes avsim keeps for itself (labels it selects pods by, the contract's variables).
RESERVED_LABEL_PREFIX = "avsim.io/"
#: Label and annotation prefixes that container runtimes, node agents and admission webhooks act on to
#: change a pod's sandbox (AppArmor, seccomp, sysctls, devices), credentials (an IAM role, injected
#: Vault secrets) or network path (a service mesh's sidecar): avsim fixes those, a manifest may not.
SANDBOX_KEY_PREFIXES = (
    "container.apparmor.security.beta.kubernetes.io/",
    "seccomp.security.alpha.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/",
    "security.alpha.kubernetes.io/",
    "io.kubernetes.cri-o.",
    "iam.amazonaws.com/",
    "vault.hashicorp.com/",
    "sidecar.istio.io/",
    "traffic.sidecar.istio.io/",
    "linkerd.io/",
    "config.linkerd.io/",
)


class PodOverrides(_Strict):
    """What a manifest may add to a phase's Kubernetes pod: an allow-list, nothing else."""

    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    env: dict[str, Annotated[str, StringConstraints(max_length=4096)]] = Field(default_factory=dict)
    ephemeral_storage: str | None = Field(default=None, description="scratch space, e.g. '20Gi'")
    shm_size: str | None = Field(default=None, description="size of /dev/shm, e.g. '2Gi'")

    @model_validator(mode="before")
    @classmethod
    def _forbidden(cls, data: Any) -> Any:
        if isinstance(data, dict):
            bad = [k for k in data if k in FORBIDDEN_POD_FIELDS]
            if bad:
                k = bad[0]
                raise ValueError(
                    f"pod field {k!r} is not allowed: {FORBIDDEN_POD_FIELDS[k]}; {POD_FIELDS_ALLOWED}"
                )
        return data

    @field_validator("labels", "annotations")
    @classmethod
    def _keys(cls, v: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        for key, value in v.items():
            if not LABEL_KEY_RE.match(key):
                raise ValueError(f"{info.field_name} key {key!r} is not a valid Kubernetes key")
            if key.startswith(RESERVED_LABEL_PREFIX):
                raise ValueError(
                    f"{info.field_name} key {key!r}: the prefix {RESERVED_LABEL_PREFIX} is avsim's"
                )
            if key.startswith(SANDBOX_KEY_PREFIXES):
                raise ValueError(
                    f"{info.field_name} key {key!r} would change the pod's sandbox, credentials or network "
                    "(runtimes, node agents and webhooks act on it); avsim sets those, remove it"
                )
            if info.field_name == "labels" and not LABEL_VALUE_RE.match(value):
                raise ValueError(
                    f"label {key}={value!r}: a label value is at most 63 letters, digits, '-', '_' or '.'"
                )
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        from avsim.phases.contract import RESERVED_ENV

        for name in v:
            if not ENV_NAME_RE.match(name):
                raise ValueError(f"env name {name!r} is not a valid variable name")
            if name in RESERVED_ENV or name.startswith("AVSIM_"):
                raise ValueError(f"env {name!r} is set by the phase contract; choose another name")
        return v

    @field_validator("ephemeral_storage", "shm_size")
    @classmethod
    def _quantity(cls, v: str | None) -> str | None:
        if v is not None:
            parse_memory(v)
        return v


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
    estimated_duration_seconds: Num = Field(gt=0, le=MAX_PHASE_SECONDS)
    timeout_seconds: Num = Field(gt=0, le=MAX_PHASE_SECONDS)
    retry: RetrySpec = RetrySpec()
    command: tuple[Annotated[str, StringConstraints(min_length=1)], ...] = Field(min_length=1)
    args: tuple[str, ...] = ()
    #: How often the phase renews its heartbeat, and how long avsim waits for a renewal before it
    #: ends the attempt as lease_expired (0: the phase keeps no heartbeat; only the timeout applies).
    #: The lease decides how soon a hang is found; the renewal interval only has to ride out a few
    #: failed renewals (five per lease by default, as Kubernetes renews node Leases four times per
    #: duration) and is each running phase's whole cost to the Kubernetes API.
    heartbeat_seconds: Num = Field(default=60, gt=0, le=3600)
    lease_seconds: Num = Field(default=300, ge=0, le=24 * 3600, validate_default=True)

    @field_validator("lease_seconds")
    @classmethod
    def _lease_covers_beats(cls, v: float, info: ValidationInfo) -> float:
        beat = info.data.get("heartbeat_seconds")
        if v and beat is not None and v < 2 * beat:
            raise ValueError(
                f"lease_seconds ({v:g}) is under twice heartbeat_seconds ({beat:g}): one late renewal would "
                "end a healthy phase; raise lease_seconds or renew more often"
            )
        return v

    @field_validator("timeout_seconds")
    @classmethod
    def _timeout_covers_estimate(cls, v: float, info: ValidationInfo) -> float:
        return _check_timeout(v, info)

    @field_validator("depends_on")
    @classmethod
    def _no_dupes(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _check_no_dupes(v)

    @property
    def can_fall_back_to_on_demand(self) -> bool:
        """A GPU phase with a preemption budget: its task has an on-demand twin after it (when the
        deployment's ``[avsim] on_demand_fallback`` is on)."""
        return self.resources.resource_class is ResourceClass.GPU and self.retry.preemption > 0


def _output_path(v: str) -> str:
    """A declared output is a relative path under the attempt's ``OUTPUT_URI``."""
    parts = v.split("/")
    if v.startswith("/") or "://" in v or "\\" in v or any(p in ("", ".", "..") for p in parts):
        raise ValueError(
            f"{v!r} is not a path under the phase's OUTPUT_URI; write it relative, e.g. trace.jsonl"
        )
    return v


#: A file a phase writes under its attempt's ``OUTPUT_URI``, named relative to it.
OutputPath = Annotated[
    str, StringConstraints(max_length=512), AfterValidator(_exact_text), AfterValidator(_output_path)
]


class PhaseSpec(_RunnableSpec):
    """One phase of a case's graph."""

    checkpoint: Bool = False
    pod: PodOverrides = PodOverrides()
    deterministic_outputs: tuple[OutputPath, ...] = Field(
        default=(),
        max_length=100,
        description="outputs (paths relative to OUTPUT_URI) that the same build, inputs and seed write byte for "
        "byte the same: the determinism audit reruns sampled passed cases and compares their digests",
    )

    @field_validator("deterministic_outputs")
    @classmethod
    def _outputs_once(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        dupes = sorted({d for d in v if v.count(d) > 1})
        if dupes:
            raise ValueError(f"deterministic_outputs lists {', '.join(dupes)} more than once; list each once")
        return v


class GraphSpec(_Strict):
    description: str = ""
    phases: dict[Name, PhaseSpec] = Field(min_length=1)


class ScenarioInput(_Strict):
    uri: Annotated[str, StringConstraints(min_length=1, max_length=2048)] = Field(
        description="Where the scenario is: a URI whose scheme and prefix [avsim] manifest_uri_schemes / "
        "manifest_uri_prefixes allow; never a loopback, link-local or metadata address"
    )
    version: Annotated[Text, StringConstraints(min_length=1, max_length=128)]

    @field_validator("uri")
    @classmethod
    def _safe_uri(cls, v: str) -> str:
        from avsim.manifest.uris import uri_problem

        problem = uri_problem(v)
        if problem:
            raise ValueError(problem)
        return v


class CaseSpec(_Strict):
    id: CaseId
    graph: Name | None = None
    phases: dict[Name, PhaseSpec] | None = Field(default=None, min_length=1)
    scenario: ScenarioInput
    seed: Int = Field(ge=0, le=2**63 - 1, strict=True)
    parameters: dict[str, Any] = Field(default_factory=dict)
    tags: tuple[Text, ...] = ()

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
