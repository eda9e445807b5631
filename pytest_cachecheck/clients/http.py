"""The HTTP layer every client talks through: one JSON-over-HTTP session per server.

Nothing here knows about pytest. A server is untrusted, so every failure becomes :class:`RequestError`
naming the cause, and the layer never lets a server take more than it should:

* the body is read streamed and decoded here (gzip or deflate), counting decoded bytes, and reading stops
  at a cap (:func:`chat_max_bytes` for chat answers, :data:`GET_MAX_BYTES` for other endpoints);
* ``timeout`` is a deadline for the whole request: a watchdog shuts the socket down when it passes, so a
  server that drips one byte at a time cannot hold a request longer;
* redirects are never followed (credentials must not go to another origin); they are errors naming the
  status and the target;
* JSON nested too deeply, integers of hundreds of digits, NaN and Infinity are malformed bodies; every
  string of a parsed body has its lone surrogates replaced (:func:`~pytest_cachecheck.text.clean_text`);
* server text in an error message is scrubbed of secrets, then escaped and shortened
  (:func:`~pytest_cachecheck.text.printable`); the URL is kept without credentials or query values.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
import zlib
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import urljoin, urlsplit, urlunsplit

import requests
import urllib3
from requests.adapters import HTTPAdapter
from requests.auth import HTTPBasicAuth
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from ..errors import RequestError
from ..redact import Redactor, display_url, split_credentials
from ..text import clean_text, printable

KiB = 1 << 10
MiB = 1 << 20
#: the cap on a body of any GET endpoint (/props, /server_info, /version, /v1/models, /metrics)
GET_MAX_BYTES = 4 * MiB
#: nesting deeper than this is refused: no server answer nests more than about ten levels
MAX_DEPTH = 64
#: integers with more digits are refused: a float() of one could overflow
MAX_INT_DIGITS = 300
_CHUNK = 64 * KiB


def chat_max_bytes(max_tokens: int) -> int:
    """The cap on a chat answer of at most ``max_tokens`` tokens: 1 MiB + max_tokens x 8 KiB.

    A token with its top-2 logprobs takes a few hundred bytes of JSON (its text, JSON-escaped, and byte
    lists, three times); 8 KiB leaves room for long tokens and reasoning text, 1 MiB for the rest.
    """
    return MiB + max_tokens * 8 * KiB


def _default_cap(method: str, body: Optional[Dict[str, Any]]) -> Tuple[int, str]:
    """(cap, why) for a request without an explicit ``max_bytes``."""
    max_tokens = body.get("max_tokens") if isinstance(body, dict) else None
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0:
        return chat_max_bytes(max_tokens), f"a reply of max_tokens={max_tokens} needs far less"
    if method == "GET" or body is None:
        return GET_MAX_BYTES, "no answer of this endpoint needs that much"
    # /tokenize, /apply-template: the answer grows with the text sent
    sent = len(json.dumps(body, ensure_ascii=False).encode("utf-8"))
    return GET_MAX_BYTES + 64 * sent, "an answer to this request needs far less"


class Http:
    """A small JSON-over-HTTP session for one server."""

    def __init__(self, url: str, *, api_key: Optional[str] = None, timeout: float = 300.0,
                 redactor: Optional[Redactor] = None) -> None:
        __tracebackhide__ = True  # its locals hold the credentials
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
        self.redactor.guard_logs()
        if api_key is not None and not all("\x21" <= c <= "\x7e" for c in api_key):
            raise ValueError("the API key holds a character an HTTP header cannot carry (a space, a line "
                             "break or a non-ASCII character); it is not shown")
        self.session = _Session()
        self.session.trust_env = False  # a loopback staging server must not go through a proxy
        for prefix in ("http://", "https://"):
            self.session.mount(prefix, _WatchedAdapter())
        # only what this layer decodes itself (urllib3 would add br and zstd where their modules exist)
        self.session.headers["Accept-Encoding"] = "gzip, deflate"
        if creds and not api_key:  # an explicit API key wins the Authorization header
            # RFC 7617: UTF-8 (requests would send latin-1, and fail on any other character)
            self.session.auth = HTTPBasicAuth(creds[0].encode("utf-8"), creds[1].encode("utf-8"))
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def __repr__(self) -> str:
        return f"Http({self.shown!r})"

    def close(self) -> None:
        self.session.close()

    def _fail(self, where: str, message: str, status: Optional[int] = None) -> RequestError:
        return RequestError(self.redactor.scrub(message), status=status, where=where)

    def _show(self, text: str, limit: int = 300) -> str:
        """Server text as an error message may hold it: secrets masked first (so a cut never splits one),
        then escaped and shortened."""
        return printable(self.redactor.scrub(text), limit)

    def url_for(self, path: str) -> str:
        """The full URL of ``path`` on this server, with the base URL's query (if any) kept."""
        __tracebackhide__ = True
        parts = urlsplit(self.base + path)
        query = "&".join(q for q in (self._query, parts.query) if q)
        return urlunsplit((parts.scheme, parts.netloc, parts.path, query, ""))

    def request(self, method: str, path: str, body: Optional[Dict[str, Any]] = None,
                *, timeout: Optional[float] = None, expect_json: bool = True,
                max_bytes: Optional[int] = None) -> Tuple[int, Any]:
        """Send a request; return (status, parsed body). Raises RequestError for transport problems,
        redirects, bodies larger than the cap and malformed JSON.

        ``timeout`` (default: the session's) bounds the whole request. ``max_bytes`` caps the decoded
        body; by default :func:`chat_max_bytes` of the body's ``max_tokens``, :data:`GET_MAX_BYTES` for a
        request without a body, and that plus 64 bytes per byte sent for other requests.
        HTTP error statuses are returned, not raised, so callers can probe optional endpoints;
        :meth:`post` raises on them. A body that is not JSON at all comes back as a non-dict object.
        """
        __tracebackhide__ = True  # its locals hold the URL with its query token
        where = f"{method} {path}"
        head = f"{where} to {self.shown}"
        url = self.url_for(path)
        limit = timeout if timeout is not None else self.timeout
        cap, why = (max_bytes, "more than this request allows") if max_bytes is not None \
            else _default_cap(method, body)
        deadline = _Deadline(limit)
        try:
            with deadline:
                resp = self.session.request(method, url, json=body, timeout=(min(10.0, limit), limit),
                                            stream=True, allow_redirects=False)
                try:
                    if 300 <= resp.status_code < 400:
                        raise self._redirect(head, where, url, resp)
                    raw = _read(resp, cap, deadline)
                finally:
                    resp.close()
        except RequestError:
            raise
        except _TooLarge:
            raise self._fail(where, f"{head}: the body is larger than {cap} bytes once decoded ({why}); "
                                    f"reading stopped there", resp.status_code) from None
        except _BadBody as exc:
            raise self._fail(where, f"{head}: {exc}", resp.status_code) from None
        except Exception as exc:
            raise self._transport_error(head, where, limit, exc, deadline.fired) from None
        text = raw.decode("utf-8", "replace")
        if not expect_json:
            return resp.status_code, text
        try:
            return resp.status_code, _parse(text)
        except _Malformed as exc:
            raise self._fail(where, f"{head}: HTTP {resp.status_code} but the body is malformed JSON ({exc})",
                             resp.status_code) from None

    def _redirect(self, head: str, where: str, url: str, resp: requests.Response) -> RequestError:
        location = resp.headers.get("Location")
        if not location:
            return self._fail(where, f"{head}: HTTP {resp.status_code} (a redirect without a Location); "
                                     f"redirects are not followed", resp.status_code)
        target = urljoin(url, location)
        other = " (another origin)" if _origin(target) != _origin(url) else ""
        shown = self._show(display_url(target), 200)
        return self._fail(where, f"{head}: HTTP {resp.status_code} redirect to {shown}{other}; redirects are "
                                 f"not followed, so credentials never go elsewhere: give the URL it points "
                                 f"to",
                          resp.status_code)

    def _transport_error(self, head: str, where: str, limit: float, exc: Exception, fired: bool
                         ) -> RequestError:
        if fired or isinstance(exc, (requests.exceptions.Timeout, urllib3.exceptions.TimeoutError,
                                     socket.timeout)):
            return self._fail(where, f"{head}: no answer within {limit:g} s (--cachecheck-timeout)")
        if isinstance(exc, (requests.exceptions.ChunkedEncodingError, urllib3.exceptions.ProtocolError,
                            _CutShort)):
            # the status line and headers came, then the connection closed before the whole body
            return self._fail(where, f"{head}: the body was cut short (the connection closed before the "
                                     f"whole answer arrived)")
        if isinstance(exc, requests.exceptions.ConnectionError):
            return self._fail(where, f"{head}: connection failed ({_connection_reason(exc, self._show)})")
        return self._fail(where, f"{head}: {type(exc).__name__}: {self._show(str(exc))}")

    def get(self, path: str, *, timeout: Optional[float] = None,
            max_bytes: Optional[int] = None) -> Tuple[int, Any]:
        return self.request("GET", path, timeout=timeout, max_bytes=max_bytes)

    def post(self, path: str, body: Dict[str, Any], *, max_bytes: Optional[int] = None) -> Dict[str, Any]:
        """POST JSON and return the JSON object; any HTTP error or malformed body raises RequestError.
        ``max_bytes`` as in :meth:`request` (by default derived from ``body["max_tokens"]``)."""
        where = f"POST {path}"
        status, data = self.request("POST", path, body, max_bytes=max_bytes)
        if status >= 400:
            raise self._fail(where, f"{where} to {self.shown}: HTTP {status}: "
                                    f"{_error_message(data, self._show)}", status)
        if isinstance(data, _NotJson):
            raise self._fail(where, f"{where} to {self.shown}: HTTP {status} but the body is not JSON "
                                    f"('{self._show(data.text, 120)}')", status)
        if not isinstance(data, dict):
            raise self._fail(where, f"{where} to {self.shown}: HTTP {status} but the body is not a JSON "
                                    f"object", status)
        return data


