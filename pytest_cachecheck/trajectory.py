"""The measurement of an episode: does the prompt cache change a whole trajectory?

Each path walks the episode on its own, feeding its own answers forward, through the scripted world:

* cache path: step 1 from a clean start, every later step reusing the state the previous step left
  (llama-server ``cache_prompt: true``; vLLM/SGLang one salt for the episode; two servers: on the caching
  server, whose own setting decides);
* recompute path: every step from scratch (``cache_prompt: false``; a new salt per request; or on the
  server with caching off).

Each path runs twice (cache 1, recompute 1, then cache 2, recompute 2). The episode is valid when each path
repeats its trajectory exactly, every cache-path step after the first reports a hit that reaches into the
previous step's answer (previous prompt + answer - 1, within the tolerance, and past the previous prompt),
the first cache step and every recompute request reused nothing. A valid episode whose two trajectories
part is *changed*: the report names the step, what parted there (text, a tool's name or its arguments),
and, from the second runs' logprobs at that step only, the token and both paths' margins.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Dict, List, Optional, Set, Tuple

from .clients import ChatClient
from .episodes import Episode
from .errors import RequestError
from .model import Divergence, EpisodeRecord, EpisodeStep, Outcome, Parting, Path, ToolCall
from .protocol import Runner, _token_parting, excerpt, first_difference
from .validity import MissingCounter, Rules, differs, inconclusive, settled, untrusted
from .servers import ServerSetup

Fields = Callable[[int], Dict[str, Any]]
MAX_SHOWN_PROBLEMS = 4


@dataclass
class _Seen:
    """What the walks saw besides their paths: the logprobs asked for, by (path, step), and each path's
    messages with how many of them each step sent."""

    logprobs: Dict[Tuple[str, int], Any] = field(default_factory=dict)
    messages: Dict[str, Tuple[List[Dict[str, Any]], List[int]]] = field(default_factory=dict)


def measure_episode(runner: Runner, episode: Episode) -> EpisodeRecord:
    """Measure one episode on the runner's servers. Request failures give outcome 'error'."""
    start = time.monotonic()
    record = EpisodeRecord(id=episode.id, source=episode.source, fingerprint=episode.fingerprint,
                           outcome=Outcome.ERROR)
    seen = _Seen()
    with settled(record, runner.redactor.scrub):
        setup = runner.prepare()
        rules = _rules(runner, setup)
        record.hit_tolerance = rules.tolerance
        cache_1 = _walk(runner, setup.cache, episode, "cache-1", _cache_fields(setup), (), record, seen)
        recompute_client = setup.nocache or setup.cache
        scratch = _scratch_fields(setup)
        recompute_1 = _walk(runner, recompute_client, episode, "recompute-1", scratch, (), record, seen)
        parted = _parting_step(cache_1, recompute_1)
        want = {parted} if parted is not None and runner.settings.logprobs else set()
        short = set()  # the calls a cache-1 hit stopped inside of: their tokens tell what the template did
        if runner.settings.logprobs and not runner.settings.skip_hit_check:
            short = {prev.step for prev, cur in zip(cache_1.steps, cache_1.steps[1:])
                     if prev.tool_calls and rules.stops_inside(cur.cached_tokens, prev)}
        _walk(runner, setup.cache, episode, "cache-2", _cache_fields(setup), want | short, record, seen)
        _walk(runner, recompute_client, episode, "recompute-2", scratch, want, record, seen)
        _judge(setup, record, seen, rules, episode)
    record.duration_s = time.monotonic() - start
    return record


def _cache_fields(setup: ServerSetup) -> Fields:
    plan = setup.cache.cache_plan(own_setting=setup.nocache is not None)  # one plan (one salt) per walk
    return lambda step: plan.first if step == 1 else plan.reuse


def _scratch_fields(setup: ServerSetup) -> Fields:
    if setup.nocache is not None:
        return lambda step: {}
    return lambda step: setup.cache.scratch() or {}


