"""Keep secrets out of everything the plugin shows or writes.

API keys, ``user:password`` parts of URLs and URL query values are collected once, and every text that
leaves the plugin (messages, summaries, reports, urllib3's log records) passes through
:meth:`Redactor.scrub`; structured data (the JSON report) through :meth:`Redactor.scrub_data`, which
scrubs string values and never the JSON syntax around them.

A secret shorter than :data:`MIN_SECRET` characters is not masked in free text: it would mask ordinary
words. The settings refuse API keys and URL passwords that short; URLs are still shown with every query
value masked, whatever its length.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import weakref
from typing import Any, Callable, Iterable, List, Optional, Tuple
from urllib.parse import quote, quote_plus, unquote, unquote_plus, urlsplit, urlunsplit

MASK = "***"
MIN_SECRET = 8

_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*:)?//([^/?#]*)@")


def ambiguous_url(url: str) -> bool:
    """Whether the URL's credentials cannot be told apart from its path or query: an ``@`` after the first
    ``/``, ``?`` or ``#`` that follows ``//`` (a user name or password holding a raw ``/``, ``?`` or ``#``,
    or an ``@`` in a path or query), or an ``@`` in a URL without ``//``."""
    if "@" not in url:
        return False
    if "//" not in url:
        return True
    rest = url.split("//", 1)[1]
    delimiter = re.search(r"[/?#]", rest)
    return delimiter is not None and "@" in rest[delimiter.start():]


def _scheme_and_host(url: str) -> str:
    """Only the scheme and the host name as :func:`urlsplit` finds them, for an ambiguous URL. A password
    follows a ``:``, so it is never part of the host name; at most (part of) a user name can be."""
    try:
        parts = urlsplit(url)
        scheme, host = parts.scheme, parts.hostname if "//" in url else None
    except ValueError:
        scheme, host = "", None
    return f"{scheme}://{host}" if scheme and host else "(URL not shown)"


def split_credentials(url: str) -> Tuple[str, Optional[Tuple[str, str]]]:
    """Return the URL without ``user:password@`` and the credentials, if any (percent-decoded).

    Never raises: a URL that :func:`urllib.parse.urlsplit` rejects (a broken IPv6 literal, a port out of
    range) still loses its credentials, so an error message about it cannot show them.
    """
    __tracebackhide__ = True  # its locals hold the credentials
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
    return "&".join((kv.split("=", 1)[0] + "=" + MASK) if "=" in kv else (MASK if kv else kv)
                    for kv in query.split("&"))


def display_url(url: str) -> str:
    """The URL as it may be shown: no credentials, query values (and bare query items) masked, no fragment.
    An ambiguous URL (see :func:`ambiguous_url`) is shown as its scheme and host name only."""
    __tracebackhide__ = True
    if ambiguous_url(url):
        return _scheme_and_host(url)
    clean, _ = split_credentials(url)
    try:
        parts = urlsplit(clean)
    except ValueError:  # unparseable: drop everything after the authority but the path
        return re.split(r"[?#]", clean, maxsplit=1)[0]
    query = _mask_query(parts.query) if parts.query else parts.query
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, ""))


def _basic_auth_forms(user: str, password: str) -> List[str]:
    """The ``Authorization: Basic`` values that may be sent for these credentials (servers echo them)."""
    forms = []
    for encoding in ("latin-1", "utf-8"):
        try:
            raw = f"{user}:{password}".encode(encoding)
        except UnicodeEncodeError:
            continue
        forms.append(base64.b64encode(raw).decode("ascii"))
    return forms


def _forms(secret: str) -> List[str]:
    """The secret as it may appear: as given, percent-encoded (as requests sends a URL, fully, and
    form-encoded), and escaped (by ``repr`` in an exception text, by JSON)."""
    return [secret, quote(secret, safe="!#$%&'()*+,/:;=?@[]~"), quote(secret, safe=""), quote_plus(secret),
            repr(secret)[1:-1], json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]]


