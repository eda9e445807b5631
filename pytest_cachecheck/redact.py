"""Keep secrets out of everything the plugin shows or writes.

API keys and ``user:password`` parts of URLs are collected once, and every text that leaves the plugin
(messages, summaries, reports) passes through :meth:`Redactor.scrub`.
"""

from __future__ import annotations

import base64
import re
from typing import Iterable, List, Optional, Tuple
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"


_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*:)?//([^/?#]*)@")


def split_credentials(url: str) -> Tuple[str, Optional[Tuple[str, str]]]:
    """Return the URL without ``user:password@`` and the credentials, if any (percent-decoded).

    Never raises: a URL that :func:`urllib.parse.urlsplit` rejects (a broken IPv6 literal, a port out of
    range) still loses its credentials, so an error message about it cannot show them.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        match = _USERINFO.match(url)
        if match is None:
            return url, None
        user, _, password = match.group(2).partition(":")
        clean = (match.group(1) or "") + "//" + url[match.end():]
        return clean, (unquote(user), unquote(password))
    if parts.username is None and parts.password is None:
        return url, None
    # the host and port exactly as written: parts.port would raise on an out-of-range port
    netloc = parts.netloc.rsplit("@", 1)[1]
    clean = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return clean, (unquote(parts.username or ""), unquote(parts.password or ""))


def _mask_query(query: str) -> str:
    return "&".join((kv.split("=", 1)[0] + "=" + MASK) if "=" in kv else kv for kv in query.split("&"))


def display_url(url: str) -> str:
    """The URL as it may be shown: no credentials, and query values masked (they often carry tokens)."""
    clean, _ = split_credentials(url)
    try:
        parts = urlsplit(clean)
    except ValueError:  # unparseable: drop everything after the authority but the path
        return re.split(r"[?#]", clean, maxsplit=1)[0]
    query = _mask_query(parts.query) if parts.query else parts.query
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, ""))


def _basic_auth_forms(user: str, password: str) -> List[str]:
    """The ``Authorization: Basic`` values requests may send for these credentials (servers echo them)."""
    forms = []
    for encoding in ("latin-1", "utf-8"):
        try:
            raw = f"{user}:{password}".encode(encoding)
        except UnicodeEncodeError:
            continue
        forms.append(base64.b64encode(raw).decode("ascii"))
    return forms


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
        clean, creds = split_credentials(url)
        if creds:
            user, password = creds
            self.add(password)
            # the raw (still percent-encoded) forms may appear too
            match = re.match(r"^[^/?#]*//([^/?#]*)@", url)
            raw = match.group(1) if match else ""
            self.add(raw)
            if ":" in raw:
                self.add(raw.split(":", 1)[1])
            self.add(user if len(user) >= 6 else None)
            if password:
                for form in _basic_auth_forms(user, password):
                    self.add(form)
        try:
            query = urlsplit(clean).query
        except ValueError:
            query = clean.partition("?")[2].partition("#")[0]
        for kv in query.split("&"):
            if "=" in kv:
                value = kv.split("=", 1)[1]
                self.add(value)
                self.add(unquote(value))

    def scrub(self, text: str) -> str:
        for s in self._secrets:
            if s in text:
                text = text.replace(s, MASK)
        # credentials in any URL-looking text, even ones we were never told about
        return re.sub(r"(https?://)[^/\s@:]+:[^/\s@]*@", r"\1" + MASK + "@", text)