# -- reading: a cap on decoded bytes, a deadline for the whole request ------------------------------------
class _TooLarge(Exception):
    pass


class _CutShort(Exception):
    pass


class _BadBody(Exception):
    """A body that cannot be decoded; the message names why."""


_ACTIVE = threading.local()  # the deadline of the request this thread is sending


class _Deadline:
    """Shuts down the sockets of the current request when ``seconds`` have passed.

    requests' timeouts bound each socket read, not the request: a server that sends a byte every half
    second would hold it for ever. The connection pools below tell the deadline which connections the
    request uses; shutting their sockets down makes the blocked read return at once.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds
        self.conns: List[Any] = []
        self.fired = False
        self._done = False
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def __enter__(self) -> "_Deadline":
        _ACTIVE.deadline = self
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()
        _ACTIVE.deadline = None

    def expired(self) -> bool:
        return self.fired or time.monotonic() >= self.end

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.fired = True
            for conn in self.conns:
                sock = getattr(conn, "sock", None)
                if sock is not None:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass


def _watch(conn: Any) -> Any:
    deadline = getattr(_ACTIVE, "deadline", None)
    if deadline is not None:
        deadline.conns.append(conn)
    return conn


class _WatchedPool(HTTPConnectionPool):
    def _get_conn(self, timeout: Optional[float] = None) -> Any:
        return _watch(super()._get_conn(timeout))


class _WatchedHTTPSPool(HTTPSConnectionPool):
    def _get_conn(self, timeout: Optional[float] = None) -> Any:
        return _watch(super()._get_conn(timeout))


class _Session(requests.Session):
    def get_redirect_target(self, resp: requests.Response) -> None:
        # never followed, and not even worked out: requests would decode the Location as UTF-8 and raise
        # on a byte that is not; Http.request reports the redirect itself
        return None


class _WatchedAdapter(HTTPAdapter):
    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _WatchedPool, "https": _WatchedHTTPSPool}


class _Decoder:
    """Content-Encoding gzip, deflate (zlib or raw) or none, decoding at most ``room`` bytes per call:
    a gzip bomb never expands in memory beyond the cap."""

    def __init__(self, encoding: str) -> None:
        name = encoding.strip().lower()
        self.name = name
        if name in ("", "identity"):
            self._z = None
        elif name in ("gzip", "x-gzip"):
            self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif name == "deflate":
            self._z = zlib.decompressobj(zlib.MAX_WBITS)
        else:
            raise _BadBody(f"the body is encoded with '{printable(encoding, 40)}', which is not decoded here "
                           f"(the request asked for gzip or deflate)")
        self._started = False

    def decode(self, data: bytes, room: int) -> bytes:
        if self._z is None:
            return data
        out = b""
        while data and len(out) < room:
            try:
                out += self._z.decompress(data, room - len(out))
            except zlib.error:
                if self.name == "deflate" and not self._started:  # raw deflate without the zlib header
                    self._z = zlib.decompressobj(-zlib.MAX_WBITS)
                    self._started = True
                    continue
                raise _BadBody(f"the {self.name} body is corrupt") from None
            self._started = True
            if self._z.unconsumed_tail:
                break  # the output reached ``room``: the caller stops at the cap
            data = self._z.unused_data if self._z.eof and self.name != "deflate" else b""
            if data:  # another gzip member follows
                self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        return out

    def finished(self) -> bool:
        return self._z is None or self._z.eof


def _read(resp: requests.Response, cap: int, deadline: _Deadline) -> bytes:
    """The decoded body, at most ``cap`` bytes; raises _TooLarge, _CutShort, _BadBody or a transport error."""
    decoder = _Decoder(resp.headers.get("Content-Encoding", ""))
    out = bytearray()
    received = 0
    while True:
        chunk = resp.raw.read(_CHUNK, decode_content=False)
        if deadline.expired():
            raise socket.timeout()
        if not chunk:
            break
        received += len(chunk)
        out += decoder.decode(chunk, cap - len(out) + 1)
        if len(out) > cap:
            raise _TooLarge()
    length = resp.headers.get("Content-Length", "")
    chunked = "chunked" in resp.headers.get("Transfer-Encoding", "").lower()
    if (length.isdigit() and not chunked and received < int(length)) or (out and not decoder.finished()):
        raise _CutShort()
    return bytes(out)


def _origin(url: str) -> Tuple[str, str, Optional[int]]:
    try:
        parts = urlsplit(url)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
        return parts.scheme.lower(), (parts.hostname or ""), port
    except ValueError:
        return ("", url, None)


# -- parsing ------------------------------------------------------------------------------------------
class _Malformed(Exception):
    """JSON that parses into something no server should send; the message names what."""


class _NotJson:
    def __init__(self, text: str) -> None:
        self.text = text


def _constant(name: str) -> Any:
    raise _Malformed(f"{name}, which is not JSON")


def _int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise _Malformed(f"an integer of {len(digits.lstrip('-'))} digits")
    return int(digits)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Malformed(f"a number too large for a float ({printable(text, 40)})")
    return value


def _clean(obj: Any, depth: int = 1) -> Any:
    """Every string (keys too) with lone surrogates replaced; refuses nesting deeper than MAX_DEPTH."""
    if isinstance(obj, str):
        return clean_text(obj)
    if isinstance(obj, (dict, list)) and depth > MAX_DEPTH:
        raise _Malformed(f"nested more than {MAX_DEPTH} levels deep")
    if isinstance(obj, dict):
        return {clean_text(k): _clean(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v, depth + 1) for v in obj]
    return obj


def _parse(text: str) -> Any:
    """The parsed, cleaned JSON body; None for an empty body; :class:`_NotJson` for text that is no JSON."""
    text = text[1:] if text.startswith("\ufeff") else text
    if not text.strip():
        return None
    try:
        data = json.loads(text, parse_constant=_constant, parse_int=_int, parse_float=_float)
    except RecursionError:
        raise _Malformed(f"nested more than {MAX_DEPTH} levels deep") from None
    except ValueError:
        return _NotJson(text)
    return _clean(data)


def nested_too_deep(text: str) -> bool:
    """Whether JSON text (a tool call's arguments, which a body carries as a string) nests more than
    MAX_DEPTH levels deep; text that is not JSON is not judged here."""
    try:
        _clean(json.loads(text))
    except (RecursionError, _Malformed):
        return True
    except ValueError:
        return False
    return False


def _error_message(data: Any, show: Callable[[str], str] = printable) -> str:
    """The server's error message, scrubbed, escaped and shortened by ``show``."""
    if isinstance(data, _NotJson):
        return show(data.text) or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("detail") or err.get("msg")
            if msg:
                return show(str(msg))
        elif isinstance(err, str):
            return show(err)
        if data.get("message"):
            return show(str(data["message"]))
    return show(json.dumps(data, ensure_ascii=False)) if data is not None else "(empty body)"


def _connection_reason(exc: Exception, show: Callable[[str, int], str] = printable) -> str:
    text = str(exc)
    for needle, reason in (("Connection refused", "connection refused"),
                           ("RemoteDisconnected", "the server closed the connection without answering"),
                           ("Connection reset", "connection reset by the server"),
                           ("IncompleteRead", "the body was cut short"),
                           ("Name or service not known", "host name not known"),
                           ("ProtocolError", "the server broke the HTTP protocol")):
        if needle in text:
            return reason
    return show(text, 160)
