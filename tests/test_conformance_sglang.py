"""What the plugin relies on from SGLang, asserted once and run against real SGLang 0.5.23 and the emulator.

The real server (``e2e``) is SGLang's own code on the CPU (tests/support/sglang_server.py); the emulator
(tests/support/emulator/, flavor ``sglang``) stands in for it in the fast tests. Each assertion here holds
for both, so the emulator cannot drift from the server on these points unnoticed. Requests carry the fields
the plugin sends (``model``, ``temperature: 0``, ``top_p``, ``n``, ``repetition_penalty``, ``max_tokens``).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional

import pytest
import requests

from tests.support.emulator import Emulator, EmulatorConfig

MODEL = "tiny-qwen2"
CONTEXT = 2048  # --context-length
TOKENIZER_MAX = 4096  # model_max_length in the tiny model's tokenizer_config.json


@dataclass
class Target:
    name: str
    url: str  # radix cache on, --enable-cache-report
    noreport_url: str  # radix cache on, no --enable-cache-report


@pytest.fixture(scope="module", params=["emulator", pytest.param("sglang", marks=pytest.mark.e2e)])
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    if request.param == "emulator":
        configs = [EmulatorConfig(flavor="sglang", block_size=1, model=MODEL, max_model_len=CONTEXT,
                                  tokenizer_max_length=TOKENIZER_MAX, report_cached_tokens=report)
                   for report in (True, False)]
        emus = [Emulator(config).start() for config in configs]
        yield Target("emulator", emus[0].url, emus[1].url)
        for emu in emus:
            emu.stop()
    else:
        default, noreport = request.getfixturevalue("sglang_servers")("default", "noreport")
        yield Target("sglang", default.url, noreport.url)


def messages(topic: str = "") -> List[Dict[str, str]]:
    # a unique prompt per call, so no test sees what another one cached
    return [{"role": "user", "content": f"({uuid.uuid4().hex[:8]}) Tell me about rivers and stones {topic}."}]


def post_chat(url: str, msgs: Any, **extra: Any) -> requests.Response:
    body: Dict[str, Any] = {"model": MODEL, "messages": msgs, "temperature": 0, "top_p": 1, "n": 1,
                            "repetition_penalty": 1.0, "max_tokens": 8}
    body.update(extra)
    return requests.post(f"{url}/v1/chat/completions", json=body, timeout=120)


def chat(url: str, msgs: Any, **extra: Any) -> Dict[str, Any]:
    r = post_chat(url, msgs, **extra)
    assert r.status_code == 200, r.text
    return r.json()


def cached(reply: Dict[str, Any]) -> Optional[int]:
    details = reply["usage"]["prompt_tokens_details"]
    return None if details is None else details["cached_tokens"]


def turn2(msgs: List[Dict[str, str]], reply: Dict[str, Any]) -> List[Dict[str, str]]:
    return msgs + [{"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
                   {"role": "user", "content": "Say it again, shorter."}]


def salt() -> str:
    return "conf-" + uuid.uuid4().hex


# -- errors --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["empty messages", "no messages", "not JSON", "negative max_tokens",
                                  "salt not a string"])
def test_bad_request_is_400_with_sglang_error_shape(target: Target, case: str) -> None:
    url = f"{target.url}/v1/chat/completions"
    good = {"model": MODEL, "messages": messages(), "max_tokens": 4}
    if case == "not JSON":
        r = requests.post(url, data=b"{bad", headers={"content-type": "application/json"}, timeout=60)
    else:
        body: Dict[str, Any] = {"empty messages": dict(good, messages=[]), "no messages": {"model": MODEL, "max_tokens": 4},
                "negative max_tokens": dict(good, max_tokens=-1),
                "salt not a string": dict(good, cache_salt=5)}[case]
        r = requests.post(url, json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()
    assert set(err) == {"object", "message", "type", "param", "code"}, err
    assert err["object"] == "error" and err["code"] == 400
    assert isinstance(err["message"], str) and err["message"]
    expected = {"empty messages": ("BadRequestError", "Messages cannot be empty."),
                "negative max_tokens": ("BadRequestError", "max_new_tokens must be at least 0, got -1."),
                "no messages": ("Bad Request", "'loc': ('body', 'messages'), 'msg': 'Field required'"),
                "not JSON": ("Bad Request", "'msg': 'JSON decode error'"),
                "salt not a string": ("Bad Request", "'loc': ('body', 'cache_salt', 'str')")}[case]
    assert err["type"] == expected[0], err
    assert expected[1] in err["message"], err


def test_unknown_route_and_wrong_method(target: Target) -> None:
    r = requests.get(f"{target.url}/no/such/route", timeout=30)
    assert (r.status_code, r.json()) == (404, {"detail": "Not Found"})
    r = requests.get(f"{target.url}/v1/chat/completions", timeout=30)
    assert (r.status_code, r.json()) == (405, {"detail": "Method Not Allowed"})


def test_max_tokens_zero_is_allowed(target: Target) -> None:
    reply = chat(target.url, messages(), max_tokens=0, cache_salt=salt())
    choice = reply["choices"][0]
    assert choice["message"]["content"] == "" and choice["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == 0


# -- the reply and its usage ---------------------------------------------------------------------------------

def test_reply_and_usage_fields(target: Target) -> None:
    msgs = messages()
    reply = chat(target.url, msgs, cache_salt=salt(), logprobs=True, top_logprobs=2)
    assert set(reply) >= {"id", "object", "created", "model", "choices", "usage"}
    assert reply["object"] == "chat.completion" and reply["model"] == MODEL
    choice = reply["choices"][0]
    assert set(choice["message"]) == {"role", "content", "reasoning_content"}, choice["message"]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["message"]["reasoning_content"] is None
    assert choice["finish_reason"] in ("stop", "length")
    usage = reply["usage"]
    assert set(usage) == {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details",
                          "reasoning_tokens", "completion_tokens_details"}, usage
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["reasoning_tokens"] == 0 and usage["completion_tokens_details"] is None
    # 0.5.23 reports a miss as {"cached_tokens": 0} when reporting is on (older releases: null)
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    # logprobs: one entry per output token (the EOS too), each with the two best alternatives
    content = choice["logprobs"]["content"]
    assert len(content) == usage["completion_tokens"]
    for entry in content:
        assert isinstance(entry["token"], str) and entry["logprob"] <= 0
        top = entry["top_logprobs"]
        assert len(top) == 2 and top[0]["logprob"] >= top[1]["logprob"]


def test_prompt_tokens_details_null_without_cache_report(target: Target) -> None:
    msgs, s = messages(), salt()
    first = chat(target.noreport_url, msgs, cache_salt=s)
    again = chat(target.noreport_url, msgs, cache_salt=s)  # a hit, but not reported
    for reply in (first, again):
        assert "prompt_tokens_details" in reply["usage"] and reply["usage"]["prompt_tokens_details"] is None


# -- the cache -----------------------------------------------------------------------------------------------

def test_cache_salt_isolation_and_the_empty_salt_rule(target: Target) -> None:
    msgs, a, b = messages("salted"), salt(), salt()
    first = chat(target.url, msgs, cache_salt=a)
    n = first["usage"]["prompt_tokens"]
    assert cached(first) == 0
    assert cached(chat(target.url, msgs, cache_salt=a)) == n - 1  # page size 1; the last token is recomputed
    assert cached(chat(target.url, msgs, cache_salt=b)) == 0
    # an empty salt is no salt: it misses the salted entries (it can hit the chat template's first tokens,
    # which any unsalted request leaves behind) and what it leaves is found without a salt
    assert cached(chat(target.url, msgs, cache_salt="")) < n - 1
    assert cached(chat(target.url, msgs)) == n - 1
    assert cached(chat(target.url, msgs, cache_salt="")) == n - 1


def test_turn2_hit_covers_turn1_prompt_and_answer(target: Target) -> None:
    msgs, s = messages("at length"), salt()
    t1 = chat(target.url, msgs, cache_salt=s, max_tokens=512)
    p1, a1 = t1["usage"]["prompt_tokens"], t1["usage"]["completion_tokens"]
    assert t1["choices"][0]["finish_reason"] == "stop" and a1 < 512
    hit = cached(chat(target.url, turn2(msgs, t1), cache_salt=s, max_tokens=8))
    # SGLang's overlap scheduler computed the EOS token's KV before it saw the EOS: prompt + answer
    assert hit == p1 + a1
    assert cached(chat(target.url, turn2(msgs, t1), cache_salt=salt(), max_tokens=8)) == 0
    # cut by max_tokens, the last token's KV is never computed: prompt + answer - 1
    msgs, s = messages("briefly"), salt()
    cut = chat(target.url, msgs, cache_salt=s, max_tokens=2)
    assert cut["choices"][0]["finish_reason"] == "length" and cut["usage"]["completion_tokens"] == 2
    assert cached(chat(target.url, turn2(msgs, cut), cache_salt=s, max_tokens=2)) == \
        cut["usage"]["prompt_tokens"] + 2 - 1


# -- informational endpoints ---------------------------------------------------------------------------------

def test_server_info(target: Target) -> None:
    for url, report in ((target.url, True), (target.noreport_url, False)):
        info = requests.get(f"{url}/server_info", timeout=30).json()
        assert info["page_size"] == 1 and info["disable_radix_cache"] is False
        assert info["enable_cache_report"] is report and info["version"] == "0.5.23"
        assert info["sampling_defaults"] == "openai" and info["context_length"] == CONTEXT
        assert info["enable_deterministic_inference"] is False
        old = requests.get(f"{url}/get_server_info", timeout=30)  # the deprecated name still answers
        assert old.status_code == 200 and old.json()["page_size"] == 1


def test_models(target: Target) -> None:
    data = requests.get(f"{target.url}/v1/models", timeout=30).json()
    assert data["object"] == "list" and len(data["data"]) == 1
    entry = data["data"][0]
    assert entry["id"] == MODEL and entry["object"] == "model" and entry["owned_by"] == "sglang"
    assert entry["max_model_len"] == CONTEXT and "root" in entry and entry["parent"] is None


def test_model_name_is_echoed_not_checked(target: Target) -> None:
    assert chat(target.url, messages(), max_tokens=1, model="no-such-model")["model"] == "no-such-model"
    body: Dict[str, Any] = {"messages": messages(), "max_tokens": 1, "temperature": 0}
    r = requests.post(f"{target.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["model"] == "default"


def test_tokenize_messages_renders_as_chat_does(target: Target) -> None:
    msgs = messages("tokenized")
    r = requests.post(f"{target.url}/tokenize", json={"model": MODEL, "messages": msgs}, timeout=30)
    assert r.status_code == 200, r.text
    data = r.json()
    assert set(data) == {"tokens", "count", "max_model_len"}
    tokens = data["tokens"]
    assert all(isinstance(t, int) for t in tokens) and data["count"] == len(tokens)
    assert data["max_model_len"] == TOKENIZER_MAX  # the tokenizer's model_max_length, not the context length
    reply = chat(target.url, msgs, cache_salt=salt())
    assert reply["usage"]["prompt_tokens"] == len(tokens)  # the generation prompt is added, as in chat
    longer = requests.post(f"{target.url}/tokenize", json={"model": MODEL, "messages": turn2(msgs, reply)},
                           timeout=30).json()["tokens"]
    assert longer[: len(tokens)] == tokens  # ChatML keeps past turns as they were prompted


def test_health_generates_and_ready_does_not(target: Target) -> None:
    began = time.monotonic()
    r = requests.get(f"{target.url}/health", timeout=60)
    took = time.monotonic() - began
    assert r.status_code == 200 and took >= 0.95  # health_generate waits a second for its one-token reply
    began = time.monotonic()
    assert requests.get(f"{target.url}/ready", timeout=60).status_code == 200
    assert time.monotonic() - began < 0.9
    assert requests.get(f"{target.url}/model_info", timeout=60).json()["model_type"] == "qwen2"
