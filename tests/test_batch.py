"""The batch measurement (pytest_cachecheck/batch.py) against the vLLM emulator, a real HTTP server in
process.

The controls: an emulated server whose answers depend on the batch (``batch_variant``) must be caught as
``different``, the same server without that fault must give ``same``, and with one slot (requests queue,
nothing is batched) the batch effect must be 0 while every probe stays valid. Then each validity rule on its
own: background that ended first, reuse, a failing background request.
"""

from __future__ import annotations

import re
from typing import Any, List

import pytest

from pytest_cachecheck.batch import STEPS, BatchRecord, BatchRunner, BatchShape, summary_line
from pytest_cachecheck.clients import detect_server
from pytest_cachecheck.clients.http import Http
from pytest_cachecheck.model import NEAR_TIE_NATS, Outcome
from pytest_cachecheck.probes import builtin_probes
from pytest_cachecheck.validity import Span, overlap, under_load
from tests.support import emulator as emulator_module

# short background (the emulator answers max_tokens characters at once; compute_seconds gives it its time)
SHAPE = BatchShape(concurrent=2, prompt_words=20, max_tokens=8, seed=7, lead_s=0.1)


@pytest.fixture(autouse=True)
def _emulator_without_nagle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emulator_module._Handler, "disable_nagle_algorithm", True)  # see tests/test_faults.py


def measure(emu: Any, n: int = 2, shape: BatchShape = SHAPE) -> List[BatchRecord]:
    client = detect_server(Http(emu.url, timeout=30), None)
    runner = BatchRunner(client, shape, max_tokens=64)
    return [runner.run(p) for p in builtin_probes()[:n]]


def test_positive_control_a_batch_variant_server_is_caught(emulator):
    emu = emulator(batch_variant=True, compute_seconds=0.5)
    records = measure(emu)
    assert [r.outcome for r in records] == [Outcome.DIFFERENT] * 2, [r.reason for r in records]
    for r in records:
        assert [q.step for q in r.requests] == list(STEPS)
        answers = {q.step: q.content for q in r.requests}
        assert answers["alone-1/turn-2"] == answers["alone-2/turn-2"] != answers["load-1/turn-2"]
        assert all(q.cached_tokens == 0 for q in r.requests)
        assert [(x.background, x.in_flight_at_send) for x in r.loads] == [(2, 2), (2, 2)]
        # run 2 asked for logprobs (run 1 parted), so the divergence has the token and both margins
        d = r.divergence
        assert r.parted_run == 2 and d is not None and d.char == 40 and d.token == 40
        assert d.cache_token != d.recompute_token and d.kind in ("near-tie", "large-gap")
        assert r.reason.startswith("under load (run 2) the turn-2 answer differed from the answer alone, "
                                   "from character 40 (token 40)\n  alone: ")
        assert f"nats: {d.kind}" in r.reason and NEAR_TIE_NATS > 0
        # a large gap amid other requests is called what it is: no rounding, a state-mixing bug's signature
        assert ("is not rounding noise" in r.reason) == (d.kind == "large-gap")
        assert r.line().startswith(f"{r.id} [batch: 2 background requests of 20 words, up to 8 tokens, "
                                   f"seed 7; cache off] different")
    assert summary_line(records, SHAPE) == (
        "batch: 2 background requests of 20 words, up to 8 tokens, seed 7; cache off: 2 of 2 valid probes "
        "answered differently under load: 100.0% (2/2, 95% CI 34.2% to 100.0%); 0 inconclusive, 0 errors")


def test_the_same_server_without_the_fault_gives_same(emulator):
    emu = emulator(compute_seconds=0.5)
    records = measure(emu)
    assert [r.outcome for r in records] == [Outcome.SAME] * 2, [r.reason for r in records]
    assert all(x.in_flight_at_send == 2 for r in records for x in r.loads)
    assert emu.max_in_flight == 3  # the measured request and both background requests at once
    # nothing parted in run 1, so nothing asked for logprobs
    assert not any(body.get("logprobs") for body in emu.requests_log)


def test_negative_control_one_slot_queues_so_the_effect_is_zero(emulator):
    """One slot: the measured request waits for the background ones and computes alone. It was sent while
    they were in flight, so it is valid under the load rule, and the batch-variant fault never fires."""
    emu = emulator(batch_variant=True, compute_seconds=0.2, slots=1)
    records = measure(emu)
    assert [r.outcome for r in records] == [Outcome.SAME] * 2, [r.reason for r in records]
    for r in records:
        for load in r.loads:
            assert load.in_flight_at_send >= 1  # sent while the background was in flight ...
            assert load.in_flight_at_answer == 0  # ... answered after it ended: it was queued
            assert load.measured_s > 0.3


