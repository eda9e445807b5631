"""The measurement: six requests per probe, the divergence; the validity rules are in validity.py.

Order of requests for one probe:

1. cache run 1, turn 1 from a clean start;   2. cache run 1, turn 2 reusing turn 1's state;
3. recompute run 1, turn 2 from scratch;
4. cache run 2, turn 1 from a clean start;   5. cache run 2, turn 2 reusing turn 1's state;
6. recompute run 2, turn 2 from scratch.

Both recompute runs build turn 2 on cache run 1's turn-1 answer. A probe is valid when each path
repeats on its own, the server's counters show the cache-path turn 2 reused turn-1 prompt + answer (to
within the tolerance, and past the prompt) and the recompute path reused nothing. A valid probe whose
cache and recompute turn-2 answers differ is a divergence. Knows nothing about pytest.

Logprobs (top-2 per answer token) are asked for only where a verdict reads them: on the two run-2 turn-2
requests (5 and 6), and only when run 1's cache and recompute answers parted. Run 2 must repeat run 1
exactly, so a run 2 that asking for logprobs had changed fails the "path did not repeat" rule and the
anatomy (token index, both tokens, both margins) never rests on a changed answer. Turn 1 never asks; with
``logprobs`` off in the settings nothing asks.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from .clients import ChatClient, Reply, plugin_kinds
from .clients.base import TokenLogprob
from .errors import RequestError, ServerSetupError
from .background import Background
from .kinds import LOADED
from .model import (LOADED_STEPS, BatchShape, Checks, Divergence, HitCheck, LoadedRecord, Outcome,
                    ProbeRecord)
from .probes import Probe
from .redact import Redactor
from .servers import ServerSetup, resolve
from .settings import Settings
from .validity import MissingCounter, Rules, Span, differs, inconclusive, settled, under_load, untrusted

EXCERPT_BEFORE, EXCERPT_AFTER = 40, 40


def first_difference(a: str, b: str) -> Optional[int]:
    """Index of the first character where a and b differ (the shorter length if one is a prefix)."""
    if a == b:
        return None
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def excerpt(text: str, at: int) -> str:
    start = max(0, at - EXCERPT_BEFORE)
    head = ("..." if start > 0 else "") + text[start:at]
    tail = text[at:at + EXCERPT_AFTER] + ("..." if at + EXCERPT_AFTER < len(text) else "")
    return repr(head)[1:-1] + " >>> " + (repr(tail)[1:-1] if tail else "(end of answer)")


def divergence_message(d: Divergence, large_gap: str = "") -> str:
    where = f"character {d.char}" + (f" (token {d.token})" if d.token is not None else "")
    text = (f"cache path and recompute path gave different turn-2 answers, from {where}\n"
            f"  cache:     {d.cache_excerpt}\n"
            f"  recompute: {d.recompute_excerpt}")
    anatomy = d.anatomy(large_gap=large_gap)
    return text + (f"\n  at {anatomy}" if anatomy else "")


def _first_token_difference(a: Optional[List[str]], b: Optional[List[str]]) -> Optional[int]:
    if a is None or b is None:
        return None
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b)) if len(a) != len(b) else None


def _token_parting(a: Optional[List[TokenLogprob]], b: Optional[List[TokenLogprob]]
                   ) -> Optional[Tuple[int, TokenLogprob, TokenLogprob]]:
    """(index, cache entry, recompute entry) of the first token where the two answers part."""
    if not a or not b:
        return None
    for i, (x, y) in enumerate(zip(a, b)):
        if x[0] != y[0]:
            return i, x, y
    return None


def divergence_of(client: ChatClient, a: Reply, b: Reply) -> Optional[Divergence]:
    """Where answer ``a`` (the cache side of a Divergence) and ``b`` (its recompute side) part, or None when
    they are the same: the character, an excerpt of each, and the token with both top-2 margins where both
    replies carry logprobs, else the token index from the server's own tokens where it can say."""
    at = first_difference(a.content, b.content)
    if at is None:
        return None
    divergence = Divergence(char=at, token=None, cache_excerpt=excerpt(a.content, at),
                            recompute_excerpt=excerpt(b.content, at))
    parted = _token_parting(a.logprobs, b.logprobs)
    if parted is not None:
        divergence.token, (divergence.cache_token, _, divergence.cache_margin), \
            (divergence.recompute_token, _, divergence.recompute_margin) = parted
    else:
        divergence.token = _first_token_difference(client.token_pieces(a.content),
                                                   client.token_pieces(b.content))
    return divergence


