"""Setup checks that send requests: run once per server, before its first probe.

The servers' own reports (``ServerSetup`` in :mod:`.servers`) are judged first; the checks here ask the
servers to do something and read the result, in this order:

* cached-token reporting on each server (each kind its own way: vLLM one one-token request, SGLang its
  ``/server_info``, llama-server always reports);
* a second cache tier that can restore what the live cache no longer holds (llama-server's host-memory
  prompt cache, ``--cache-ram``, which ``/props`` does not report);
* the chat template: the server renders a turn-1 prompt and the turn-2 prompt built on it (no text is
  generated); a cache hit can reach into the turn-1 answer only if the second starts with the first
  followed by the answer. A template that drops earlier turns' reasoning is noted too;
* a health endpoint that generates (SGLang's ``/health``).

Problems stop the run (the probes error with the fix named); warnings are shown in the header, the
summary and the report. The requests that generate go only to a server this process is about to probe,
never from an xdist controller whose workers may be probing it already.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from .clients import ChatClient, Findings

# A tiny conversation for the template check; nothing is generated for it.
_TURN1 = [{"role": "system", "content": "You are a helpful assistant."},
          {"role": "user", "content": "Name three colours."}]
_ANSWER = "Red, green and blue."
_REASONING = "The user wants three colours, so I will name the three primary ones in one short sentence."
_FOLLOWUP = {"role": "user", "content": "Name three more."}


def _common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


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


def run_checks(cache: ChatClient, nocache: Optional[ChatClient], skip_hit_check: bool) -> Findings:
    """Every check that applies to the run's servers. Raises RequestError when a check's request fails."""
    found = Findings()
    servers = [cache] + ([nocache] if nocache is not None else [])
    if not skip_hit_check:
        for client in servers:
            client.check_reporting(found)
        if found.problems:
            return found
        cache.check_host_cache(found)
        chat_template(cache, found)
    for client in servers:
        client.check_health(found)
    return found
