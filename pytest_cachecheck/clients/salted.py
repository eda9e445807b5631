"""What vLLM and SGLang share: per-request ``cache_salt``, which keeps the cache of one salt apart from
every other's, and a ``/tokenize`` endpoint that renders chat messages with the server's template.
"""

from __future__ import annotations

import uuid
from typing import Any, Dict, List, Optional, Sequence

from .base import CachePlan, ChatClient


def new_salt() -> str:
    """A ``cache_salt`` no other request has used. vLLM (0.32 and 0.34 alike) takes a non-empty string of at most 128
    characters without '@', '/', '\\' or NUL; SGLang reads an empty one as no salt."""
    return "cachecheck-" + uuid.uuid4().hex


class SaltedClient(ChatClient):
    """A server that keeps caches apart by ``cache_salt``."""

    def cache_plan(self, own_setting: bool = False) -> CachePlan:
        salt = new_salt()  # turn 1 with a fresh salt starts clean; turn 2 with the same salt reuses it
        return CachePlan({"cache_salt": salt}, {"cache_salt": salt}, clean_start=True)

    def scratch(self) -> Optional[Dict[str, Any]]:
        return {"cache_salt": new_salt()}

    def no_early_stop(self) -> Dict[str, Any]:
        return {"ignore_eos": True}

    def body(self, messages: List[Dict[str, Any]], max_tokens: int) -> Dict[str, Any]:
        body = super().body(messages, max_tokens)
        # a model's generation_config may carry a repetition penalty that acts even at temperature 0
        body["repetition_penalty"] = 1.0
        return body

    def render(self, messages: List[Dict[str, Any]], tools: Optional[List[Dict[str, Any]]] = None
               ) -> Optional[Sequence[Any]]:
        # POST /tokenize with messages applies the template a chat request uses (generation prompt added)
        status, data = self.http.request("POST", "/tokenize", {"model": self.info.model, "messages": messages,
                                                                **({"tools": tools} if tools else {})})
        tokens = data.get("tokens") if status == 200 and isinstance(data, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            return None
        return tokens