def _assistant(step: int, content: str, calls: List[ToolCall]) -> Dict[str, Any]:
    message: Dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
    if calls:
        message["tool_calls"] = [{"id": f"call_{step}_{i}", "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}}
                                 for i, c in enumerate(calls)]
    return message


def _walk(runner: Runner, client: ChatClient, episode: Episode, name: str, fields: Fields,
          logprobs_at: Collection[int], record: EpisodeRecord, seen: _Seen) -> Path:
    """One path through the episode, its own answers fed forward; the path is kept on the record as it
    grows, so what was measured before a failure stays in the report."""
    s = runner.settings
    path = Path(name=name)
    record.paths.append(path)
    history = episode.opening()
    sent: List[int] = []
    seen.messages[name] = (history, sent)
    turns = list(episode.user_turns)
    for step in range(1, episode.max_steps + 1):
        sent.append(len(history))
        reply = client.chat(history, max_tokens=s.max_tokens, cache=fields(step),
                            logprobs=step in logprobs_at, tools=episode.tool_schemas(),
                            tool_choice=episode.choice(step))
        calls = [ToolCall(name=n, arguments=a) for n, a in reply.tool_calls]
        path.steps.append(EpisodeStep(step=step, content=reply.content, tool_calls=calls,
                                      finish_reason=reply.finish_reason, prompt_tokens=reply.prompt_tokens,
                                      completion_tokens=reply.completion_tokens, cached_tokens=reply.cached_tokens))
        if step in logprobs_at:
            seen.logprobs[(name, step)] = reply.logprobs
        MissingCounter.check(reply, f"{name}, step {step}", client, s.skip_hit_check)
        history.append(_assistant(step, reply.content, calls))
        if calls:
            for i, call in enumerate(calls):
                history.append({"role": "tool", "tool_call_id": f"call_{step}_{i}",
                                "content": episode.result(call.name, call.arguments)})
            continue
        if not turns:
            path.ended = "user turns ran out"
            return path
        history.append({"role": "user", "content": turns.pop(0)})
    path.ended = "max_steps reached"
    return path


def _parting_step(a: Path, b: Path) -> Optional[int]:
    """The first step (1-based) where two trajectories part, or None when they are the same."""
    for i, (x, y) in enumerate(zip(a.steps, b.steps)):
        if x.answer() != y.answer():
            return i + 1
    if len(a.steps) != len(b.steps):
        return min(len(a.steps), len(b.steps)) + 1
    return None


def _ignored_calls(episode: Episode, record: EpisodeRecord) -> List[str]:
    """Steps whose ``tool_choice`` demanded a call ("required", or a named tool) answered without one: the
    server ignores the tools (llama-server does so without ``--jinja``), so the episode is not the one the
    file describes."""
    found = []
    for p in record.paths:
        for st in p.steps:
            choice = episode.choice(st.step)
            if choice is not None and choice not in ("auto", "none") and not st.tool_calls:
                shown = choice if isinstance(choice, str) else choice["function"]["name"]
                found.append(f"{p.name} step {st.step} (tool_choice {shown!r})")
    return found


def _call_cause(client: ChatClient, episode: Episode, seen: _Seen, step: int) -> str:
    """Why a hit stopped inside step ``step``'s tool call, from the tokens cache-2 generated there (their
    logprobs) and the prompts the server's template renders before and after that step."""
    tokens = seen.logprobs.get(("cache-2", step))
    history, sent = seen.messages.get("cache-2", ([], []))
    before = after = None
    if tokens and step < len(sent):
        try:
            before = client.render(history[:sent[step - 1]], episode.tool_schemas())
            after = client.render(history[:sent[step]], episode.tool_schemas())
        except RequestError:
            pass
    if not (isinstance(before, str) and isinstance(after, str) and after.startswith(before)):
        return (f"; the hit stopped inside step {step}'s tool call: the chat template re-renders the call as "
                f"other text than the model generated, or the same text tokenizes into other tokens (not "
                f"told apart: that needs the answer's tokens and the server's prompt text)")
    generated, rendered = "".join(t for t, _, _ in tokens), after[len(before):]
    at = first_difference(generated, rendered)
    if at is None or at == len(generated):
        return (f"; the chat template renders step {step}'s tool call as the text the model generated, but "
                f"that text tokenizes into other tokens than the model's")
    return (f"; the chat template re-renders step {step}'s tool call as other text than the model generated: "
            f"generated {excerpt(generated, at)}, rendered {excerpt(rendered, at)}")


def _rules(runner: Runner, setup: ServerSetup) -> Rules:
    return Rules(setup.tolerance(runner.settings.hit_tolerance), runner.settings.skip_hit_check,
                 setup.cache.cache_plan(own_setting=setup.nocache is not None).clean_start)


def _judge(setup: ServerSetup, record: EpisodeRecord, seen: _Seen, rules: Rules,
           episode: Optional[Episode] = None) -> None:
    paths = {p.name: p for p in record.paths}
    ignored = _ignored_calls(episode, record) if episode is not None else []
    if ignored:
        record.outcome = Outcome.INCONCLUSIVE
        record.reason = ("inconclusive: a step that demanded a tool call was answered without one, so the server "
                         "ignores the tools (llama-server needs --jinja, and a chat template that knows tools): "
                         + "; ".join(ignored[:MAX_SHOWN_PROBLEMS])
                         + (f" and {len(ignored) - MAX_SHOWN_PROBLEMS} more" if ignored[MAX_SHOWN_PROBLEMS:] else ""))
        return
    bad = untrusted([(f"{p.name} step {st.step}", st) for p in record.paths for st in p.steps], MAX_SHOWN_PROBLEMS)
    if bad:
        record.outcome, record.reason = Outcome.INCONCLUSIVE, bad
        return
    problems = [p for a, b, what in (("cache-1", "cache-2", "the two cache runs"),
                                     ("recompute-1", "recompute-2", "the two recompute runs"))
                for p in [differs(f"{what} took different trajectories", _parting_step(paths[a], paths[b]), "step")]
                if p]
    told: Set[int] = set()
    for name in ("cache-1", "cache-2"):
        steps = paths[name].steps
        problems += [p for p in [rules.clean(f"{name} step 1", steps[0].cached_tokens if steps else None)] if p]
        for prev, cur in zip(steps, steps[1:]):
            hit = rules.hit(f"{name} step {cur.step}: cache hit", cur.cached_tokens, prev, f"step {prev.step}",
                            f"step {prev.step}'s prompt")
            if hit is None:
                continue
            problem = hit.text + (" (after a tool call)" if prev.tool_calls else "")
            if hit.short and episode is not None and prev.tool_calls \
                    and rules.stops_inside(cur.cached_tokens, prev) and prev.step not in told:
                told.add(prev.step)  # cache-1 and cache-2 share one trajectory: the cause is said once
                problem += _call_cause(setup.cache, episode, seen, prev.step)
            elif not hit.short and not (prev.content or prev.tool_calls):
                problem += f"; step {prev.step}'s answer was empty, so no answer token could be reused"
            problems.append(problem)
    problems += [p for name in ("recompute-1", "recompute-2") for st in paths[name].steps
                 for p in [rules.no_reuse(f"{name} step {st.step}", st.cached_tokens)] if p]
    if problems:
        record.outcome, record.reason = Outcome.INCONCLUSIVE, inconclusive(problems, MAX_SHOWN_PROBLEMS)
        return
    cache, recompute = paths["cache-1"], paths["recompute-1"]
    step = _parting_step(cache, recompute)
    if step is None:
        record.outcome = Outcome.SAME
        return
    record.outcome = Outcome.DIFFERENT
    record.parting = _parting(step, cache, recompute, seen.logprobs.get(("cache-2", step)),
                              seen.logprobs.get(("recompute-2", step)))
    record.reason = parting_message(record.parting, len(cache.steps), len(recompute.steps))


def _parting(step: int, cache: Path, recompute: Path, cache_lp: Any, recompute_lp: Any) -> Parting:
    n_cache, n_recompute = len(cache.steps), len(recompute.steps)
    if step > n_cache or step > n_recompute:
        return Parting(step=step, what="length", divergence=None, cache_steps=n_cache,
                       recompute_steps=n_recompute)
    a, b = cache.steps[step - 1], recompute.steps[step - 1]
    names_a, names_b = [c.name for c in a.tool_calls], [c.name for c in b.tool_calls]
    if bool(names_a) != bool(names_b):
        what = "tool call or text"
        text_a, text_b = _rendered(a), _rendered(b)
    elif names_a != names_b:
        what, text_a, text_b = "tool name", ", ".join(names_a), ", ".join(names_b)
    elif a.content == b.content:
        what = "arguments"
        text_a, text_b = next((x.arguments, y.arguments) for x, y in zip(a.tool_calls, b.tool_calls)
                              if x.arguments != y.arguments)
    else:
        what, text_a, text_b = "text", a.content, b.content
    at = first_difference(text_a, text_b) or 0
    divergence = Divergence(char=at, token=None, cache_excerpt=excerpt(text_a, at),
                            recompute_excerpt=excerpt(text_b, at))
    parted = _token_parting(cache_lp, recompute_lp)
    if parted is not None:
        divergence.token, (divergence.cache_token, _, divergence.cache_margin), \
            (divergence.recompute_token, _, divergence.recompute_margin) = parted
    return Parting(step=step, what=what, divergence=divergence, cache_steps=n_cache, recompute_steps=n_recompute)


def _rendered(st: EpisodeStep) -> str:
    calls = "".join(f"[call {c.name}({c.arguments})]" for c in st.tool_calls)
    return st.content + calls


def parting_message(p: Parting, cache_steps: int, recompute_steps: int) -> str:
    text = (f"the cache and recompute trajectories parted at step {p.step} ({p.what}); the cache path then ran "
            f"{cache_steps} steps, the recompute path {recompute_steps}")
    d = p.divergence
    if d is not None:
        text += (f"\n  cache:     {d.cache_excerpt}\n  recompute: {d.recompute_excerpt}")
        anatomy = d.anatomy()
        if anatomy:
            text += f"\n  at {anatomy}"
    return text