def scrub_data(obj: Any, scrub: Callable[[str], str]) -> Any:
    """A copy of ``obj`` (dicts, lists, tuples as lists) with ``scrub`` applied to every string value, and
    to a key only where that changes it; numbers, booleans and None are kept as they are."""
    if isinstance(obj, str):
        return scrub(obj)
    if isinstance(obj, dict):
        return {(scrub(k) if isinstance(k, str) else k): scrub_data(v, scrub) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub_data(v, scrub) for v in obj]
    return obj


class Redactor:
    """Replaces every known secret in a text with ``***``."""

    def __init__(self, secrets: Iterable[Optional[str]] = ()) -> None:
        self._secrets: List[str] = []
        for s in secrets:
            self.add(s)

    def __repr__(self) -> str:
        return f"Redactor({len(self._secrets)} forms of secrets)"

    def add(self, secret: Optional[str]) -> None:
        """Mask ``secret`` and its encoded forms from now on; one shorter than MIN_SECRET is ignored."""
        if not secret or len(secret) < MIN_SECRET:
            return
        for form in _forms(secret):
            if len(form) >= MIN_SECRET and form not in self._secrets:
                self._secrets.append(form)
        self._secrets.sort(key=len, reverse=True)

    def add_url(self, url: Optional[str]) -> None:
        __tracebackhide__ = True
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
            self.add(user)
            if password:
                for form in _basic_auth_forms(user, password):
                    self.add(form)
        if ambiguous_url(url):
            # what a user may have meant as credentials: everything from '//' to the first and the last '@'
            rest = url.split("//", 1)[-1]
            for userinfo in (rest.split("@", 1)[0], rest.rsplit("@", 1)[0]):
                self.add(userinfo)
                self.add(unquote(userinfo.partition(":")[2]))
        try:
            query = urlsplit(clean).query
        except ValueError:
            query = clean.partition("?")[2].partition("#")[0]
        for kv in query.split("&"):
            value = kv.split("=", 1)[1] if "=" in kv else kv
            for form in (value, unquote(value), unquote_plus(value)):
                self.add(form)

    def scrub(self, text: str) -> str:
        for s in self._secrets:
            if s in text:
                text = text.replace(s, MASK)
        # credentials in any URL-looking text, even ones we were never told about
        return re.sub(r"(https?://)[^/\s@:]+:[^/\s@]*@", r"\1" + MASK + "@", text)

    def scrub_data(self, obj: Any) -> Any:
        """``obj`` with every string value scrubbed; JSON keys and literals stay intact."""
        return scrub_data(obj, self.scrub)

    def guard_logs(self) -> None:
        """Scrub this redactor's secrets from every record urllib3 logs (its DEBUG records hold URLs)."""
        _LOG_FILTER.redactors.add(self)
        for name in ["urllib3", *logging.Logger.manager.loggerDict]:
            if name == "urllib3" or name.startswith("urllib3."):
                logger = logging.getLogger(name)
                if _LOG_FILTER not in logger.filters:
                    logger.addFilter(_LOG_FILTER)


class _LogScrubber(logging.Filter):
    """Scrubs a record's message (formatted with its arguments) and exception text, for live redactors."""

    def __init__(self) -> None:
        super().__init__()
        self.redactors: "weakref.WeakSet[Redactor]" = weakref.WeakSet()

    def filter(self, record: logging.LogRecord) -> bool:
        redactors = list(self.redactors)
        if not redactors:
            return True

        def scrub(text: str) -> str:
            for r in redactors:
                text = r.scrub(text)
            return text

        try:
            message = record.getMessage()
        except Exception:  # a record that cannot be formatted: keep only what is certain to be safe
            message = f"(unformattable {record.name} record)"
        record.msg, record.args = scrub(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        return True


_LOG_FILTER = _LogScrubber()
