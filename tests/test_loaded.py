"""The cache under load (the probe protocol with every turn-2 request amid the background: protocol.Runner with
``load``, background.py) against the vLLM emulator, a real HTTP server in process.

The controls: a cache fault that appears only amid other requests (``diverge_on_hit_under_load``) must be caught
under load and not by the quiet probe; a server without it must give ``same``. Then the rules: every probe rule
still holds (a missed hit is inconclusive), the load rule for each measured request, a failing background request
is an error, and what is sent (turn 1 alone, turn 2 amid the background, the background from scratch).
"""

from __future__ import annotations

import re
from typing import Any, List, Optional

import pytest

from pytest_cachecheck.batch import BatchRunner
from pytest_cachecheck.clients import detect_server
from pytest_cachecheck.clients.http import Http
from pytest_cachecheck.model import LOADED_STEPS, BatchShape, LoadedRecord, LoadedSummary, Outcome, ProbeRecord
from pytest_cachecheck.probes import builtin_probes
from pytest_cachecheck.protocol import Runner
from pytest_cachecheck.settings import Settings
from tests.support import emulator as emulator_module

SHAPE = BatchShape(concurrent=2, prompt_words=20, max_tokens=8, seed=7, lead_s=0.1)


@pytest.fixture(autouse=True)
def _emulator_without_nagle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emulator_module._Handler, "disable_nagle_algorithm", True)  # see tests/test_faults.py


def runner(emu: Any) -> Runner:
    return Runner(Settings(url=emu.url, max_tokens=64, timeout=30))


def measure(emu: Any, n: int = 2, shape: Optional[BatchShape] = SHAPE) -> List[ProbeRecord]:
    r = runner(emu)
    return [r.run(p, load=shape) for p in builtin_probes()[:n]]


def test_positive_control_a_fault_only_under_load_is_caught_and_the_quiet_probe_misses_it(emulator):
    emu = emulator(diverge_on_hit_under_load=True, compute_seconds=0.5)
    loaded = measure(emu)
    assert [r.outcome for r in loaded] == [Outcome.DIFFERENT] * 2, [r.reason for r in loaded]
    for r in loaded:
        assert isinstance(r, LoadedRecord) and r.shape == SHAPE
        assert [(x.run, x.background) for x in r.loads] == [(1, 2), (2, 2), (3, 2), (4, 2)]
        assert all(x.in_flight_at_send >= 1 for x in r.loads)
        assert r.divergence is not None and r.divergence.char == 40
        assert r.checks is not None and all(h.cached_tokens for h in r.checks.cache_hits)
        assert r.line().startswith(f"{r.id} [cache under load: 2 background requests of 20 words, up to 8 "
                                   f"tokens, seed 7, sent 0.1 s ahead] different")
        assert r.message().startswith("[cache under load: 2 background requests of 20 words, up to 8 tokens, "
                                      "seed 7, sent 0.1 s ahead] cache path and recompute path gave different turn-2 answers")
        assert r.message().endswith("the load alone (batch kind, cache off): not measured")
        # under load, a large gap is called a state bug's signature (a near-tie or no margins: nothing more)
        assert ("under load is not rounding noise" in r.reason) == (r.divergence.kind == "large-gap")
    quiet = measure(emu, shape=None)  # the same server, quiet: the fault never fires
    assert [r.outcome for r in quiet] == [Outcome.SAME] * 2, [r.reason for r in quiet]
    assert not any(isinstance(r, LoadedRecord) for r in quiet)
    # the batch kind (cache off) sees nothing either: only the cache path under load is wrong
    client = detect_server(Http(emu.url, timeout=30), None)
    batch = [BatchRunner(client, SHAPE, max_tokens=64).run(p) for p in builtin_probes()[:2]]
    assert [b.outcome for b in batch] == [Outcome.SAME] * 2, [b.reason for b in batch]


def test_the_same_server_without_the_fault_gives_same(emulator):
    emu = emulator(compute_seconds=0.3)
    records = measure(emu)
    assert [r.outcome for r in records] == [Outcome.SAME] * 2, [r.reason for r in records]
    assert emu.max_in_flight == 3  # the measured request and both background requests at once
    s = LoadedSummary.of(records, SHAPE)  # type: ignore[arg-type]
    assert (s.tally.valid, s.tally.different) == (2, 0)
    assert s.attribution() == "0 of 2 valid loaded probes diverged under load"


def test_load_alone_attribution_in_the_summary():
    def rec(i: int, outcome: Outcome, alone: str) -> LoadedRecord:
        return LoadedRecord(id=f"p{i}", source="", fingerprint="", outcome=outcome, load_alone=alone)

    records = [rec(1, Outcome.DIFFERENT, "different"), rec(2, Outcome.DIFFERENT, "same"),
               rec(3, Outcome.DIFFERENT, "not measured"), rec(4, Outcome.SAME, "different")]
    s = LoadedSummary.of(records, SHAPE)
    assert (s.load_alone_different, s.load_alone_same) == (1, 1)
    assert s.attribution() == ("3 of 4 valid loaded probes diverged under load; the load alone (batch, cache off) "
                               "changed 1 of those 3 (1 not measured by the batch kind)")
    one = LoadedSummary.of(records[:1], SHAPE)
    assert one.attribution() == ("1 of 1 valid loaded probe diverged under load; the load alone (batch, cache off) "
                                 "changed it too")
    assert LoadedSummary.from_json(s.to_json()) == s


