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
  SGLang's ``GET /health`` runs a one-token generation on ``input_ids=[0]`` that goes into the cache; vLLM
  answers under its first served name whichever it was asked for, SGLang under the name it was asked for;
* knobs for tests: ``diverge_on_hit`` (chosen prompts answer differently on a cache hit, a modelled
  cache-induced flip), ``honor_salt=False`` (a build that ignores the salt), ``api_key``, and fault
  injection (``fault``, among them ``"other-model"``: an answer under another model's name;
  ``fail_after_requests``, :meth:`Emulator.kill`);
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

The package: :mod:`.text` (tokenizer, template, generation, prefix cache), :mod:`.config` (EmulatorConfig,
faults), :mod:`.core` (HTTP server, lifecycle, dispatch, faults), :mod:`.generation` (chat and completion
endpoints), :mod:`.vllm` and :mod:`.sglang` (each kind's other routes).
"""

from __future__ import annotations

from .config import EmulatorConfig
from .core import Emulator
from .core import _Handler as _Handler  # tests patch the handler class
from .text import (
    CHAT_TEMPLATES,
    EOS_TOKEN_ID,
    IM_END,
    IM_START,
    THINK_END,
    THINK_START,
    detokenize,
    expected_cached_tokens,
    generate_answer,
    generate_reasoning,
    render_chat,
    split_reasoning,
    thinking_output,
    tokenize,
)

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
