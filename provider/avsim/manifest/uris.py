"""URIs in a manifest: what any deployment refuses (here) and what a site allows (:mod:`.policy`).

Whatever the settings, a URI is absolute, with a lower-case scheme and no whitespace or control
character; its host is no loopback, link-local, unspecified or cloud metadata address, in any spelling;
its path has no ``.`` or ``..`` segment (also percent-encoded); a ``file`` URI has no host. There are no
DNS lookups: a host name resolving to such an address is for the allow-list to keep out.
docs/security.md, "The manifest" (*URIs*).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from urllib.parse import unquote, urlsplit

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_METADATA_HOSTS = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "metadata.azure.com",
        "instance-data",
        "instance-data.ec2.internal",
        "localhost",
    }
)
_METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200", "192.0.0.192")
)
_EXAMPLE = "s3://bucket/key or file:///absolute/path"


def scheme_of(uri: str) -> str | None:
    m = _SCHEME.match(uri)
    return m.group(1) if m else None


def uri_problem(uri: str) -> str | None:
    """Why no deployment may read ``uri``, or None."""
    if uri != uri.strip() or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in uri):
        return f"URI {uri!r} holds whitespace or a control character; remove it (nothing is stripped)"
    scheme = scheme_of(uri)
    if scheme is None:
        return f"{uri!r} is not an absolute URI; write it with its scheme, like {_EXAMPLE}"
    if scheme != scheme.lower():
        return f"URI {uri!r}: write the scheme in lower case ({scheme.lower()}://)"
    try:
        parts = urlsplit(uri)
        host = parts.hostname
        parts.port  # noqa: B018  (raises on a port that is no number)
    except ValueError as exc:
        return f"URI {uri!r} cannot be parsed ({exc}); write it like {_EXAMPLE}"
    if scheme == "file" and parts.netloc:
        return f"file URI {uri!r} names a host ({parts.netloc!r}); a file URI is file:///absolute/path"
    if host:
        bad = address_problem(host)
        if bad:
            return (
                f"URI {uri!r} points at {bad}; the platform never reads from there: use the data store's URI"
            )
    elif scheme != "file":
        return f"URI {uri!r} has no host or bucket; write it like {_EXAMPLE}"
    segments = unquote(parts.path).split("/")
    if any(seg in (".", "..") for seg in segments):
        return f"URI {uri!r} has a '.' or '..' path segment; write the path without it"
    if "\\" in unquote(parts.path):
        return f"URI {uri!r} holds a backslash; use '/' between path segments"
    return None


def address_problem(host: str) -> str | None:
    """What kind of forbidden address ``host`` is (e.g. 'a loopback address'), or None."""
    name = host.lower().rstrip(".")
    if name in _METADATA_HOSTS or name.endswith(".localhost"):
        return "a loopback address" if "localhost" in name else "a cloud metadata service"
    ip = _as_ip(name)
    if ip is None:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip in _METADATA_ADDRESSES:
        return "a cloud metadata service"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_unspecified:
        return "the unspecified address"
    return None


def _as_ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name.strip("[]").split("%", 1)[0])
    except ValueError:
        pass
    # The forms inet_aton (and so most HTTP clients) also take: 2130706433, 0x7f.1, 0177.0.0.1, 127.1.
    if re.fullmatch(r"[0-9a-fx.]+", name) and any(c.isdigit() for c in name):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(name))
        except OSError:
            return None
    return None
