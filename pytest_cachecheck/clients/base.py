"""The client interface every server kind implements, and what they share: the reply record, reading an
OpenAI-style chat completion, finding the model a server serves and the one rule for the model an answer
names. Nothing here knows pytest.

A client answers the questions the measurement and the setup checks ask of a server kind: which request
fields start a request from a clean state, which make turn 2 reuse turn 1's state, which compute a request
from scratch, how its cached-token counter is read and which flag turns it on, its cache block size,
whether it says prefix caching is on, and the checks only its kind needs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Optional, Sequence, Tuple

from ..errors import ModelChoiceError, RequestError, WrongModel
from ..model import Request, ServerDescription
from ..text import printable
from .http import MAX_DEPTH, Http, nested_too_deep

#: per answer token: (token text, its logprob, top-1 minus top-2 logprob)
TokenLogprob = Tuple[str, Optional[float], Optional[float]]


@dataclass
class Reply:
    """One chat completion as the plugin needs it."""

    content: str
    finish_reason: Optional[str]
    prompt_tokens: Optional[int]
    completion_tokens: Optional[int]
    cached_tokens: Optional[int]  # None = the server did not report it (unknown, never 0)
    logprobs: Optional[List[TokenLogprob]] = None  # where they were asked for
    #: characters of reasoning the server split off the answer (``reasoning_content`` / ``reasoning``)
    reasoning_chars: int = 0
    #: the tool calls of the answer: (function name, arguments as JSON text)
    tool_calls: List[Tuple[str, str]] = field(default_factory=list)

    def request(self, step: str, server: str) -> Request:
        return Request(step, server, self.content, self.finish_reason, self.prompt_tokens,
                       self.completion_tokens, self.cached_tokens, self.reasoning_chars)


@dataclass
class ServerInfo:
    """What the server says about itself."""

    kind: str  # llama.cpp | vllm | sglang | openai
    build: Optional[str] = None
    model: Optional[str] = None  # the model the run asks for and reports
    models: List[str] = field(default_factory=list)  # every model /v1/models lists
    #: every name the server gives ``model`` (vLLM's other served names, llama-server's alias and file name);
    #: an answer under any other name is another model's
    names: List[str] = field(default_factory=list)
    details: Dict[str, Any] = field(default_factory=dict)

    def describe(self) -> ServerDescription:
        return ServerDescription(self.kind, self.build, self.model, dict(self.details))


@dataclass
class CachePlan:
    """The cache fields of one cache run: ``first`` for turn 1 (a clean start where the kind can make
    one: then ``clean_start`` is true and turn 1 must reuse nothing), ``reuse`` for turn 2."""

    first: Dict[str, Any]
    reuse: Dict[str, Any]
    clean_start: bool


@dataclass
class Findings:
    """What the setup checks found: problems stop the run, warnings are shown, notes go in the report."""

    problems: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)


class ChatClient:
    """One server of one kind. Subclasses say how their kind is detected and controlled."""

    kind: ClassVar[str] = "openai"
    #: the server flag that turns cached-token reporting on, named when the counter is missing
    reporting_flag: ClassVar[str] = "vLLM: --enable-prompt-tokens-details; SGLang: --enable-cache-report"
    #: whether the server names its model so that two servers' models can be compared
    names_model: ClassVar[bool] = True

    def __init__(self, http: Http, info: ServerInfo) -> None:
        self.http = http
        self.info = info

    # -- what a kind says about itself ----------------------------------------------------------------
    @classmethod
    def detect(cls, http: Http) -> Optional[ServerInfo]:
        """The server's info when it answers like this kind, else None. Sends nothing that generates."""
        return None

    @classmethod
    def resolve_model(cls, http: Http, info: ServerInfo, wanted: Optional[str],
                      prefer: Optional[str]) -> None:
        """Set ``info.model`` to the model to ask for, and ``info.names``: the one given (``wanted``, which
        ``/v1/models`` must list), else ``prefer`` (the first server's model, for the second of a pair) where
        listed, else the only one listed. Raises ModelChoiceError. Sends nothing that generates."""
        listed = served_models(http)
        info.models = list(listed)
        if wanted is None and prefer is not None and prefer in listed:
            wanted = prefer
        info.model = choose_model(info.models, wanted, http.shown)
        root = listed.get(info.model)  # vLLM answers under its first served name, whichever was asked for
        info.names = [m for m, r in listed.items() if m == info.model or (root and r == root)]

    def block_size(self) -> Optional[int]:
        """The hit granularity the server reports (vLLM block size, SGLang page size)."""
        return None

    def prefix_caching(self) -> Optional[bool]:
        """Whether the server says prefix caching is on (None when it does not say)."""
        return None

    def setup_problems(self) -> List[str]:
        """Settings this server reported that would spoil the measurement, each with its fix."""
        return []

    # -- the cache controls ---------------------------------------------------------------------------
    def cache_plan(self, own_setting: bool = False) -> CachePlan:
        """The fields of one cache run. ``own_setting``: the server's own cache setting decides turn 2 (the
        caching server of two-servers mode, so that a both-caches-off control stays off)."""
        return CachePlan({}, {}, clean_start=False)

    def scratch(self) -> Optional[Dict[str, Any]]:
        """The fields of a request computed from scratch on this server, or None when it has no control."""
        return None

    def unpinned(self) -> Dict[str, Any]:
        """The fields that let the server run a request on any free slot, beside others in flight (the batch
        measurement's requests); {} where the kind pins nothing."""
        return {}

    def as_app(self) -> Dict[str, Any]:
        """The fields an application sends (the order measurement's requests): no cache control field, so the
        server's own defaults decide, and no pinned slot."""
        return self.unpinned()

    def beside_cache(self, i: int) -> Dict[str, Any]:
        """The fields that run background request ``i`` (0-based) beside others in flight without taking the
        cache path's state (the cache under load); the unpinned fields where the kind keeps no state per
        slot."""
        return self.unpinned()

    def no_early_stop(self) -> Dict[str, Any]:
        """The fields that make a request answer its whole ``max_tokens`` (the batch measurement's background,
        whose length is its shape's); {} where the kind has none it is known to honour."""
        return {}

    # -- requests -------------------------------------------------------------------------------------
    def chat(self, messages: List[Dict[str, Any]], *, max_tokens: int, cache: Dict[str, Any],
             logprobs: bool = False, tools: Optional[List[Dict[str, Any]]] = None,
             tool_choice: Any = None) -> Reply:
        """One greedy, non-streamed chat completion; ``cache`` holds the mode's cache fields; ``tools`` and
        ``tool_choice`` are OpenAI's."""
        body = self.body(messages, max_tokens)
        body.update(self.logprob_fields(logprobs))
        if tools:
            body["tools"] = tools
            if tool_choice is not None:
                body["tool_choice"] = tool_choice
        body.update(cache)
        where = f"POST /v1/chat/completions to {self.http.shown}"
        data = self.http.post("/v1/chat/completions", body)
        content, finish, usage = parse_choice(data, where)
        check_answer_model(data, self.info, self.http.shown)
        prompt = counter(usage, ("prompt_tokens",), where)
        completion = counter(usage, ("completion_tokens",), where)
        if prompt is None or completion is None:
            raise RequestError(f"{where}: usage lacks prompt_tokens or completion_tokens", where=where)
        return Reply(content, finish, prompt, completion, self.cached_tokens(data, usage, where),
                     parse_logprobs(data["choices"][0], where), reasoning_chars(data),
                     parse_tool_calls(data["choices"][0], where))

    def body(self, messages: List[Dict[str, Any]], max_tokens: int) -> Dict[str, Any]:
        return {"model": self.info.model, "messages": messages, "temperature": 0, "top_p": 1, "n": 1,
                "max_tokens": max_tokens, "stream": False}

    def cached_tokens(self, data: Dict[str, Any], usage: Dict[str, Any], where: str) -> Optional[int]:
        """``usage.prompt_tokens_details.cached_tokens``; None when the server did not report it."""
        details = usage.get("prompt_tokens_details")
        if not isinstance(details, dict):
            return None
        return counter(details, ("cached_tokens",), where, "usage.prompt_tokens_details.")

    @staticmethod
    def logprob_fields(want: bool) -> Dict[str, Any]:
        """Ask for the top-2 logprobs of each answer token (never prompt logprobs: they bypass caches)."""
        return {"logprobs": True, "top_logprobs": 2} if want else {}

    def render(self, messages: List[Dict[str, Any]], tools: Optional[List[Dict[str, Any]]] = None
               ) -> Optional[Sequence[Any]]:
        """The prompt the server's chat template makes of ``messages`` (and ``tools``; with the generation
        prompt), as text or token ids, where the server has an endpoint for it; else None. Generates
        nothing."""
        return None

    def token_pieces(self, text: str) -> Optional[List[str]]:
        """The text as the server's tokens, where the server can say; else None."""
        return None

    # -- the checks only this kind needs (see checks.run_checks) --------------------------------------
    def check_reporting(self, found: Findings) -> None:
        """Does a reply carry the cached-token counter? One one-token request."""
        reply = self.chat([{"role": "user", "content": "Reply with one word."}], max_tokens=1,
                          cache=self.cache_plan(own_setting=True).first)
        if reply.cached_tokens is None:
            found.problems.append(f"the {self.info.kind} server at {self.http.shown} did not report cached "
                                  f"tokens (usage.prompt_tokens_details.cached_tokens is missing), so cache use "
                                  f"cannot be checked; turn reporting on with {self.reporting_flag}")

    def check_host_cache(self, found: Findings) -> None:
        """A second cache tier that can restore a prompt the live cache no longer holds."""

    def check_health(self, found: Findings) -> None:
        """A health endpoint whose polling would batch with the probes."""


