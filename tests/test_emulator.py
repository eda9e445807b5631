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
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest
import requests

try:
    from tests.support.emulator import (
        EOS_TOKEN_ID,
        IM_END,
        THINK_END,
        THINK_START,
        Emulator,
        EmulatorConfig,
        expected_cached_tokens,
        generate_answer,
        generate_reasoning,
        render_chat,
        tokenize,
    )
except ImportError:  # plain `pytest` without the repository root on sys.path
    from support.emulator import (  # type: ignore[no-redef]
        EOS_TOKEN_ID,
        IM_END,
        THINK_END,
        THINK_START,
        Emulator,
        EmulatorConfig,
        expected_cached_tokens,
        generate_answer,
        generate_reasoning,
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


def ran_ahead(flavor: str) -> int:
    """Tokens past ``prompt + output - 1`` that a turn-1 answer ending with EOS leaves in the cache: SGLang's
    overlap scheduler has already computed the EOS token's KV."""
    return 1 if flavor == "sglang" else 0


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
    assert cached(t1) == 0
    p1, a1 = t1["usage"]["prompt_tokens"], t1["usage"]["completion_tokens"]
    assert t1["choices"][0]["finish_reason"] == "stop"
    assert a1 == len(content(t1)) + 1  # completion_tokens counts the EOS token
    assert p1 == len(tokenize(render_chat(TURN1)))
    t2 = ok(emu, turn2(t1), **salt("a"))
    kept = p1 + a1 - 1 + ran_ahead(flavor)
    expected = kept // block_size * block_size
    assert cached(t2) == expected == expected_cached_tokens(kept, t2["usage"]["prompt_tokens"], block_size)
    assert expected > p1  # the hit covers part of the answer, not only the turn-1 prompt
    assert (cached(t2) or 0) % block_size == 0


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_another_salt_gets_nothing_and_the_answers_match(start, flavor: str) -> None:
    emu = start(flavor=flavor)
    t1 = ok(emu, TURN1, **salt("a"))
    hit = ok(emu, turn2(t1), **salt("a"))
    miss = ok(emu, turn2(t1), **salt("b"))
    assert (cached(hit) or 0) > 0
    assert cached(miss) == 0
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
    assert cached(s2) == 0  # SGLang 0.5.23: {"cached_tokens": 0}
    assert requests.get(f"{sg.url}/server_info", timeout=5).json()["disable_radix_cache"] is True
    older = start(flavor="sglang", prefix_caching=False, null_details_on_miss=True)
    assert cached(ok(older, turn2(s1), **salt("a"))) is None  # older SGLang: 0 is reported as null details


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_a_build_that_ignores_the_salt_hits_across_salts(start, flavor: str) -> None:
    emu = start(flavor=flavor, honor_salt=False, block_size=16)
    t1 = ok(emu, TURN1, **salt("a"))
    t2 = ok(emu, turn2(t1), **salt("b"))
    assert cached(t2) == (t1["usage"]["prompt_tokens"] + t1["usage"]["completion_tokens"] - 1) // 16 * 16


def test_sglang_overlap_schedule_keeps_the_eos_token(start) -> None:
    """As real SGLang 0.5.23 does: with the overlap scheduler an answer ending with EOS before max_tokens
    leaves prompt + output in the cache; cut by max_tokens, or without the scheduler, prompt + output - 1."""
    for overlap, extra in ((True, 1), (False, 0)):
        emu = start(flavor="sglang", block_size=1, overlap_schedule=overlap)
        t1 = ok(emu, TURN1, **salt("o"))
        p1, a1 = t1["usage"]["prompt_tokens"], t1["usage"]["completion_tokens"]
        assert cached(ok(emu, turn2(t1), **salt("o"))) == p1 + a1 - 1 + extra
        cut = ok(emu, TURN1, max_tokens=10, **salt("c"))
        assert cut["choices"][0]["finish_reason"] == "length"
        assert cached(ok(emu, turn2(cut), **salt("c"))) == p1 + 10 - 1
        at_limit = ok(emu, TURN1, max_tokens=a1, **salt("e"))  # the EOS is the max_tokens-th token
        assert at_limit["choices"][0]["finish_reason"] == "stop"
        assert cached(ok(emu, turn2(at_limit), **salt("e"))) == p1 + a1 - 1


def test_sglang_empty_salt_is_no_salt_and_extra_key_separates(start) -> None:
    emu = start(flavor="sglang", block_size=1)
    t1 = ok(emu, TURN1, cache_salt="")
    p1, a1 = t1["usage"]["prompt_tokens"], t1["usage"]["completion_tokens"]
    assert cached(ok(emu, turn2(t1), cache_salt="s1")) == 0
    assert cached(ok(emu, turn2(t1), extra_key="tenant-a")) == 0
    assert cached(ok(emu, turn2(t1))) == p1 + a1  # "" was no salt; page size 1: exact (EOS included)
    again = ok(emu, turn2(t1), cache_salt="")  # the same prompt once more: capped at n - 1
    assert cached(again) == again["usage"]["prompt_tokens"] - 1
    e1 = ok(emu, TURN1, extra_key="tenant-b")
    assert cached(e1) == 0
    assert cached(ok(emu, turn2(e1), extra_key="tenant-b")) == p1 + a1
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
    assert reply["usage"]["reasoning_tokens"] == 0
    assert reply["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


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
    r = chat(sg, TURN1, model="no/such-model")  # SGLang 0.5.23 does not check the name; it echoes it
    assert r.status_code == 200 and r.json()["model"] == "no/such-model"
    assert chat(sg, [], n=1).status_code == 400
    assert chat(sg, TURN1, n=3).status_code == 400
    assert requests.post(f"{sg.url}/v1/chat/completions", json={}, timeout=5).status_code == 400
    assert vllm.served_requests == 0 and sg.served_requests == 1
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
    assert ok(emu, TURN1, model="alias-a")["model"] == "emu/tiny-chat"  # real vLLM: the first served name
    metrics = requests.get(f"{emu.url}/metrics", timeout=5).text
    info = [line for line in metrics.splitlines() if line.startswith("vllm:cache_config_info{")]
    assert len(info) == 1 and 'block_size="64"' in info[0] and 'enable_prefix_caching="True"' in info[0]
    assert info[0].endswith(" 1.0")
    assert (
        "# TYPE vllm:prefix_cache_queries_total counter" in metrics
        and "vllm:prefix_cache_hits_total{" in metrics
    )
    tok = requests.post(f"{emu.url}/tokenize", json={"messages": TURN1}, timeout=5).json()
    assert tok["count"] == len(tokenize(render_chat(TURN1)))
    for path in ("/props", "/server_info", "/get_server_info", "/ready", "/nope"):
        r = requests.get(f"{emu.url}{path}", timeout=5)
        assert r.status_code == 404 and r.json() == {"detail": "Not Found"}, path  # as real vLLM 0.32.0


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


# -- Qwen3-like knobs: chat template, reasoning, SGLang's generating /health ----------------------------------

THOUGHT = f"{THINK_START}\nplan the greeting\n{THINK_END}\n\n"
USER1 = {"role": "user", "content": "Say hello."}


def tokens(emu: Emulator, messages: List[Dict[str, Any]], path: str = "/tokenize") -> List[int]:
    r = requests.post(f"{emu.url}{path}", json={"model": emu.config.model, "messages": messages}, timeout=5)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["tokens"])
    return body["tokens"]


def reasoning_of(reply: Dict[str, Any], flavor: str) -> Optional[str]:
    message = reply["choices"][0]["message"]
    assert ("reasoning_content" not in message) if flavor == "vllm" else ("reasoning" not in message)
    return message["reasoning" if flavor == "vllm" else "reasoning_content"]


def test_new_knobs_default_off_and_are_validated() -> None:
    cfg = EmulatorConfig()
    assert (cfg.chat_template, cfg.reasoning, cfg.health_generates) == ("chatml", False, True)
    with pytest.raises(ValueError, match="chat_template"):
        EmulatorConfig(chat_template="qwen3")
    with pytest.raises(ValueError):
        render_chat(TURN1, template="nope")
    assert render_chat(TURN1, template="chatml") == render_chat(TURN1)


@pytest.mark.parametrize("flavor,path", [("vllm", "/tokenize"), ("sglang", "/tokenize"), ("sglang", "/v1/tokenize")])
def test_drop_reasoning_template_renders_past_turns_after_think_only(start, flavor: str, path: str) -> None:
    thought = [USER1, {"role": "assistant", "content": THOUGHT + "Hi."}, FOLLOW_UP]
    plain = [USER1, {"role": "assistant", "content": "Hi."}, FOLLOW_UP]
    drop = start(flavor=flavor, chat_template="drop-reasoning")
    chatml = start(flavor=flavor)
    assert tokens(drop, thought, path) == tokens(drop, plain, path) == tokens(chatml, plain, path)
    kept = tokens(chatml, thought, path)
    assert len(kept) == len(tokens(chatml, plain, path)) + len(THOUGHT)  # ChatML keeps the think block
    # only what follows the last </think> is kept, leading newlines stripped; no </think>: untouched
    twice = [USER1, {"role": "assistant", "content": f"a{THINK_END}b{THINK_END}\n\nHi."}, FOLLOW_UP]
    assert tokens(drop, twice, path) == tokens(drop, plain, path)
    no_end = [USER1, {"role": "assistant", "content": "\n\nHi."}, FOLLOW_UP]
    assert tokens(drop, no_end, path) == tokens(chatml, no_end, path) != tokens(drop, plain, path)
    # user turns keep their text; the generation prompt is plain ChatML
    said = [{"role": "user", "content": THOUGHT + "Say hello."}]
    assert tokens(drop, said, path) == tokens(chatml, said, path)
    # the chat request is prompted with the template /tokenize uses
    assert ok(drop, thought)["usage"]["prompt_tokens"] == len(tokens(drop, thought, path))


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_empty_think_prompt_template_breaks_the_turn2_prefix(start, flavor: str) -> None:
    emu = start(flavor=flavor, chat_template="empty-think-prompt", block_size=1)
    chatml = start(flavor=flavor, block_size=1)
    block = tokenize(f"{THINK_START}\n\n{THINK_END}\n\n")
    first = tokens(emu, TURN1)
    assert first == tokens(chatml, TURN1) + block  # the generation prompt ends with an empty think block
    history = TURN1 + [{"role": "assistant", "content": "Red."}, FOLLOW_UP]
    second = tokens(emu, history)
    assert second == tokens(chatml, history) + block  # past turns are plain ChatML; the new prompt has the block
    assert second[: len(first)] != first and tokens(chatml, history)[: len(first) - len(block)] == tokens(
        chatml, TURN1
    )
    t1 = ok(emu, TURN1, **salt("e"))
    p1 = t1["usage"]["prompt_tokens"]
    assert p1 == len(first) and content(t1) == generate_answer(render_chat(TURN1, template="empty-think-prompt"))
    t2 = ok(emu, turn2(t1), **salt("e"))
    assert t2["usage"]["prompt_tokens"] == len(tokens(emu, turn2(t1)))
    assert cached(t2) == p1 - len(block)  # the hit stops where the turn-1 prompt's think block began


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_reasoning_is_split_off_and_counted(start, flavor: str) -> None:
    emu = start(flavor=flavor, reasoning=True)
    reply = ok(emu, TURN1, logprobs=True, top_logprobs=2)
    prompt = render_chat(TURN1)
    r, answer = generate_reasoning(prompt), generate_answer(prompt)
    assert 60 <= len(r) <= 120 and r == generate_reasoning(prompt) and r != answer[: len(r)]
    reasoning = reasoning_of(reply, flavor)
    # the parsers cut at </think> and strip nothing: "<think>" + reasoning + "</think>" + content is the output
    assert reasoning == f"\n{r}\n" and content(reply) == f"\n\n{answer}"
    full = THINK_START + reasoning + THINK_END + content(reply)
    usage = reply["usage"]
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert usage["completion_tokens"] == len(tokenize(full)) + 1  # reasoning and EOS included
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    entries = reply["choices"][0]["logprobs"]["content"]
    assert len(entries) == usage["completion_tokens"]
    assert "".join(e["token"] for e in entries) == full + IM_END
    if flavor == "vllm":  # tokens of the reasoning between the markers
        assert usage["completion_tokens_details"] == {"reasoning_tokens": len(tokenize(reasoning))}
    else:  # tokens from the first output token through </think>
        n_think = len(tokenize(THINK_START + reasoning + THINK_END))
        assert usage["reasoning_tokens"] == n_think == len(r) + 2 + len(THINK_START) + len(THINK_END)
        assert usage["completion_tokens_details"] == {"reasoning_tokens": n_think}
    plain = ok(start(flavor=flavor), TURN1)  # without reasoning the answer is the same, alone
    assert content(plain) == answer and reasoning_of(plain, flavor) is None
    # both send completion_tokens_details: null without reasoning tokens (test_conformance_*.py)
    assert "completion_tokens_details" in plain["usage"] and plain["usage"]["completion_tokens_details"] is None


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_reasoning_streams_reasoning_then_content(start, flavor: str) -> None:
    emu = start(flavor=flavor, reasoning=True)
    whole = ok(emu, TURN1)
    r = requests.post(
        f"{emu.url}/v1/chat/completions",
        timeout=5,
        json={"messages": TURN1, "stream": True, "stream_options": {"include_usage": True}},
    )
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    key = "reasoning" if flavor == "vllm" else "reasoning_content"
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    streamed_r = "".join(d.get(key) or "" for d in deltas)
    streamed_c = "".join(d.get("content") or "" for d in deltas)
    assert streamed_r == reasoning_of(whole, flavor) and streamed_c == content(whole)
    first_content = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert not any(d.get(key) for d in deltas[first_content:])  # reasoning comes first
    assert chunks[-1]["usage"] == whole["usage"] | {"prompt_tokens_details": chunks[-1]["usage"]["prompt_tokens_details"]}


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_reasoning_turn2_from_content_only_stops_at_the_turn1_prompt(start, flavor: str) -> None:
    emu = start(flavor=flavor, reasoning=True, block_size=1)
    t1 = ok(emu, TURN1, **salt("r"))
    p1, a1 = t1["usage"]["prompt_tokens"], t1["usage"]["completion_tokens"]
    only_content = ok(emu, turn2(t1), **salt("r"))
    assert cached(only_content) <= p1
    assert cached(only_content) == p1  # the history's answer departs from the output at "<think>"
    full = THINK_START + reasoning_of(t1, flavor) + THINK_END + content(t1)
    with_thought = TURN1 + [{"role": "assistant", "content": full}, FOLLOW_UP]
    t2 = ok(emu, with_thought, **salt("r"))
    # ChatML re-renders the whole output: prompt + every output token - 1 (SGLang: the EOS too)
    assert cached(t2) == p1 + a1 - 1 + ran_ahead(flavor)
    assert t2["usage"]["prompt_tokens"] == p1 + a1 + len(tokenize(f"\n{render_chat([FOLLOW_UP])}"))

    paged = start(flavor=flavor, reasoning=True, block_size=16)
    q1 = ok(paged, TURN1, **salt("r"))
    assert cached(ok(paged, with_thought, **salt("r"))) == (p1 + a1 - 1 + ran_ahead(flavor)) // 16 * 16
    assert cached(ok(paged, turn2(q1), **salt("r"))) == p1 // 16 * 16

    qwen = start(flavor=flavor, reasoning=True, block_size=1, chat_template="drop-reasoning")
    w1 = ok(qwen, TURN1, **salt("q"))
    assert reasoning_of(w1, flavor) == reasoning_of(t1, flavor)
    w2 = ok(qwen, TURN1 + [{"role": "assistant", "content": full}, FOLLOW_UP], **salt("q"))
    assert cached(w2) == p1  # the template dropped the reasoning: the hit stops at the turn-1 prompt


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_reasoning_cut_by_max_tokens_is_all_reasoning(start, flavor: str) -> None:
    emu = start(flavor=flavor, reasoning=True, block_size=1)
    reply = ok(emu, TURN1, max_tokens=20, **salt("m"))
    r = generate_reasoning(render_chat(TURN1))
    assert reply["choices"][0]["finish_reason"] == "length" and reply["usage"]["completion_tokens"] == 20
    assert reasoning_of(reply, flavor) == f"\n{r}"[:13]  # the 20 tokens less "<think>"
    assert content(reply) == (None if flavor == "vllm" else "")
    if flavor == "vllm":
        assert reply["usage"]["completion_tokens_details"] == {"reasoning_tokens": 13}
    else:
        assert reply["usage"]["reasoning_tokens"] == 20  # </think> never came: every output token
    again = ok(emu, TURN1 + [{"role": "assistant", "content": THINK_START + f"\n{r}"[:13]}], **salt("m"))
    assert cached(again) is not None and cached(again) >= reply["usage"]["prompt_tokens"] + 19 - 1


def test_reasoning_opt_outs_per_request(start) -> None:
    vllm = start(flavor="vllm", reasoning=True)
    reply = ok(vllm, TURN1, include_reasoning=False, logprobs=True)
    assert reply["choices"][0]["message"]["reasoning"] is None and content(reply).startswith("\n\n")
    assert reply["choices"][0]["logprobs"] is None  # vLLM suppresses them with include_reasoning false
    sg = start(flavor="sglang", reasoning=True)
    whole = ok(sg, TURN1, separate_reasoning=False)
    assert whole["choices"][0]["message"]["reasoning_content"] is None
    assert content(whole).startswith(THINK_START + "\n") and THINK_END + "\n\n" in content(whole)
    assert whole["usage"]["reasoning_tokens"] > 0  # the scheduler counts them all the same


def test_sglang_health_generates_and_waits_a_second_by_default(start) -> None:
    emu = start(flavor="sglang", block_size=1)
    assert emu.config.health_generates is True
    done: List[float] = []

    def health() -> None:
        began = time.monotonic()
        assert requests.get(f"{emu.url}/health", timeout=5).status_code == 200
        done.append(time.monotonic() - began)

    worker = threading.Thread(target=health)
    worker.start()
    time.sleep(0.2)
    began = time.monotonic()
    ok(emu, TURN1)  # the wait holds no lock: a chat request is served meanwhile
    assert time.monotonic() - began < 0.5 and not done
    worker.join()
    assert done and done[0] >= 1.0
    assert emu.health_generations == 1 and emu.served_requests == 1
    began = time.monotonic()
    assert requests.get(f"{emu.url}/health_generate", timeout=5).status_code == 200
    assert time.monotonic() - began >= 1.0 and emu.health_generations == 2

    vllm = start(flavor="vllm")  # vLLM's /health never generates
    began = time.monotonic()
    assert requests.get(f"{vllm.url}/health", timeout=5).status_code == 200
    assert time.monotonic() - began < 0.5


def test_sglang_health_without_generation(start) -> None:
    emu = start(flavor="sglang", block_size=1, health_generates=False)
    began = time.monotonic()
    assert requests.get(f"{emu.url}/health", timeout=5).status_code == 200
    assert time.monotonic() - began < 0.5
    assert emu.health_generations == 0 and emu.cached_blocks == 0
    began = time.monotonic()
    assert requests.get(f"{emu.url}/health_generate", timeout=5).status_code == 200
    assert time.monotonic() - began >= 1.0
    assert emu.health_generations == 1 and emu.cached_blocks == 1  # input_ids=[0] went into the cache


def test_stop_during_a_health_wait_does_not_hang(start) -> None:
    emu = start(flavor="sglang")
    worker = threading.Thread(target=lambda: pytest.raises(Exception, requests.get, f"{emu.url}/health", timeout=5))
    worker.start()
    time.sleep(0.2)
    began = time.monotonic()
    emu.stop()
    worker.join(timeout=5)
    assert not worker.is_alive() and time.monotonic() - began < 1.0


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


@contextmanager
def cli_emulator(*args: str) -> Iterator[int]:
    """Run ``python -m tests.support.emulator`` with ``args`` on a free port until Ctrl-C; yield the port once
    it answers, then check that SIGINT ends it with status 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.emulator", "--port", str(port), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        up = False
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and not up:
            try:
                requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
                up = True
            except requests.exceptions.ConnectionError:
                if proc.poll() is not None:
                    break
                time.sleep(0.05)
        assert up, proc.communicate()[1] if proc.poll() is not None else "no answer"
        yield port
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0


def test_command_line_serves_until_interrupted() -> None:
    with cli_emulator("--flavor", "sglang", "--block-size", "1", "--no-cache-report", "--ignore-salt") as port:
        info = requests.get(f"http://127.0.0.1:{port}/server_info", timeout=1).json()
        assert info["page_size"] == 1 and info["enable_cache_report"] is False


def test_command_line_qwen3_flags() -> None:
    thought = [USER1, {"role": "assistant", "content": THOUGHT + "Hi."}, FOLLOW_UP]
    plain = [USER1, {"role": "assistant", "content": "Hi."}, FOLLOW_UP]
    args = ("--flavor", "sglang", "--chat-template", "drop-reasoning", "--reasoning", "--no-health-generate")
    with cli_emulator(*args) as port:
        url = f"http://127.0.0.1:{port}"
        began = time.monotonic()
        assert requests.get(f"{url}/health", timeout=5).status_code == 200
        assert time.monotonic() - began < 0.5
        tok = [requests.post(f"{url}/tokenize", json={"messages": m}, timeout=5).json()["tokens"] for m in (thought, plain)]
        assert tok[0] == tok[1]
        reply = requests.post(f"{url}/v1/chat/completions", json={"messages": TURN1}, timeout=5).json()
        assert reply["choices"][0]["message"]["reasoning_content"] and reply["usage"]["reasoning_tokens"] > 0
    with cli_emulator("--flavor", "vllm", "--chat-template", "empty-think-prompt") as port:
        tok = requests.post(f"http://127.0.0.1:{port}/tokenize", json={"messages": TURN1}, timeout=5).json()
        assert tok["tokens"][-len(THINK_END) - 2 :] == tokenize(THINK_END + "\n\n")
