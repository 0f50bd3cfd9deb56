"""OCI image references, checked against the distribution reference grammar in full.

The grammar is github.com/distribution/reference's (``reference.go``): the first component is the
registry only if it holds a ``.`` or a ``:`` or is ``localhost`` (as ``docker pull`` decides), and the
name is at most 255 characters. avsim's rule on top: a build is pinned by a ``sha256`` digest, and a
reference with a tag next to its digest is refused (docs/security.md, "The manifest", *Images*).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

_DOMAIN_COMPONENT = re.compile(r"^([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])$")
_PATH_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[_.]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^\w[\w.-]{0,127}$", re.ASCII)
_SHA256 = re.compile(r"^sha256:[0-9a-f]{64}$")
_DIGEST_SHAPE = re.compile(r"^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]+$")
MAX_NAME_LENGTH = 255
#: How a pinned reference is written, for messages.
EXAMPLE = "registry.example.com/team/simulator@sha256:<64 hex digits>"


@dataclass(frozen=True)
class ImageRef:
    """A parsed, digest-pinned image reference."""

    registry: str
    repository: str
    digest: str

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}" if self.registry else self.repository


def parse_image(ref: str) -> ImageRef:
    """Parse a digest-pinned reference; ``ValueError`` names the part that is wrong and the fix."""
    if not ref:
        raise ValueError(f"image is empty; write it as {EXAMPLE!r}")
    if ref != ref.strip() or any(c.isspace() for c in ref):
        raise ValueError(f"image {ref!r} holds whitespace; remove it ({EXAMPLE!r})")
    if "@" not in ref:
        raise ValueError(f"image {ref!r} is not pinned by digest; write it as {EXAMPLE!r}")
    name_tag, digest = ref.rsplit("@", 1)
    if "@" in name_tag:
        raise ValueError(f"image {ref!r} has more than one '@'; a reference has one digest ({EXAMPLE!r})")
    if not _SHA256.match(digest):
        if _DIGEST_SHAPE.match(digest) and not digest.startswith("sha256:"):
            reason = f"digest algorithm {digest.split(':', 1)[0]!r} is not sha256"
        else:
            reason = f"invalid digest {digest!r}: it must be 'sha256:' and 64 lowercase hex digits"
        raise ValueError(f"image {ref!r}: {reason}; write it as {EXAMPLE!r}")
    registry, remote, tag = _split_name(name_tag)
    problem = _name_problem(name_tag, registry, remote)
    if problem:
        raise ValueError(f"image {ref!r}: {problem}; write it as {EXAMPLE!r}")
    if tag is not None:
        if not _TAG.match(tag):
            what = "empty tag" if not tag else f"invalid tag {tag!r}"
            raise ValueError(
                f"image {ref!r}: {what} before the digest; remove ':{tag}' (the digest pins the image)"
            )
        raise ValueError(
            f"image {ref!r} has a tag ({tag!r}) next to its digest: the digest pins what runs and the tag "
            f"would mislead whoever reads it; remove ':{tag}'"
        )
    return ImageRef(registry=registry, repository=remote, digest=digest)


def _split_name(name_tag: str) -> tuple[str, str, str | None]:
    """(registry, remote name, tag or None); the tag is after the last ':' of the last component."""
    first, sep, rest = name_tag.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        registry, remote = first, rest
    else:
        registry, remote = "", name_tag
    tag: str | None = None
    last_slash = remote.rfind("/")
    colon = remote.rfind(":")
    if colon > last_slash:
        remote, tag = remote[:colon], remote[colon + 1 :]
    return registry, remote, tag


def _name_problem(name_tag: str, registry: str, remote: str) -> str | None:
    if registry:
        bad = _registry_problem(registry)
        if bad:
            return bad
    if not remote:
        return "empty repository name"
    full = f"{registry}/{remote}" if registry else remote
    if len(full) > MAX_NAME_LENGTH:
        return f"the name is {len(full)} characters long, the limit is {MAX_NAME_LENGTH}"
    for k, component in enumerate(remote.split("/")):
        if not component:
            return f"empty path component (number {k + 1} of {remote!r})"
        if not _PATH_COMPONENT.match(component):
            hint = " (upper case is not allowed)" if component.lower() != component else ""
            return (
                f"invalid path component {component!r}{hint}: use lowercase letters and digits separated by "
                "'.', '_', '__' or '-'"
            )
    return None


def _registry_problem(registry: str) -> str | None:
    host, port = registry, None
    if registry.startswith("["):
        end = registry.find("]")
        if end < 0:
            return f"invalid registry {registry!r}: unclosed '['"
        host, after = registry[1:end], registry[end + 1 :]
        if after and not after.startswith(":"):
            return f"invalid registry {registry!r}"
        port = after[1:] if after else None
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return f"invalid registry {registry!r}: {host!r} is no IPv6 address"
    else:
        if ":" in registry:
            host, port = registry.split(":", 1)
        if not host:
            return f"invalid registry {registry!r}: empty host"
        for part in host.split("."):
            if not _DOMAIN_COMPONENT.match(part):
                what = "empty host component" if not part else f"invalid host component {part!r}"
                return f"invalid registry {registry!r}: {what}"
    if port is not None and not (port.isdigit() and port.isascii() and 0 < int(port) < 65536):
        return f"invalid registry {registry!r}: port {port!r} is not a number from 1 to 65535"
    return None