def test_background_must_be_in_flight_when_the_measured_request_is_sent(emulator):
    emu = emulator()  # answers at once: the background ends within the lead time
    shape = BatchShape(concurrent=2, prompt_words=20, max_tokens=8, lead_s=0.3)
    (record,) = measure(emu, 1, shape)
    assert record.outcome == Outcome.INCONCLUSIVE
    assert record.reason == (
        "inconclusive: load run 1: none of the 2 background requests was in flight when it was sent (they "
        "ended first); give them more tokens to answer; load run 2: none of the 2 background requests was in "
        "flight when it was sent (they ended first); give them more tokens to answer")


def test_reuse_on_any_measured_request_is_inconclusive(emulator):
    emu = emulator(honor_salt=False, compute_seconds=0.1)  # the scratch salt is ignored: turn 2 hits turn 1
    (record,) = measure(emu, 1)
    assert record.outcome == Outcome.INCONCLUSIVE
    assert re.match(r"inconclusive: alone-1/turn-2 reused \d+ cached tokens, expected 0; "
                    r"load-1/turn-2 reused", record.reason), record.reason


def test_a_failing_background_request_is_an_error(emulator):
    # chat requests: 1 turn 1, 2 alone run 1, 3 and 4 the background of load run 1, 5 its measured request
    emu = emulator(compute_seconds=0.2, fault={3: "500"})
    (record,) = measure(emu, 1)
    assert record.outcome == Outcome.ERROR
    assert re.match(r"load run 1: background request [12] of 2 failed: POST /v1/chat/completions to "
                    r"http://127\.0\.0\.1:\d+: HTTP 500: Internal Server Error", record.reason), record.reason
    assert emu.in_flight == 0  # nothing left running


def test_what_is_sent(emulator):
    """Every request computed from scratch (its own fresh salt); the background answers max_tokens in full and
    shares no text with the probe; the measured requests carry the probe's conversation."""
    emu = emulator(compute_seconds=0.2)
    (record,) = measure(emu, 1)
    probe = builtin_probes()[0]
    salts = [body["cache_salt"] for body in emu.requests_log]
    assert len(salts) == len(set(salts)) == 5 + 2 * SHAPE.concurrent
    background = [b for b in emu.requests_log if b.get("ignore_eos")]
    assert len(background) == 4 and all(b["max_tokens"] == 8 for b in background)
    ours = sorted(m[0]["content"] for m in SHAPE.messages())  # the same in both runs (threads: any order)
    assert [sorted(b["messages"][0]["content"] for b in run) for run in (background[:2], background[2:])] \
        == [ours, ours]
    measured = [b for b in emu.requests_log if not b.get("ignore_eos")]
    assert measured[0]["messages"] == probe.turn1_messages()
    turn2 = probe.turn2_messages(record.requests[0].content)
    assert all(b["messages"] == turn2 and b["max_tokens"] == 64 for b in measured[1:])
    first = probe.turn1_messages()[0]["content"]
    assert all(m[0]["content"][:1] != first[:1] for m in SHAPE.messages())


def test_shape():
    assert BatchShape(seed=1).messages() == BatchShape(seed=1).messages() != BatchShape(seed=2).messages()
    texts = [m[0]["content"] for m in BatchShape(concurrent=3, prompt_words=50).messages()]
    assert len(set(texts)) == 3 and all(len(t.split(": ", 1)[1].split()) > 50 for t in texts)
    for bad in ({"concurrent": 0}, {"prompt_words": 0}, {"max_tokens": 0}, {"lead_s": -1}):
        with pytest.raises(ValueError, match="the batch shape's"):
            BatchShape(**bad)


def test_overlap_rule():
    measured = Span(10.0, 12.0)
    spans = [Span(9.0, 13.0), Span(9.5, 11.0), Span(9.0, 9.9), Span(10.5, 14.0)]
    # in flight at send: the first two (the third ended first, the fourth was sent later); at answer: one
    assert overlap(measured, spans) == (2, 1)
    assert overlap(measured, []) == (0, 0)
    assert under_load("load run 1", 2, 4) is None
    assert under_load("load run 1", 0, 4) == ("load run 1: none of the 4 background requests was in flight "
                                              "when it was sent (they ended first); give them more tokens to "
                                              "answer")


@pytest.mark.parametrize("margins, said", [((0.0, 0.125), False), ((2.0, 0.0), True), ((None, None), False)])
def test_batch_message_calls_a_large_gap_a_bug_signature(margins, said):
    """The anatomy names the sides alone/load; only a large gap (one side sure) is called a state bug's
    signature, never a near-tie or an answer without margins."""
    from pytest_cachecheck.batch import batch_message
    from pytest_cachecheck.model import Divergence
    d = Divergence(char=3, token=1, cache_excerpt="a", recompute_excerpt="b", cache_token="x",
                   recompute_token="y", cache_margin=margins[0], recompute_margin=margins[1])
    text = batch_message(d, 2)
    assert "at token 1: alone 'x' vs load 'y'" in text
    assert ("not rounding noise" in text and "llama.cpp #27148" in text) == said
    assert ("nats: large-gap" in text) == said
