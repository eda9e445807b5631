"""The SGLang kind: its routes besides the generation endpoints: ``/server_info``, ``/model_info``, the
``/health`` that generates one token through the radix cache, ``/flush_cache``, ``/ready``, ``/tokenize``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .config import HEALTH_CHECK_POLL_SECONDS, Kind

if TYPE_CHECKING:
    from .core import Routes, _Handler


class SglangKind(Kind):
    """SGLang's informational routes, bound to one emulator."""

    def routes(self) -> Routes:
        e = self.emu
        return {
            **super().routes(),
            "/server_info": (("GET",), self.server_info),
            "/get_server_info": (("GET",), self.server_info),
            "/model_info": (("GET",), self.model_info),
            "/health": (("GET",), lambda h: self.health(h, e.config.health_generates)),
            "/health_generate": (("GET",), lambda h: self.health(h, True)),
            "/ready": (("GET",), lambda h: h.send_body(200, b"")),
            "/flush_cache": (("GET", "POST"), self.flush_cache),
            "/v1/tokenize": (("POST",), e._tokenize),
        }

    def server_info(self, h: _Handler) -> None:
        cfg = self.emu.config
        info = {
            "model_path": cfg.model,
            "tokenizer_path": cfg.model,
            "tokenizer_mode": "auto",
            "served_model_name": cfg.model,
            "host": self.emu.host,
            "port": self.emu.port,
            "api_key": None,
            "context_length": cfg.max_model_len,
            "page_size": cfg.block_size,
            "disable_radix_cache": not cfg.prefix_caching,
            "enable_cache_report": cfg.report_cached_tokens,
            "sampling_defaults": cfg.sampling_defaults,
            "enable_deterministic_inference": False,
            "attention_backend": "fa3",
            "sampling_backend": "flashinfer",
            "schedule_policy": "fcfs",
            "radix_eviction_policy": "lru",
            "chunked_prefill_size": 8192,
            "max_running_requests": None,
            "strip_thinking_cache": False,
            "enable_metrics": False,
            "tp_size": 1,
            "dp_size": 1,
            "max_total_num_tokens": 200_000,
            "max_req_input_len": cfg.max_model_len - 5,
            "internal_states": [{"last_gen_throughput": 0.0, "memory_usage": {}}],
            "version": cfg.version,
        }
        h.send_json(200, info)

    def model_info(self, h: _Handler) -> None:
        cfg = self.emu.config
        h.send_json(
            200,
            {
                "model_path": cfg.model,
                "tokenizer_path": cfg.model,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "qwen2",
                "architectures": ["Qwen2ForCausalLM"],
                "served_model_name": cfg.model,
            },
        )

    def health(self, h: _Handler, generate: bool) -> None:
        """SGLang's ``health_generate`` (srt/entrypoints/http_server.py:721-790), behind both ``GET /health``
        and ``GET /health_generate``.

        With ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION`` false (``generate=False``) ``/health`` answers 200 at
        once (:745-749). Otherwise it generates one token (greedy) for ``input_ids=[0]`` (:751-766); the
        request goes through the radix cache like any other, so its (prompt + output - 1) = [0] is inserted
        (a full page only when G = 1). The handler then ``await asyncio.sleep(1)`` before it first looks for
        the reply (:778-780), so it answers after at least one second: modelled with a 1 s wait outside the
        generation lock (other requests are served meanwhile).
        """
        if not generate:
            h.send_body(200, b"")
            return
        tic = time.monotonic()
        with self.emu._lock:
            self.emu.health_generations += 1
            if self.emu.config.prefix_caching:
                self.emu._cache.insert([0], None)
        if self.emu._stopping.wait(max(HEALTH_CHECK_POLL_SECONDS - (time.monotonic() - tic), 0.0)):
            h.abort()  # stopped while waiting
            return
        h.send_body(200, b"")

    def flush_cache(self, h: _Handler) -> None:
        h.read_body()
        self.emu.reset_cache()
        h.send_body(
            200,
            b"Cache flushed.\nPlease check backend logs for more details. (When there are running "
            b"or waiting requests, the operation will not be performed.)\n",
            "text/plain",
        )
