"""OpenAI-compatible servers (vLLM, SGLang, others): ``/v1/chat/completions`` with ``cache_salt``.

The hit counter is ``usage.prompt_tokens_details.cached_tokens``; vLLM reports it only with
``--enable-prompt-tokens-details`` and SGLang only with ``--enable-cache-report``. A missing counter is
unknown, never 0, except on SGLang with reporting on (its ``/server_info`` says so), which leaves
``prompt_tokens_details`` null when nothing was reused.
"""

from __future__ import annotations

import uuid
from typing import Any, Dict, List, Optional, Sequence

from ..errors import RequestError
from .base import ChatClient, Reply, int_or_none, parse_logprobs


def new_salt() -> str:
    """A ``cache_salt`` no other request has used. vLLM 0.34 takes a non-empty string of at most 128
    characters without '@', '/', '\\' or NUL; SGLang reads an empty one as no salt."""
    return "cachecheck-" + uuid.uuid4().hex


class OpenAICompatClient(ChatClient):
    kind = "openai"

    def chat(self, messages: List[Dict[str, str]], *, max_tokens: int, cache: Dict[str, Any],
             logprobs: bool = False) -> Reply:
        body: Dict[str, Any] = {
            "model": self.info.model,
            "messages": messages,
            "temperature": 0,
            "top_p": 1,
            "n": 1,
            "max_tokens": max_tokens,
            "stream": False,
        }
        if self.info.kind in ("vllm", "sglang"):
            # a model's generation_config may carry a repetition penalty that acts even at temperature 0
            body["repetition_penalty"] = 1.0
        body.update(self.logprob_fields(logprobs))
        body.update(cache)
        where = f"POST /v1/chat/completions to {self.http.shown}"
        data = self.http.post("/v1/chat/completions", body)
        content, finish, usage = self.parse_choice(data, where)
        details = usage.get("prompt_tokens_details")
        cached = int_or_none(details.get("cached_tokens")) if isinstance(details, dict) else None
        if cached is None and details is None and self.info.kind == "sglang" \
                and self.info.details.get("enable_cache_report") is True:
            # SGLang leaves prompt_tokens_details null when the hit is 0, even with --enable-cache-report
            cached = 0
        prompt = int_or_none(usage.get("prompt_tokens"))
        completion = int_or_none(usage.get("completion_tokens"))
        if prompt is None or completion is None:
            raise RequestError(f"{where}: usage lacks prompt_tokens or completion_tokens", where=where)
        return Reply(content, finish, prompt, completion, cached, parse_logprobs(data["choices"][0]),
                     self.reasoning_chars(data))

    def render(self, messages: List[Dict[str, str]]) -> Optional[Sequence[Any]]:
        # vLLM and SGLang tokenize chat messages with the template a chat request uses (POST /tokenize;
        # the generation prompt is added by default); other servers have no such endpoint
        if self.info.kind not in ("vllm", "sglang"):
            return None
        status, data = self.http.request("POST", "/tokenize", {"model": self.info.model, "messages": messages})
        tokens = data.get("tokens") if status == 200 and isinstance(data, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            return None
        return tokens

    def token_pieces(self, text: str) -> Optional[List[str]]:
        return None