def test_the_load_rule_holds_for_every_measured_request(emulator):
    emu = emulator()  # answers at once: the background ends within the lead time
    shape = BatchShape(concurrent=2, prompt_words=20, max_tokens=8, lead_s=0.3)
    (record,) = measure(emu, 1, shape)
    assert record.outcome == Outcome.INCONCLUSIVE
    for step in LOADED_STEPS:
        assert (f"{step}: none of the 2 background requests was in flight when it was sent (they ended first); "
                f"give them more tokens to answer") in record.reason, record.reason


def test_the_hit_rule_catches_a_cache_state_the_background_took(emulator):
    """A cache of 16 blocks: the background evicts turn 1's, so the cache path under load reuses nothing; the
    probe's own hit rule makes it inconclusive, never a divergence. Quiet, the same probe is valid."""
    emu = emulator(cache_capacity_blocks=16, compute_seconds=0.2)
    (record,) = measure(emu, 1)
    assert record.outcome == Outcome.INCONCLUSIVE
    assert re.match(r"inconclusive: cache run 1: turn-2 cache hit was 0 tokens, expected at least \d+ "
                    r"\(turn-1 prompt", record.reason), record.reason
    (quiet,) = measure(emu, 1, None)
    assert quiet.outcome == Outcome.SAME, quiet.reason


def test_a_failing_background_request_is_an_error(emulator):
    # chat requests: 1 the setup check, 2 turn 1, 3 and 4 the background of the first turn-2 request, 5 that one
    emu = emulator(compute_seconds=0.2, fault={3: "500"})
    (record,) = measure(emu, 1)
    assert record.outcome == Outcome.ERROR and isinstance(record, LoadedRecord)
    assert re.match(r"load run 1: background request [12] of 2 failed: POST /v1/chat/completions to "
                    r"http://127\.0\.0\.1:\d+: HTTP 500: Internal Server Error", record.reason), record.reason
    assert emu.in_flight == 0  # nothing left running
    # the runner measures the next probe quietly
    (quiet,) = [runner(emu).run(builtin_probes()[1])]
    assert quiet.outcome == Outcome.SAME and not isinstance(quiet, LoadedRecord)


def test_what_is_sent(emulator):
    """Turn 1 alone, every turn-2 request amid the background, which is computed from scratch (its own fresh
    salt), answers max_tokens in full and shares no text with the probe; the cache path keeps its own salt."""
    emu = emulator(compute_seconds=0.5)
    (record,) = measure(emu, 1)
    assert record.outcome == Outcome.SAME, record.reason
    log = emu.requests_log[1:]  # after the setup check (the runner's, once)
    background = [b for b in log if b.get("ignore_eos")]
    measured = [b for b in log if not b.get("ignore_eos")]
    assert len(background) == 2 * 4 and all(b["max_tokens"] == 8 for b in background)
    assert len({b["cache_salt"] for b in background}) == 8
    assert [s for s in (b.get("cache_salt") for b in measured)].count(None) == 0
    assert len(measured) == 6
    # the order sent: turn 1 (alone), then each turn-2 request after the background of its load run
    kinds = ["bg" if b.get("ignore_eos") else "m" for b in log]
    assert kinds[0] == "m" and kinds.count("m") == 6
    assert len(record.loads) == 4 and all(x.in_flight_at_send >= 1 for x in record.loads)
    ours = sorted(m[0]["content"] for m in SHAPE.messages())
    assert all(sorted(b["messages"][0]["content"] for b in background[i:i + 2]) == ours for i in (0, 2, 4, 6))


def test_the_background_keeps_off_the_cache_paths_slot_only_under_load_cache():
    """llama-server: the cache path runs on slot 0 (the body's id_slot); an unpinned request would take the
    slot it shares most prompt with, slot 0, so the cache under load sends background request i to slot i + 1.
    The batch kind's background stays unpinned; vLLM and SGLang pin nothing."""
    from pytest_cachecheck.background import Background
    from pytest_cachecheck.clients import LlamaCppClient, ServerInfo, VllmClient

    llama = LlamaCppClient(Http("http://127.0.0.1:9"), ServerInfo(kind="llama.cpp"))
    assert llama.body([], 8)["id_slot"] == 0
    assert [Background(llama, SHAPE, beside_cache=True).fields(i) for i in (0, 1)] == [
        {"cache_prompt": False, "id_slot": 1, "ignore_eos": True},
        {"cache_prompt": False, "id_slot": 2, "ignore_eos": True}]
    assert Background(llama, SHAPE).fields(1) == {"cache_prompt": False, "id_slot": -1, "ignore_eos": True}
    vllm = VllmClient(Http("http://127.0.0.1:9"), ServerInfo(kind="vllm"))
    fields = Background(vllm, SHAPE, beside_cache=True).fields(0)
    assert set(fields) == set(Background(vllm, SHAPE).fields(0)) and "id_slot" not in fields


@pytest.mark.parametrize("margins, said", [((0.0, 0.125), False), ((2.0, 0.0), True), ((None, None), False)])
def test_a_large_gap_under_load_is_called_a_state_bug_signature_and_a_quiet_one_is_not(margins, said):
    from pytest_cachecheck.kinds import LOADED
    from pytest_cachecheck.model import Divergence
    from pytest_cachecheck.protocol import divergence_message
    d = Divergence(char=3, token=1, cache_excerpt="a", recompute_excerpt="b", cache_token="x",
                   recompute_token="y", cache_margin=margins[0], recompute_margin=margins[1])
    assert ("a large gap under load is not rounding noise" in divergence_message(d, LOADED.large_gap)) == said
    assert "not rounding noise" not in divergence_message(d)  # the quiet probe's message is as before
