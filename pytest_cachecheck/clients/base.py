"""The client interface, the reply record and the HTTP layer shared by every server kind.

Nothing here knows about pytest. Every failure becomes :class:`RequestError` with the server's status
and message; secrets never reach an error text (the URL is kept without credentials).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit, urlunsplit

import requests

from ..errors import RequestError
from ..redact import Redactor, display_url, split_credentials


@dataclass
class Reply:
    """One chat completion as the plugin needs it."""

    content: str
    finish_reason: Optional[str]
    prompt_tokens: Optional[int]
    completion_tokens: Optional[int]
    cached_tokens: Optional[int]  # None = the server did not report it (unknown, never 0)
    #: per answer token (token text, its logprob, top-1 minus top-2 logprob), where logprobs were asked for
    logprobs: Optional[List[Tuple[str, Optional[float], Optional[float]]]] = None
    #: characters of reasoning the server split off the answer (``reasoning_content`` / ``reasoning``)
    reasoning_chars: int = 0

    def to_dict(self) -> Dict[str, Any]:
        return {
            "content": self.content,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "reasoning_chars": self.reasoning_chars,
        }


@dataclass
class ServerInfo:
    """What the server says about itself."""

    kind: str  # llama.cpp | vllm | sglang | openai
    build: Optional[str] = None
    model: Optional[str] = None
    models: List[str] = field(default_factory=list)
    details: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return {"kind": self.kind, "build": self.build, "model": self.model, "details": self.details}


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


REPORTING_FLAGS = {
    "vllm": "vLLM: --enable-prompt-tokens-details",
    "sglang": "SGLang: --enable-cache-report",
    "openai": "vLLM: --enable-prompt-tokens-details; SGLang: --enable-cache-report",
    "llama.cpp": "llama-server reports timings.cache_n always: is this a stock llama-server?",
}


class ChatClient:
    """One server. Subclasses build the request body and read the counters of their server kind."""

    kind = "openai"

    def __init__(self, http: Http, info: ServerInfo) -> None:
        self.http = http
        self.info = info

    @property
    def reporting_flag(self) -> str:
        """The server flag that turns cached-token reporting on, named when the counter is missing."""
        return REPORTING_FLAGS.get(self.info.kind, REPORTING_FLAGS["openai"])

    def chat(self, messages: List[Dict[str, str]], *, max_tokens: int,
             cache: Dict[str, Any], logprobs: bool = False) -> Reply:
        """One greedy, non-streamed chat completion. ``cache`` holds the mode's cache fields."""
        raise NotImplementedError

    def token_pieces(self, text: str) -> Optional[List[str]]:
        """The text as the server's tokens, where the server can say; else None."""
        return None

    def render(self, messages: List[Dict[str, str]]) -> Optional[Sequence[Any]]:
        """The prompt the server's chat template makes of ``messages`` (with the generation prompt), as text
        or token ids, where the server has an endpoint for it; else None. Generates nothing."""
        return None

    @staticmethod
    def logprob_fields(want: bool) -> Dict[str, Any]:
        """Ask for the top-2 logprobs of each answer token (never prompt logprobs: they bypass caches)."""
        return {"logprobs": True, "top_logprobs": 2} if want else {}

    @staticmethod
    def parse_choice(data: Dict[str, Any], where: str) -> Tuple[str, Optional[str], Dict[str, Any]]:
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise RequestError(f"{where}: the response has no choices", where=where)
        message = choices[0].get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if content is None and isinstance(message, dict) and _reasoning(message):
            content = ""  # a reasoning model that spent every token thinking: an empty answer, not a fault
        if not isinstance(content, str):
            raise RequestError(f"{where}: the response has no message content", where=where)
        usage = data.get("usage")
        if not isinstance(usage, dict):
            raise RequestError(f"{where}: the response has no usage counts", where=where)
        return content, choices[0].get("finish_reason"), usage

    @staticmethod
    def reasoning_chars(data: Dict[str, Any]) -> int:
        """Characters of reasoning a reasoning parser split off the answer: ``reasoning_content``
        (llama-server, SGLang, older vLLM) or ``reasoning`` (vLLM 0.34)."""
        return len(_reasoning(data["choices"][0].get("message") or {}))


def _reasoning(message: Dict[str, Any]) -> str:
    """The reasoning a reasoning parser split off a reply's message, or "" when there is none."""
    for key in ("reasoning_content", "reasoning"):
        text = message.get(key)
        if isinstance(text, str) and text:
            return text
    return ""


def parse_logprobs(choice: Dict[str, Any]) -> Optional[List[Tuple[str, Optional[float], Optional[float]]]]:
    """OpenAI-style ``choices[0].logprobs.content`` as (token, logprob, top-2 margin) per token."""
    block = choice.get("logprobs")
    content = block.get("content") if isinstance(block, dict) else None
    if not isinstance(content, list):
        return None
    out: List[Tuple[str, Optional[float], Optional[float]]] = []
    for entry in content:
        if not isinstance(entry, dict) or not isinstance(entry.get("token"), str):
            return None
        raw = [t.get("logprob") for t in entry.get("top_logprobs") or [] if isinstance(t, dict)]
        top = sorted((float(x) for x in raw if isinstance(x, (int, float))), reverse=True)
        margin = top[0] - top[1] if len(top) >= 2 else None
        lp = entry.get("logprob")
        out.append((entry["token"], float(lp) if isinstance(lp, (int, float)) else None, margin))
    return out


def int_or_none(value: Any) -> Optional[int]:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None