# -- reading replies ----------------------------------------------------------------------------------------
def parse_choice(data: Dict[str, Any], where: str) -> Tuple[str, Optional[str], Dict[str, Any]]:
    """(content, finish_reason, usage) of an OpenAI-style chat completion."""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise RequestError(f"{where}: the response has no choices", where=where)
    message = choices[0].get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if content is None and isinstance(message, dict) and (reasoning(message) or message.get("tool_calls")):
        content = ""  # all tool calls, or all reasoning: an empty answer, not a fault
    if not isinstance(content, str):
        raise RequestError(f"{where}: the response has no message content", where=where)
    usage = data.get("usage")
    if not isinstance(usage, dict):
        raise RequestError(f"{where}: the response has no usage counts", where=where)
    finish = choices[0].get("finish_reason")
    return content, finish if isinstance(finish, str) else None, usage


def check_answer_model(data: Dict[str, Any], info: ServerInfo, shown_url: str) -> None:
    """The rule for every answer's ``model`` field, whatever the server kind: an answer under a name that is
    not one of the run's model (``info.model`` or one of ``info.names``) is another model's, so it raises
    WrongModel. An answer that names no model passes: there is nothing to compare. (llama-server answers
    under its own name for its model whatever the request said, vLLM under its first served name, SGLang
    under the name asked for.)"""
    answered = data.get("model")
    if not isinstance(answered, str) or not answered or not info.model:
        return
    if answered != info.model and answered not in info.names:
        raise WrongModel(f"the server at {shown_url} answered as model {printable(repr(answered), 120)}, not "
                         f"{printable(repr(info.model), 120)}, so the answer is another model's")


