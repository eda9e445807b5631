"""Keep secrets out of everything the plugin shows or writes.

API keys and ``user:password`` parts of URLs are collected once, and every text that leaves the plugin
(messages, summaries, reports) passes through :meth:`Redactor.scrub`.
"""

from __future__ import annotations

import re
from typing import Iterable, List, Optional, Tuple
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"


def split_credentials(url: str) -> Tuple[str, Optional[Tuple[str, str]]]:
    """Return the URL without ``user:password@`` and the credentials, if any (percent-decoded)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    clean = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return clean, (unquote(parts.username or ""), unquote(parts.password or ""))


def display_url(url: str) -> str:
    """The URL as it may be shown: no credentials, and query values masked (they often carry tokens)."""
    clean, _ = split_credentials(url)
    parts = urlsplit(clean)
    query = parts.query
    if query:
        query = "&".join(
            (kv.split("=", 1)[0] + "=" + MASK) if "=" in kv else kv for kv in query.split("&")
        )
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, ""))


class Redactor:
    """Replaces every known secret in a text with ``***``."""

    def __init__(self, secrets: Iterable[Optional[str]] = ()) -> None:
        self._secrets: List[str] = []
        for s in secrets:
            self.add(s)

    def add(self, secret: Optional[str]) -> None:
        if secret and len(secret) >= 3 and secret not in self._secrets:
            self._secrets.append(secret)
            self._secrets.sort(key=len, reverse=True)

    def add_url(self, url: Optional[str]) -> None:
        if not url:
            return
        _, creds = split_credentials(url)
        if creds:
            user, password = creds
            self.add(password)
            parts = urlsplit(url)
            # the raw (still percent-encoded) forms may appear too
            raw = parts.netloc.rsplit("@", 1)[0]
            self.add(raw)
            if ":" in raw:
                self.add(raw.split(":", 1)[1])
            self.add(user if len(user) >= 6 else None)
        parts = urlsplit(url)
        for kv in parts.query.split("&"):
            if "=" in kv:
                self.add(kv.split("=", 1)[1])

    def scrub(self, text: str) -> str:
        for s in self._secrets:
            if s in text:
                text = text.replace(s, MASK)
        # credentials in any URL-looking text, even ones we were never told about
        return re.sub(r"(https?://)[^/\s@:]+:[^/\s@]*@", r"\1" + MASK + "@", text)