class Runner:
    """Runs probes against the configured server(s): resolves and checks the setup once, then measures."""

    def __init__(self, settings: Settings, redactor: Optional[Redactor] = None,
                 server_kinds: Callable[[], Iterable[Any]] = tuple) -> None:
        __tracebackhide__ = True  # ``url`` may hold credentials
        self.settings = settings
        #: the ``pytest_cachecheck_server_kinds`` hook's results, asked for when the servers are detected
        self.server_kinds = server_kinds
        self.redactor = redactor or Redactor()
        self.redactor.add(settings.api_key)
        for url in (settings.url, settings.nocache_url, *settings.replicas):
            self.redactor.add_url(url)
        self.setup: Optional[ServerSetup] = None
        self._background: Optional[Background] = None  # while a probe is measured under load
        self._setup_error: Optional[Exception] = None

    # -- set-up -----------------------------------------------------------------------------------
    def prepare(self, *, send: bool = True) -> ServerSetup:
        """Detect the servers, resolve the mode and check the setup, once. Raises RequestError or
        ServerSetupError (again on every later call), and ConfigError when the server kinds hook returned
        something other than client classes.

        ``send=False`` stops before the checks that send chat requests (an xdist controller, whose
        workers may already be probing the server, must not send any); they run on the next call with
        ``send=True``.
        """
        if self._setup_error is not None:
            raise self._setup_error
        try:
            if self.setup is None:
                self.setup = resolve(self.settings, self.redactor, plugin_kinds(self.server_kinds()))
            if send and not self.setup.checked:
                self.setup.check(self.settings.skip_hit_check, self.settings.order)
        except (RequestError, ServerSetupError) as exc:
            self._setup_error = exc
            raise
        return self.setup

    # -- one probe --------------------------------------------------------------------------------
    def run(self, probe: Probe, load: Optional[BatchShape] = None) -> ProbeRecord:
        """Measure one probe. Request failures give outcome 'error', never a divergence.

        ``load``: the cache under load (the loaded kind): every turn-2 request is sent amid this background
        (background.py), turn 1 alone; the record is a :class:`LoadedRecord` with its load runs, and the load
        rule (:func:`~pytest_cachecheck.validity.under_load`) is one more validity rule."""
        start = time.monotonic()
        record = (ProbeRecord if load is None else LoadedRecord)(
            id=probe.id, source=probe.source, fingerprint=probe.fingerprint, outcome=Outcome.ERROR)
        replies: Dict[str, Reply] = {}
        try:
            with settled(record, self.redactor.scrub):
                setup = self.prepare()
                if isinstance(record, LoadedRecord):
                    assert load is not None
                    record.shape = load
                    self._background = Background(setup.cache, load, beside_cache=True)
                self._measure(setup, probe, record, replies)
                self._judge(setup, record, replies)
        finally:
            self._background = None  # the next probe is measured quietly
        record.duration_s = time.monotonic() - start
        return record

    def _ask(self, record: ProbeRecord, replies: Dict[str, Reply], name: str, server: str, client: ChatClient,
             messages: List[Dict[str, Any]], fields: Dict[str, Any], logprobs: bool = False) -> Reply:
        def send() -> Tuple[Reply, Span]:
            sent = time.monotonic()
            return (client.chat(messages, max_tokens=self.settings.max_tokens, cache=fields, logprobs=logprobs),
                    Span(sent, time.monotonic()))

        if isinstance(record, LoadedRecord) and self._background is not None and name in LOADED_STEPS:
            reply, load = self._background.around(len(record.loads) + 1, send)
            record.loads.append(load)
        else:
            reply, _ = send()
        replies[name] = reply
        record.requests.append(reply.request(name, server))
        MissingCounter.check(reply, name, client, self.settings.skip_hit_check)
        return reply

    def _measure(self, setup: ServerSetup, probe: Probe, record: ProbeRecord, replies: Dict[str, Reply]) -> None:
        two = setup.nocache is not None
        recompute_client = setup.nocache if setup.nocache is not None else setup.cache
        turn1 = probe.turn1_messages()
        turn2: List[Dict[str, Any]] = []
        logprobs = False
        for run in (1, 2):
            plan = setup.cache.cache_plan(own_setting=two)
            t1 = self._ask(record, replies, f"cache-{run}/turn-1", "cache", setup.cache, turn1, plan.first)
            own_turn2 = probe.turn2_messages(t1.content)
            if run == 1:
                turn2 = own_turn2  # both recompute runs build on cache run 1's turn-1 answer
            self._ask(record, replies, f"cache-{run}/turn-2", "cache", setup.cache, own_turn2, plan.reuse,
                      logprobs)
            # two servers: the recompute path is sent as it is; one server: from scratch by its own control
            fields = {} if two else (recompute_client.scratch() or {})
            self._ask(record, replies, f"recompute-{run}/turn-2", "nocache" if two else "cache",
                      recompute_client, turn2, fields, logprobs)
            # run 2 asks for the anatomy's logprobs only where run 1's two paths parted
            logprobs = self.settings.logprobs and \
                replies["cache-1/turn-2"].content != replies["recompute-1/turn-2"].content

    def _judge(self, setup: ServerSetup, record: ProbeRecord, replies: Dict[str, Reply]) -> None:
        s = self.settings
        rules = Rules(setup.tolerance(s.hit_tolerance), s.skip_hit_check,
                      setup.cache.cache_plan(own_setting=setup.nocache is not None).clean_start)
        bad = untrusted(list(replies.items()))
        if bad:
            record.outcome, record.reason = Outcome.INCONCLUSIVE, bad
            return
        problems = [p for a, b, what in (
            ("cache-1/turn-1", "cache-2/turn-1", "the two cache runs gave different turn-1 answers"),
            ("cache-1/turn-2", "cache-2/turn-2", "the two cache runs gave different turn-2 answers"),
            ("recompute-1/turn-2", "recompute-2/turn-2", "the two recompute runs gave different answers"))
            for p in [differs(what, first_difference(replies[a].content, replies[b].content), "character")] if p]
        hits, missed = [], False
        for run in (1, 2):
            t1, t2 = replies[f"cache-{run}/turn-1"], replies[f"cache-{run}/turn-2"]
            assert t1.prompt_tokens is not None and t1.completion_tokens is not None
            hits.append(HitCheck(run=run, cached_tokens=t2.cached_tokens, turn1_prompt_tokens=t1.prompt_tokens,
                                 turn1_answer_tokens=t1.completion_tokens, expected_at_least=rules.need(t1),
                                 full_reuse=rules.full(t1)))
            hit = rules.hit(f"cache run {run}: turn-2 cache hit", t2.cached_tokens, t1, "turn-1",
                            "the turn-1 prompt")
            if hit is not None:
                missed = True
                problems.append(hit.text if hit.short else
                                f"{hit.text}; ask for a longer turn-1 answer or a smaller block size")
            problems += [p for p in [rules.clean(f"cache run {run}: turn 1", t1.cached_tokens)] if p]
        reasoned = max(replies[f"cache-{run}/turn-1"].reasoning_chars for run in (1, 2))
        if reasoned and missed:
            problems.append(f"turn 1 came with {reasoned} characters of reasoning, which the server split off "
                            f"the answer and the turn-2 history (the answer only) does not carry; turn thinking "
                            f"off for this check")
        reuse = [p for run in (1, 2) for p in [rules.no_reuse(f"recompute run {run}",
                                                              replies[f"recompute-{run}/turn-2"].cached_tokens)] if p]
        problems += reuse
        if isinstance(record, LoadedRecord):  # the load rule, for each request measured under load
            problems += [p for step, x in zip(LOADED_STEPS, record.loads)
                         for p in [under_load(step, x.in_flight_at_send, x.background)] if p]
        record.checks = Checks(hit_tolerance=rules.tolerance, skip_hit_check=s.skip_hit_check, cache_hits=hits,
                               recompute_reused=bool(reuse))
        if problems:
            record.outcome, record.reason = Outcome.INCONCLUSIVE, inconclusive(problems)
            return
        # run 2 repeats run 1 (checked above) and carries the logprobs where they were asked for
        divergence = divergence_of(setup.cache, replies["cache-2/turn-2"], replies["recompute-2/turn-2"])
        if divergence is None:
            record.outcome = Outcome.SAME
            return
        record.outcome = Outcome.DIFFERENT
        record.divergence = divergence
        # under load a large gap is no rounding (the quiet probe's large gap says nothing more)
        record.reason = divergence_message(divergence, LOADED.large_gap if isinstance(record, LoadedRecord) else "")
