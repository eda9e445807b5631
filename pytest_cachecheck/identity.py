"""Which server a URL reaches, so that two URLs written differently (``http://127.0.0.1:8000`` and
``http://localhost:8000``) count as one server wherever the plugin must keep one server to one process:
the replicas' validation, the placement of probes under pytest-xdist, the claims, the placement check.

Requests sent to one server in parallel are batched together, and batching alone changes answers; a
server's identity is therefore what a connection reaches: the scheme, the addresses the host name resolves
to, the port (the scheme's default when none is written) and the path prefix (one proxy may route paths to
different servers). Credentials and the query do not change the server. Every loopback or unspecified
address (``127.0.0.0/8``, ``::1``, ``0.0.0.0``) counts as one address, this machine's. Two URLs reach one
server when their scheme, port and path agree and their addresses overlap (``localhost`` may resolve to
``::1`` and ``127.0.0.1``, the literal ``127.0.0.1`` only to the second).
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from dataclasses import dataclass
from typing import FrozenSet, List, Sequence
from urllib.parse import urlsplit

from .redact import split_credentials

LOCAL = "this-machine"  # every loopback or unspecified address
DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class ServerIdentity:
    """What a URL connects to; compare two with :meth:`same_server`. Never shown: it is not redacted."""

    scheme: str
    addresses: FrozenSet[str]  # resolved; the host name when it does not resolve; the URL when unparseable
    port: int
    path: str

    def keys(self) -> List[str]:
        """One key per address; two identities reach one server when a key is in both."""
        return sorted(f"{self.scheme}://[{a}]:{self.port}{self.path}" for a in self.addresses)

    def same_server(self, other: "ServerIdentity") -> bool:
        return not set(self.keys()).isdisjoint(other.keys())


@functools.lru_cache(maxsize=256)
def server_identity(url: str) -> ServerIdentity:
    """The identity of the server ``url`` reaches. Never raises: a host name that does not resolve stands
    for itself, and a URL that cannot be parsed for itself as written (without credentials)."""
    __tracebackhide__ = True  # ``url`` may hold credentials
    clean, _ = split_credentials(url.strip())
    try:
        parts = urlsplit(clean)
        scheme, host = parts.scheme.lower(), parts.hostname
        port = parts.port or DEFAULT_PORTS.get(scheme, 0)
    except ValueError:
        return ServerIdentity("", frozenset([clean]), 0, "")
    if not host:
        return ServerIdentity("", frozenset([clean]), 0, "")
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    except (OSError, UnicodeError, ValueError):  # socket.gaierror is an OSError
        found = set()
    addresses = frozenset(_address(str(a)) for a in found) or frozenset([host])
    return ServerIdentity(scheme, addresses, port, parts.path.rstrip("/"))


def _address(text: str) -> str:
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0])  # without an IPv6 scope id
    except ValueError:
        return text
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return LOCAL if ip.is_loopback or ip.is_unspecified else str(ip)


def server_groups(urls: Sequence[str]) -> List[List[int]]:
    """The positions of ``urls`` grouped by the server they reach, each group in order, the groups in the
    order of their first URL. Two URLs are in one group when a chain of URLs that reach one server joins
    them; the same URL given twice is in one group with itself."""
    identities = [server_identity(u) for u in urls]
    groups: List[List[int]] = []
    for i, identity in enumerate(identities):
        joined = [g for g in groups if any(identities[j].same_server(identity) for j in g)]
        merged = sorted([i, *(j for g in joined for j in g)])
        groups = [g for g in groups if g not in joined]
        groups.append(merged)
    return sorted(groups, key=lambda g: g[0])
