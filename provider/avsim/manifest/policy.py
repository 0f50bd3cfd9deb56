"""What a deployment allows a manifest: size limits, URI schemes and prefixes, a past deadline.

:class:`ManifestPolicy` is built from ``[avsim]`` once (:func:`policy_from_settings`) and handed to the
checks, which are pure: one pair of size limits for the loader, the validator and ``avsim manifest
sample``; the URI allow-list (a ``file://`` URI always confined to the ``file://`` prefixes and the
artifact root); the deadline at start (:func:`avsim.manifest.deadline.deadline_at_start`).
docs/security.md, "The manifest" (*URIs*, *Deadlines*, *Limits*).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from avsim.errors import ManifestError, Problem
from avsim.manifest.deadline import deadline_at_start
from avsim.manifest.field_errors import format_path
from avsim.manifest.uris import scheme_of, uri_problem

if TYPE_CHECKING:
    from avsim.manifest.models import Manifest
    from avsim.settings import AvsimSettings

DEFAULT_MAX_BYTES = 64 * 2**20
DEFAULT_MAX_CASES = 100_000


@dataclass(frozen=True)
class ManifestPolicy:
    max_bytes: int = DEFAULT_MAX_BYTES
    max_cases: int = DEFAULT_MAX_CASES
    #: Allowed schemes; empty: any scheme (the policy of a manifest checked without a deployment).
    uri_schemes: frozenset[str] = frozenset()
    uri_prefixes: tuple[str, ...] = ()
    #: The artifact root: its scheme is allowed, and file:// URIs under it.
    artifact_root: str = ""
    allow_past_deadline: bool = False

    def uri_problem(self, uri: str) -> str | None:
        """Why this deployment does not read ``uri`` (already checked by :func:`.uris.uri_problem`), or None."""
        scheme = scheme_of(uri)
        if scheme is None:
            return None
        if self.uri_schemes and scheme not in self.uri_schemes:
            allowed = ", ".join(f"{s}://" for s in sorted(self.uri_schemes))
            return (
                f"URI {uri!r}: the scheme {scheme}:// is not allowed here (allowed: {allowed}); use one of "
                "them or add it to [avsim] manifest_uri_schemes"
            )
        roots = [p for p in self.uri_prefixes if scheme_of(p) == scheme]
        if self.artifact_root and scheme_of(self.artifact_root) == scheme:
            roots.append(self.artifact_root)
        if (self.uri_prefixes or scheme == "file") and not any(_under(uri, root) for root in roots):
            shown = ", ".join(roots) or "none"
            return (
                f"URI {uri!r} is outside the allowed roots ({shown}); move the data under one of them or add "
                "its prefix to [avsim] manifest_uri_prefixes"
            )
        return None

    def problems(self, data: dict[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
        """Site problems of a parsed manifest document (best effort on a malformed one), at their paths."""
        out: list[tuple[tuple[Any, ...], str]] = []
        cases = data.get("cases")
        if not isinstance(cases, list):
            return out
        if len(cases) > self.max_cases:
            out.append(
                (
                    ("cases",),
                    f"{len(cases)} cases, the limit is {self.max_cases}; split the week into several "
                    "manifests or raise [avsim] max_manifest_cases",
                )
            )
        for i, case in enumerate(cases):
            scenario = case.get("scenario") if isinstance(case, dict) else None
            uri = scenario.get("uri") if isinstance(scenario, dict) else None
            if isinstance(uri, str) and uri_problem(uri) is None:
                bad = self.uri_problem(uri)
                if bad:
                    out.append((("cases", i, "scenario", "uri"), bad))
        return out

    def check(self, manifest: Manifest, source: str) -> None:
        data = manifest.model_dump(mode="json", by_alias=True)
        found = [Problem(format_path(loc), msg) for loc, msg in self.problems(data)]
        if found:
            raise ManifestError(found, source=source)

    def check_start(self, manifest: Manifest, source: str, now: dt.datetime | None = None) -> None:
        """At prepare: refuse a run whose deadline has passed (:func:`deadline_at_start`)."""
        run = manifest.run
        bad = deadline_at_start(
            run.deadline,
            now or dt.datetime.now(dt.UTC),
            rerun=run.rerun_of is not None,
            allow_past=self.allow_past_deadline,
        )
        if bad:
            raise ManifestError([Problem("run.deadline", bad)], source=source)


def _under(uri: str, root: str) -> bool:
    """``uri`` is ``root`` or below it, segment-wise (``s3://b`` does not cover ``s3://bb/x``)."""
    base = root.rstrip("/")
    if base.endswith(":"):  # a bare "file:///" or "s3://" root
        return uri.startswith(root)
    return uri == base or uri.startswith(base + "/")


def policy_from_settings(settings: AvsimSettings) -> ManifestPolicy:
    safety = settings.manifest_safety
    root = settings.resolved_artifact_root
    schemes = set(safety.uri_schemes)
    root_scheme = scheme_of(root)
    if root_scheme:
        schemes.add(root_scheme)
    return ManifestPolicy(
        max_bytes=settings.max_manifest_bytes,
        max_cases=safety.max_cases,
        uri_schemes=frozenset(schemes),
        uri_prefixes=safety.uri_prefixes,
        artifact_root=root,
        allow_past_deadline=safety.allow_past_deadline,
    )


def deployment_policy() -> ManifestPolicy:
    """The policy of this deployment's ``[avsim]`` settings (defaults where Airflow's config is absent)."""
    try:
        from avsim.settings import load_settings

        return policy_from_settings(load_settings())
    except ImportError:  # pragma: no cover - the provider always runs with Airflow installed
        from avsim.settings import AvsimSettings

        return policy_from_settings(AvsimSettings())


def check_prepare(manifest: Manifest, settings: AvsimSettings, source: str, **kw: Any) -> None:
    """What ``prepare_week`` checks with the run's own settings: the site's URI rules and limits, and
    the deadline at start."""
    policy = policy_from_settings(settings)
    policy.check(manifest, source)
    policy.check_start(manifest, source, **kw)
