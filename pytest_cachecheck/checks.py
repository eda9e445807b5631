"""Setup checks that need requests: run once per server, before its first probe.

:func:`~pytest_cachecheck.detect.setup_problems` judges what the servers say about themselves; the checks
here ask them to do something and read the result:

* llama-server's host-memory prompt cache (``--cache-ram``, on by default), which ``/props`` does not
  report: three one-token requests show whether a prompt the slot no longer holds comes back from it;
* cached-token reporting (vLLM ``--enable-prompt-tokens-details``; SGLang says it in ``/server_info``):
  one one-token request with a salt no other request uses;
* the chat template: the server renders a turn-1 prompt and the turn-2 prompt built on it (no text is
  generated); a cache hit can reach into the turn-1 answer only if the second starts with the first
  followed by the answer. A template that drops earlier turns' reasoning is noted too;
* SGLang's ``/health``, which runs a generation unless ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION`` is
  false: asked once, it answers after at least one second when it generates.

Each check returns problems (the run cannot measure; the probes error with the fix named) and warnings
(shown in the header, the summary and the report). The requests that generate go only to a server this
process is about to probe, never from an xdist controller whose workers may be probing it already.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence

from .clients import ChatClient
from .clients.openai_compat import new_salt
from .errors import RequestError

# Two unrelated passages of about 150 tokens each, for the host-memory cache check.
_PASSAGE_A = (
    "Describe, in order, how a small bakery prepares for the morning: the ovens are lit before dawn, the "
    "sourdough starter is fed and left to rise, flour and salt are weighed for the first batch, the dough "
    "is kneaded, divided and shaped into loaves, croissants are laminated with cold butter and folded "
    "three times, trays are proofed in a warm cabinet, the first loaves are scored and baked with steam, "
    "the shelves are stocked, the coffee machine is cleaned and warmed, and the chalkboard is written "
    "with the day's specials before the door opens at seven."
)
_PASSAGE_B = (
    "List the steps a ship's crew follows when a storm is forecast at sea: secure every hatch and "
    "porthole, lash the deck cargo with extra chains, check the bilge pumps and the emergency generator, "
    "plot a course away from the worst of the weather, reduce speed to ease the pounding of the waves, "
    "brief the watch on the lifeboat stations, stow loose equipment in the galley and the engine room, "
    "keep the radio on the coast guard channel, log the barometer every hour, and rest the off-duty "
    "sailors so that they are fresh when the wind rises after midnight."
)

# A tiny conversation for the template check; nothing is generated for it.
_TURN1 = [{"role": "system", "content": "You are a helpful assistant."},
          {"role": "user", "content": "Name three colours."}]
_ANSWER = "Red, green and blue."
_REASONING = "The user wants three colours, so I will name the three primary ones in one short sentence."
_FOLLOWUP = {"role": "user", "content": "Name three more."}

#: SGLang's generating /health waits at least this long (``await asyncio.sleep(1)`` before it looks for
#: the reply, sglang/srt/entrypoints/http_server.py ``health_generate``); a plain /health answers at once.
HEALTH_GENERATION_SECONDS = 0.8


@dataclass
class Findings:
    problems: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)  # what was checked, for the report


def _common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def host_cache(client: ChatClient, found: Findings) -> None:
    """llama-server: is a prompt the slot no longer holds restored from the host-memory prompt cache?

    A, then B (a different prompt: llama-server saves A's state to the host cache, when it has one,
    because B keeps less than half of the slot), then A again with cache_prompt on. Without the host cache
    the third request can reuse only what A shares with B (the template's opening); with it, the server
    loads A's saved state and reuses nearly all of A.
    """
    a = [{"role": "user", "content": _PASSAGE_A}]
    b = [{"role": "user", "content": _PASSAGE_B}]
    client.chat(a, max_tokens=1, cache={"cache_prompt": False})
    shared = client.chat(b, max_tokens=1, cache={"cache_prompt": True}).cached_tokens
    again = client.chat(a, max_tokens=1, cache={"cache_prompt": True})
    if shared is None or again.cached_tokens is None or again.prompt_tokens is None:
        return  # llama-server always reports cache_n; a server that does not fails the probes by name
    found.notes.append(f"host-memory prompt cache: a prompt of {again.prompt_tokens} tokens sent again after "
                       f"another reused {again.cached_tokens} tokens (the two share {shared})")
    if again.cached_tokens > shared + (again.prompt_tokens - shared) // 2:
        found.problems.append(
            f"llama-server restores prompts from its host-memory prompt cache: a prompt sent again after "
            f"another reused {again.cached_tokens} of its {again.prompt_tokens} tokens, though the slot then held "
            f"only the {shared} they share, so a request can reuse state that its own turn 1 did not leave; "
            f"start it with --cache-ram 0")


def cached_token_reporting(client: ChatClient, found: Findings) -> None:
    """vLLM and other OpenAI-compatible servers: does a reply carry usage.prompt_tokens_details?"""
    if client.info.kind == "sglang" and isinstance(client.info.details.get("enable_cache_report"), bool):
        if not client.info.details["enable_cache_report"]:
            found.problems.append(f"the sglang server at {client.http.shown} does not report cached tokens "
                                  f"(/server_info: enable_cache_report false), so cache use cannot be "
                                  f"checked; turn reporting on with {client.reporting_flag}")
        return
    fields = {"cache_salt": new_salt()} if client.info.kind in ("vllm", "sglang") else {}
    reply = client.chat([{"role": "user", "content": "Reply with one word."}], max_tokens=1, cache=fields)
    if reply.cached_tokens is None:
        found.problems.append(f"the {client.info.kind} server at {client.http.shown} did not report cached "
                              f"tokens (usage.prompt_tokens_details.cached_tokens is missing), so cache use "
                              f"cannot be checked; turn reporting on with {client.reporting_flag}")


def chat_template(client: ChatClient, found: Findings) -> None:
    """Does the server's chat template re-render turn 1 and its answer as they were when turn 2 is sent?"""
    first = client.render(_TURN1)
    if first is None:
        found.notes.append("chat template: not checked (the server renders no prompt for a client)")
        return
    plain = client.render(_TURN1 + [{"role": "assistant", "content": _ANSWER}, _FOLLOWUP])
    reasoned = client.render(_TURN1 + [{"role": "assistant",
                                        "content": f"<think>\n{_REASONING}\n</think>\n\n{_ANSWER}"}, _FOLLOWUP])
    if plain is None or reasoned is None:
        found.notes.append("chat template: not checked (the server rendered only some of the prompts)")
        return
    text = isinstance(first, str)
    unit = "characters" if text else "tokens"
    kept = _common_prefix(first, plain)
    # token ids may merge across the end of the generation prompt, so one token of slack there
    if kept < len(first) - (0 if text else 1) or (text and _ANSWER not in str(plain)[len(first):]):
        found.problems.append(
            f"the chat template does not re-render the history as it was generated: the turn-2 prompt "
            f"departs from the turn-1 prompt after {kept} of its {len(first)} {unit} (as with a template "
            f"that adds an empty think block to the generation prompt but not to past turns), so a turn-2 "
            f"cache hit cannot reach into the turn-1 answer; serve a chat template that keeps past turns as "
            f"they were prompted (llama-server --chat-template-file, vLLM/SGLang --chat-template)")
    dropped = _REASONING not in reasoned if isinstance(reasoned, str) else len(reasoned) - len(plain) < 8
    if dropped:
        found.warnings.append(
            "the chat template drops earlier turns' reasoning (<think> blocks) from the history: if the model "
            "reasons, a turn-2 cache hit stops before the turn-1 answer and every probe is inconclusive; turn "
            "thinking off for this check, or serve a template that keeps past reasoning")
    found.notes.append(f"chat template: the turn-2 prompt repeats {kept} of the turn-1 prompt's {len(first)} "
                       f"{unit}" + ("; past reasoning is dropped" if dropped else "; past reasoning is kept"))


def sglang_health(client: ChatClient, found: Findings) -> None:
    """SGLang: does GET /health run a generation? (It does by default; any health checker that polls it
    during the run then sends requests that batch with the probes.)"""
    start = time.monotonic()
    client.http.get("/v1/models")
    plain = time.monotonic() - start
    start = time.monotonic()
    try:
        status, _ = client.http.get("/health", timeout=30.0)
    except RequestError:
        return
    took = time.monotonic() - start
    if status == 200 and took - plain >= HEALTH_GENERATION_SECONDS:
        found.warnings.append(
            f"SGLang's /health at {client.http.shown} runs a generation (it answered in {took:.1f} s; "
            f"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is on, the default): a load balancer or Kubernetes "
            f"probe polling it during the run sends requests that batch with the probes and can change "
            f"their answers; start SGLang with SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false, or point "
            f"health checks at /ready")
    found.notes.append(f"SGLang /health answered in {took:.2f} s")


def run_checks(mode: str, cache: ChatClient, nocache: Optional[ChatClient], skip_hit_check: bool) -> Findings:
    """Every check that applies to the run's servers. Raises RequestError when a check's request fails."""
    found = Findings()
    servers = [cache] + ([nocache] if nocache is not None else [])
    if not skip_hit_check:
        for client in servers:
            if client.info.kind != "llama.cpp":
                cached_token_reporting(client, found)
    if found.problems:
        return found
    if cache.info.kind == "llama.cpp" and mode in ("llama.cpp", "two-servers") and not skip_hit_check:
        host_cache(cache, found)
    if not skip_hit_check:
        chat_template(cache, found)
    for client in servers:
        if client.info.kind == "sglang":
            sglang_health(client, found)
    return found
