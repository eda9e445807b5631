"""HTTP layer and server clients, against `responses` mocks: request bodies, counters, failures."""

from __future__ import annotations

import json

import pytest
import requests
import responses

from pytest_cachecheck.clients import CLIENTS, LlamaCppClient, detect_server
from pytest_cachecheck.clients.base import ServerInfo
from pytest_cachecheck.clients.http import Http
from pytest_cachecheck.errors import ModelChoiceError, RequestError, ServerSetupError, WrongModel

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


def llama_server_mocks(path="/m/tiny.gguf", aliases=()):
    """GET /props and /v1/models as llama-server (11434.0.0, seen in tests/test_e2e_llama.py) answers them:
    its model's name is the first alias in sorted order, else the model path as given to -m; the aliases are
    the --alias names, else that path."""
    name = sorted(aliases)[0] if aliases else path
    responses.get(URL + "/props", json={"build_info": "b9999-abc", "total_slots": 1, "model_path": path,
                                        "model_alias": name, "default_generation_settings": {"n_ctx": 4096}})
    responses.get(URL + "/v1/models", json={"object": "list", "data": [
        {"id": name, "aliases": sorted(aliases) or [path], "object": "model", "owned_by": "llamacpp"}]})
    return name


@responses.activate
def test_detect_llama_server():
    llama_server_mocks()
    info = detect_server(Http(URL), None).info
    assert (info.kind, info.build, info.model) == ("llama.cpp", "b9999-abc", "tiny.gguf")
    assert info.details["total_slots"] == 1
    assert [c.request.method for c in responses.calls] == ["GET", "GET"]  # nothing that generates


@responses.activate
@pytest.mark.parametrize("path, aliases, given", [
    ("/m/tiny-q4_0.gguf", (), "tiny-q4_0.gguf"),  # the file name
    ("/m/tiny-q4_0.gguf", (), "tiny-q4_0"),  # without .gguf
    ("/m/tiny-q4_0.gguf", (), "/m/tiny-q4_0.gguf"),  # the path as the server was started with it
    ("models/tiny-q4_0.gguf", ("tiny", "prod"), "tiny"),  # an alias, not the first
    ("models/tiny-q4_0.gguf", ("tiny", "prod"), "tiny-q4_0.gguf"),  # the file, under an alias
    ("/m/big-Q4_K_M-00001-of-00003.gguf", (), "big-Q4_K_M"),  # a split model's name
])
def test_llama_server_model_given_is_one_of_its_names(path, aliases, given):
    llama_server_mocks(path, aliases)
    info = detect_server(Http(URL), given).info
    assert info.model == given


@responses.activate
@pytest.mark.parametrize("aliases, given, serves", [
    ((), "tiny-f32.gguf", "named tiny-q4_0.gguf, tiny-q4_0 (its file name"),  # the other quantization
    ((), "tiny", "named tiny-q4_0.gguf, tiny-q4_0 ("),
    ((), "TINY-Q4_0.GGUF", "named tiny-q4_0.gguf, tiny-q4_0 ("),  # names are exact
    (("prod",), "staging", "named tiny-q4_0.gguf, prod, tiny-q4_0 ("),
])
def test_llama_server_refuses_a_model_it_does_not_serve(aliases, given, serves):
    llama_server_mocks("/srv/models/tiny-q4_0.gguf", aliases)
    with pytest.raises(ModelChoiceError) as info:
        detect_server(Http(URL), given)
    text = str(info.value)
    assert text.startswith(f"--cachecheck-model {given!r} is not served by {URL}: llama-server serves one model, ")
    assert serves in text and "/srv/models" not in text  # the path only as the file name
    assert [c.request.method for c in responses.calls] == ["GET", "GET"]


@responses.activate
def test_llama_server_without_a_model_name_refuses_any_given():
    responses.get(URL + "/props", json={"build_info": "b1", "total_slots": 1})
    responses.get(URL + "/v1/models", status=404)
    assert detect_server(Http(URL), None).info.model is None
    with pytest.raises(ModelChoiceError, match="names it nowhere"):
        detect_server(Http(URL), "tiny")


# -- the model an answer names: one rule for every kind ----------------------------------------------------
def named(model, **kwargs):
    body = chat_body(**kwargs)
    if model is not None:
        body["model"] = model
    return body


@responses.activate
@pytest.mark.parametrize("aliases, given", [((), None), ((), "tiny-q4_0"), (("tiny",), None), (("tiny",), "tiny"),
                                            (("tiny",), "tiny-q4_0.gguf")])
def test_llama_server_answers_under_its_own_name_whatever_was_given(aliases, given):
    """llama-server names its model in every answer (its first alias, else the path it was started with),
    never the name a request asked for; every name of its model is the model's."""
    own = llama_server_mocks("models/tiny-q4_0.gguf", aliases)
    client = detect_server(Http(URL), given)
    responses.post(CHAT, json=named(own, timings={"cache_n": 0}))
    assert client.chat(MSGS, max_tokens=8, cache={}).content == "hello there"


@responses.activate
def test_an_answer_under_another_model_name_is_wrong_model():
    llama_server_mocks("/m/tiny-q4_0.gguf")
    client = detect_server(Http(URL), None)
    responses.post(CHAT, json=named("/m/tiny-f32.gguf", timings={"cache_n": 0}))
    with pytest.raises(WrongModel) as info:
        client.chat(MSGS, max_tokens=8, cache={})
    assert str(info.value) == (f"the server at {URL} answered as model '/m/tiny-f32.gguf', not 'tiny-q4_0.gguf', "
                               f"so the answer is another model's")


def vllm_mocks(models):
    responses.get(URL + "/props", status=404)
    responses.get(URL + "/server_info", status=404)
    responses.get(URL + "/get_server_info", status=404)
    responses.get(URL + "/version", json={"version": "0.34.0"})
    responses.get(URL + "/metrics", status=404)
    responses.get(URL + "/v1/models", json={"object": "list", "data": [
        {"id": name, "object": "model", "root": root, "parent": None} for name, root in models]})


@responses.activate
@pytest.mark.parametrize("given, answered, ok", [
    ("b", "a", True),  # vLLM --served-model-name a b answers under its first name, whichever was asked for
    ("a", "b", True),
    ("a", None, True),  # an answer that names no model: nothing to compare
    ("a", "", True),
    ("a", "lora-x", False),  # another model the server lists (a LoRA adapter on the same weights)
    ("a", "c", False),
])
def test_an_answer_is_the_model_asked_for_under_any_of_its_names(given, answered, ok):
    vllm_mocks([("a", "/w/qwen"), ("b", "/w/qwen"), ("lora-x", "/w/lora-x")])
    client = detect_server(Http(URL), given)
    assert client.info.names == ["a", "b"]
    responses.post(CHAT, json=named(answered, cached=0))
    if ok:
        assert client.chat(MSGS, max_tokens=8, cache={}).cached_tokens == 0
    else:
        with pytest.raises(WrongModel, match=f"answered as model '{answered}', not '{given}'"):
            client.chat(MSGS, max_tokens=8, cache={})


@responses.activate
def test_the_model_an_answer_names_is_shown_inert():
    vllm_mocks([("a", None)])
    client = detect_server(Http(URL), None)
    assert client.info.names == ["a"]
    responses.post(CHAT, json=named("evil\x1b[2J\u202e" * 40, cached=0))
    with pytest.raises(WrongModel) as info:
        client.chat(MSGS, max_tokens=8, cache={})
    text = str(info.value)
    assert "\x1b" not in text and "\u202e" not in text and len(text) < 400


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
