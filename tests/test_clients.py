"""HTTP layer and server clients, against `responses` mocks: request bodies, counters, failures."""

from __future__ import annotations

import json

import pytest
import requests
import responses

from pytest_cachecheck.clients import CLIENTS, LlamaCppClient, detect_server
from pytest_cachecheck.clients.base import ServerInfo
from pytest_cachecheck.clients.http import Http
from pytest_cachecheck.errors import RequestError, ServerSetupError

URL = "http://127.0.0.1:8080"
CHAT = URL + "/v1/chat/completions"
MSGS = [{"role": "user", "content": "hi"}]


def chat_body(content="hello there", cached=None, timings=None, details=True):
    usage = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    if details:
        usage["prompt_tokens_details"] = {"cached_tokens": cached} if cached is not None else None
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}], "usage": usage}
    if timings is not None:
        body["timings"] = timings
    return body


def llama(http=None):
    return LlamaCppClient(http or Http(URL), ServerInfo(kind="llama.cpp"))


def oai(kind="vllm", details=None):
    return CLIENTS[kind](Http(URL), ServerInfo(kind=kind, model="m1", details=details or {}))


@responses.activate
def test_llama_request_body_and_cache_n():
    responses.post(CHAT, json=chat_body(cached=7, timings={"cache_n": 11, "prompt_n": 1}))
    reply = llama().chat(MSGS, max_tokens=64, cache={"cache_prompt": True})
    sent = json.loads(responses.calls[0].request.body)
    assert sent == {"messages": MSGS, "temperature": 0, "max_tokens": 64, "stream": False,
                    "samplers": ["temperature"], "id_slot": 0, "cache_prompt": True}
    assert reply.cached_tokens == 11  # timings.cache_n wins
    assert (reply.content, reply.finish_reason, reply.prompt_tokens, reply.completion_tokens) == \
        ("hello there", "stop", 12, 3)


@responses.activate
def test_llama_falls_back_to_usage_counter():
    responses.post(CHAT, json=chat_body(cached=5))
    assert llama().chat(MSGS, max_tokens=8, cache={}).cached_tokens == 5


@responses.activate
@pytest.mark.parametrize("kind, penalty", [("vllm", True), ("sglang", True), ("openai", False)])
def test_openai_request_body(kind, penalty):
    responses.post(CHAT, json=chat_body(cached=0))
    oai(kind).chat(MSGS, max_tokens=32, cache={"cache_salt": "cachecheck-abc"})
    sent = json.loads(responses.calls[0].request.body)
    assert sent["model"] == "m1" and sent["temperature"] == 0 and sent["n"] == 1
    assert sent["cache_salt"] == "cachecheck-abc" and sent["max_tokens"] == 32 and sent["stream"] is False
    assert ("repetition_penalty" in sent) is penalty


@responses.activate
@pytest.mark.parametrize("details", [False, True])
def test_openai_missing_counter_is_unknown_not_zero(details):
    responses.post(CHAT, json=chat_body(cached=None, details=details))
    assert oai().chat(MSGS, max_tokens=8, cache={}).cached_tokens is None


@responses.activate
@pytest.mark.parametrize("kwargs, words", [
    ({"status": 500, "json": {"error": {"message": "boom", "code": 500}}}, "HTTP 500: boom"),
    ({"status": 429, "json": {"object": "error", "message": "slow down"}}, "HTTP 429: slow down"),
    ({"status": 503, "body": "<html>down</html>"}, "HTTP 503: <html>down</html>"),
    ({"status": 200, "body": "not json"}, "body is not JSON"),
    ({"status": 200, "body": '{"choices": [{"message": {"content": "x"'}, "body is not JSON"),
    ({"status": 200, "json": {"usage": {}}}, "no choices"),
    ({"status": 200, "json": {"choices": [{"message": {"content": "x"}}]}}, "no usage"),
    ({"status": 200, "json": [1, 2]}, "not a JSON object"),
])
def test_failures_are_request_errors(kwargs, words):
    responses.post(CHAT, **kwargs)
    with pytest.raises(RequestError) as info:
        llama().chat(MSGS, max_tokens=8, cache={})
    assert words in str(info.value)


@responses.activate
def test_timeout_and_refused_are_request_errors():
    responses.post(CHAT, body=requests.exceptions.ReadTimeout("read timed out"))
    with pytest.raises(RequestError, match="no answer within 300 s"):
        llama().chat(MSGS, max_tokens=8, cache={})


def test_refused_connection():
    http = Http("http://127.0.0.1:9", timeout=5)  # port 9 (discard) is closed here
    with pytest.raises(RequestError, match="connection refused"):
        llama(http).chat(MSGS, max_tokens=8, cache={})


