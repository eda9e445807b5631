"""The HTTP layer every client talks through: one JSON-over-HTTP session per server.

Nothing here knows about pytest. Every failure becomes :class:`RequestError` with the server's status
and message; secrets never reach an error text (the URL is kept without credentials).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, Optional, Tuple
from urllib.parse import urlsplit, urlunsplit

import requests

from ..errors import RequestError
from ..redact import Redactor, display_url, split_credentials


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


class Http:
    """A small JSON-over-HTTP session for one server."""

    def __init__(self, url: str, *, api_key: Optional[str] = None, timeout: float = 300.0,
                 redactor: Optional[Redactor] = None) -> None:
        clean, creds = split_credentials(url)
        parts = urlsplit(clean)
        # a query (a gateway's ?token=...) belongs after the request path, not before it
        self.base = urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")).rstrip("/")
        self._query = parts.query
        self.shown = display_url(url)
        self.timeout = timeout
        self.redactor = redactor or Redactor()
        self.redactor.add(api_key)
        self.redactor.add_url(url)
        self.session = requests.Session()
        self.session.trust_env = False  # a loopback staging server must not go through a proxy
        if creds and not api_key:  # an explicit API key wins the Authorization header
            self.session.auth = creds
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def close(self) -> None:
        self.session.close()

    def _fail(self, where: str, message: str, status: Optional[int] = None) -> RequestError:
        return RequestError(self.redactor.scrub(message), status=status, where=where)

    def url_for(self, path: str) -> str:
        """The full URL of ``path`` on this server, with the base URL's query (if any) kept."""
        parts = urlsplit(self.base + path)
        query = "&".join(q for q in (self._query, parts.query) if q)
        return urlunsplit((parts.scheme, parts.netloc, parts.path, query, ""))

    def request(self, method: str, path: str, body: Optional[Dict[str, Any]] = None,
                *, timeout: Optional[float] = None, expect_json: bool = True) -> Tuple[int, Any]:
        """Send a request; return (status, parsed body). Raises RequestError for transport problems.

        HTTP error statuses are returned, not raised, so callers can probe optional endpoints;
        :meth:`post` raises on them.
        """
        where = f"{method} {path}"
        url = self.url_for(path)
        scrub = self.redactor.scrub
        limit = timeout if timeout is not None else self.timeout
        try:
            resp = self.session.request(method, url, json=body, timeout=(min(10.0, limit), limit))
            text = resp.text
        except requests.exceptions.Timeout:
            raise self._fail(where, f"{where} to {self.shown}: no answer within {limit:g} s "
                                    f"(--cachecheck-timeout)") from None
        except requests.exceptions.ConnectionError as exc:
            reason = _connection_reason(exc, scrub)
            raise self._fail(where, f"{where} to {self.shown}: connection failed ({reason})") from None
        except requests.exceptions.ChunkedEncodingError:
            # the status line and headers came, then the connection closed before the whole body
            raise self._fail(where, f"{where} to {self.shown}: the body was cut short (the connection "
                                    f"closed before the whole answer arrived)") from None
        except requests.exceptions.RequestException as exc:
            raise self._fail(where, f"{where} to {self.shown}: {type(exc).__name__}: "
                                    f"{_short(scrub(str(exc)))}") from None
        if not expect_json:
            return resp.status_code, text
        try:
            data = json.loads(text) if text.strip() else None
        except ValueError:
            data = _NotJson(text)
        return resp.status_code, data

    def get(self, path: str, *, timeout: Optional[float] = None) -> Tuple[int, Any]:
        return self.request("GET", path, timeout=timeout)

    def post(self, path: str, body: Dict[str, Any]) -> Dict[str, Any]:
        """POST JSON and return the JSON object; any HTTP error or malformed body raises RequestError."""
        where = f"POST {path}"
        status, data = self.request("POST", path, body)
        if status >= 400:
            raise self._fail(where, f"{where} to {self.shown}: HTTP {status}: "
                                    f"{_error_message(data, self.redactor.scrub)}", status)
        if isinstance(data, _NotJson):
            raise self._fail(where, f"{where} to {self.shown}: HTTP {status} but the body is not JSON "
                                    f"({_short(self.redactor.scrub(data.text), 120)!r})", status)
        if not isinstance(data, dict):
            raise self._fail(where, f"{where} to {self.shown}: HTTP {status} but the body is not a JSON "
                                    f"object", status)
        return data


class _NotJson:
    def __init__(self, text: str) -> None:
        self.text = text


def _error_message(data: Any, scrub: Callable[[str], str] = lambda text: text) -> str:
    """The server's error message, shortened; secrets are scrubbed first, so a cut never splits one."""
    if isinstance(data, _NotJson):
        return _short(scrub(data.text)) or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("detail") or err.get("msg")
            if msg:
                return _short(scrub(str(msg)))
        elif isinstance(err, str):
            return _short(scrub(err))
        if data.get("message"):
            return _short(scrub(str(data["message"])))
    return _short(scrub(json.dumps(data, ensure_ascii=False))) if data is not None else "(empty body)"


def _connection_reason(exc: Exception, scrub: Callable[[str], str] = lambda text: text) -> str:
    text = scrub(str(exc))
    for needle, reason in (("Connection refused", "connection refused"),
                           ("RemoteDisconnected", "the server closed the connection without answering"),
                           ("Connection reset", "connection reset by the server"),
                           ("IncompleteRead", "the body was cut short"),
                           ("Name or service not known", "host name not known"),
                           ("ProtocolError", "the server broke the HTTP protocol")):
        if needle in text:
            return reason
    return _short(text, 160)
