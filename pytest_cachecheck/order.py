"""The order measurement: does a probe's answer change with the order the server saw the conversations in,
and the state earlier ones left?

The probe set is sent as an application would send it: no cache control field (the server's own defaults
decide, for llama-server its ``cache_prompt`` default and its host-memory cache), no pinned slot, one request
at a time. Twice:

* pass A: every probe's conversation in file order: turn 1, then turn 2 built on its own turn-1 answer;
* pass B: the same conversations in reverse order, with ``OrderConditions.between`` other conversations
  (generated like the batch kind's background, sharing no text with the probes) sent before each one.

Each request's cached-token counter is kept: which request reused how much state in which pass is the
evidence of "state". Valid (the rules are validity.py's): every request answered, by the expected model,
with counters that can be trusted. A valid probe whose transcript (turn-1 or turn-2 answer) differs between
the passes is ``different``; a failed request, the other conversations' included, is an ``error``, never a
difference. Knows nothing about pytest.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence

from .clients import ChatClient, Reply
from .errors import CachecheckError
from .kinds import ORDER
from .model import Divergence, OrderConditions, OrderRecord, Outcome
from .probes import Probe
from .protocol import divergence_of
from .redact import Redactor
from .validity import MissingCounter, settled, untrusted

__all__ = ["OrderRunner", "STEPS", "order_message"]

STEPS = ("A/turn-1", "A/turn-2", "B/turn-1", "B/turn-2")


def order_message(d: Divergence, turn: int) -> str:
    where = f"character {d.char}" + (f" (token {d.token})" if d.token is not None else "")
    text = (f"pass B (reversed, after other conversations) gave another turn-{turn} answer than pass A, from "
            f"{where}\n"
            f"  pass A: {d.cache_excerpt}\n"
            f"  pass B: {d.recompute_excerpt}")
    anatomy = d.anatomy(("pass A", "pass B"), ORDER.large_gap)
    return text + (f"\n  at {anatomy}" if anatomy else "")


def reused(record: OrderRecord) -> str:
    """``cached tokens: A/turn-1 0, A/turn-2 31, B/turn-1 12, B/turn-2 40``: the state each request reused."""
    return "cached tokens: " + ", ".join(f"{r.step} {r.cached_tokens}" for r in record.requests)


class _Failed(Exception):
    """Another conversation's request failed: the probe it preceded is an error, named by the request."""


class OrderRunner:
    """Measures a probe set's order and state effect on one server (``client``), answers up to ``max_tokens``.
    ``logprobs``: ask the top-2 logprobs on every measured request of both passes (the same fields in both,
    so the comparison stays symmetric), which gives a difference its anatomy."""

    def __init__(self, client: ChatClient, conditions: OrderConditions, *, max_tokens: int,
                 logprobs: bool = True, skip_hit_check: bool = False,
                 redactor: Optional[Redactor] = None) -> None:
        self.client = client
        self.conditions = conditions
        self.max_tokens = max_tokens
        self.logprobs = logprobs
        self.skip_hit_check = skip_hit_check
        self.redactor = redactor or Redactor()
        self._others = conditions.others()

    def run(self, probes: Sequence[Probe]) -> List[OrderRecord]:
        """Measure the set; one record per probe, in the order given. A failed request: outcome 'error'."""
        records = [OrderRecord(id=p.id, source=p.source, fingerprint=p.fingerprint, outcome=Outcome.SAME,
                               conditions=self.conditions) for p in probes]
        replies: List[Dict[str, Reply]] = [{} for _ in probes]
        spent = [0.0] * len(probes)
        for i, probe in enumerate(probes):  # pass A: file order
            start = time.monotonic()
            records[i].positions.append(i + 1)
            with settled(records[i], self.redactor.scrub):
                self._conversation(records[i], replies[i], "A", probe)
            spent[i] += time.monotonic() - start
        order = [i for i in reversed(range(len(probes))) if records[i].outcome != Outcome.ERROR]
        for place, i in enumerate(order):  # pass B: reversed, other conversations before each
            start = time.monotonic()
            records[i].positions.append(place + 1)
            with settled(records[i], self.redactor.scrub, also=(_Failed,)):
                self._others_between()
                self._conversation(records[i], replies[i], "B", probes[i])
            spent[i] += time.monotonic() - start
        for record, got, seconds in zip(records, replies, spent):
            if record.outcome != Outcome.ERROR and record.outcome != Outcome.INCONCLUSIVE:
                self._judge(record, got)
            record.duration_s = seconds
        return records

    def _ask(self, record: OrderRecord, replies: Dict[str, Reply], name: str, messages: List[Dict[str, Any]]
             ) -> Reply:
        reply = self.client.chat(messages, max_tokens=self.max_tokens, cache=self.client.as_app(),
                                 logprobs=self.logprobs)
        replies[name] = reply
        record.requests.append(reply.request(name, "cache"))
        MissingCounter.check(reply, name, self.client, self.skip_hit_check)
        return reply

    def _conversation(self, record: OrderRecord, replies: Dict[str, Reply], run: str, probe: Probe) -> None:
        """Turn 1, then turn 2 built on this pass's own turn-1 answer, as an application's user would."""
        turn1 = self._ask(record, replies, f"{run}/turn-1", probe.turn1_messages())
        self._ask(record, replies, f"{run}/turn-2", probe.turn2_messages(turn1.content))

    def _others_between(self) -> None:
        n = len(self._others)
        for k, messages in enumerate(self._others):
            try:
                self.client.chat(messages, max_tokens=self.conditions.max_tokens, cache=self.client.as_app())
            except (CachecheckError, OSError) as exc:
                raise _Failed(f"pass B: other conversation {k + 1} of {n} before this probe failed: "
                              f"{exc}") from None

    def _judge(self, record: OrderRecord, replies: Dict[str, Reply]) -> None:
        bad = untrusted(list(replies.items()))
        if bad:
            record.outcome, record.reason = Outcome.INCONCLUSIVE, bad
            return
        for turn in (1, 2):
            divergence = divergence_of(self.client, replies[f"A/turn-{turn}"], replies[f"B/turn-{turn}"])
            if divergence is not None:
                record.outcome, record.divergence, record.parted_turn = Outcome.DIFFERENT, divergence, turn
                record.reason = f"{order_message(divergence, turn)}\n  {reused(record)}"
                return
        record.outcome = Outcome.SAME
