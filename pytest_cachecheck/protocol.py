"""The measurement: six requests per probe, the validity rules and the verdict.

Order of requests for one probe:

1. cache run 1, turn 1 from a clean start;   2. cache run 1, turn 2 reusing turn 1's state;
3. cache run 2, turn 1 from a clean start;   4. cache run 2, turn 2 reusing turn 1's state;
5. recompute run 1, turn 2 from scratch;     6. recompute run 2, turn 2 from scratch.

Both recompute runs build turn 2 on cache run 1's turn-1 answer. A probe is valid when each path
repeats on its own, the server's counters show the cache-path turn 2 reused turn-1 prompt + answer (to
within the tolerance, and past the prompt) and the recompute path reused nothing. A valid probe whose
cache and recompute turn-2 answers differ is a divergence.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .clients import CLIENTS, ChatClient, Http, Reply
from .clients.openai_compat import new_salt
from .detect import block_size, detect_server, setup_problems
from .errors import RequestError, ServerSetupError
from .outcomes import DIFFERENT, ERROR, INCONCLUSIVE, SAME
from .probes import Probe
from .redact import Redactor, display_url
from .report import first_difference
from .settings import Settings

EXCERPT_BEFORE, EXCERPT_AFTER = 40, 40


@dataclass
class Step:
    """One request of a probe and what the server said."""

    name: str  # cache-1/turn-1, cache-1/turn-2, ..., recompute-2/turn-2
    server: str  # "cache" or "nocache"
    reply: Reply

    def to_dict(self) -> Dict[str, Any]:
        return {"step": self.name, "server": self.server, **self.reply.to_dict()}


#: a divergence is a near-tie when, at the first differing token, the top-1 minus top-2 logprob is below
#: this on both paths: the two best tokens were so close that kernel rounding could swap them. Otherwise
#: it is a large gap: at least one path was sure of its token, which is worth a closer look.
NEAR_TIE_NATS = 0.1


@dataclass
class Divergence:
    char: int
    token: Optional[int]
    cache_excerpt: str
    recompute_excerpt: str
    cache_token: Optional[str] = None
    recompute_token: Optional[str] = None
    cache_margin: Optional[float] = None
    recompute_margin: Optional[float] = None

    @property
    def kind(self) -> Optional[str]:
        if self.cache_margin is None or self.recompute_margin is None:
            return None
        return "near-tie" if max(self.cache_margin, self.recompute_margin) < NEAR_TIE_NATS else "large-gap"

    def anatomy(self) -> Optional[str]:
        if self.cache_token is None or self.recompute_token is None:
            return None
        text = f"token {self.token}: cache {self.cache_token!r} vs recompute {self.recompute_token!r}"
        if self.kind is not None:
            assert self.cache_margin is not None and self.recompute_margin is not None
            text += (f"; top-2 logprob margin {self.cache_margin:.4f} (cache) and {self.recompute_margin:.4f} "
                     f"(recompute) nats: {self.kind}")
        return text

    def to_dict(self) -> Dict[str, Any]:
        return {"char": self.char, "token": self.token, "cache_excerpt": self.cache_excerpt,
                "recompute_excerpt": self.recompute_excerpt, "cache_token": self.cache_token,
                "recompute_token": self.recompute_token, "cache_margin": self.cache_margin,
                "recompute_margin": self.recompute_margin, "kind": self.kind,
                "near_tie_threshold": NEAR_TIE_NATS}


@dataclass
class ProbeResult:
    """The outcome of one probe, with everything the report keeps."""

    probe: Probe
    outcome: str
    reason: str = ""
    steps: List[Step] = field(default_factory=list)
    divergence: Optional[Divergence] = None
    checks: Dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def valid(self) -> bool:
        return self.outcome in (SAME, DIFFERENT)

    @property
    def same(self) -> bool:
        return self.outcome == SAME

    @property
    def different(self) -> bool:
        return self.outcome == DIFFERENT

    def _content(self, name: str) -> Optional[str]:
        for s in self.steps:
            if s.name == name:
                return s.reply.content
        return None

    @property
    def cache_answer(self) -> Optional[str]:
        return self._content("cache-1/turn-2")

    @property
    def recompute_answer(self) -> Optional[str]:
        return self._content("recompute-1/turn-2")

    def message(self) -> str:
        """The text a user sees for this outcome."""
        if self.outcome == DIFFERENT and self.divergence is not None:
            d = self.divergence
            where = f"character {d.char}" + (f" (token {d.token})" if d.token is not None else "")
            text = (f"cache path and recompute path gave different turn-2 answers, from {where}\n"
                    f"  cache:     {d.cache_excerpt}\n"
                    f"  recompute: {d.recompute_excerpt}")
            anatomy = d.anatomy()
            return text + (f"\n  at {anatomy}" if anatomy else "")
        return self.reason

    def to_dict(self) -> Dict[str, Any]:
        answers = {
            "turn1": [self._content("cache-1/turn-1"), self._content("cache-2/turn-1")],
            "cache": [self._content("cache-1/turn-2"), self._content("cache-2/turn-2")],
            "recompute": [self._content("recompute-1/turn-2"), self._content("recompute-2/turn-2")],
        }
        return {
            "id": self.probe.id,
            "source": self.probe.source,
            "fingerprint": self.probe.fingerprint,
            "outcome": self.outcome,
            "reason": self.message() if self.outcome != SAME else "",
            "divergence": self.divergence.to_dict() if self.divergence else None,
            "checks": self.checks,
            "answers": answers,
            "requests": [s.to_dict() for s in self.steps],
            "duration_s": round(self.duration_s, 3),
        }


def excerpt(text: str, at: int) -> str:
    start = max(0, at - EXCERPT_BEFORE)
    head = ("..." if start > 0 else "") + text[start:at]
    tail = text[at:at + EXCERPT_AFTER] + ("..." if at + EXCERPT_AFTER < len(text) else "")
    return repr(head)[1:-1] + " >>> " + (repr(tail)[1:-1] if tail else "(end of answer)")


def _first_token_difference(a: Optional[List[str]], b: Optional[List[str]]) -> Optional[int]:
    if a is None or b is None:
        return None
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b)) if len(a) != len(b) else None


def _token_parting(a: Optional[List[Any]], b: Optional[List[Any]]) -> Optional[Tuple[int, Any, Any]]:
    """(index, cache entry, recompute entry) of the first token where the two answers part."""
    if not a or not b:
        return None
    for i, (x, y) in enumerate(zip(a, b)):
        if x[0] != y[0]:
            return i, x, y
    return None


class MissingCounter(ServerSetupError):
    pass


@dataclass
class Target:
    """The resolved run: mode, clients and what the servers said about themselves."""

    mode: str
    cache: ChatClient
    nocache: Optional[ChatClient]
    hit_tolerance: Optional[int] = None  # None: as configured; set from the server's block size
    checked: bool = False  # whether the setup checks that send requests (``checks.run_checks``) have run
    warnings: List[str] = field(default_factory=list)  # setup findings that do not stop the run
    notes: List[str] = field(default_factory=list)  # what those checks saw

    def describe(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"mode": self.mode, "server": self.cache.info.to_dict(),
                               "hit_tolerance": self.hit_tolerance, "setup_warnings": list(self.warnings),
                               "setup_checks": list(self.notes)}
        if self.nocache is not None:
            out["nocache_server"] = self.nocache.info.to_dict()
        return out


class Runner:
    """Runs probes against the configured server(s). Knows nothing about pytest."""

    def __init__(self, settings: Settings, redactor: Optional[Redactor] = None) -> None:
        self.settings = settings
        self.redactor = redactor or Redactor()
        self.redactor.add(settings.api_key)
        for url in (settings.url, settings.nocache_url, *settings.replicas):
            self.redactor.add_url(url)
        self._target: Optional[Target] = None
        self._setup_error: Optional[Exception] = None

    # -- set-up -----------------------------------------------------------------------------------
    def _http(self, url: str) -> Http:
        return Http(url, api_key=self.settings.api_key, timeout=self.settings.timeout,
                    redactor=self.redactor)

    def target(self, *, send: bool = True) -> Target:
        """Detect servers, resolve the mode and check the setup, once. Raises RequestError or
        ServerSetupError.

        ``send=False`` stops before the checks that send chat requests (an xdist controller, whose
        workers may already be probing the server, must not send any); they run on the next call with
        ``send=True``.
        """
        if self._setup_error is not None:
            raise self._setup_error
        try:
            if self._target is None:
                self._target = self._resolve()
            if send and not self._target.checked:
                self._check(self._target)
        except (RequestError, ServerSetupError) as exc:
            self._setup_error = exc
            raise
        return self._target

    def _check(self, target: Target) -> None:
        from .checks import run_checks

        target.checked = True
        found = run_checks(target.mode, target.cache, target.nocache, self.settings.skip_hit_check)
        target.warnings, target.notes = found.warnings, found.notes
        if found.problems:
            raise ServerSetupError("the server setup would spoil the measurement: " + "; ".join(found.problems))

    def _resolve(self) -> Target:
        s = self.settings
        http = self._http(s.url)
        info = detect_server(http, s.model)
        mode = s.mode
        if mode == "auto":
            mode = "llama.cpp" if info.kind == "llama.cpp" else "one-server"
        if mode == "llama.cpp" and info.kind != "llama.cpp":
            raise ServerSetupError(f"--cachecheck-mode llama.cpp, but {display_url(s.url)} does not answer "
                                   f"like llama-server (no /props); it looks like {info.kind}")
        if mode == "one-server" and info.kind == "llama.cpp":
            raise ServerSetupError("--cachecheck-mode one-server needs a server that honours cache_salt "
                                   "(vLLM, SGLang); llama-server has none: use --cachecheck-mode llama.cpp")
        cache = CLIENTS[info.kind](http, info)
        nocache = None
        if mode == "two-servers":
            assert s.nocache_url is not None
            http2 = self._http(s.nocache_url)
            info2 = detect_server(http2, s.model, prefer=info.model)
            nocache = CLIENTS[info2.kind](http2, info2)
        problems = setup_problems(mode, info, nocache.info if nocache else None)
        tolerance = s.hit_tolerance
        block = block_size(info)
        if block is not None and block - 1 > tolerance:
            if s.hit_tolerance_given:
                problems.append(f"the server caches in blocks of {block} tokens, so hits are rounded down by up "
                                f"to {block - 1}; --cachecheck-hit-tolerance {tolerance} is too small (use at "
                                f"least {block - 1})")
            else:
                tolerance = block - 1
        if problems:
            raise ServerSetupError("the server setup would spoil the measurement: " + "; ".join(problems))
        return Target(mode, cache, nocache, tolerance if tolerance != s.hit_tolerance else None)

    # -- one probe --------------------------------------------------------------------------------
    def run(self, probe: Probe) -> ProbeResult:
        """Measure one probe. Request failures give outcome 'error', never a divergence."""
        start = time.monotonic()
        result = ProbeResult(probe, ERROR)
        try:
            target = self.target()
            self._measure(target, probe, result)
            self._judge(target, result)
        except (RequestError, ServerSetupError) as exc:
            result.outcome = ERROR
            result.reason = self.redactor.scrub(str(exc))
        result.duration_s = time.monotonic() - start
        return result

    def _plan(self, target: Target) -> Tuple[Any, Any, Any]:
        """(turn-1 fields, turn-2 fields, recompute (client, fields)) for one cache run."""
        if target.mode == "llama.cpp":
            return {"cache_prompt": False}, {"cache_prompt": True}, (target.cache, {"cache_prompt": False})
        if target.mode == "one-server":
            salt = new_salt()
            return {"cache_salt": salt}, {"cache_salt": salt}, (target.cache, {"cache_salt": new_salt()})
        assert target.nocache is not None
        # two servers: the caching server's turn 1 still starts clean where its kind allows it, else
        # run 2's turn 1 would be a full cache hit; turn 2 is left to the server's own cache setting
        # (so the both-caches-off control stays off), and the recompute path is sent as it is.
        kind = target.cache.info.kind
        if kind == "llama.cpp":
            return {"cache_prompt": False}, {}, (target.nocache, {})
        if kind in ("vllm", "sglang"):
            salt = new_salt()
            return {"cache_salt": salt}, {"cache_salt": salt}, (target.nocache, {})
        return {}, {}, (target.nocache, {})

    @staticmethod
    def clean_turn1(target: Target) -> bool:
        """Whether the cache-path turn 1 was sent with a clean-start control (so it must reuse nothing)."""
        return target.mode != "two-servers" or target.cache.info.kind in ("llama.cpp", "vllm", "sglang")

    def _ask(self, result: ProbeResult, name: str, server: str, client: ChatClient,
             messages: List[Dict[str, str]], fields: Dict[str, Any]) -> Reply:
        # every turn-2 request (both paths, both runs) asks for logprobs alike, turn 1 never
        want = self.settings.logprobs and name.endswith("turn-2")
        reply = client.chat(messages, max_tokens=self.settings.max_tokens, cache=fields, logprobs=want)
        result.steps.append(Step(name, server, reply))
        if reply.cached_tokens is None and not self.settings.skip_hit_check:
            raise MissingCounter(
                f"{name}: the server at {client.http.shown} did not report cached tokens "
                f"(usage.prompt_tokens_details.cached_tokens is missing), so cache use cannot be checked; "
                f"turn reporting on with {client.reporting_flag}")
        return reply

    def _measure(self, target: Target, probe: Probe, result: ProbeResult) -> None:
        turn1 = probe.turn1_messages()
        first_answer: Optional[str] = None
        for run in (1, 2):
            t1_fields, t2_fields, _ = self._plan(target)
            t1 = self._ask(result, f"cache-{run}/turn-1", "cache", target.cache, turn1, t1_fields)
            if first_answer is None:
                first_answer = t1.content
            self._ask(result, f"cache-{run}/turn-2", "cache", target.cache,
                      probe.turn2_messages(t1.content), t2_fields)
        assert first_answer is not None
        turn2 = probe.turn2_messages(first_answer)
        for run in (1, 2):
            _, _, (client, fields) = self._plan(target)
            self._ask(result, f"recompute-{run}/turn-2", "nocache" if target.nocache else "cache",
                      client, turn2, fields)

    def _judge(self, target: Target, result: ProbeResult) -> None:
        s = self.settings
        tolerance = target.hit_tolerance if target.hit_tolerance is not None else s.hit_tolerance
        by = {st.name: st.reply for st in result.steps}
        problems: List[str] = []
        checks: Dict[str, Any] = {"hit_tolerance": tolerance, "skip_hit_check": s.skip_hit_check}

        def compare(a: str, b: str, what: str) -> None:
            at = first_difference(by[a].content, by[b].content)
            if at is not None:
                problems.append(f"{what} (from character {at})")

        compare("cache-1/turn-1", "cache-2/turn-1", "the two cache runs gave different turn-1 answers")
        compare("cache-1/turn-2", "cache-2/turn-2", "the two cache runs gave different turn-2 answers")
        compare("recompute-1/turn-2", "recompute-2/turn-2", "the two recompute runs gave different answers")

        hits = []
        for run in (1, 2):
            t1, t2 = by[f"cache-{run}/turn-1"], by[f"cache-{run}/turn-2"]
            assert t1.prompt_tokens is not None and t1.completion_tokens is not None
            full = t1.prompt_tokens + t1.completion_tokens - 1
            need = max(full - tolerance, 0)
            hits.append({"run": run, "cached_tokens": t2.cached_tokens, "turn1_prompt_tokens": t1.prompt_tokens,
                         "turn1_answer_tokens": t1.completion_tokens, "expected_at_least": need,
                         "full_reuse": full})
            if s.skip_hit_check:
                continue
            cached = t2.cached_tokens
            assert cached is not None
            if cached < need:
                problems.append(
                    f"cache run {run}: turn-2 cache hit was {cached} tokens, expected at least {need} "
                    f"(turn-1 prompt {t1.prompt_tokens} + answer {t1.completion_tokens} - 1 - tolerance "
                    f"{tolerance})")
            elif cached <= t1.prompt_tokens:
                problems.append(
                    f"cache run {run}: turn-2 cache hit was {cached} tokens, not past the turn-1 prompt "
                    f"({t1.prompt_tokens} tokens); ask for a longer turn-1 answer or a smaller block size")
            if self.clean_turn1(target) and t1.cached_tokens:
                problems.append(f"cache run {run}: turn 1 reused {t1.cached_tokens} cached tokens; it must "
                                f"start from a clean state")
        reasoned = max(by[f"cache-{run}/turn-1"].reasoning_chars for run in (1, 2))
        if reasoned and any("turn-2 cache hit was" in p for p in problems):
            problems.append(f"turn 1 came with {reasoned} characters of reasoning, which the server split off "
                            f"the answer and the turn-2 history (the answer only) does not carry; turn thinking "
                            f"off for this check")
        checks["cache_hits"] = hits
        reused = []
        for run in (1, 2):
            r = by[f"recompute-{run}/turn-2"]
            if r.cached_tokens:
                reused.append(r.cached_tokens)
                problems.append(f"recompute run {run} reused {r.cached_tokens} cached tokens, expected 0")
        checks["recompute_reused"] = bool(reused)
        result.checks = checks
        if problems:
            result.outcome = INCONCLUSIVE
            result.reason = "inconclusive: " + "; ".join(problems)
            return
        cache_answer, recompute_answer = by["cache-1/turn-2"].content, by["recompute-1/turn-2"].content
        at = first_difference(cache_answer, recompute_answer)
        if at is None:
            result.outcome = SAME
            return
        result.outcome = DIFFERENT
        divergence = Divergence(at, None, excerpt(cache_answer, at), excerpt(recompute_answer, at))
        parted = _token_parting(by["cache-1/turn-2"].logprobs, by["recompute-1/turn-2"].logprobs)
        if parted is not None:
            divergence.token, (divergence.cache_token, _, divergence.cache_margin), \
                (divergence.recompute_token, _, divergence.recompute_margin) = parted
        else:
            divergence.token = _first_token_difference(target.cache.token_pieces(cache_answer),
                                                       target.cache.token_pieces(recompute_answer))
        result.divergence = divergence
        result.reason = result.message()
