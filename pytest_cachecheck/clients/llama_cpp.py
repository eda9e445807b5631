"""llama.cpp's llama-server: ``/v1/chat/completions`` with per-request ``cache_prompt``.

The hit counter is ``timings.cache_n`` (the same value as ``usage.prompt_tokens_details.cached_tokens``).
``"samplers": ["temperature"]`` leaves only the greedy arg-max, so no penalty or GGUF default can act.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from ..errors import RequestError
from .base import ChatClient, Reply, int_or_none, parse_logprobs


class LlamaCppClient(ChatClient):
    kind = "llama.cpp"

    def chat(self, messages: List[Dict[str, str]], *, max_tokens: int, cache: Dict[str, Any],
             logprobs: bool = False) -> Reply:
        body: Dict[str, Any] = {
            "messages": messages,
            "temperature": 0,
            "max_tokens": max_tokens,
            "stream": False,
            "samplers": ["temperature"],
            "id_slot": 0,
        }
        body.update(self.logprob_fields(logprobs))
        body.update(cache)
        where = f"POST /v1/chat/completions to {self.http.shown}"
        data = self.http.post("/v1/chat/completions", body)
        content, finish, usage = self.parse_choice(data, where)
        cached: Optional[int] = None
        timings = data.get("timings")
        if isinstance(timings, dict):
            cached = int_or_none(timings.get("cache_n"))
        if cached is None:
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict):
                cached = int_or_none(details.get("cached_tokens"))
        prompt = int_or_none(usage.get("prompt_tokens"))
        completion = int_or_none(usage.get("completion_tokens"))
        if prompt is None or completion is None:
            raise RequestError(f"{where}: usage lacks prompt_tokens or completion_tokens", where=where)
        return Reply(content, finish, prompt, completion, cached, parse_logprobs(data["choices"][0]),
                     self.reasoning_chars(data))

    def render(self, messages: List[Dict[str, str]]) -> Optional[Sequence[Any]]:
        # POST /apply-template: the chat template's text, exactly as a chat request would be prompted
        status, data = self.http.request("POST", "/apply-template", {"messages": messages})
        if status != 200 or not isinstance(data, dict) or not isinstance(data.get("prompt"), str):
            return None
        return data["prompt"]

    def token_pieces(self, text: str) -> Optional[List[str]]:
        try:
            data = self.http.post("/tokenize", {"content": text, "with_pieces": True})
        except RequestError:
            return None
        tokens = data.get("tokens")
        if not isinstance(tokens, list):
            return None
        pieces = []
        for t in tokens:
            if not isinstance(t, dict) or not isinstance(t.get("piece"), str):
                return None
            pieces.append(t["piece"])
        return pieces
