"""SGLang's OpenAI-compatible server: per-request ``cache_salt``; detected by ``GET /server_info`` (older
releases ``/get_server_info``), which also says its page size, whether the radix cache is off and whether
cached tokens are reported (``--enable-cache-report``).

With reporting on, SGLang 0.5.23 reports ``{"cached_tokens": 0}`` on a miss; older releases leave
``prompt_tokens_details`` null then, which reads as 0 only when ``/server_info`` says reporting is on. Its ``/health`` runs a generation by default, so the
plugin never polls it during a run, and warns when it generates.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Optional

from ..errors import RequestError
from .base import Findings, ServerInfo, get_json
from .http import Http
from .salted import SaltedClient

_SERVER_INFO_KEYS = ("page_size", "disable_radix_cache", "enable_cache_report", "sampling_defaults",
                     "enable_deterministic_inference")
#: SGLang's generating /health waits at least a second (``await asyncio.sleep(1)`` before it looks for the
#: reply, sglang/srt/entrypoints/http_server.py ``health_generate``); a plain /health answers at once.
HEALTH_GENERATION_SECONDS = 0.8


class SglangClient(SaltedClient):
    kind = "sglang"
    reporting_flag = "SGLang: --enable-cache-report"

    @classmethod
    def detect(cls, http: Http) -> Optional[ServerInfo]:
        info = get_json(http, "/server_info") or get_json(http, "/get_server_info")
        if info is None or not any(k in info for k in ("page_size", "disable_radix_cache", "enable_cache_report")):
            return None
        version = info.get("version")
        return ServerInfo(kind=cls.kind, build=str(version) if version is not None else None,
                          details={k: info.get(k) for k in _SERVER_INFO_KEYS if k in info})

    @property
    def reporting(self) -> Optional[bool]:
        value = self.info.details.get("enable_cache_report")
        return value if isinstance(value, bool) else None

    def block_size(self) -> Optional[int]:
        value = self.info.details.get("page_size")
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    def prefix_caching(self) -> Optional[bool]:
        value = self.info.details.get("disable_radix_cache")
        return None if value is None else not value

    def cached_tokens(self, data: Dict[str, Any], usage: Dict[str, Any], where: str) -> Optional[int]:
        cached = super().cached_tokens(data, usage, where)
        if cached is None and usage.get("prompt_tokens_details") is None and self.reporting is True:
            return 0  # older releases: null when the hit is 0, even with --enable-cache-report
        return cached

    def check_reporting(self, found: Findings) -> None:
        if self.reporting is None:
            super().check_reporting(found)
        elif not self.reporting:
            found.problems.append(f"the sglang server at {self.http.shown} does not report cached tokens "
                                  f"(/server_info: enable_cache_report false), so cache use cannot be checked; "
                                  f"turn reporting on with {self.reporting_flag}")

    def check_health(self, found: Findings) -> None:
        """Does GET /health run a generation? (It does by default; a health checker polling it during the
        run then sends requests that batch with the probes.)"""
        start = time.monotonic()
        self.http.get("/v1/models")
        plain = time.monotonic() - start
        start = time.monotonic()
        try:
            status, _ = self.http.get("/health", timeout=30.0)
        except RequestError:
            return
        took = time.monotonic() - start
        if status == 200 and took - plain >= HEALTH_GENERATION_SECONDS:
            found.warnings.append(
                f"SGLang's /health at {self.http.shown} runs a generation (it answered in {took:.1f} s; "
                f"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is on, the default): a load balancer or Kubernetes "
                f"probe polling it during the run sends requests that batch with the probes and can change "
                f"their answers; start SGLang with SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false, or point "
                f"health checks at /ready")
        found.notes.append(f"SGLang /health answered in {took:.2f} s")
