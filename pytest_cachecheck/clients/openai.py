"""Any other OpenAI-compatible server. Asked to keep caches apart by ``cache_salt`` in one-server mode
(servers built on vLLM often honour it; one that does not shows up as recompute reuse, with the cause
named); in two-servers mode its own setting decides, and it must report
``usage.prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from .base import CachePlan, ChatClient, ServerInfo
from .http import Http
from .salted import new_salt


class OpenAIClient(ChatClient):
    kind = "openai"

    @classmethod
    def detect(cls, http: Http) -> Optional[ServerInfo]:
        return ServerInfo(kind=cls.kind)  # what answers last: anything OpenAI-compatible

    def cache_plan(self, own_setting: bool = False) -> CachePlan:
        if own_setting:
            return CachePlan({}, {}, clean_start=False)  # no control it is known to honour
        salt = new_salt()
        return CachePlan({"cache_salt": salt}, {"cache_salt": salt}, clean_start=True)

    def scratch(self) -> Optional[Dict[str, Any]]:
        return {"cache_salt": new_salt()}
