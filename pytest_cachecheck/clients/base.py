"""The client interface and the reply record shared by every server kind. Nothing here knows pytest."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import RequestError
from .http import Http


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
