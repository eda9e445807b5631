"""The order measurement (pytest_cachecheck/order.py) against the vLLM emulator, a real HTTP server in
process.

The controls: an emulated server whose answer changes when a request reuses cached state (``diverge_on_hit``,
the emulator's shared prefix cache: no cache field, so no salt) must be caught as ``different`` wherever pass
B reused state that pass A did not; the same server without that fault must give ``same`` on every probe, with
the state pass B reused recorded. Then what is sent (no cache control field, the set in file order then
reversed with other conversations between), a failed request (an error, never a difference) and impossible
counters (inconclusive).
"""

from __future__ import annotations

import dataclasses
from typing import Any, List

import pytest

from pytest_cachecheck.clients import detect_server
from pytest_cachecheck.clients.http import Http
from pytest_cachecheck.model import OrderConditions, OrderRecord, Outcome
from pytest_cachecheck.order import STEPS, OrderRunner
from pytest_cachecheck.probes import builtin_probes
from tests.support import emulator as emulator_module

CONDITIONS = OrderConditions(between=1, prompt_words=20, max_tokens=8, seed=3)


@pytest.fixture(autouse=True)
def _emulator_without_nagle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emulator_module._Handler, "disable_nagle_algorithm", True)  # see tests/test_faults.py


def measure(emu: Any, n: int = 4, conditions: OrderConditions = CONDITIONS, client: Any = None
            ) -> List[OrderRecord]:
    client = client or detect_server(Http(emu.url, timeout=30), None)
    return OrderRunner(client, conditions, max_tokens=64).run(builtin_probes()[:n])


def cached(record: OrderRecord, step: str) -> int:
    return next(int(q.cached_tokens or 0) for q in record.requests if q.step == step)


def test_positive_control_state_that_changes_answers_is_caught(emulator):
    emu = emulator(diverge_on_hit=lambda messages: True)
    records = measure(emu)
    # pass B's turn 1 reuses the state pass A left; where pass A's turn 1 reused none, its answer differs
    for r in records:
        assert [q.step for q in r.requests] == list(STEPS)
        assert cached(r, "B/turn-1") > 0
        fresh = cached(r, "A/turn-1") == 0
        assert r.outcome == (Outcome.DIFFERENT if fresh else Outcome.SAME), r.reason
    different = [r for r in records if r.different]
    assert different, [r.requests for r in records]
    for r in different:
        d = r.divergence
        # the emulator's diverged answers part at character 40
        assert r.parted_turn == 1 and d is not None and d.char == 40
        # logprobs were asked on both passes: the token and both margins
        assert d.token is not None and d.cache_margin is not None and d.recompute_margin is not None
        assert d.kind in ("near-tie", "large-gap")
        assert ("pass B (reversed, after other conversations) gave another turn-1 answer than pass A"
                in r.reason)
        assert "cached tokens: A/turn-1 0, " in r.reason
        assert r.message().startswith(f"[{CONDITIONS.label()}] ")


def test_negative_control_a_deterministic_server_gives_same_with_the_state_recorded(emulator):
    emu = emulator()
    records = measure(emu)
    assert [r.outcome for r in records] == [Outcome.SAME] * 4, [r.reason for r in records]
    assert all(cached(r, "B/turn-1") > 0 and cached(r, "B/turn-2") > 0 for r in records)  # the state evidence
    assert [r.positions for r in records] == [[1, 4], [2, 3], [3, 2], [4, 1]]
    off = measure(emulator(prefix_caching=False))
    assert [r.outcome for r in off] == [Outcome.SAME] * 4
    assert all(q.cached_tokens == 0 for r in off for q in r.requests)


def test_what_is_sent_no_cache_field_file_order_then_reversed_with_others_between(emulator):
    emu = emulator()
    probes = builtin_probes()[:3]
    measure(emu, n=3, conditions=dataclasses.replace(CONDITIONS, between=2))
    log = emu.requests_log
    assert len(log) == 3 * 2 + 3 * (2 + 2)
    for body in log:
        assert not {"cache_salt", "cache_prompt", "id_slot", "extra_key"} & set(body), body
    firsts = [body["messages"][:len(p.turn1_messages())] for p in probes for body in log
              if body["messages"][:len(p.turn1_messages())] == p.turn1_messages()]
    assert len(firsts) == 3 * 4
    # pass A: each conversation in file order; pass B: two others, then the conversations in reverse
    users = [b["messages"][-1]["content"] for b in log]
    others = [i for i, text in enumerate(users) if text.startswith("Background task")]
    assert others == [6, 7, 10, 11, 14, 15]
    order = [next(k for k, p in enumerate(probes)
                  if b["messages"][:len(p.turn1_messages())] == p.turn1_messages())
             for b in log if not b["messages"][-1]["content"].startswith("Background task")]
    assert order == [0, 0, 1, 1, 2, 2, 2, 2, 1, 1, 0, 0]
    assert all(b.get("logprobs") for b in log if not b["messages"][-1]["content"].startswith("Background"))


def test_a_failed_request_is_an_error_never_a_difference(emulator):
    # request 2: pass A's turn 2 of the first probe; request 7: the other conversation before pass B's first
    emu = emulator(fault={2: "500", 7: "500"})
    records = measure(emu, n=3)
    assert [r.outcome for r in records] == [Outcome.ERROR, Outcome.SAME, Outcome.ERROR], [
        r.reason for r in records]
    assert "500" in records[0].reason
    assert records[2].reason.startswith("pass B: other conversation 1 of 1 before this probe failed")
    assert records[0].positions == [1]  # not sent again in pass B


def test_impossible_counters_are_inconclusive(emulator):
    client = detect_server(Http(emulator().url, timeout=30), None)
    chat = client.chat
    sent = []

    def lying(messages: Any, **kwargs: Any) -> Any:
        reply = chat(messages, **kwargs)
        sent.append(reply)
        if len(sent) == 1:  # pass A's turn 1 of the first probe: more cached tokens than the prompt has
            return dataclasses.replace(reply, cached_tokens=(reply.prompt_tokens or 0) + 5)
        return reply

    client.chat = lying  # type: ignore[method-assign]
    records = measure(None, n=2, client=client)
    assert records[0].outcome == Outcome.INCONCLUSIVE
    assert records[0].reason.startswith("inconclusive: the server reported impossible token counts")
    assert records[1].outcome == Outcome.SAME


def test_conditions_and_the_json_round_trip():
    c = OrderConditions(between=2, cache_ram=8192)
    assert c.label() == ("order: server defaults, no cache fields; reversed, 2 other conversations between; "
                         "served llama-server --cache-ram 8192")
    assert OrderConditions().label() == ("order: server defaults, no cache fields; reversed, 1 other "
                                         "conversation between")
    assert len(c.others()) == 2 and c.others() == OrderConditions(between=2).others()
    r = OrderRecord(id="x", source="s", fingerprint="f", outcome=Outcome.DIFFERENT, conditions=c,
                    reason="why", parted_turn=2, positions=[1, 2])
    back = OrderRecord.from_json(r.to_json())
    assert back == r and r.to_json()["kind"] == "order" and r.to_json()["conditions"]["cache_ram"] == 8192
