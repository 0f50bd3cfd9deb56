"""Where a run's manifest is: the trigger's ``manifest`` parameter, else ``[avsim] default_manifest``.

:func:`manifest_source` is what ``prepare`` and the run's deadline reference read, so both name the
same manifest; :func:`check_location` refuses a location with a credential in it or one no filesystem
serves. The parameter may hold the manifest's text instead (:func:`is_inline`), read under the name
:data:`INLINE_SOURCE` with a file's bounds; :class:`ManifestSource` holds either, decided once here, so
its readers never ask which.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from avsim.errors import ManifestError, Problem
from avsim.settings import AvsimSettings

if TYPE_CHECKING:
    from avsim.manifest.loader import Format

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
#: How an inline manifest is named in problems and in the run descriptor.
INLINE_SOURCE = "params.manifest (inline)"


def is_inline(value: str) -> bool:
    """A ``manifest`` parameter that is the manifest's text, not its location: a JSON object, or
    text of several lines (no path or URI holds a line break)."""
    return value.lstrip().startswith("{") or "\n" in value.strip()


@dataclass(frozen=True)
class ManifestSource:
    """A run's manifest: at ``location`` (a path or ObjectStoragePath URI), or its ``text`` itself."""

    location: str = ""
    text: str | None = None

    @classmethod
    def of(cls, value: str | ManifestSource) -> ManifestSource:
        """``value``, or the location it names."""
        return value if isinstance(value, ManifestSource) else cls(location=value)

    @property
    def name(self) -> str:
        """How problems and the run descriptor name it: the location, never the text."""
        return INLINE_SOURCE if self.text is not None else self.location

    @property
    def fmt(self) -> Format | None:
        """``"json"`` or ``"yaml"`` when the location's name says so, else None (sniffed from the text)."""
        from avsim.manifest.loader import format_from_name

        return None if self.text is not None else format_from_name(self.location)

    def read(self, max_bytes: int) -> bytes:
        """The manifest's bytes, at most ``max_bytes`` from a location (the text's size is checked by
        :func:`manifest_source`)."""
        if self.text is not None:
            return self.text.encode("utf-8", errors="surrogatepass")
        from avsim.manifest.loader import read_manifest_bytes

        return read_manifest_bytes(self.location, max_bytes)


def manifest_source(
    params: dict[str, Any], settings: AvsimSettings, when: dt.datetime | None
) -> ManifestSource:
    """The manifest a run uses: the trigger's ``manifest`` parameter, else ``[avsim] default_manifest``."""
    given = params.get("manifest")
    if given is not None and not isinstance(given, str):
        raise ManifestError(
            [Problem("params.manifest", f"must be a path or URI (a string), got {type(given).__name__}")],
            source="DAG run conf",
        )
    if given is not None and is_inline(given):
        size = len(given.encode("utf-8", errors="surrogatepass"))
        if size > settings.max_manifest_bytes:
            raise ManifestError(
                [
                    Problem(
                        "params.manifest",
                        f"the inline manifest is too large: {size} bytes, the limit is "
                        f"{settings.max_manifest_bytes} bytes; split the week into several manifests or raise "
                        "[avsim] max_manifest_bytes",
                    )
                ],
                source=INLINE_SOURCE,
            )
        return ManifestSource(text=given)
    source = str(given or settings.default_manifest or "").strip()
    if not source:
        raise ManifestError(
            [
                Problem(
                    "params.manifest",
                    "no manifest given; trigger the DAG with conf {'manifest': '<path or URI>'} "
                    "or set [avsim] default_manifest for the scheduled run",
                )
            ],
            source="DAG run conf",
        )
    if "{iso_week}" in source:
        from avsim.manifest.deadline import iso_week_of

        source = source.replace("{iso_week}", iso_week_of(when or dt.datetime.now(dt.UTC)))
    check_location(source, "params.manifest")
    return ManifestSource(location=source)


def check_location(uri: str, where: str) -> None:
    """Refuse, before anything reads it, a location with a credential in it or that no filesystem serves.

    The location is logged and kept in the run descriptor (XCom), so a password in it would leak; and
    an unknown scheme is a mistake in the conf, not a failure a retry fixes."""
    from avsim.manifest.secrets import USE_A_CONNECTION, find_secrets

    found = find_secrets(uri)
    if found:
        raise ManifestError(
            [Problem(where, f"{found[0].kind} ({found[0].masked}): {USE_A_CONNECTION}")],
            source="DAG run conf",
        )
    if _SCHEME.match(uri) and not uri.startswith("file://"):  # a local file is always served
        from airflow.sdk import ObjectStoragePath

        try:
            ObjectStoragePath(uri).fs  # noqa: B018  (resolves the filesystem; reads nothing)
        except (ValueError, ImportError) as exc:
            raise ManifestError(
                [
                    Problem(
                        where,
                        f"{uri!r} is no location avsim can read ({exc}); give a path, a file:// URI or an "
                        "ObjectStoragePath URI such as s3://<conn_id>@bucket/key",
                    )
                ],
                source="DAG run conf",
            ) from None
