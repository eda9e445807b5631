"""An in-process emulation of vLLM's and SGLang's OpenAI-compatible HTTP servers, for end-to-end tests.

There is no GPU here, so the plugin's vLLM/SGLang clients are tested against this: a stdlib HTTP server
that behaves as those servers do for the parts the plugin uses (see
``shared/research/server-protocols.md`` sections 2, 3 and 5):

* a real (if trivial) tokenizer and ChatML template: the markers ``<|im_start|>`` / ``<|im_end|>`` are one
  token each, every other code point is one token, so an answer re-rendered inside the history gives the
  same tokens it was generated as;
* greedy, deterministic generation: the answer is a function of the rendered prompt only, 150-400
  characters of lowercase words, plus one EOS token (``<|im_end|>``) when it stops by itself;
* a block-hashed prefix cache (vLLM) / page-aligned radix cache (SGLang) with chained hashes, the salt
  mixed into the first block; after a request, the full blocks of ``prompt + output - 1`` tokens are kept
  (the last sampled token's KV is never computed), except that SGLang's overlap scheduler (on by default,
  ``overlap_schedule``) has already run one more decode step when an answer ends with EOS before
  ``max_tokens``, so then all ``prompt + output`` tokens are kept; a request hits
  ``floor(min(LCP, n_prompt - 1) / G) * G`` tokens;
* each server's quirks: vLLM validates ``cache_salt`` (non-empty, <= 128 chars, none of ``@ / \\`` NUL) and
  reports ``prompt_tokens_details: {"cached_tokens": 0}`` on a miss when reporting is on, and so does SGLang
  0.5.23 (``null_details_on_miss=True`` models older SGLang releases, whose
  ``UsageProcessor._details_if_cached`` left the details null whenever the hit count was 0, even with
  ``--enable-cache-report``); SGLang treats an empty salt as no salt and accepts ``extra_key``;
  SGLang's ``GET /health`` runs a one-token generation on ``input_ids=[0]`` that goes into the cache;
* knobs for tests: ``diverge_on_hit`` (chosen prompts answer differently on a cache hit, a modelled
  cache-induced flip), ``honor_salt=False`` (a build that ignores the salt), ``api_key``, and fault
  injection (``fault``, ``fail_after_requests``, :meth:`Emulator.kill`);
* Qwen3-like behaviour: ``chat_template`` (``"drop-reasoning"``: past turns lose their ``<think>`` block;
  ``"empty-think-prompt"``: the generation prompt carries an empty think block that past turns do not),
  ``reasoning=True`` (the model thinks first; the server's reasoning parser splits the reasoning off the
  answer, so a turn 2 built from ``content`` cannot reuse it), and ``health_generates=False`` (SGLang run
  with ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false``; by default its ``/health`` generates and takes
  at least one second).

The vLLM flavor's error bodies, response and usage fields and ``/metrics`` text follow real vLLM 0.32.0 where
``tests/test_conformance_vllm.py`` runs the same assertions against both (the version it reports stays
``EmulatorConfig.version``, default 0.34.0).

Run one by hand with ``python -m tests.support.emulator --flavor vllm --port 8000``.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import hashlib
import json
import socket
import threading
import time
import uuid
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple, Union
from urllib.parse import urlsplit

__all__ = [
    "EmulatorConfig",
    "Emulator",
    "IM_START",
    "IM_END",
    "EOS_TOKEN_ID",
    "THINK_START",
    "THINK_END",
    "CHAT_TEMPLATES",
    "render_chat",
    "tokenize",
    "detokenize",
    "generate_answer",
    "generate_reasoning",
    "thinking_output",
    "split_reasoning",
    "expected_cached_tokens",
]

# ------------------------------------------------------------------------------------------------------------
# Tokenizer and chat template
# ------------------------------------------------------------------------------------------------------------

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
# Ids above the Unicode range so they never collide with a code point (ordinary characters use ord(c)).
SPECIAL_TOKENS: Dict[str, int] = {IM_START: 0x110000, IM_END: 0x110001, ENDOFTEXT: 0x110002}
SPECIAL_BY_ID: Dict[int, str] = {v: k for k, v in SPECIAL_TOKENS.items()}
EOS_TOKEN_ID = SPECIAL_TOKENS[IM_END]
# Qwen3's reasoning markers. They are ordinary text to this tokenizer (one token per code point), unlike
# Qwen3's own, where each is one added token; nothing here depends on that.
THINK_START = "<think>"
THINK_END = "</think>"
#: ``EmulatorConfig.chat_template`` values: plain ChatML; Qwen3's template, which renders a past assistant
#: turn with only what follows its last ``</think>``; Qwen3's template with ``enable_thinking: false``,
#: whose generation prompt ends with an empty think block that past turns are not rendered with.
CHAT_TEMPLATES = ("chatml", "drop-reasoning", "empty-think-prompt")
EMPTY_THINK_BLOCK = f"{THINK_START}\n\n{THINK_END}\n\n"

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


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
            else:
                raise ValueError("only text content parts are supported")
        return "".join(parts)
    raise ValueError("message content must be a string or a list of text parts")


def render_chat(
    messages: Iterable[Dict[str, Any]], add_generation_prompt: bool = True, template: str = "chatml"
) -> str:
    """ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, then the generation prompt
    ``<|im_start|>assistant\\n``.

    ``template`` (one of :data:`CHAT_TEMPLATES`) models Qwen3's template:

    * ``"drop-reasoning"``: an assistant message whose content contains ``</think>`` is rendered with only
      ``content.split("</think>")[-1].lstrip("\\n")`` (Qwen3's template does so for every assistant turn
      before the last user message; here it is done for every assistant message);
    * ``"empty-think-prompt"``: the generation prompt is ``<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n``
      (Qwen3 with ``enable_thinking: false``) while past assistant turns are plain ChatML, so a turn-2
      prompt does not start with its turn-1 prompt.
    """
    if template not in CHAT_TEMPLATES:
        raise ValueError(f"chat template must be one of {', '.join(CHAT_TEMPLATES)}, not {template!r}")
    out = []
    for msg in messages:
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise ValueError("each message must be an object with a string 'role'")
        text = _content_text(msg.get("content"))
        if template == "drop-reasoning" and msg["role"] == "assistant" and THINK_END in text:
            text = text.split(THINK_END)[-1].lstrip("\n")
        for call in msg.get("tool_calls") or []:  # Hermes style, as the model generated it
            fn = call.get("function") or {} if isinstance(call, dict) else {}
            text += tool_call_text(str(fn.get("name")), str(fn.get("arguments")))
        out.append(f"{IM_START}{msg['role']}\n{text}{IM_END}\n")
    if add_generation_prompt:
        out.append(f"{IM_START}assistant\n")
        if template == "empty-think-prompt":
            out.append(EMPTY_THINK_BLOCK)
    return "".join(out)


def tokenize(text: str) -> List[int]:
    """Special markers are one token each; every other code point is one token (its ``ord``)."""
    ids: List[int] = []
    i = 0
    n = len(text)
    while i < n:
        if text[i] == "<" and text.startswith("<|", i):
            for marker, tid in SPECIAL_TOKENS.items():
                if text.startswith(marker, i):
                    ids.append(tid)
                    i += len(marker)
                    break
            else:
                ids.append(ord(text[i]))
                i += 1
        else:
            ids.append(ord(text[i]))
            i += 1
    return ids


def token_str(tid: int) -> str:
    return SPECIAL_BY_ID.get(tid) or chr(tid)


def detokenize(ids: Iterable[int]) -> str:
    return "".join(token_str(t) for t in ids)


# ------------------------------------------------------------------------------------------------------------
# Deterministic "greedy" generation
# ------------------------------------------------------------------------------------------------------------

_WORDS: Tuple[str, ...] = tuple(
    "apple river stone cloud amber quiet lantern maple orbit pepper harbor velvet meadow copper "
    "signal window garden silver candle forest marble ocean pencil rocket saddle thunder violet "
    "walnut yellow zephyr basket circle dragon engine falcon glacier hollow island jigsaw kettle "
    "ladder mirror needle oyster pillow quartz ribbon shadow tunnel umbrella valley wander canyon "
    "blossom cobalt desert ember fable granite horizon ivory juniper".split()
)
# Words used after a cache-induced divergence: disjoint from _WORDS so the two answers part visibly.
_ALT_WORDS: Tuple[str, ...] = tuple(
    "nebula trellis quiver sprocket lattice gossamer tundra bramble cinder drizzle fjord gizmo "
    "hammock inkwell jubilee kayak lagoon mosaic nugget outpost".split()
)
DIVERGE_AFTER_CHARS = 40


def _words(seed: bytes, words: Tuple[str, ...], length: int) -> str:
    """At least ``length`` characters of words from ``words``, picked by hashing ``seed``."""
    out: List[str] = []
    size = -1
    counter = 0
    digest = b""
    while size < length:
        if counter % 16 == 0:
            digest = hashlib.sha256(seed + counter.to_bytes(4, "big")).digest()
        word = words[digest[(counter % 16) * 2] % len(words)]
        out.append(word)
        size += len(word) + 1
        counter += 1
    return " ".join(out)


def _fit(text: str, length: int) -> str:
    """Cut to exactly ``length`` characters, never ending on a space."""
    text = text[:length]
    return text[:-1] + "e" if text.endswith(" ") else text


def tool_call_text(name: str, arguments: str) -> str:
    """A tool call as the emulated model writes it (and the template renders it back)."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def generate_tool_call(prompt_text: str, tools: List[Dict[str, Any]], choice: Any, flip: bool = False) -> str:
    """The greedy tool call for a rendered prompt when a call is required: the named (or first) tool,
    its first parameter set to a word chosen by the prompt's sha256 (another word when ``flip``)."""
    name = choice["function"]["name"] if isinstance(choice, dict) else tools[0]["function"]["name"]
    fn = next((t["function"] for t in tools if t["function"]["name"] == name), tools[0]["function"])
    props = list(((fn.get("parameters") or {}).get("properties") or {"input": {}}).keys()) or ["input"]
    digest = hashlib.sha256(prompt_text.encode("utf-8")).digest()
    word = _WORDS[(digest[0] + (7 if flip else 0)) % len(_WORDS)]
    return tool_call_text(name, json.dumps({props[0]: word}))


