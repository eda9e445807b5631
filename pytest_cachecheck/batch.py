"""The batch measurement: does a probe's answer change when the server has other work in flight?

One probe, the cache off on every request (the kind's own scratch control), so that only the batch differs:

1. turn 1, alone: the conversation's turn-1 answer;
2. alone run 1: turn 2 (the whole conversation) with nothing else in flight;
3. load run 1: the same turn 2, sent ``lead_s`` after ``BatchShape.concurrent`` background requests, while
   they are in flight;
4. alone run 2 and 5. load run 2: the same again.

The runs are interleaved (alone, load, alone, load) as the cache measurement's are, so that run 2 asks for
the top-2 logprobs only where run 1's two answers parted, and the anatomy (token, both margins) comes from
answers that repeat the ones asked without logprobs. Background requests are generated from
``BatchShape.seed`` (the same for every probe and run), share no text with the measured request, answer
``BatchShape.max_tokens`` tokens (``ignore_eos`` where the kind honours it) and are finished before the next
request is sent.

The records (:class:`~pytest_cachecheck.model.BatchRecord`, its :class:`~pytest_cachecheck.model.BatchShape`
and :class:`~pytest_cachecheck.model.LoadRun`) are the model's, so the reports read them back.

Valid (the rules are in validity.py): the counters can be trusted, the two alone runs repeat, no measured
request reused cached tokens, and each load run's background was in flight when its measured request was sent
(:func:`~pytest_cachecheck.validity.under_load`). The load runs need not repeat each other: which steps the
background shares with the measured request depends on timing, so requiring it would hide the effect
measured. A valid probe whose answer under load (either run) differs from its answer alone is ``different``.
A failed request, background ones included, is an ``error``. Knows nothing about pytest.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .background import Background
from .clients import ChatClient, Reply
from .kinds import BATCH
from .model import BatchRecord, BatchShape, Divergence, LoadRun, Outcome, Tally
from .probes import Probe
from .protocol import divergence_of, first_difference
from .redact import Redactor
from .validity import (
    MissingCounter,
    Rules,
    Span,
    differs,
    inconclusive,
    settled,
    under_load,
    untrusted,
)

__all__ = ["BatchRecord", "BatchRunner", "BatchShape", "LoadRun", "STEPS", "batch_message", "summary_line"]

KIND = "batch"
STEPS = ("turn-1", "alone-1/turn-2", "load-1/turn-2", "alone-2/turn-2", "load-2/turn-2")

def summary_line(records: Sequence[BatchRecord], shape: BatchShape) -> str:
    """``batch: ...; cache off: 1 of 12 valid probes answered differently under load: 8.3% (1/12, 95% CI
    ...); 0 inconclusive, 0 errors``."""
    t = Tally.of(records)  # type: ignore[arg-type]  # reads .outcome only
    rate = t.rate
    said = f": {rate.text()}" if rate is not None else ""
    return (f"{shape.label()}: {t.different} of {t.valid} valid probes answered differently under "
            f"load{said}; {t.inconclusive} inconclusive, {t.errors} errors")


def batch_message(d: Divergence, run: int) -> str:
    where = f"character {d.char}" + (f" (token {d.token})" if d.token is not None else "")
    text = (f"under load (run {run}) the turn-2 answer differed from the answer alone, from {where}\n"
            f"  alone: {d.cache_excerpt}\n"
            f"  load:  {d.recompute_excerpt}")
    anatomy = d.anatomy(("alone", "load"), BATCH.large_gap)
    return text + (f"\n  at {anatomy}" if anatomy else "")


class BatchRunner:
    """Measures probes' batch effect on one server (``client``), with answers of up to ``max_tokens``."""

    def __init__(self, client: ChatClient, shape: BatchShape, *, max_tokens: int, logprobs: bool = True,
                 skip_hit_check: bool = False, redactor: Optional[Redactor] = None) -> None:
        self.client = client
        self.shape = shape
        self.max_tokens = max_tokens
        self.logprobs = logprobs
        self.skip_hit_check = skip_hit_check
        self.redactor = redactor or Redactor()
        self._background = Background(client, shape)

    def fields(self) -> Dict[str, Any]:
        """Every request's cache and slot fields: computed from scratch, on any free slot."""
        return {**(self.client.scratch() or {}), **self.client.unpinned()}

    def run(self, probe: Probe) -> BatchRecord:
        """Measure one probe. Request failures give outcome 'error', never a difference."""
        start = time.monotonic()
        record = BatchRecord(id=probe.id, source=probe.source, fingerprint=probe.fingerprint,
                             outcome=Outcome.ERROR, shape=self.shape)
        replies: Dict[str, Reply] = {}
        with settled(record, self.redactor.scrub):
            self._measure(probe, record, replies)
            self._judge(record, replies)
        record.duration_s = time.monotonic() - start
        return record

    def _ask(self, record: BatchRecord, replies: Dict[str, Reply], name: str, messages: List[Dict[str, Any]],
             logprobs: bool = False) -> Tuple[Reply, Span]:
        sent = time.monotonic()
        reply = self.client.chat(messages, max_tokens=self.max_tokens, cache=self.fields(), logprobs=logprobs)
        span = Span(sent, time.monotonic())
        replies[name] = reply
        record.requests.append(reply.request(name, "cache"))
        MissingCounter.check(reply, name, self.client, self.skip_hit_check)
        return reply, span

    def _measure(self, probe: Probe, record: BatchRecord, replies: Dict[str, Reply]) -> None:
        turn1, _ = self._ask(record, replies, "turn-1", probe.turn1_messages())
        turn2 = probe.turn2_messages(turn1.content)
        logprobs = False
        for run in (1, 2):
            _, alone = self._ask(record, replies, f"alone-{run}/turn-2", turn2, logprobs)
            record.alone_s.append(alone.answered - alone.sent)
            record.loads.append(self._under_load(record, replies, run, turn2, logprobs))
            # run 2 asks for the anatomy's logprobs only where run 1's answers parted
            logprobs = self.logprobs and replies["alone-1/turn-2"].content != replies["load-1/turn-2"].content

    def _under_load(self, record: BatchRecord, replies: Dict[str, Reply], run: int,
                    turn2: List[Dict[str, Any]], logprobs: bool) -> LoadRun:
        """The measured request amid the background (background.py: one rule for every kind under load)."""
        _, load = self._background.around(
            run, lambda: self._ask(record, replies, f"load-{run}/turn-2", turn2, logprobs))
        return load

    def _judge(self, record: BatchRecord, replies: Dict[str, Reply]) -> None:
        bad = untrusted(list(replies.items()))
        if bad:
            record.outcome, record.reason = Outcome.INCONCLUSIVE, bad
            return
        alone = first_difference(replies["alone-1/turn-2"].content, replies["alone-2/turn-2"].content)
        found = [differs("the two runs alone gave different answers", alone, "character")]
        found += [Rules.no_reuse(name, replies[name].cached_tokens) for name in STEPS[1:]]
        found += [under_load(f"load run {x.run}", x.in_flight_at_send, x.background) for x in record.loads]
        problems = [p for p in found if p]
        if problems:
            record.outcome, record.reason = Outcome.INCONCLUSIVE, inconclusive(problems)
            return
        for run in (2, 1):  # run 2 carries the logprobs where they were asked for
            alone_reply, load_reply = replies[f"alone-{run}/turn-2"], replies[f"load-{run}/turn-2"]
            divergence = divergence_of(self.client, alone_reply, load_reply)
            if divergence is not None:
                record.outcome, record.divergence, record.parted_run = Outcome.DIFFERENT, divergence, run
                record.reason = batch_message(divergence, run)
                return
        record.outcome = Outcome.SAME
