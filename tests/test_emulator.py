"""The vLLM/SGLang emulation obeys the protocol facts the plugin uses (server-protocols.md §2, §3, §5)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest
import requests

try:
    from tests.support.emulator import (
        EOS_TOKEN_ID,
        IM_END,
        Emulator,
        EmulatorConfig,
        expected_cached_tokens,
        generate_answer,
        render_chat,
        tokenize,
    )
except ImportError:  # plain `pytest` without the repository root on sys.path
    from support.emulator import (  # type: ignore[no-redef]
        EOS_TOKEN_ID,
        IM_END,
        Emulator,
        EmulatorConfig,
        expected_cached_tokens,
        generate_answer,
        render_chat,
        tokenize,
    )

REPO = Path(__file__).resolve().parents[1]
SYSTEM = {"role": "system", "content": "You are a terse assistant for the cache check."}
TURN1 = [SYSTEM, {"role": "user", "content": "Describe a river, a stone and a lantern in one paragraph."}]
FOLLOW_UP = {"role": "user", "content": "Now say it again with more detail, please."}


@pytest.fixture
def start() -> Iterator[Callable[..., Emulator]]:
    """Start emulators with keyword config overrides; all are stopped at teardown."""
    started: List[Emulator] = []

    def _start(**overrides: Any) -> Emulator:
        emu = Emulator(EmulatorConfig(**overrides)).start()
        started.append(emu)
        return emu

    yield _start
    for emu in started:
        emu.stop()


def chat(
    emu: Emulator, messages: List[Dict[str, Any]], session: Optional[requests.Session] = None, **extra: Any
) -> requests.Response:
    body: Dict[str, Any] = {"model": emu.config.model, "messages": messages, "temperature": 0}
    body.update(extra)
    return (session or requests).post(f"{emu.url}/v1/chat/completions", json=body, timeout=10)


def ok(emu: Emulator, messages: List[Dict[str, Any]], **extra: Any) -> Dict[str, Any]:
    r = chat(emu, messages, **extra)
    assert r.status_code == 200, r.text
    return r.json()


def content(reply: Dict[str, Any]) -> str:
    return reply["choices"][0]["message"]["content"]


def cached(reply: Dict[str, Any]) -> Optional[int]:
    details = reply["usage"]["prompt_tokens_details"]
    return None if details is None else details["cached_tokens"]


def turn2(turn1_reply: Dict[str, Any], messages: List[Dict[str, Any]] = TURN1) -> List[Dict[str, Any]]:
    return messages + [{"role": "assistant", "content": content(turn1_reply)}, FOLLOW_UP]


def salt(tag: str) -> Dict[str, str]:
    return {"cache_salt": f"salt-{tag}-0123456789abcdef"}


# -- tokenizer, template, generation -------------------------------------------------------------------------


def test_tokenizer_markers_are_one_token_and_history_rerenders_identically() -> None:
    assert tokenize(f"<|im_start|>user\nhi{IM_END}\n") == [
        0x110000,
        ord("u"),
        ord("s"),
        ord("e"),
        ord("r"),
        ord("\n"),
        ord("h"),
        ord("i"),
        EOS_TOKEN_ID,
        ord("\n"),
    ]
    answer = generate_answer(render_chat(TURN1))
    assert (
        150 <= len(answer) <= 400
        and answer == answer.lower()
        and answer == generate_answer(render_chat(TURN1))
    )
    first = tokenize(render_chat(TURN1)) + [ord(c) for c in answer] + [EOS_TOKEN_ID]
    second = tokenize(render_chat(TURN1 + [{"role": "assistant", "content": answer}, FOLLOW_UP]))
    assert second[: len(first)] == first


# -- cached_tokens on the cache path and the recompute path --------------------------------------------------


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
@pytest.mark.parametrize("block_size", [16, 64])
def test_salted_turn2_reuses_prompt_and_answer_in_whole_blocks(start, flavor: str, block_size: int) -> None:
    emu = start(flavor=flavor, block_size=block_size)
    t1 = ok(emu, TURN1, **salt("a"))
    assert cached(t1) == (0 if flavor == "vllm" else None)  # SGLang: details only when the count is > 0
    p1, a1 = t1["usage"]["prompt_tokens"], t1["usage"]["completion_tokens"]
    assert t1["choices"][0]["finish_reason"] == "stop"
    assert a1 == len(content(t1)) + 1  # completion_tokens counts the EOS token
    assert p1 == len(tokenize(render_chat(TURN1)))
    t2 = ok(emu, turn2(t1), **salt("a"))
    expected = (p1 + a1 - 1) // block_size * block_size
    assert (
        cached(t2)
        == expected
        == expected_cached_tokens(p1 + a1 - 1, t2["usage"]["prompt_tokens"], block_size)
    )
    assert expected > p1  # the hit covers part of the answer, not only the turn-1 prompt
    assert (cached(t2) or 0) % block_size == 0


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_another_salt_gets_nothing_and_the_answers_match(start, flavor: str) -> None:
    emu = start(flavor=flavor)
    t1 = ok(emu, TURN1, **salt("a"))
    hit = ok(emu, turn2(t1), **salt("a"))
    miss = ok(emu, turn2(t1), **salt("b"))
    assert (cached(hit) or 0) > 0
    assert cached(miss) == (0 if flavor == "vllm" else None)
    assert content(hit) == content(miss)  # without the diverge knob, hit and miss answer alike
    unsalted = ok(emu, turn2(t1))
    assert cached(unsalted) in (0, None)  # salted blocks are not shared with unsalted requests


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
@pytest.mark.parametrize("block_size", [1, 16])
def test_identical_prompt_is_capped_at_n_minus_one(start, flavor: str, block_size: int) -> None:
    emu = start(flavor=flavor, block_size=block_size)
    messages = [SYSTEM, {"role": "user", "content": "x"}]
    base = len(tokenize(render_chat(messages)))
    pad = (-base) % 16 or 16  # make n_prompt a multiple of 16: a full hit would be n, the cap gives n - 16
    messages = [SYSTEM, {"role": "user", "content": "x" * (1 + pad)}]
    n = len(tokenize(render_chat(messages)))
    assert n % 16 == 0
    ok(emu, messages, **salt("same"))
    again = ok(emu, messages, **salt("same"))
    assert again["usage"]["prompt_tokens"] == n
    assert cached(again) == (n - 1) // block_size * block_size
    assert cached(again) == (n - 16 if block_size == 16 else n - 1)


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_reporting_off_gives_null_details(start, flavor: str) -> None:
    emu = start(flavor=flavor, report_cached_tokens=False)
    t1 = ok(emu, TURN1, **salt("a"))
    t2 = ok(emu, turn2(t1), **salt("a"))
    for reply in (t1, t2):
        assert "prompt_tokens_details" in reply["usage"] and reply["usage"]["prompt_tokens_details"] is None
        assert (
            reply["usage"]["total_tokens"]
            == reply["usage"]["prompt_tokens"] + reply["usage"]["completion_tokens"]
        )
    if flavor == "sglang":
        assert t2["usage"]["reasoning_tokens"] == 0
        assert requests.get(f"{emu.url}/server_info", timeout=5).json()["enable_cache_report"] is False


def test_prefix_caching_off_reports_zero(start) -> None:
    emu = start(flavor="vllm", prefix_caching=False)
    t1 = ok(emu, TURN1, **salt("a"))
    t2 = ok(emu, turn2(t1), **salt("a"))
    assert cached(t1) == 0 and cached(t2) == 0
    metrics = requests.get(f"{emu.url}/metrics", timeout=5).text
    assert 'enable_prefix_caching="False"' in metrics
    assert 'vllm:prefix_cache_queries_total{engine="0",model_name="emu/tiny-chat"} 0.0' in metrics

    sg = start(flavor="sglang", prefix_caching=False)
    s1 = ok(sg, TURN1, **salt("a"))
    s2 = ok(sg, turn2(s1), **salt("a"))
    assert cached(s2) is None  # SGLang: 0 is reported as null details
    assert requests.get(f"{sg.url}/server_info", timeout=5).json()["disable_radix_cache"] is True


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_a_build_that_ignores_the_salt_hits_across_salts(start, flavor: str) -> None:
    emu = start(flavor=flavor, honor_salt=False, block_size=16)
    t1 = ok(emu, TURN1, **salt("a"))
    t2 = ok(emu, turn2(t1), **salt("b"))
    assert cached(t2) == (t1["usage"]["prompt_tokens"] + t1["usage"]["completion_tokens"] - 1) // 16 * 16


def test_sglang_empty_salt_is_no_salt_and_extra_key_separates(start) -> None:
    emu = start(flavor="sglang", block_size=1)
    t1 = ok(emu, TURN1, cache_salt="")
    p1, a1 = t1["usage"]["prompt_tokens"], t1["usage"]["completion_tokens"]
    assert cached(ok(emu, turn2(t1), cache_salt="s1")) is None
    assert cached(ok(emu, turn2(t1), extra_key="tenant-a")) is None
    assert cached(ok(emu, turn2(t1))) == p1 + a1 - 1  # "" was no salt; page size 1: exact
    again = ok(emu, turn2(t1), cache_salt="")  # the same prompt once more: capped at n - 1
    assert cached(again) == again["usage"]["prompt_tokens"] - 1
    e1 = ok(emu, TURN1, extra_key="tenant-b")
    assert cached(e1) is None
    assert cached(ok(emu, turn2(e1), extra_key="tenant-b")) == p1 + a1 - 1
    r = chat(emu, TURN1, cache_salt=123)
    assert r.status_code == 400
    assert r.json()["object"] == "error" and r.json()["code"] == 400


@pytest.mark.parametrize("bad", ["", "a/b", "a@b", "back\\slash", "nul\x00", "x" * 129, 123])
def test_vllm_rejects_bad_salts(start, bad: Any) -> None:
    emu = start(flavor="vllm")
    r = chat(emu, TURN1, cache_salt=bad)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == 400 and err["param"] == "cache_salt" and "cache_salt" in err["message"]
    if isinstance(bad, str) and bad:
        assert "must be at most 128 characters and must not contain '@', '/'" in err["message"]
    assert set(r.json()) == {"error"} and set(err) == {"message", "type", "param", "code"}
    assert emu.served_requests == 0
    assert chat(emu, TURN1, cache_salt="x" * 128).status_code == 200


# -- the diverge knob ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
@pytest.mark.parametrize("knob", ["markers", "callable"])
def test_diverge_knob_changes_only_cache_hit_answers(start, flavor: str, knob: str) -> None:
    marker = "FLIP-ME"
    diverge: Any = (
        {marker}
        if knob == "markers"
        else (lambda messages: any(marker in str(m.get("content")) for m in messages))
    )
    emu = start(flavor=flavor, diverge_on_hit=diverge)
    flip = [SYSTEM, {"role": "user", "content": f"{marker}: describe a river in one paragraph."}]
    for messages, should_flip in ((flip, True), (TURN1, False)):
        tag = str(should_flip)  # fresh salts per probe, as the plugin uses them
        cache_t1 = ok(emu, messages, **salt("c" + tag))
        recompute_t1 = ok(emu, messages, **salt("r1" + tag))
        assert content(cache_t1) == content(recompute_t1)  # turn 1 is a miss on both paths
        cache_t2 = ok(emu, turn2(cache_t1, messages), **salt("c" + tag))
        recompute_t2 = ok(emu, turn2(cache_t1, messages), **salt("r2" + tag))
        assert (cached(cache_t2) or 0) > 0 and not cached(recompute_t2)
        assert content(recompute_t2) == generate_answer(render_chat(turn2(cache_t1, messages)))
        if should_flip:
            a, b = content(cache_t2), content(recompute_t2)
            assert a != b and a[:40] == b[:40] and a[40] != b[40]
        else:
            assert content(cache_t2) == content(recompute_t2)


# -- response shape, logprobs, limits ------------------------------------------------------------------------


def test_vllm_response_shape_and_logprobs(start) -> None:
    emu = start(flavor="vllm")
    reply = ok(emu, TURN1, logprobs=True, top_logprobs=3)
    assert reply["object"] == "chat.completion" and reply["id"].startswith("chatcmpl-")
    assert reply["model"] == "emu/tiny-chat" and isinstance(reply["created"], int)
    choice = reply["choices"][0]
    assert (
        choice["index"] == 0
        and choice["message"]["role"] == "assistant"
        and choice["finish_reason"] == "stop"
    )
    entries = choice["logprobs"]["content"]
    assert len(entries) == reply["usage"]["completion_tokens"]
    assert "".join(e["token"] for e in entries[:-1]) == content(reply) and entries[-1]["token"] == IM_END
    for e in entries:
        assert e["bytes"] == list(e["token"].encode()) and len(e["top_logprobs"]) == 3
        assert e["top_logprobs"][0]["token"] == e["token"] and e["logprob"] < 0
        assert all(alt["logprob"] < e["logprob"] for alt in e["top_logprobs"][1:])
    plain = ok(emu, TURN1)
    assert plain["choices"][0]["logprobs"] is None and content(plain) == content(reply)


def test_sglang_response_shape(start) -> None:
    emu = start(flavor="sglang")
    reply = ok(emu, TURN1, logprobs=True, top_logprobs=2)
    assert set(reply) >= {"id", "object", "created", "model", "choices", "usage"}
    choice = reply["choices"][0]
    assert choice["message"]["reasoning_content"] is None and choice["matched_stop"] == EOS_TOKEN_ID
    assert len(choice["logprobs"]["content"]) == reply["usage"]["completion_tokens"]
    assert reply["usage"]["reasoning_tokens"] == 0 and reply["usage"]["prompt_tokens_details"] is None


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_max_tokens_stops_with_length_and_no_eos(start, flavor: str) -> None:
    emu = start(flavor=flavor, block_size=16)
    t1 = ok(emu, TURN1, max_tokens=100, **salt("m"))
    assert t1["choices"][0]["finish_reason"] == "length" and t1["usage"]["completion_tokens"] == 100
    assert content(t1) == generate_answer(render_chat(TURN1))[:100]
    t2 = ok(emu, turn2(t1), max_completion_tokens=7, **salt("m"))
    assert t2["usage"]["completion_tokens"] == 7
    assert cached(t2) == (t1["usage"]["prompt_tokens"] + 100 - 1) // 16 * 16


def test_request_errors(start) -> None:
    vllm = start(flavor="vllm")
    r = chat(vllm, TURN1, model="no/such-model")
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
    assert "does not exist" in r.json()["error"]["message"]
    assert (
        requests.post(
            f"{vllm.url}/v1/chat/completions", json={"model": "emu/tiny-chat"}, timeout=5
        ).status_code
        == 400
    )
    r = chat(vllm, TURN1, n=2)
    assert (
        r.status_code == 400
        and r.json()["error"]["message"] == "n must be 1 when using greedy sampling, got 2."
    )
    assert (
        requests.post(
            f"{vllm.url}/v1/chat/completions",
            data=b"{not json",
            headers={"content-type": "application/json"},
            timeout=5,
        ).status_code
        == 400
    )

    sg = start(flavor="sglang")
    r = chat(sg, TURN1, model="no/such-model")
    assert r.status_code == 400 and r.json()["object"] == "error" and "does not exist" in r.json()["message"]
    assert chat(sg, [], n=1).status_code == 400
    assert chat(sg, TURN1, n=3).status_code == 400
    assert requests.post(f"{sg.url}/v1/chat/completions", json={}, timeout=5).status_code == 400
    assert vllm.served_requests == 0 and sg.served_requests == 0
    assert [b.get("n") for b in sg.requests_log] == [None, 1, 3, None]


# -- endpoints -----------------------------------------------------------------------------------------------


def test_vllm_endpoints(start) -> None:
    emu = start(flavor="vllm", block_size=64, models=["alias-a"])
    assert requests.get(f"{emu.url}/version", timeout=5).json() == {"version": "0.34.0"}
    health = requests.get(f"{emu.url}/health", timeout=5)
    assert health.status_code == 200 and health.content == b""
    models = requests.get(f"{emu.url}/v1/models", timeout=5).json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["emu/tiny-chat", "alias-a"]
    assert {m["owned_by"] for m in models["data"]} == {"vllm"} and models["data"][0]["max_model_len"] == 8192
    assert ok(emu, TURN1, model="alias-a")["model"] == "alias-a"
    metrics = requests.get(f"{emu.url}/metrics", timeout=5).text
    info = [line for line in metrics.splitlines() if line.startswith("vllm:cache_config_info{")]
    assert len(info) == 1 and 'block_size="64"' in info[0] and 'enable_prefix_caching="True"' in info[0]
    assert info[0].endswith(" 1.0")
    assert (
        "# TYPE vllm:prefix_cache_queries counter" in metrics and "vllm:prefix_cache_hits_total{" in metrics
    )
    tok = requests.post(f"{emu.url}/tokenize", json={"messages": TURN1}, timeout=5).json()
    assert tok["count"] == len(tokenize(render_chat(TURN1)))
    for path in ("/props", "/server_info", "/get_server_info", "/ready", "/nope"):
        r = requests.get(f"{emu.url}{path}", timeout=5)
        assert r.status_code == 404 and r.json()["error"]["code"] == 404, path


def test_vllm_metrics_count_queries_and_hits(start) -> None:
    emu = start(flavor="vllm")
    t1 = ok(emu, TURN1, **salt("q"))
    t2 = ok(emu, turn2(t1), **salt("q"))
    metrics = requests.get(f"{emu.url}/metrics", timeout=5).text
    queries = t1["usage"]["prompt_tokens"] + t2["usage"]["prompt_tokens"]
    assert (
        f'vllm:prefix_cache_queries_total{{engine="0",model_name="emu/tiny-chat"}} {float(queries)}'
        in metrics
    )
    assert (
        f'vllm:prefix_cache_hits_total{{engine="0",model_name="emu/tiny-chat"}} {float(cached(t2) or 0)}'
        in metrics
    )


def test_sglang_endpoints_and_health_generation(start) -> None:
    emu = start(flavor="sglang", block_size=1)
    for path in ("/server_info", "/get_server_info"):
        info = requests.get(f"{emu.url}{path}", timeout=5).json()
        assert info["page_size"] == 1 and info["disable_radix_cache"] is False
        assert info["enable_cache_report"] is True and info["version"] == "0.5.23"
        assert info["sampling_defaults"] == "openai" and info["model_path"] == "emu/tiny-chat"
    model_info = requests.get(f"{emu.url}/model_info", timeout=5).json()
    assert model_info["is_generation"] is True and model_info["served_model_name"] == "emu/tiny-chat"
    models = requests.get(f"{emu.url}/v1/models", timeout=5).json()
    assert models["data"][0]["owned_by"] == "sglang"
    assert requests.get(f"{emu.url}/ready", timeout=5).status_code == 200
    assert emu.health_generations == 0 and emu.cached_blocks == 0
    assert requests.get(f"{emu.url}/health", timeout=5).status_code == 200
    assert emu.health_generations == 1 and emu.cached_blocks == 1  # input_ids=[0] went into the radix cache
    assert requests.get(f"{emu.url}/health_generate", timeout=5).status_code == 200
    assert emu.health_generations == 2
    assert requests.post(f"{emu.url}/flush_cache", timeout=5).status_code == 200 and emu.cached_blocks == 0
    for path in ("/props", "/version", "/metrics", "/nope"):
        r = requests.get(f"{emu.url}{path}", timeout=5)
        assert r.status_code == 404 and r.json() == {"detail": "Not Found"}, path

    paged = start(flavor="sglang", block_size=16)
    requests.get(f"{paged.url}/health", timeout=5)
    assert paged.health_generations == 1 and paged.cached_blocks == 0  # one token is no full page


def test_streaming_chat_with_usage(start) -> None:
    emu = start(flavor="vllm")
    r = requests.post(
        f"{emu.url}/v1/chat/completions",
        timeout=5,
        json={
            "model": "emu/tiny-chat",
            "messages": TURN1,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == generate_answer(render_chat(TURN1))
    assert chunks[-1]["usage"]["completion_tokens"] == len(text) + 1


def test_requests_are_serialized_and_logged(start) -> None:
    emu = start(flavor="vllm")
    errors: List[BaseException] = []

    def worker(i: int) -> None:
        try:
            assert ok(emu, [{"role": "user", "content": f"question {i}"}], **salt(str(i)))["usage"]
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and emu.served_requests == 8 and len(emu.requests_log) == 8
    assert sorted(b["cache_salt"] for b in emu.requests_log) == sorted(
        salt(str(i))["cache_salt"] for i in range(8)
    )


# -- faults, auth, death -------------------------------------------------------------------------------------


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
@pytest.mark.parametrize("status", [429, 500, 503])
def test_status_faults(start, flavor: str, status: int) -> None:
    emu = start(flavor=flavor, fault={2: str(status)})
    ok(emu, TURN1)
    r = chat(emu, TURN1)
    assert r.status_code == status
    body = r.json()
    assert (body["error"]["code"] if flavor == "vllm" else body["code"]) == status
    assert emu.served_requests == 1  # the faulted request generated nothing
    assert ok(emu, TURN1)["usage"]
    assert len(emu.requests_log) == 3


def test_body_faults(start) -> None:
    emu = start(flavor="vllm", fault={1: "not-json", 2: "truncated", 3: "no-choices", 4: "no-usage"})
    r = chat(emu, TURN1)
    assert r.status_code == 200
    with pytest.raises(ValueError):
        r.json()
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        chat(emu, TURN1)
    r = chat(emu, TURN1)
    assert r.status_code == 200 and r.json()["choices"] == [] and "usage" in r.json()
    r = chat(emu, TURN1)
    assert r.status_code == 200 and "usage" not in r.json() and content(r.json())
    assert ok(emu, TURN1)["usage"]["prompt_tokens"] > 0


def test_slow_fault(start) -> None:
    emu = start(flavor="sglang", fault={1: "slow:0.4"})
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(f"{emu.url}/v1/chat/completions", json={"messages": TURN1}, timeout=0.1)
    began = time.monotonic()
    ok(emu, TURN1)  # request 2 is not delayed
    assert time.monotonic() - began < 0.4
    emu.config.fault[3] = "slow:0.3"
    began = time.monotonic()
    ok(emu, TURN1)
    assert time.monotonic() - began >= 0.3


def test_fault_config_is_validated() -> None:
    with pytest.raises(ValueError):
        EmulatorConfig(fault={1: "418"})
    with pytest.raises(ValueError):
        EmulatorConfig(fault={0: "500"})
    with pytest.raises(ValueError):
        EmulatorConfig(flavor="tgi")


def _refused(emu: Emulator) -> bool:
    try:
        socket.create_connection((emu.host, emu.port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    except OSError:  # reset while the listener was closing: not refused yet
        return False
    return False


def test_fail_after_requests_drops_then_refuses(start) -> None:
    emu = start(flavor="vllm", fail_after_requests=2)
    session = requests.Session()
    ok(emu, TURN1)
    assert chat(emu, TURN1, session=session).status_code == 200
    with pytest.raises(requests.exceptions.ConnectionError):
        chat(emu, TURN1, session=session)
    deadline = time.monotonic() + 3
    while not _refused(emu) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _refused(emu)
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"{emu.url}/health", timeout=2)
    assert emu.served_requests == 2 and len(emu.requests_log) == 3


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_api_key(start, flavor: str) -> None:
    emu = start(flavor=flavor, api_key="sk-emulated")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sk-emulated"}):
        r = requests.post(
            f"{emu.url}/v1/chat/completions", json={"messages": TURN1}, headers=headers, timeout=5
        )
        assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
        assert requests.get(f"{emu.url}/v1/models", headers=headers, timeout=5).status_code == 401
    good = {"Authorization": "Bearer sk-emulated"}
    r = requests.post(f"{emu.url}/v1/chat/completions", json={"messages": TURN1}, headers=good, timeout=5)
    assert r.status_code == 200 and emu.served_requests == 1
    assert requests.get(f"{emu.url}/health", timeout=5).status_code == 200  # health is never guarded
    info_path = "/version" if flavor == "vllm" else "/server_info"
    unguarded = requests.get(f"{emu.url}{info_path}", timeout=5).status_code
    assert unguarded == (200 if flavor == "vllm" else 401)  # vLLM guards /v1 only; SGLang all but /health*
    assert requests.get(f"{emu.url}{info_path}", headers=good, timeout=5).status_code == 200


def test_kill_refuses_new_connections_and_breaks_open_ones(start) -> None:
    emu = start(flavor="vllm")
    session = requests.Session()
    assert chat(emu, TURN1, session=session).status_code == 200  # leaves a keep-alive connection open
    emu.kill()
    assert _refused(emu)
    with pytest.raises(requests.exceptions.ConnectionError):
        chat(emu, TURN1, session=session)
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"{emu.url}/health", timeout=2)
    emu.stop()  # still fine after kill


def test_reset_cache_and_context_manager() -> None:
    with Emulator(flavor="vllm") as emu:
        t1 = ok(emu, TURN1, **salt("z"))
        emu.reset_cache()
        assert cached(ok(emu, turn2(t1), **salt("z"))) == 0
    assert _refused(emu)


def test_command_line_serves_until_interrupted() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.emulator",
            "--flavor",
            "sglang",
            "--port",
            str(port),
            "--block-size",
            "1",
            "--no-cache-report",
            "--ignore-salt",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        info = None
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and info is None:
            try:
                info = requests.get(f"http://127.0.0.1:{port}/server_info", timeout=1).json()
            except requests.exceptions.ConnectionError:
                time.sleep(0.05)
        assert info is not None, proc.communicate()[1] if proc.poll() is not None else "no answer"
        assert info["page_size"] == 1 and info["enable_cache_report"] is False
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