def generate_answer(prompt_text: str) -> str:
    """The greedy answer to a rendered prompt: 150-400 characters of lowercase words, from its sha256."""
    digest = hashlib.sha256(prompt_text.encode("utf-8")).digest()
    length = 150 + int.from_bytes(digest[:4], "big") % 251
    return _fit(_words(digest, _WORDS, length), length)


def generate_reasoning(prompt_text: str) -> str:
    """The greedy "thinking" for a rendered prompt (``reasoning=True``): 60-120 characters of lowercase
    words, from a sha256 of the prompt."""
    digest = hashlib.sha256(b"reasoning\x00" + prompt_text.encode("utf-8")).digest()
    length = 60 + int.from_bytes(digest[:4], "big") % 61
    return _fit(_words(digest, _WORDS, length), length)


def thinking_output(reasoning: str, answer: str) -> str:
    """A thinking model's output text (before EOS), Qwen3's shape: ``<think>\\n{R}\\n</think>\\n\\n{answer}``."""
    return f"{THINK_START}\n{reasoning}\n{THINK_END}\n\n{answer}"


def split_reasoning(text: str) -> Tuple[Optional[str], str]:
    """(reasoning, content) of a thinking model's output text, as the Qwen3 reasoning parsers split it.

    Both servers cut at the first ``</think>`` and strip nothing: the reasoning is the text between the
    leading ``<think>`` and ``</think>`` (``"\\n" + R + "\\n"`` here), the content everything after
    ``</think>`` (``"\\n\\n" + answer``), so ``"<think>" + reasoning + "</think>" + content`` is the output
    again (SGLang 0.5.23 ``BaseReasoningFormatDetector._detect_and_parse_impl``,
    srt/parser/reasoning_parser.py:163-201; vLLM 0.34 ``ParserEngine._single_pass_parse`` with
    ``strip_trailing_reasoning_whitespace=False`` for qwen3, vllm/parser/engine/parser_engine.py:794-835,
    vllm/parser/qwen3.py:328). Output cut by ``max_tokens`` before ``</think>`` is all reasoning (SGLang:
    "Assume reasoning was truncated before end token", reasoning_parser.py:188-191) and the content is empty;
    a partial marker is kept as text (kept simple: the real parsers may hold a partial ``</think>`` back).
    """
    body = text[len(THINK_START) :] if text.startswith(THINK_START) else text
    if THINK_END not in body:
        return body, ""
    reasoning, content = body.split(THINK_END, 1)
    return reasoning, content


def diverged_answer(prompt_text: str, original: str) -> str:
    """The answer on a cache hit when the diverge knob fires: the same first 40 characters, then other words.

    It has the same length as ``original`` and differs from it exactly at character 40."""
    seed = hashlib.sha256(b"diverge\x00" + prompt_text.encode("utf-8")).digest()
    keep = original[:DIVERGE_AFTER_CHARS]
    rest = _words(seed, _ALT_WORDS, len(original))
    if rest[:1] == original[len(keep) : len(keep) + 1]:  # same first letter by chance: part at once anyway
        rest = "x" + rest
    return _fit(keep + rest, len(original))


