"""The attribution (pytest_cachecheck/attribution.py): each cause a target measured side by side, read from
the kinds' own summaries, and the probes that differed under any cause with their outcome under each."""

from __future__ import annotations

from pytest_cachecheck import attribution
from pytest_cachecheck.model import (BatchRecord, BatchShape, BatchSummary, OrderConditions, OrderRecord,
                                     OrderSummary, Outcome)
from tests.support import factories as f

SHAPE = BatchShape(concurrent=2, prompt_words=20, max_tokens=8, seed=7)


def _target(probes, batches=None, orders=None):
    t = f.report([f.record(i, o, recompute="another answer" if o == "different" else "the same answer")
                  for i, o in probes]).targets[0]
    if batches is not None:
        t.batches = [BatchRecord(id=i, source="s", fingerprint="f", outcome=Outcome(o), shape=SHAPE)
                     for i, o in batches]
        t.batch_summary = BatchSummary.of(t.batches, SHAPE)
    if orders is not None:
        t.orders = [OrderRecord(id=i, source="s", fingerprint="f", outcome=Outcome(o)) for i, o in orders]
        t.order_summary = OrderSummary.of(t.orders, OrderConditions())
    return t


def test_one_cause_says_nothing_more():
    assert attribution.lines(_target([("a", "different"), ("b", "same")])) == []


def test_each_cause_once_under_its_conditions_and_each_probe_that_differed_under_any():
    t = _target([("a", "different"), ("b", "same"), ("c", "same")],
                batches=[("a", "same"), ("b", "different"), ("c", "same")],
                orders=[("a", "same"), ("b", "same"), ("c", "inconclusive")])
    out = attribution.lines(t)
    assert out[0].startswith("cache: 1 of 3 valid probes differed, 33.3% (95% interval ")
    assert out[1].startswith("batch: 1 of 3 valid batch probes answered differently amid other requests, 33.3%")
    assert out[1].endswith("; 0 inconclusive, 0 errors [2 background requests of 20 words, up to 8 tokens, "
                           "seed 7; cache off]")  # the conditions named once, without "batch: " again
    assert out[2].startswith("order: 0 of 2 valid order probes answered differently in another order and state")
    assert out[2].endswith("; 1 inconclusive, 0 errors [server defaults, no cache fields; reversed, 1 other "
                           "conversation between]")
    assert out[3:] == ["a: cache different, batch same, order same",
                       "b: cache same, batch different, order same"]
    assert [i for i, _ in attribution.told_apart(attribution.causes(t))] == ["a", "b"]


def test_a_cause_with_no_valid_item_says_so_and_the_limit_counts_the_rest():
    t = _target([(f"p{i}", "different") for i in range(3)], batches=[(f"p{i}", "inconclusive") for i in range(3)])
    out = attribution.lines(t, limit=2)
    assert out[1] == ("batch: no valid batch probe; 3 inconclusive, 0 errors [2 background requests of 20 words, "
                      "up to 8 tokens, seed 7; cache off]")
    assert out[2:] == ["p0: cache different, batch inconclusive", "p1: cache different, batch inconclusive",
                       "... and 1 more probes that differed (-v shows all)"]
    assert len(attribution.lines(t, limit=None)) == 5


def test_no_probe_differed_under_any_cause():
    t = _target([("a", "same")], batches=[("a", "same")])
    assert attribution.lines(t)[-1] == "no probe differed under any cause"
