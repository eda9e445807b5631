"""vLLM's OpenAI-compatible server: per-request ``cache_salt``; detected by ``GET /version``.

``usage.prompt_tokens_details.cached_tokens`` is reported only with ``--enable-prompt-tokens-details``.
The cache block size and whether prefix caching is on come from the ``vllm:cache_config_info`` metric.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Optional

from ..errors import RequestError
from .base import ServerInfo, get_json
from .http import Http
from .salted import SaltedClient


class VllmClient(SaltedClient):
    kind = "vllm"
    reporting_flag = "vLLM: --enable-prompt-tokens-details"

    @classmethod
    def detect(cls, http: Http) -> Optional[ServerInfo]:
        version = get_json(http, "/version")
        if version is None or not isinstance(version.get("version"), str):
            return None
        return ServerInfo(kind=cls.kind, build=version["version"], details=_cache_config(http))

    def block_size(self) -> Optional[int]:
        value = self.info.details.get("block_size")
        return value if isinstance(value, int) and value > 0 else None

    def prefix_caching(self) -> Optional[bool]:
        value = self.info.details.get("enable_prefix_caching")
        return value if isinstance(value, bool) else None


def _cache_config(http: Http) -> Dict[str, Any]:
    """Block size and prefix caching from the ``vllm:cache_config_info`` metric's labels, where served."""
    try:
        status, text = http.request("GET", "/metrics", timeout=min(http.timeout, 30.0), expect_json=False)
    except RequestError:
        return {}  # metrics are optional; detection goes on without them
    if status != 200 or not isinstance(text, str):
        return {}
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("{", 1)[1].rsplit("}", 1)[0]))
            out: Dict[str, Any] = {}
            if labels.get("block_size", "").isdigit():
                out["block_size"] = int(labels["block_size"])
            if labels.get("enable_prefix_caching") in ("True", "False"):
                out["enable_prefix_caching"] = labels["enable_prefix_caching"] == "True"
            return out
    return {}
