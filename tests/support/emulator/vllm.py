"""The vLLM kind: its routes besides the generation endpoints, and its ``/metrics`` text (prometheus_client's
format and labels as real vLLM 0.32.0 serves them, values from the emulator's counters and config).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List

from .config import Kind

if TYPE_CHECKING:
    from .core import Routes, _Handler


class VllmKind(Kind):
    """vLLM's informational routes, bound to one emulator."""

    def routes(self) -> Routes:
        e = self.emu
        return {
            **super().routes(),
            "/version": (("GET",), lambda h: h.send_json(200, {"version": e.config.version})),
            "/health": (("GET",), lambda h: h.send_body(200, b"")),
            "/metrics": (("GET",), self.metrics),
        }

    def metrics(self, h: _Handler) -> None:
        cfg = self.emu.config
        m = self.emu._metrics
        labels = f'engine="0",model_name="{cfg.model}"'
        # the labels of real vLLM 0.32.0 (CPU build), in its order; values from this emulator's config
        cache_labels = {
            "_block_size_resolved": "True",
            "block_size": str(cfg.block_size),
            "cache_dtype": "auto",
            "cache_hit_alignment_tokens": "None",
            "effective_attention_block_size": str(cfg.block_size),
            "enable_mamba_shared_prefix_checkpoint": "False",
            "enable_prefix_caching": str(bool(cfg.prefix_caching)),
            "engine": "0",
            "gpu_memory_utilization": "0.92",
            "hash_block_size": "None",
            "is_attention_free": "False",
            "kv_cache_dtype_skip_layers": "[]",
            "kv_cache_layout": "None",
            "kv_cache_max_concurrency": "1024.0",
            "kv_cache_memory_bytes": "1073741824",
            "kv_cache_size_tokens": "2097152",
            "kv_offloading_backend": "native",
            "kv_offloading_size": "None",
            "kv_sharing_fast_prefill": "False",
            "mamba_block_size": "None",
            "mamba_cache_dtype": "auto",
            "mamba_cache_mode": "none",
            "mamba_page_size_padded": "None",
            "mamba_ssm_cache_dtype": "auto",
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(2097152 // cfg.block_size),
            "num_gpu_blocks_override": "None",
            "prefix_cache_retention_interval": "0",
            "prefix_caching_hash_algo": "sha256",
            "prefix_match_unit": "None",
            "replayssm_buffer_len": "16",
            "skip_page_size_padded": "None",
            "sliding_window": "None",
            "swa_bounded_replay": "True",
            "use_kda_recoverssm": "False",
            "use_replayssm": "False",
            "user_specified_block_size": "False",
        }
        cache_label_text = ",".join(f'{k}="{v}"' for k, v in cache_labels.items())
        created = f"{float(self.emu._started_at):.10e}"

        def counter(name: str, help_text: str, value: float, extra: str = "") -> List[str]:
            # prometheus_client's text format as real vLLM 0.32.0 serves it: a _total sample, a _created gauge
            return [f"# HELP vllm:{name}_total {help_text}", f"# TYPE vllm:{name}_total counter",
                    f"vllm:{name}_total{{{labels}{extra}}} {float(value)}",
                    f"# HELP vllm:{name}_created {help_text}", f"# TYPE vllm:{name}_created gauge",
                    f"vllm:{name}_created{{{labels}{extra}}} {created}"]

        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} 0.0",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{labels}}} 0.0",
            *counter("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
                     m["queries"]),
            *counter("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                     m["hits"]),
            *counter("prompt_tokens", "Number of prefill tokens processed.", m["prompt_tokens"]),
            *counter("generation_tokens", "Number of generation tokens processed.", m["generation_tokens"]),
            *counter("request_success", "Count of successfully processed requests.", m["success_stop"],
                     ',finished_reason="stop"'),
            f'vllm:request_success_total{{{labels},finished_reason="length"}} {float(m["success_length"])}',
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge",
            f"vllm:cache_config_info{{{cache_label_text}}} 1.0",
        ]
        h.send_body(
            200, ("\n".join(lines) + "\n").encode("utf-8"), "text/plain; version=0.0.4; charset=utf-8"
        )