@responses.activate
def test_credentials_go_to_headers_never_to_messages():
    url = "http://alice:s3cr3t-pw@127.0.0.1:8080"
    responses.post(CHAT, status=401, json={"error": {"message": "bad key sk-KEY-123 and s3cr3t-pw"}})
    http = Http(url, api_key="sk-KEY-123")
    with pytest.raises(RequestError) as info:
        llama(http).chat(MSGS, max_tokens=8, cache={})
    text = str(info.value)
    assert "s3cr3t-pw" not in text and "sk-KEY-123" not in text and "***" in text
    sent = responses.calls[0].request
    assert sent.headers["Authorization"] == "Bearer sk-KEY-123"
    assert "alice" not in sent.url and "s3cr3t" not in sent.url


@responses.activate
def test_url_credentials_become_basic_auth():
    responses.post(CHAT, json=chat_body(cached=0))
    llama(Http("http://alice:pw%40x@127.0.0.1:8080")).chat(MSGS, max_tokens=8, cache={})
    sent = responses.calls[0].request
    assert sent.headers["Authorization"].startswith("Basic ") and "alice" not in sent.url


@responses.activate
def test_detect_llama_server():
    responses.get(URL + "/props", json={"build_info": "b9999-abc", "total_slots": 1,
                                        "model_path": "/m/tiny.gguf",
                                        "default_generation_settings": {"n_ctx": 4096}})
    info = detect_server(Http(URL), None).info
    assert (info.kind, info.build, info.model) == ("llama.cpp", "b9999-abc", "tiny.gguf")
    assert info.details["total_slots"] == 1


@responses.activate
def test_detect_sglang_and_vllm_and_generic():
    responses.get(URL + "/props", status=404)
    responses.get(URL + "/server_info", json={"page_size": 1, "version": "0.5.23"})
    responses.get(URL + "/v1/models", json={"data": [{"id": "qwen"}]})
    info = detect_server(Http(URL), None).info
    assert (info.kind, info.build, info.model) == ("sglang", "0.5.23", "qwen")

    responses.reset()
    responses.get(URL + "/props", status=404)
    responses.get(URL + "/server_info", status=404)
    responses.get(URL + "/get_server_info", status=404)
    responses.get(URL + "/version", json={"version": "0.34.0"})
    responses.get(URL + "/metrics", body='# HELP x\nvllm:cache_config_info{block_size="64",'
                                         'enable_prefix_caching="True",gpu_memory_utilization="0.9"} 1.0\n')
    responses.get(URL + "/v1/models", json={"data": [{"id": "a"}, {"id": "b"}]})
    with pytest.raises(ServerSetupError, match="several models.*a, b"):
        detect_server(Http(URL), None)
    info = detect_server(Http(URL), "b").info
    assert info.kind == "vllm" and info.details == {"block_size": 64, "enable_prefix_caching": True}
    with pytest.raises(ServerSetupError, match="'c' is not served.*a, b"):
        detect_server(Http(URL), "c")


@responses.activate
def test_detect_refused_credentials():
    responses.get(URL + "/props", status=401, json={"error": {"message": "Invalid API Key"}})
    with pytest.raises(RequestError, match="check --cachecheck-api-key"):
        detect_server(Http(URL, api_key="nope"), None)


@responses.activate
@pytest.mark.parametrize("reporting, expected", [(True, 0), (False, None), (None, None)])
def test_sglang_null_details_mean_zero_only_with_reporting_on(reporting, expected):
    responses.post(CHAT, json=chat_body(cached=None))
    details = {} if reporting is None else {"enable_cache_report": reporting}
    client = oai("sglang", details)
    assert client.chat(MSGS, max_tokens=8, cache={}).cached_tokens == expected


@responses.activate
def test_logprobs_requested_and_parsed():
    body = chat_body(cached=0, timings={"cache_n": 0})
    body["choices"][0]["logprobs"] = {"content": [
        {"token": " hi", "logprob": -0.2, "top_logprobs": [{"token": " hi", "logprob": -0.2},
                                                          {"token": " yo", "logprob": -1.7}]}]}
    responses.post(CHAT, json=body)
    reply = llama().chat(MSGS, max_tokens=8, cache={}, logprobs=True)
    sent = json.loads(responses.calls[0].request.body)
    assert sent["logprobs"] is True and sent["top_logprobs"] == 2 and "prompt_logprobs" not in sent
    assert reply.logprobs == [(" hi", -0.2, pytest.approx(1.5))]