def expected_cached_tokens(lcp: int, n_prompt: int, block_size: int) -> int:
    """``floor(min(LCP, n_prompt - 1) / G) * G``: what a vLLM/SGLang request can hit."""
    usable = max(min(lcp, n_prompt - 1), 0)
    return (usable // block_size) * block_size


# ------------------------------------------------------------------------------------------------------------
# Prefix cache: chained block hashes, salt in the first block
# ------------------------------------------------------------------------------------------------------------


class PrefixCache:
    """Full blocks of ``block_size`` tokens keyed by a chained hash; the namespace (salt) enters block 0."""

    def __init__(self, block_size: int, capacity_blocks: int = 200_000) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self.block_size = block_size
        self.capacity = capacity_blocks
        self._blocks: "OrderedDict[bytes, None]" = OrderedDict()

    def _hashes(self, tokens: List[int], namespace: Optional[str], limit: int) -> Iterable[bytes]:
        g = self.block_size
        parent = b"root"
        for start in range(0, (limit // g) * g, g):
            h = hashlib.sha256(parent)
            if start == 0 and namespace is not None:
                h.update(b"\x00salt\x00" + namespace.encode("utf-8") + b"\x00")
            h.update(array.array("I", tokens[start : start + g]).tobytes())
            parent = h.digest()
            yield parent

    def lookup(self, tokens: List[int], namespace: Optional[str], max_tokens: int) -> int:
        """Leading full blocks found, within the first ``max_tokens`` tokens."""
        hit = 0
        for digest in self._hashes(tokens, namespace, min(max_tokens, len(tokens))):
            if digest not in self._blocks:
                break
            self._blocks.move_to_end(digest)
            hit += self.block_size
        return hit

    def insert(self, tokens: List[int], namespace: Optional[str]) -> None:
        for digest in self._hashes(tokens, namespace, len(tokens)):
            self._blocks[digest] = None
            self._blocks.move_to_end(digest)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()

    def __len__(self) -> int:
        return len(self._blocks)


# ------------------------------------------------------------------------------------------------------------
# Configuration
# ------------------------------------------------------------------------------------------------------------

_DEFAULT_VERSIONS = {"vllm": "0.34.0", "sglang": "0.5.23"}
# SGLang's health_generate sleeps this long before it first checks for the reply (http_server.py:779).
HEALTH_CHECK_POLL_SECONDS = 1.0
FAULT_KINDS = ("429", "500", "503", "not-json", "truncated", "no-choices", "no-usage", "slow:<seconds>",
               # hostile servers: a 100 MiB body, a 256 MiB gzip bomb, one byte every <seconds>, a 307 to
               # another origin, JSON nested 100000 deep, a 5000-digit integer, a NaN counter, an error
               # message with a lone surrogate, an error message with terminal control sequences
               "huge", "gzip-bomb", "drip:<seconds>", "redirect", "nested", "bigint", "nan", "surrogate",
               "control")
_SIMPLE_FAULTS = ("429", "500", "503", "not-json", "truncated", "no-choices", "no-usage", "huge", "gzip-bomb",
                  "redirect", "nested", "bigint", "nan", "surrogate", "control")
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

    def __post_init__(self) -> None:
        if self.flavor not in _DEFAULT_VERSIONS:
            raise ValueError(f"flavor must be 'vllm' or 'sglang', not {self.flavor!r}")
        if self.chat_template not in CHAT_TEMPLATES:
            raise ValueError(
                f"chat_template must be one of {', '.join(CHAT_TEMPLATES)}, not {self.chat_template!r}"
            )
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
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


# ------------------------------------------------------------------------------------------------------------
# HTTP plumbing
# ------------------------------------------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn serves
    disable_nagle_algorithm = True  # small JSON answers would otherwise wait ~40 ms for delayed ACKs
    server_version = "uvicorn"
    sys_version = ""
    emulator: "Emulator"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        self.emulator._register_conn(self.connection)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.emulator._unregister_conn(self.connection)

    # -- sending ---------------------------------------------------------------------------------------------

    def send_body(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: Optional[Dict[str, str]] = None,
    ) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)
        self.wfile.flush()

    def send_json(self, status: int, obj: Any, headers: Optional[Dict[str, str]] = None) -> None:
        self.send_body(status, json.dumps(obj).encode("utf-8"), "application/json", headers)

    def abort(self) -> None:
        """Drop the connection without (finishing) a response."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.wfile.flush()
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def read_body(self) -> bytes:
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    # -- verbs -----------------------------------------------------------------------------------------------

    def _dispatch(self) -> None:
        try:
            self.emulator._handle(self)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    do_GET = _dispatch
    do_POST = _dispatch
    do_PUT = _dispatch
    do_DELETE = _dispatch


# ------------------------------------------------------------------------------------------------------------
# The emulator
# ------------------------------------------------------------------------------------------------------------


class Emulator:
    """A vLLM- or SGLang-like server on 127.0.0.1 in a daemon thread. Use as a context manager.

    ``Emulator(EmulatorConfig(flavor="sglang"))`` or ``Emulator(flavor="sglang", block_size=1)``.
    """

    def __init__(
        self,
        config: Optional[EmulatorConfig] = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        **overrides: Any,
    ) -> None:
        if config is None:
            config = EmulatorConfig(**overrides)
        elif overrides:
            raise TypeError("give either a config or keyword overrides, not both")
        self.config = config
        self.host = host
        self.port = port
        self.url = ""
        self.requests_log: List[Dict[str, Any]] = []  # every chat (and completion) request body, in order
        self.every_request: List[Tuple[str, str]] = []  # (method, path) of every request of any kind
        self.health_generations = 0  # SGLang GET /health runs
        self.chat_requests = 0  # chat/completion POSTs received (the numbering `fault` uses)
        self.served_requests = 0  # requests that generated an answer
        self.in_flight = 0  # chat/completion requests received and not yet answered
        self.max_in_flight = 0  # the most that were ever in flight at once (1: no client sent in parallel)
        self._cache = PrefixCache(config.block_size, config.cache_capacity_blocks)
        self._lock = threading.Lock()  # batch size one: one generation at a time
        self._count_lock = threading.Lock()
        self._conns: Set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None
        self._stopping = threading.Event()
        self._dead = False
        self._started_at = int(time.time())
        self._fingerprint = hashlib.sha256(repr(config).encode("utf-8")).hexdigest()[:8]
        self._metrics = {
            "queries": 0,
            "hits": 0,
            "prompt_tokens": 0,
            "generation_tokens": 0,
            "success_stop": 0,
            "success_length": 0,
        }

    # -- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> "Emulator":
        if self._server is not None:
            raise RuntimeError("emulator already started")
        handler = type("_BoundHandler", (_Handler,), {"emulator": self})
        self._server = _Server((self.host, self.port), handler)
        self.port = self._server.server_address[1]
        self.url = f"http://{self.host}:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.01},
            name=f"emulator-{self.config.flavor}-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close every connection. Safe to call twice or after :meth:`kill`."""
        self._stopping.set()
        self._shutdown_listener()
        self._close_conns()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def kill(self) -> None:
        """Simulate the server dying: stop listening (later connects are refused), drop open connections."""
        self._dead = True
        self._stopping.set()
        self._shutdown_listener()
        self._close_conns()

    def reset_cache(self) -> None:
        """Forget every cached block (SGLang ``/flush_cache``, vLLM ``/reset_prefix_cache``)."""
        with self._lock:
            self._cache.clear()

    @property
    def cached_blocks(self) -> int:
        return len(self._cache)

    def __enter__(self) -> "Emulator":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _shutdown_listener(self) -> None:
        server = self._server
        if server is None:
            return
        with self._count_lock:
            if getattr(server, "_emu_closed", False):
                return
            server._emu_closed = True  # type: ignore[attr-defined]
        server.shutdown()
        server.server_close()

    def _register_conn(self, conn: socket.socket) -> None:
        with self._conns_lock:
            self._conns.add(conn)
        if self._dead:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def _unregister_conn(self, conn: socket.socket) -> None:
        with self._conns_lock:
            self._conns.discard(conn)

    def _close_conns(self) -> None:
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    # -- routing ---------------------------------------------------------------------------------------------

    @property
    def _vllm(self) -> bool:
        return self.config.flavor == "vllm"

    def _error_body(
        self, status: int, message: str, err_type: str, param: Optional[str] = None
    ) -> Dict[str, Any]:
        if self._vllm:
            return {"error": {"message": message, "type": err_type, "param": param, "code": status}}
        return {"object": "error", "message": message, "type": err_type, "param": param, "code": status}

    def _send_error(self, h: _Handler, err: _RequestError) -> None:
        h.send_json(err.status, self._error_body(err.status, err.message, err.err_type, err.param))

    def _not_found(self, h: _Handler) -> None:
        # FastAPI's default for an unknown route (real vLLM 0.32.0 too, tests/test_conformance_vllm.py)
        h.send_json(404, {"detail": "Not Found"})

    def _method_not_allowed(self, h: _Handler) -> None:
        h.send_json(405, {"detail": "Method Not Allowed"})

    def _authorized(self, h: _Handler, path: str) -> bool:
        key = self.config.api_key
        if not key:
            return True
        if self._vllm:
            protected = path.startswith("/v1")  # vLLM's AuthenticationMiddleware guards /v1 only
        else:
            protected = not path.startswith(("/health", "/metrics"))
        return not protected or h.headers.get("Authorization") == f"Bearer {key}"

    def _handle(self, h: _Handler) -> None:
        self.every_request.append((h.command, h.path))
        if self._dead:
            h.abort()
            return
        path = urlsplit(h.path).path
        method = h.command
        chat_paths = ("/v1/chat/completions", "/v1/completions")
        if path in chat_paths and method == "POST":
            self._handle_generation(h, path)
            return
        if not self._authorized(h, path):
            h.read_body()
            h.send_json(401, {"error": "Unauthorized"})
            return
        routes = self._vllm_routes() if self._vllm else self._sglang_routes()
        entry = routes.get(path)
        if entry is None:
            h.read_body()
            if path in chat_paths:
                self._method_not_allowed(h)
            else:
                self._not_found(h)
            return
        methods, fn = entry
        if method not in methods:
            h.read_body()
            self._method_not_allowed(h)
            return
        fn(h)

    def _vllm_routes(self) -> Dict[str, Tuple[Tuple[str, ...], Callable[[_Handler], None]]]:
        return {
            "/v1/models": (("GET",), self._models),
            "/version": (("GET",), lambda h: h.send_json(200, {"version": self.config.version})),
            "/health": (("GET",), lambda h: h.send_body(200, b"")),
            "/metrics": (("GET",), self._vllm_metrics),
            "/tokenize": (("POST",), self._tokenize),
            "/detokenize": (("POST",), self._detokenize),
        }

    def _sglang_routes(self) -> Dict[str, Tuple[Tuple[str, ...], Callable[[_Handler], None]]]:
        return {
            "/v1/models": (("GET",), self._models),
            "/server_info": (("GET",), self._sglang_server_info),
            "/get_server_info": (("GET",), self._sglang_server_info),
            "/model_info": (("GET",), self._sglang_model_info),
            "/get_model_info": (("GET",), self._sglang_model_info),
            "/health": (("GET",), lambda h: self._sglang_health(h, self.config.health_generates)),
            "/health_generate": (("GET",), lambda h: self._sglang_health(h, True)),
            "/ready": (("GET",), lambda h: h.send_body(200, b"")),
            "/flush_cache": (("GET", "POST"), self._sglang_flush_cache),
            "/tokenize": (("POST",), self._tokenize),
            "/v1/tokenize": (("POST",), self._tokenize),
        }

    # -- informational endpoints -----------------------------------------------------------------------------

    def _models(self, h: _Handler) -> None:
        cfg = self.config
        data = []
        for name in cfg.served_models:
            if self._vllm:
                data.append(
                    {
                        "id": name,
                        "object": "model",
                        "created": self._started_at,
                        "owned_by": "vllm",
                        "root": cfg.model,
                        "parent": None,
                        "max_model_len": cfg.max_model_len,
                        "permission": [
                            {
                                "id": f"modelperm-{uuid.uuid4().hex}",
                                "object": "model_permission",
                                "created": self._started_at,
                                "allow_create_engine": False,
                                "allow_sampling": True,
                                "allow_logprobs": True,
                                "allow_search_indices": False,
                                "allow_view": True,
                                "allow_fine_tuning": False,
                                "organization": "*",
                                "group": None,
                                "is_blocking": False,
                            }
                        ],
                    }
                )
            else:
                data.append(
                    {
                        "id": name,
                        "object": "model",
                        "created": self._started_at,
                        "owned_by": "sglang",
                        "root": cfg.model,
                        "parent": None,
                        "max_model_len": cfg.max_model_len,
                    }
                )
        h.send_json(200, {"object": "list", "data": data})

    def _vllm_metrics(self, h: _Handler) -> None:
        cfg = self.config
        m = self._metrics
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
        created = f"{float(self._started_at):.10e}"

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

    def _sglang_server_info(self, h: _Handler) -> None:
        cfg = self.config
        info = {
            "model_path": cfg.model,
            "tokenizer_path": cfg.model,
            "tokenizer_mode": "auto",
            "served_model_name": cfg.model,
            "host": self.host,
            "port": self.port,
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

    def _sglang_model_info(self, h: _Handler) -> None:
        cfg = self.config
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

    def _sglang_health(self, h: _Handler, generate: bool) -> None:
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
        with self._lock:
            self.health_generations += 1
            if self.config.prefix_caching:
                self._cache.insert([0], None)
        if self._stopping.wait(max(HEALTH_CHECK_POLL_SECONDS - (time.monotonic() - tic), 0.0)):
            h.abort()  # stopped while waiting
            return
        h.send_body(200, b"")

    def _sglang_flush_cache(self, h: _Handler) -> None:
        h.read_body()
        self.reset_cache()
        h.send_body(
            200,
            b"Cache flushed.\nPlease check backend logs for more details. (When there are running "
            b"or waiting requests, the operation will not be performed.)\n",
            "text/plain",
        )

    def _tokenize(self, h: _Handler) -> None:
        try:
            body = json.loads(h.read_body() or b"{}")
            if not isinstance(body, dict):
                raise ValueError("body must be a JSON object")
            if "messages" in body:
                text = render_chat(
                    body["messages"], bool(body.get("add_generation_prompt", True)), self.config.chat_template
                )
            elif isinstance(body.get("prompt"), str):
                text = body["prompt"]
            else:
                raise ValueError("give 'prompt' or 'messages'")
        except (ValueError, TypeError) as exc:
            self._send_error(h, _RequestError(400, str(exc), "BadRequestError"))
            return
        ids = tokenize(text)
        limit = self.config.max_model_len
        if not self._vllm and self.config.tokenizer_max_length is not None:
            limit = self.config.tokenizer_max_length
        out: Dict[str, Any] = {"count": len(ids), "max_model_len": limit, "tokens": ids}
        if self._vllm:
            out["token_strs"] = [token_str(t) for t in ids] if body.get("return_token_strs") else None
        h.send_json(200, out)

    def _detokenize(self, h: _Handler) -> None:
        try:
            body = json.loads(h.read_body() or b"{}")
            text = detokenize(int(t) for t in body["tokens"])
        except (ValueError, TypeError, KeyError) as exc:
            self._send_error(h, _RequestError(400, f"bad detokenize request: {exc}", "BadRequestError"))
            return
        h.send_json(200, {"prompt": text})

    # -- generation ------------------------------------------------------------------------------------------

    def _handle_generation(self, h: _Handler, path: str) -> None:
        with self._count_lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            self._handle_generation_counted(h, path)
        finally:
            with self._count_lock:
                self.in_flight -= 1

    def _handle_generation_counted(self, h: _Handler, path: str) -> None:
        raw = h.read_body()
        with self._count_lock:
            self.chat_requests += 1
            number = self.chat_requests
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        self.requests_log.append(
            body if isinstance(body, dict) else {"_invalid_body": raw.decode("utf-8", "replace")}
        )

        cfg = self.config
        if cfg.fail_after_requests is not None and number > cfg.fail_after_requests:
            self._dead = True  # before anything else can be served
            h.abort()
            threading.Thread(target=self.kill, daemon=True).start()
            return
        fault_kind, slow_for = _parse_fault(cfg.fault[number]) if number in cfg.fault else ("", 0.0)
        if fault_kind in ("429", "500", "503"):
            status = int(fault_kind)
            phrase = {429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}[
                status
            ]
            headers = {"retry-after": "1"} if status in (429, 503) else None
            h.send_json(
                status,
                self._error_body(
                    status,
                    f"{phrase} (emulated fault on request {number})",
                    phrase.replace(" ", "") + "Error",
                ),
                headers,
            )
            return
        if fault_kind == "slow" and self._stopping.wait(slow_for):
            h.abort()  # stopped while "slow"
            return
        if self._hostile(h, fault_kind, number):
            return
        if not self._authorized(h, path):
            h.send_json(401, {"error": "Unauthorized"})
            return
        try:
            if raw and body is None:
                raise self._validation_error("JSON decode error", "body", "json_invalid")
            if not isinstance(body, dict):
                raise self._validation_error("Input should be a valid dictionary or object to extract fields "
                                             "from", "body", "model_attributes_type")
            if path == "/v1/chat/completions":
                response, stream_chunks = self._chat(body)
            else:
                response, stream_chunks = self._completion(body)
        except _RequestError as err:
            self._send_error(h, err)
            return

        if stream_chunks is not None:
            payload = "".join(f"data: {json.dumps(c)}\n\n" for c in stream_chunks) + "data: [DONE]\n\n"
            data = payload.encode("utf-8")
            if fault_kind == "truncated":
                self._send_truncated(h, data, "text/event-stream; charset=utf-8")
            else:
                h.send_body(200, data, "text/event-stream; charset=utf-8")
            return
        if fault_kind == "no-choices":
            response["choices"] = []
        elif fault_kind == "no-usage":
            response.pop("usage", None)
        if fault_kind == "not-json":
            h.send_body(
                200, b"<html><body>502 Bad Gateway (emulated: not JSON)</body></html>", "application/json"
            )
            return
        if fault_kind == "nan":  # json.dumps writes NaN, which is not JSON
            response["usage"]["prompt_tokens_details"] = {"cached_tokens": float("nan")}
        data = json.dumps(response).encode("utf-8")
        if fault_kind == "truncated":
            self._send_truncated(h, data, "application/json")
            return
        if fault_kind == "drip":
            self._drip(h, data, slow_for)
            return
        h.send_body(200, data)

    _bomb: Optional[bytes] = None

    def _hostile(self, h: _Handler, kind: str, number: int) -> bool:
        """Answer as a hostile or broken server would, for faults that need no real reply; True if done."""
        if kind == "huge":
            total = 100 << 20
            h.send_response(200)
            h.send_header("content-type", "application/json")
            h.send_header("content-length", str(total))
            h.end_headers()
            piece = b'{"choices": [' + b" " * ((1 << 20) - 13)
            with contextlib.suppress(OSError):
                for _ in range(total >> 20):
                    h.wfile.write(piece)
            h.close_connection = True
        elif kind == "gzip-bomb":
            if Emulator._bomb is None:  # 64 gzip members of 4 MiB of zeros each: 256 MiB in 260 KB
                comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
                Emulator._bomb = (comp.compress(b"\0" * (4 << 20)) + comp.flush()) * 64
            h.send_body(200, Emulator._bomb, headers={"content-encoding": "gzip"})
        elif kind == "redirect":
            h.send_body(307, b"", headers={"location": f"http://evil.invalid:9{h.path}"})
        elif kind == "nested":
            h.send_body(200, b"[" * 100_000 + b"]" * 100_000)
        elif kind == "bigint":
            h.send_body(200, b'{"choices": [], "usage": {"prompt_tokens": 1' + b"0" * 5000 + b"}}")
        elif kind in ("surrogate", "control"):
            message = "bad \ud800 answer" if kind == "surrogate" else CONTROL_MESSAGE
            h.send_json(500, self._error_body(500, f"{message} (emulated fault on request {number})",
                                              "InternalServerError"))
        else:
            return False
        return True

    def _drip(self, h: _Handler, data: bytes, every: float) -> None:
        h.send_response(200)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        with contextlib.suppress(OSError):
            for i in range(len(data)):
                h.wfile.write(data[i:i + 1])
                h.wfile.flush()
                if self._stopping.wait(every):
                    break
        h.close_connection = True

    @staticmethod
    def _send_truncated(h: _Handler, data: bytes, content_type: str) -> None:
        h.send_response(200)
        h.send_header("content-type", content_type)
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        h.wfile.write(data[: max(len(data) // 2, 1)])
        h.abort()

    def _validation_error(
        self, message: str, param: Optional[str], kind: str = "value_error"
    ) -> _RequestError:
        """A request-schema error, as each server's RequestValidationError handler words it. vLLM 0.32.0:
        ``1 validation error:\n  {'type': 'missing', 'loc': 'body.messages', 'msg': 'Field required', ...}``
        with ``param`` the location."""
        if self._vllm:
            loc = f"body.{param}" if param and param != "body" else "body"
            return _RequestError(400, f"1 validation error:\n  {{'type': '{kind}', 'loc': '{loc}', 'msg': "
                                      f"'{message}', 'input': '<request>'}}", "Bad Request", loc)
        if param == "body":  # what pydantic says about a body that is not JSON
            return _RequestError(400, "1 validation error:\n  {'type': 'json_invalid', 'loc': ('body', 1), "
                                 "'msg': 'JSON decode error'}", "Bad Request", None)
        return _RequestError(
            400,
            f"1 validation error:\n  {{'loc': ('body', {param!r}), 'msg': {message!r}}}",
            "Bad Request",
            None,
        )

    def _check_model(self, body: Dict[str, Any]) -> str:
        cfg = self.config
        model = body.get("model")
        if model is None:
            return cfg.model if self._vllm else "default"  # SGLang's DEFAULT_MODEL_NAME
        if not isinstance(model, str):
            raise self._validation_error("Input should be a valid string", "model")
        if model in cfg.served_models:
            return model
        if self._vllm:
            raise _RequestError(404, f"The model `{model}` does not exist. Valid aliases: "
                                     f"{', '.join(cfg.served_models)}.", "NotFoundError", "model")
        return model  # SGLang 0.5.23 serves whatever name a chat request gives, and echoes it

    def _namespace(self, body: Dict[str, Any]) -> Optional[str]:
        """Validate the salt fields; return the cache namespace they select (None = the shared one)."""
        salt = body.get("cache_salt")
        if self._vllm:
            if salt is not None:
                # real vLLM 0.32.0 answers both as a BadRequestError naming the parameter
                if not isinstance(salt, str) or not salt:
                    raise _RequestError(
                        400,
                        "Parameter 'cache_salt' must be a non-empty string if provided. "
                        "(parameter=cache_salt)",
                        "BadRequestError",
                        "cache_salt",
                    )
                if len(salt) > 128 or any(c in salt for c in "@/\\\x00"):
                    raise _RequestError(
                        400,
                        "Parameter 'cache_salt' must be at most 128 characters and must not contain "
                        "'@', '/', '\\\\', or NUL. (parameter=cache_salt)",
                        "BadRequestError",
                        "cache_salt",
                    )
            if not self.config.honor_salt or salt is None:
                return None
            return "vllm\x00" + salt
        extra = body.get("extra_key")
        for name, value in (("cache_salt", salt), ("extra_key", extra)):
            if value is not None and not isinstance(value, (str, list)):  # the field is str | list[str]
                raise _RequestError(
                    400,
                    f"2 validation errors:\n  {{'type': 'list_type', 'loc': ('body', '{name}', 'list[str]'), "
                    f"'msg': 'Input should be a valid list'}}\n  {{'type': 'string_type', 'loc': ('body', "
                    f"'{name}', 'str'), 'msg': 'Input should be a valid string'}}",
                    "Bad Request",
                    None,
                )
            if value is not None and not isinstance(value, str):
                raise _RequestError(
                    400,
                    f"{name} must be a string for a single request, got {type(value).__name__}",
                    "BadRequestError",
                    name,
                )
        salt = salt or None  # SGLang: an empty string is no salt
        extra = extra or None
        if not self.config.honor_salt or (salt is None and extra is None):
            return None
        return f"sglang\x00{extra or ''}\x00{salt or ''}"

    def _max_tokens(self, body: Dict[str, Any], n_prompt: int) -> Optional[int]:
        cfg = self.config
        value = body.get("max_completion_tokens")
        name = "max_completion_tokens"
        if value is None:
            value, name = body.get("max_tokens"), "max_tokens"
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise self._validation_error("Input should be a valid integer", name)
        if value is not None and value < 1 and self._vllm:
            raise _RequestError(
                400, f"max_tokens must be at least 1, got {value}. (parameter={name}, value={value})",
                "BadRequestError", name
            )
        if value is not None and value < 0:  # SGLang generates nothing for 0 (SamplingParams.verify)
            raise _RequestError(400, f"max_new_tokens must be at least 0, got {value}.", "BadRequestError", None)
        if self._vllm and value is not None and value > cfg.max_model_len:
            raise _RequestError(
                400,
                f"{name}={value} cannot be greater than max_model_len={cfg.max_model_len}. Please request "
                f"fewer output tokens. (parameter={name}, value={value})",
                "BadRequestError",
                name,
            )
        if n_prompt >= cfg.max_model_len:
            if self._vllm:  # real vLLM 0.32.0 tokenizes at most max_model_len + 1 tokens to tell
                seen = min(n_prompt, cfg.max_model_len + 1)
                raise _RequestError(
                    400,
                    f"This model's maximum context length is {cfg.max_model_len} tokens. However, your "
                    f"prompt contains at least {seen} input tokens, which exceeds this limit even without "
                    f"any output tokens. Please reduce the length of the input prompt. "
                    f"(parameter=input_tokens, value={seen})",
                    "BadRequestError",
                    "input_tokens",
                )
            raise _RequestError(
                400,
                f"The input ({n_prompt} tokens) is longer than the model's context length "
                f"({cfg.max_model_len} tokens).",
                "BadRequestError",
            )
        # vLLM 0.32.0 serves a prompt + max_tokens longer than the context; the answer stops at its end
        room = cfg.max_model_len - n_prompt
        return min(value, room) if value is not None else room

    def _check_n(self, body: Dict[str, Any]) -> None:
        n = body.get("n", 1)
        if n is None or n == 1:
            return
        temperature = body.get("temperature")
        if self._vllm and (
            temperature is None or (isinstance(temperature, (int, float)) and temperature < 1e-5)
        ):
            raise _RequestError(
                400, f"n must be 1 when using greedy sampling, got {n}.", "BadRequestError", None
            )
        raise _RequestError(
            400, f"n={n} is not supported by the emulator (it serves n=1 only)", "BadRequestError", "n"
        )

    def _logprobs_k(self, body: Dict[str, Any]) -> Optional[int]:
        """None = no logprobs; else the number of top alternatives per token."""
        want = body.get("logprobs")
        top = body.get("top_logprobs")
        if top is not None and (not isinstance(top, int) or isinstance(top, bool)):
            raise self._validation_error("Input should be a valid integer", "top_logprobs")
        if not want:
            if top and self._vllm:
                raise _RequestError(
                    400,
                    "when using `top_logprobs`, `logprobs` must be set to true. (parameter=top_logprobs)",
                    "BadRequestError",
                    "top_logprobs",
                )
            return None
        k = 0 if top is None else top
        if k == -1:
            k = 20
        if k < 0:
            raise _RequestError(
                400,
                f"`top_logprobs` must be a positive value or -1. (parameter=top_logprobs, value={k})",
                "BadRequestError",
                "top_logprobs",
            )
        if k > 20:
            raise _RequestError(
                400,
                f"Requested sample logprobs of {k}, which is greater than max allowed: 20 "
                f"(parameter=logprobs, value={k})",
                "BadRequestError",
                "logprobs",
            )
        return k

    def _should_diverge(self, prompt_text: str, messages: Any) -> bool:
        knob = self.config.diverge_on_hit
        if knob is None:
            return False
        if callable(knob):
            return bool(knob(messages))
        markers = [knob] if isinstance(knob, str) else list(knob)
        return any(marker in prompt_text for marker in markers)

    def _generate(
        self,
        prompt_ids: List[int],
        prompt_text: str,
        namespace: Optional[str],
        messages: Any,
        max_tokens: Optional[int],
        tools: Optional[List[Dict[str, Any]]] = None,
        tool_choice: Any = None,
    ) -> Dict[str, Any]:
        """Look up the cache, answer greedily, insert the request's blocks. Serialized: batch size one.
        With ``tools`` and a ``tool_choice`` that requires a call (``required`` or a named tool), the
        answer is that call (the emulated model never calls a tool unasked).

        With ``reasoning`` the output is :func:`thinking_output` (reasoning, then the answer) and every output
        token, reasoning included, is counted, cut by ``max_tokens`` and cached like any other."""
        cfg = self.config
        with self._lock:
            n_prompt = len(prompt_ids)
            cached = 0
            if cfg.prefix_caching:
                cached = self._cache.lookup(prompt_ids, namespace, n_prompt - 1)
                self._metrics["queries"] += n_prompt
                self._metrics["hits"] += cached
            answer = generate_answer(prompt_text)
            diverged = False
            flip = cached > 0 and self._should_diverge(prompt_text, messages)
            if tools and tool_choice not in (None, "auto", "none"):
                answer = generate_tool_call(prompt_text, tools, tool_choice, flip)
                diverged = flip
            elif flip:
                answer = diverged_answer(prompt_text, answer)
                diverged = True
            full = thinking_output(generate_reasoning(prompt_text), answer) if cfg.reasoning else answer
            if max_tokens is not None and max_tokens <= len(full):
                text = full[:max_tokens]
                output_ids = tokenize(text)
                finish = "length"
            else:
                text = full
                output_ids = tokenize(text) + [EOS_TOKEN_ID]
                finish = "stop"
            if cfg.prefix_caching:
                # The last sampled token is never fed back, so its KV is never computed or cached, unless
                # SGLang's overlap scheduler ran the next decode step before it saw the EOS.
                ran_ahead = (not self._vllm and cfg.overlap_schedule and finish == "stop"
                             and (max_tokens is None or len(output_ids) < max_tokens))
                kept = prompt_ids + output_ids if ran_ahead else (prompt_ids + output_ids)[:-1]
                self._cache.insert(kept, namespace)
            self._metrics["prompt_tokens"] += n_prompt
            self._metrics["generation_tokens"] += len(output_ids)
            self._metrics["success_" + finish] += 1
            self.served_requests += 1
        reasoning_text: Optional[str] = None
        content_text = text
        reasoning_tokens = 0
        parsed_reasoning_tokens = 0
        if cfg.reasoning:
            reasoning_text, content_text = split_reasoning(text)
            # SGLang's scheduler counts output tokens up to and including the think-end token sequence, or
            # all of them while it has not come (Req.update_reasoning_tokens, srt/managers/schedule_batch.py:
            # 2240-2259; the self-opened variant adds the <think> start tokens, :2261-2283): the tokens of
            # the "<think>...</think>" part.
            end = text.find(THINK_END)
            reasoning_tokens = len(tokenize(text[: end + len(THINK_END)])) if end >= 0 else len(output_ids)
            # vLLM counts the tokens of the parser's reasoning chunks, the text between the markers
            # (ParserEngine.count_reasoning_tokens -> StreamingParserEngine._record_reasoning_tokens,
            # vllm/parser/engine/parser_engine.py:788-790, streaming_parser_engine.py:180-185).
            parsed_reasoning_tokens = len(tokenize(reasoning_text or ""))
        return {
            "text": text,
            "reasoning_text": reasoning_text,
            "content_text": content_text,
            "output_ids": output_ids,
            "finish_reason": finish,
            "cached_tokens": cached,
            "prompt_tokens": n_prompt,
            "diverged": diverged,
            "reasoning_tokens": reasoning_tokens if not self._vllm else parsed_reasoning_tokens,
        }

    def _usage(self, result: Dict[str, Any], chat: bool = True) -> Dict[str, Any]:
        """The usage object. ``completion_tokens`` counts every output token, reasoning included."""
        cfg = self.config
        prompt = result["prompt_tokens"]
        completion = len(result["output_ids"])
        cached = result["cached_tokens"]
        if self._vllm:
            # vLLM 0.32.0 also reports created_cache_tokens (the prompt's full blocks this request wrote to
            # the cache: a 292-token prompt with 256 cached, block 32, gave 32) and multimodal_tokens (null)
            created = prompt // cfg.block_size * cfg.block_size - cached if cfg.prefix_caching else 0
            details = (
                {"cached_tokens": cached, "created_cache_tokens": max(created, 0), "multimodal_tokens": None}
                if cfg.report_cached_tokens
                else None
            )
            usage: Dict[str, Any] = {
                "prompt_tokens": prompt,
                "total_tokens": prompt + completion,
                "completion_tokens": completion,
                "prompt_tokens_details": details,
            }
            if chat:
                usage["completion_tokens_details"] = None
            if cfg.reasoning and chat:
                # With a reasoning parser, chat usage carries completion_tokens_details.reasoning_tokens
                # (vllm/entrypoints/openai/chat_completion/serving.py:166, :1110-1122).
                usage["completion_tokens_details"] = {"reasoning_tokens": result["reasoning_tokens"]}
            return usage
        details = {"cached_tokens": cached} if cfg.report_cached_tokens else None
        if cfg.null_details_on_miss and not cached:  # older SGLang's UsageProcessor._details_if_cached
            details = None
        usage = {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": details,
            "reasoning_tokens": result["reasoning_tokens"],
            # null unless there are reasoning tokens (srt/entrypoints/openai/usage_processor.py:127-131)
            "completion_tokens_details": (
                {"reasoning_tokens": result["reasoning_tokens"]} if result["reasoning_tokens"] else None
            ),
        }
        return usage

    @staticmethod
    def _logprob_content(prompt_text: str, output_ids: List[int], k: int) -> List[Dict[str, Any]]:
        seed = hashlib.sha256(b"logprobs\x00" + prompt_text.encode("utf-8")).digest()
        pool = "etaoinshrdlcumwfgypbvkjxqz ,."
        content = []
        for i, tid in enumerate(output_ids):
            d = hashlib.sha256(seed + i.to_bytes(4, "big")).digest()
            tok = token_str(tid)
            chosen = -round(0.0001 + (int.from_bytes(d[:2], "big") % 2000) / 10000.0, 6)
            alts = [c for c in pool if c != tok]
            start = d[2] % len(alts)
            top = [{"token": tok, "logprob": chosen, "bytes": list(tok.encode("utf-8"))}]
            for j in range(max(k - 1, 0)):
                alt = alts[(start + j) % len(alts)]
                lp = round(chosen - 1.0 - 0.75 * j - (d[3 + (j % 20)] % 50) / 1000.0, 6)
                top.append({"token": alt, "logprob": lp, "bytes": list(alt.encode("utf-8"))})
            content.append(
                {"token": tok, "logprob": chosen, "bytes": list(tok.encode("utf-8")), "top_logprobs": top[:k]}
            )
        return content

    def _chat(self, body: Dict[str, Any]) -> Tuple[Dict[str, Any], Optional[List[Dict[str, Any]]]]:
        messages = body.get("messages")
        if messages is None:
            raise self._validation_error("Field required", "messages", "missing")
        if not isinstance(messages, list):
            raise self._validation_error("Input should be a valid list", "messages")
        if not messages:
            if self._vllm:
                raise _RequestError(
                    400,
                    "Cannot apply chat template to an empty conversation. Provide at least one message.",
                    "BadRequestError",
                )
            raise _RequestError(400, "Messages cannot be empty.", "BadRequestError")
        namespace = self._namespace(body)
        model = self._check_model(body)
        self._check_n(body)
        k = self._logprobs_k(body)
        try:
            prompt_text = render_chat(
                messages, bool(body.get("add_generation_prompt", True)), self.config.chat_template
            )
        except ValueError as exc:
            raise self._validation_error(str(exc), "messages") from None
        prompt_ids = tokenize(prompt_text)
        max_tokens = self._max_tokens(body, len(prompt_ids))
        tools = body.get("tools") if isinstance(body.get("tools"), list) else None
        result = self._generate(prompt_ids, prompt_text, namespace, messages, max_tokens, tools,
                                body.get("tool_choice"))
        reasoning, answer, keep_logprobs = self._message_fields(body, result)
        tool_calls = None
        if tools and answer and answer.startswith("<tool_call>\n") and answer.endswith("\n</tool_call>"):
            call = json.loads(answer[len("<tool_call>\n"):-len("\n</tool_call>")])
            tool_calls = [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                           "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}]
            answer = None
            result["finish_reason"] = "tool_calls"

        logprobs = (
            {"content": self._logprob_content(prompt_text, result["output_ids"], k)}
            if k is not None and keep_logprobs
            else None
        )
        usage = self._usage(result)
        created = int(time.time())
        if self._vllm:
            rid = f"chatcmpl-{uuid.uuid4().hex}"
            message: Dict[str, Any] = {
                "role": "assistant",
                "content": answer,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "reasoning": reasoning,
            }
            if tool_calls:
                message["tool_calls"] = tool_calls
            choice = {
                "index": 0,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": result["finish_reason"],
                "stop_reason": None,
                "token_ids": None,
                "routed_experts": None,
            }
            response = {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [choice],
                "service_tier": None,
                "system_fingerprint": f"vllm-{self.config.version}-{self._fingerprint}",
                "usage": usage,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "prompt_text": None,
                "kv_transfer_params": None,
                "ec_transfer_params": None,
                "metrics": None,
            }
        else:
            rid = uuid.uuid4().hex
            message = {"role": "assistant", "content": answer, "reasoning_content": reasoning}
            if tool_calls:
                message["tool_calls"] = tool_calls
            choice = {
                "index": 0,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": result["finish_reason"],
                "matched_stop": EOS_TOKEN_ID if result["finish_reason"] == "stop" else None,
            }
            response = {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [choice],
                "usage": usage,
                "metadata": None,
            }
        if not body.get("stream"):
            return response, None
        return response, self._stream_chunks(body, response, result, logprobs)

    def _message_fields(
        self, body: Dict[str, Any], result: Dict[str, Any]
    ) -> Tuple[Optional[str], Optional[str], bool]:
        """(reasoning, content, keep logprobs) of the chat message, as the server's reasoning parser gives them.

        vLLM 0.34: ``message.reasoning`` and ``content`` from the parser, each None when empty
        (chat_completion/protocol.py:76-88; parser_engine.py:794-835); ``include_reasoning: false`` drops the
        reasoning and the logprobs (protocol.py:281; chat_completion/serving.py:1026-1035,
        message_assembly.py:53-54). SGLang 0.5.23: ``message.reasoning_content`` (None when empty) and
        ``content`` ("" when empty) unless ``separate_reasoning: false``, which leaves the whole output in
        ``content`` (protocol.py:1018; serving_chat.py:2929-2950, :2994-3004)."""
        if not self.config.reasoning:
            return None, result["text"], True
        reasoning, content = result["reasoning_text"], result["content_text"]
        if self._vllm:
            if body.get("include_reasoning", True) is False:
                return None, content or None, False
            return reasoning or None, content or None, True
        if body.get("separate_reasoning", True) is False:
            return None, result["text"], True
        return reasoning or None, content, True

    def _stream_chunks(
        self,
        body: Dict[str, Any],
        response: Dict[str, Any],
        result: Dict[str, Any],
        logprobs: Optional[Dict[str, Any]],
    ) -> List[Dict[str, Any]]:
        base = {
            "id": response["id"],
            "object": "chat.completion.chunk",
            "created": response["created"],
            "model": response["model"],
        }
        chunks: List[Dict[str, Any]] = [
            dict(
                base,
                choices=[
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            )
        ]
        step = 8
        lp_content = (logprobs or {}).get("content") or []
        cursor = 0  # logprob entries already sent: a piece carries those of the tokens up to its end
        for key, text, offset in self._stream_segments(response, result):
            for start in range(0, len(text), step):
                end = offset + min(start + step, len(text))  # one token per character of the output text
                piece_lp = {"content": lp_content[cursor:end]} if logprobs is not None else None
                cursor = end
                chunks.append(
                    dict(
                        base,
                        choices=[
                            {
                                "index": 0,
                                "delta": {key: text[start : start + step]},
                                "logprobs": piece_lp,
                                "finish_reason": None,
                            }
                        ],
                    )
                )
        chunks.append(
            dict(
                base,
                choices=[
                    {"index": 0, "delta": {}, "logprobs": None, "finish_reason": result["finish_reason"]}
                ],
            )
        )
        options = body.get("stream_options") or {}
        if isinstance(options, dict) and options.get("include_usage"):
            chunks.append(dict(base, choices=[], usage=response["usage"]))
        return chunks

    def _stream_segments(
        self, response: Dict[str, Any], result: Dict[str, Any]
    ) -> List[Tuple[str, str, int]]:
        """(delta key, text, offset of its first token in the output) for each streamed part of the message:
        the reasoning (vLLM ``delta.reasoning``, SGLang ``delta.reasoning_content``), then the content."""
        message = response["choices"][0]["message"]
        text = result["text"]
        reasoning_key = "reasoning" if self._vllm else "reasoning_content"
        reasoning = message.get(reasoning_key)
        content = message.get("content") or ""
        if not self.config.reasoning or content == text:
            return [("content", content, 0)]
        segments: List[Tuple[str, str, int]] = []
        if reasoning:
            segments.append((reasoning_key, reasoning, len(THINK_START) if text.startswith(THINK_START) else 0))
        if content:
            segments.append(("content", content, text.index(THINK_END) + len(THINK_END)))
        return segments

    def _completion(self, body: Dict[str, Any]) -> Tuple[Dict[str, Any], Optional[List[Dict[str, Any]]]]:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt_text = prompt
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt_text = detokenize(prompt)
        elif prompt is None:
            raise self._validation_error("Field required", "prompt")
        else:
            raise _RequestError(
                400,
                "the emulator accepts one prompt (a string or a list of token ids)",
                "BadRequestError",
                "prompt",
            )
        if body.get("stream"):
            raise _RequestError(
                400, "the emulator does not stream /v1/completions", "BadRequestError", "stream"
            )
        if body.get("logprobs") is not None:
            raise _RequestError(
                400, "the emulator does not return /v1/completions logprobs", "BadRequestError", "logprobs"
            )
        namespace = self._namespace(body)
        model = self._check_model(body)
        self._check_n(body)
        prompt_ids = tokenize(prompt_text)
        max_tokens = body.get("max_tokens", 16)  # the OpenAI completions default
        if max_tokens is None:
            body_for_limits = {k: v for k, v in body.items() if k != "max_tokens"}
        else:
            body_for_limits = dict(body, max_tokens=max_tokens)
        max_tokens = self._max_tokens(body_for_limits, len(prompt_ids))
        result = self._generate(
            prompt_ids, prompt_text, namespace, [{"role": "prompt", "content": prompt_text}], max_tokens
        )
        choice: Dict[str, Any] = {
            "index": 0,
            "text": result["text"],
            "logprobs": None,
            "finish_reason": result["finish_reason"],
        }
        if self._vllm:
            choice.update(
                {"stop_reason": None, "prompt_logprobs": None, "prompt_token_ids": None, "token_ids": None}
            )
            rid = f"cmpl-{uuid.uuid4().hex}"
        else:
            choice["matched_stop"] = EOS_TOKEN_ID if result["finish_reason"] == "stop" else None
            rid = uuid.uuid4().hex
        response = {
            "id": rid,
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": self._usage(result, chat=False),
        }
        return response, None


# ------------------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------------------


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.emulator", description="Serve an emulated vLLM or SGLang until Ctrl-C."
    )
    parser.add_argument("--flavor", choices=sorted(_DEFAULT_VERSIONS), default="vllm")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default="emu/tiny-chat")
    parser.add_argument("--block-size", type=int, default=16, help="vLLM block size / SGLang page size")
    parser.add_argument(
        "--no-prefix-caching",
        action="store_true",
        help="as vLLM --no-enable-prefix-caching / SGLang --disable-radix-cache",
    )
    parser.add_argument(
        "--no-cache-report",
        action="store_true",
        help="without vLLM --enable-prompt-tokens-details / SGLang --enable-cache-report",
    )
    parser.add_argument("--ignore-salt", action="store_true", help="a build that ignores cache_salt")
    parser.add_argument("--api-key", default=None)
    parser.add_argument(
        "--diverge-marker",
        action="append",
        default=None,
        help="prompts containing this answer differently on a cache hit (repeatable)",
    )
    parser.add_argument(
        "--chat-template",
        choices=CHAT_TEMPLATES,
        default="chatml",
        help="chatml; drop-reasoning (Qwen3: past turns lose their <think> block); empty-think-prompt "
        "(Qwen3 with enable_thinking false: the generation prompt ends with an empty think block)",
    )
    parser.add_argument(
        "--reasoning",
        action="store_true",
        help="a thinking model behind a reasoning parser: <think>...</think> before each answer",
    )
    parser.add_argument(
        "--no-health-generate",
        action="store_true",
        help="SGLang with SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false: /health does not generate",
    )
    args = parser.parse_args(argv)
    config = EmulatorConfig(
        flavor=args.flavor,
        model=args.model,
        block_size=args.block_size,
        prefix_caching=not args.no_prefix_caching,
        report_cached_tokens=not args.no_cache_report,
        honor_salt=not args.ignore_salt,
        api_key=args.api_key,
        diverge_on_hit=set(args.diverge_marker) if args.diverge_marker else None,
        chat_template=args.chat_template,
        reasoning=args.reasoning,
        health_generates=not args.no_health_generate,
    )
    emulator = Emulator(config, host=args.host, port=args.port).start()
    health = ""
    if config.flavor == "sglang":
        health = f", /health {'generates' if config.health_generates else 'does not generate'}"
    print(
        f"emulated {config.flavor} {config.version} serving {config.model!r} at {emulator.url} "
        f"(block size {config.block_size}, prefix caching {'on' if config.prefix_caching else 'off'}, "
        f"cache report {'on' if config.report_cached_tokens else 'off'}, salt "
        f"{'honoured' if config.honor_salt else 'ignored'}, chat template {config.chat_template}, reasoning "
        f"{'on' if config.reasoning else 'off'}{health}); Ctrl-C stops it",
        flush=True,
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        emulator.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