def parse_tool_calls(choice: Dict[str, Any], where: str) -> List[Tuple[str, str]]:
    """``choices[0].message.tool_calls`` as (name, arguments JSON text): the text as the server gave it, to be
    fed forward unchanged; arguments given as an object are written as JSON in the server's key order. A
    call without a function name, or with arguments nested more than MAX_DEPTH levels, is a malformed
    reply."""
    message = choice.get("message")
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if not calls:
        return []
    if not isinstance(calls, list):
        raise RequestError(f"{where}: malformed tool_calls (not a list)", where=where)
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise RequestError(f"{where}: malformed tool call (no function name)", where=where)
        args = fn.get("arguments") if isinstance(fn, dict) else None
        if isinstance(args, str) and nested_too_deep(args):
            raise RequestError(f"{where}: the server's tool-call arguments are nested more than {MAX_DEPTH} "
                               f"levels deep", where=where)
        out.append((name, args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)))
    return out


def counter(obj: Dict[str, Any], keys: Sequence[str], where: str, prefix: str = "usage.") -> Optional[int]:
    """A token counter: its whole-number value (even an impossible one, which the measurement judges),
    None when absent or null, and a RequestError when it is not a whole number (malformed, not missing)."""
    for key in keys:
        value = obj.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            shown = json.dumps(value)[:40] if isinstance(value, (str, int, float)) else type(value).__name__
            raise RequestError(f"{where}: malformed counter {prefix}{key} = {shown}: not a whole number",
                               where=where)
        return value
    return None


