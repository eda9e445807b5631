"""How an emulated server is "launched" (EmulatorConfig, one field per real server flag), the fault kinds
tests can inject, and the error a rejected request raises inside the emulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set, Tuple, Union

from .text import CHAT_TEMPLATES

if TYPE_CHECKING:
    from .core import Emulator, Routes

DivergeKnob = Union[
    Callable[[List[Dict[str, Any]]], bool], Set[str], frozenset, List[str], Tuple[str, ...], str, None
]


class _RequestError(Exception):
    """A request the server rejects: carries the HTTP status, message, error type and param."""

    def __init__(
        self, status: int, message: str, err_type: str = "BadRequestError", param: Optional[str] = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param


_DEFAULT_VERSIONS = {"vllm": "0.34.0", "sglang": "0.5.23"}
# SGLang's health_generate sleeps this long before it first checks for the reply (http_server.py:779).
HEALTH_CHECK_POLL_SECONDS = 1.0
FAULT_KINDS = ("429", "500", "503", "not-json", "truncated", "no-choices", "no-usage", "slow:<seconds>",
               # hostile servers: a 100 MiB body, a 256 MiB gzip bomb, one byte every <seconds>, a 307 to
               # another origin, JSON nested 100000 deep, a 5000-digit integer, a NaN counter, an error
               # message with a lone surrogate, an error message with terminal control sequences, a chat
               # answer that is a call of the request's first tool with arguments nested 5000 deep
               "huge", "gzip-bomb", "drip:<seconds>", "redirect", "nested", "bigint", "nan", "surrogate",
               "control", "nested-arguments",
               # a proxy that routed the request to another model: the answer under OTHER_MODEL's name
               "other-model")
_SIMPLE_FAULTS = ("429", "500", "503", "not-json", "truncated", "no-choices", "no-usage", "huge", "gzip-bomb",
                  "redirect", "nested", "bigint", "nan", "surrogate", "control", "nested-arguments", "other-model")
#: the model name of the "other-model" fault's answer
OTHER_MODEL = "emu/other-model"
#: the error message of the "control" fault: it would clear the line and forge a PASSED in a terminal
CONTROL_MESSAGE = "boom\x1b[2K\r\x1b[32mPASSED\x1b[0m\nforged line \u202etxt.exe"


@dataclass
class EmulatorConfig:
    """How the emulated server is "launched". Field comments give the real server flag each one stands for."""

    flavor: str = "vllm"  # "vllm" | "sglang"
    model: str = "emu/tiny-chat"  # the served model name (first in /v1/models)
    models: Optional[List[str]] = None  # several served names (vLLM --served-model-name a b); model is added
    block_size: int = 16  # vLLM --block-size / SGLang --page-size: hits are whole blocks
    prefix_caching: bool = True  # False = vLLM --no-enable-prefix-caching / SGLang --disable-radix-cache
    report_cached_tokens: bool = True  # vLLM --enable-prompt-tokens-details / SGLang --enable-cache-report
    honor_salt: bool = True  # False = a build that ignores cache_salt (and SGLang's extra_key)
    diverge_on_hit: DivergeKnob = None  # markers (str set) or callable(messages) -> bool
    api_key: Optional[str] = None  # --api-key: require "Authorization: Bearer <key>"
    version: Optional[str] = None  # default "0.34.0" (vllm) / "0.5.23" (sglang)
    max_model_len: int = 8192  # context length
    sampling_defaults: str = "openai"  # SGLang --sampling-defaults, as shown by /server_info
    fail_after_requests: Optional[int] = None  # serve this many chat requests, then die on the next one
    fault: Dict[int, str] = field(default_factory=dict)  # chat request number (1-based) -> fault kind
    cache_capacity_blocks: int = 200_000  # LRU bound on cached blocks
    # --chat-template: "chatml" | "drop-reasoning" (Qwen3: past turns keep only what follows </think>) |
    # "empty-think-prompt" (Qwen3 with enable_thinking false: the generation prompt ends with an empty think
    # block that past turns lack). Used by chat requests and /tokenize alike.
    chat_template: str = "chatml"
    # A thinking model served with --reasoning-parser qwen3: it outputs "<think>\nR\n</think>\n\n" before its
    # answer, and the chat response splits R off (vLLM message.reasoning, SGLang message.reasoning_content).
    reasoning: bool = False
    # SGLang only: SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION (default true in 0.5.23, srt/environ.py:344).
    # False: GET /health answers at once without generating; /health_generate still generates.
    health_generates: bool = True
    # SGLang only: older releases (UsageProcessor._details_if_cached) report prompt_tokens_details null when
    # the hit is 0, even with --enable-cache-report; 0.5.23 reports {"cached_tokens": 0}
    # (srt/entrypoints/openai/usage_processor.py:38-44; seen on the real server in
    # tests/test_conformance_sglang.py)
    null_details_on_miss: bool = False
    # SGLang only: False = --disable-overlap-schedule. With the overlap scheduler (the default) an answer
    # that ends with EOS before max_tokens leaves prompt + output tokens in the radix cache, one more than
    # otherwise (its KV was computed by the decode step that ran while the EOS was checked; seen on 0.5.23).
    overlap_schedule: bool = True
    # SGLang only: its /tokenize reports the tokenizer's model_max_length as max_model_len (not the context
    # length; srt/entrypoints/openai/serving_tokenize.py:47-52); None = the context length
    tokenizer_max_length: Optional[int] = None
    # Batching, for the batch measurement's controls. Each generation takes ``compute_seconds`` of wall time
    # (outside the cache lock, so generations overlap as on a continuous-batching server); ``slots`` bounds
    # how many compute at once (llama-server -np N; 0 = no bound): the others wait, queued, and compute alone.
    # ``batch_variant``: a generation that another one overlapped answers differently (from character 40,
    # as ``diverge_on_hit``'s do), as a server whose kernels' reduction order depends on the batch would.
    compute_seconds: float = 0.0
    slots: int = 0
    batch_variant: bool = False
    # The cache under load: a generation that reused cached tokens while another one overlapped it answers
    # differently (from character 40; after ``batch_variant``'s change when both apply), as a server whose
    # cache reuse goes wrong only amid other requests would. A quiet server answers as it should.
    diverge_on_hit_under_load: bool = False

    def __post_init__(self) -> None:
        if self.flavor not in _DEFAULT_VERSIONS:
            raise ValueError(f"flavor must be 'vllm' or 'sglang', not {self.flavor!r}")
        if self.chat_template not in CHAT_TEMPLATES:
            raise ValueError(
                f"chat_template must be one of {', '.join(CHAT_TEMPLATES)}, not {self.chat_template!r}"
            )
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.compute_seconds < 0 or self.slots < 0:
            raise ValueError("compute_seconds and slots must be >= 0")
        if self.version is None:
            self.version = _DEFAULT_VERSIONS[self.flavor]
        for number, kind in self.fault.items():
            _parse_fault(kind)  # fail early on a typo
            if not isinstance(number, int) or number < 1:
                raise ValueError(f"fault keys are 1-based chat request numbers, not {number!r}")

    @property
    def served_models(self) -> List[str]:
        return list(dict.fromkeys([self.model, *(self.models or [])]))  # in order, once each


def _parse_fault(kind: str) -> Tuple[str, float]:
    if kind in _SIMPLE_FAULTS:
        return kind, 0.0
    for name in ("slow", "drip"):
        if isinstance(kind, str) and kind.startswith(name + ":"):
            try:
                seconds = float(kind[len(name) + 1:])
            except ValueError:
                seconds = -1.0
            if seconds >= 0:
                return name, seconds
    raise ValueError(f"unknown fault {kind!r}; use one of {', '.join(FAULT_KINDS)}")



class Kind:
    """One server kind's routes besides the generation endpoints (:mod:`.vllm`, :mod:`.sglang`), bound to one
    emulator."""

    def __init__(self, emu: Emulator) -> None:
        self.emu = emu

    def routes(self) -> Routes:
        """The routes both kinds serve; each kind adds its own."""
        return {"/v1/models": (("GET",), self.emu._models), "/tokenize": (("POST",), self.emu._tokenize)}