def reasoning(message: Dict[str, Any]) -> str:
    """The reasoning a reasoning parser split off a reply's message: ``reasoning_content`` (llama-server,
    SGLang, older vLLM) or ``reasoning`` (vLLM 0.34); "" when there is none."""
    for key in ("reasoning_content", "reasoning"):
        text = message.get(key)
        if isinstance(text, str) and text:
            return text
    return ""


def reasoning_chars(data: Dict[str, Any]) -> int:
    message = data["choices"][0].get("message")
    return len(reasoning(message)) if isinstance(message, dict) else 0


def parse_logprobs(choice: Dict[str, Any], where: str = "") -> Optional[List[TokenLogprob]]:
    """OpenAI-style ``choices[0].logprobs.content`` as (token, logprob, top-2 margin) per token; None when
    absent or unusable. Numbers outside a float's range count as absent, never as an error."""
    block = choice.get("logprobs")
    content = block.get("content") if isinstance(block, dict) else None
    if not isinstance(content, list):
        return None
    out: List[TokenLogprob] = []
    for entry in content:
        if not isinstance(entry, dict) or not isinstance(entry.get("token"), str):
            return None
        top = sorted((x for x in (_finite(t.get("logprob")) for t in entry.get("top_logprobs") or []
                                  if isinstance(t, dict)) if x is not None), reverse=True)[:2]
        margin = top[0] - top[1] if len(top) == 2 else None
        out.append((entry["token"], _finite(entry.get("logprob")), margin))
    return out


def _finite(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if number == number and abs(number) != float("inf") else None


# -- models -------------------------------------------------------------------------------------------------
def get_json(http: Http, path: str) -> Optional[Dict[str, Any]]:
    """GET ``path``: its JSON object on 200, None otherwise; refused credentials or a loading server raise."""
    status, data = http.get(path, timeout=min(http.timeout, 30.0))
    if status in (401, 403):
        raise RequestError(f"GET {path} to {http.shown}: HTTP {status}: the server refused the credentials "
                           f"(check --cachecheck-api-key)", status=status, where=f"GET {path}")
    if status == 503:
        raise RequestError(f"GET {path} to {http.shown}: HTTP 503: the server is not ready (still loading?)",
                           status=status, where=f"GET {path}")
    return data if status == 200 and isinstance(data, dict) else None


def served_models(http: Http) -> Dict[str, Optional[str]]:
    """``/v1/models``: each model id listed, in order, with its ``root`` (the weights it serves), if any."""
    data = get_json(http, "/v1/models")
    if not data or not isinstance(data.get("data"), list):
        return {}
    return {m["id"]: m.get("root") if isinstance(m.get("root"), str) and m.get("root") else None
            for m in data["data"] if isinstance(m, dict) and isinstance(m.get("id"), str)}


def some_names(names: List[str], limit: int = 10) -> str:
    listed = ", ".join(printable(n, 120) for n in names[:limit])
    return listed + (f" and {len(names) - limit} more" if len(names) > limit else "")


def choose_model(listed: List[str], wanted: Optional[str], shown_url: str) -> str:
    """The model to ask for: the one given (which the server must list), else the only one listed."""
    if wanted:
        if listed and wanted not in listed:
            raise ModelChoiceError(f"--cachecheck-model {wanted!r} is not served by {shown_url}; it lists: "
                                   + some_names(listed))
        return wanted
    if len(listed) == 1:
        return listed[0]
    if not listed:
        raise ModelChoiceError(f"{shown_url} lists no model at /v1/models; give --cachecheck-model NAME")
    raise ModelChoiceError(f"{shown_url} serves several models; choose one with --cachecheck-model: "
                           + some_names(listed))
