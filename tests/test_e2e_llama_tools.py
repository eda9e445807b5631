"""End to end: real tool calls from a tiny random-weight model on a real llama-server, and how much of
each step a multi-step conversation (an *episode*) gets from the prompt cache.

The model is ``serve.tools_model`` (``tinymodel.tool_model_config()``: ``<tool_call>`` markers and a
bigram "grammar sense" for the demo tools), served with ``--jinja --chat-template-file`` Qwen2.5's
template from the llama.cpp sdist. Everything goes over raw HTTP; nothing is mocked. The exact facts
asserted here were measured first (tests/support/TOOLCALL_FINDINGS.md); whether cache and recompute
paths take different trajectories is recorded and printed, never assumed. With ``CI`` set, failing to
obtain llama-server fails these tests instead of skipping them. At most one llama-server runs at a time.
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

requests = pytest.importorskip("requests")
pytest.importorskip("gguf")

from pytest_cachecheck.llama_server import LlamaServer  # noqa: E402
from pytest_cachecheck.serve import demo_model, ensure_llama_server, ensure_template, tools_model  # noqa: E402
from pytest_cachecheck.tinymodel import DEMO_TOOLS, WORDS_PATTERN  # noqa: E402

pytestmark = pytest.mark.e2e

WEATHER, BOOK = DEMO_TOOLS
WORDS = ("house river stone paris rome weather table dinner lunch book find cold warm rain sun city two "
         "four green light").split()


def _log(message: str) -> None:
    sys.stderr.write(message + "\n")


@pytest.fixture(scope="session")
def llama_binary() -> str:
    try:
        return str(ensure_llama_server(_log))
    except Exception as exc:  # noqa: BLE001 - any failure to obtain the binary
        if os.environ.get("CI"):
            pytest.fail(f"llama-server could not be obtained in CI: {exc}", pytrace=False)
        pytest.skip(f"llama-server not available: {exc}")


@pytest.fixture(scope="session")
def server(llama_binary: str) -> Iterator[Callable[[str, str], LlamaServer]]:
    """``server("tools", "q4_0")``: the tool model with Qwen2.5's template; ``server("plain", "f32")``: the
    demo model with the server's defaults. Asking for another one stops the running one."""
    running: Dict[Tuple[str, str], LlamaServer] = {}

    def get(kind: str, ftype: str) -> LlamaServer:
        key = (kind, ftype)
        if key not in running:
            for old in running.values():
                old.stop()
            running.clear()
            if kind == "tools":
                srv = LlamaServer(llama_binary, tools_model(_log, ftype),
                                  extra_args=("--jinja", "--chat-template-file", str(ensure_template(_log))))
            else:
                srv = LlamaServer(llama_binary, demo_model(_log, ftype))
            try:
                srv.start(timeout=180)
            except Exception:
                _log(srv.log_tail(80))
                srv.stop()
                raise
            running[key] = srv
        assert running[key].is_alive(), running[key].log_tail(80)
        return running[key]

    yield get
    for srv in running.values():
        srv.stop()


def post(srv: LlamaServer, path: str, body: Dict[str, Any]) -> Dict[str, Any]:
    resp = requests.post(srv.url + path, json=body, timeout=600)
    assert resp.status_code == 200, (path, resp.status_code, resp.text[:1000])
    return resp.json()


def chat_body(messages: List[Dict[str, Any]], tools: Optional[List[Dict[str, Any]]], cache: bool,
              **extra: Any) -> Dict[str, Any]:
    body: Dict[str, Any] = {"messages": messages, "temperature": 0, "samplers": ["temperature"],
                            "max_tokens": 80, "cache_prompt": cache, "id_slot": 0,
                            "logprobs": True, "top_logprobs": 1}
    if tools is not None:
        body["tools"] = tools
    body.update(extra)
    return body


def prompt_ids(srv: LlamaServer, messages: List[Dict[str, Any]],
               tools: Optional[List[Dict[str, Any]]]) -> List[int]:
    """The prompt the server builds for ``messages`` (``/apply-template``, then ``/tokenize``)."""
    body: Dict[str, Any] = {"messages": messages}
    if tools is not None:
        body["tools"] = tools
    text = post(srv, "/apply-template", body)["prompt"]
    return [int(t) for t in post(srv, "/tokenize", {"content": text, "parse_special": True})["tokens"]]


@dataclass
class Step:
    prompt: int                 # usage.prompt_tokens
    answer: int                 # usage.completion_tokens
    cached: int                 # usage.prompt_tokens_details.cached_tokens
    cache_n: int                # timings.cache_n
    finish: str
    content: str
    calls: List[Tuple[str, Dict[str, Any]]]
    ids: List[int]              # generated token ids (logprobs), the last one never enters the KV cache
    prompt_ids: List[int] = field(default_factory=list)

    def move(self) -> Tuple[str, Any]:
        return ("call", self.calls) if self.calls else ("answer", self.content)


def run_episode(srv: LlamaServer, seed: int, tools: Optional[List[Dict[str, Any]]], cache: bool, steps: int,
                with_prompts: bool = False) -> List[Step]:
    """One conversation; each step sends the previous steps' own answers back (``cache``: every step
    after the first with ``cache_prompt: true``; otherwise every step with ``cache_prompt: false``).
    A tool call is answered by a ``tool`` message, a text answer by a new user message."""
    rng = random.Random(seed)
    messages: List[Dict[str, Any]] = [{"role": "user", "content": say(rng, 6)}]
    out: List[Step] = []
    for k in range(steps):
        extra = {"tool_choice": "auto"} if tools else {}
        data = post(srv, "/v1/chat/completions", chat_body(messages, tools, cache and k > 0, **extra))
        choice, usage = data["choices"][0], data["usage"]
        msg = choice["message"]
        calls = msg.get("tool_calls") or []
        step = Step(usage["prompt_tokens"], usage["completion_tokens"],
                    usage["prompt_tokens_details"]["cached_tokens"], data["timings"]["cache_n"],
                    choice["finish_reason"], msg.get("content") or "",
                    [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls],
                    [int(t["id"]) for t in choice["logprobs"]["content"]])
        assert len(step.ids) == step.answer
        if with_prompts:
            step.prompt_ids = prompt_ids(srv, messages, tools)
            assert len(step.prompt_ids) == step.prompt
        out.append(step)
        if calls:
            messages.append({"role": "assistant", "content": msg.get("content") or "", "tool_calls": calls})
            for c in calls:
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": say(rng, 3)})
        else:
            messages.append({"role": "assistant", "content": msg.get("content") or ""})
            messages.append({"role": "user", "content": say(rng, 4)})
    return out


def say(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def common_prefix(a: List[int], b: List[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def check_call(name: str, args: Dict[str, Any]) -> None:
    words = re.compile(WORDS_PATTERN)
    if name == "get_weather":
        assert set(args) == {"city"} and words.match(args["city"]), args
    else:
        assert name == "book_table", name
        assert set(args) == {"name", "guests", "time"}, args
        assert words.match(args["name"]) and args["time"] in ("lunch", "dinner"), args
        assert isinstance(args["guests"], int) and 1 <= args["guests"] <= 20, args


# ---------------------------------------------------------------------------------------------


def test_required_tool_call_over_raw_http(server: Callable[[str, str], LlamaServer]) -> None:
    srv = server("tools", "f32")
    props = requests.get(srv.url + "/props", timeout=30).json()
    assert "<tool_call>" in props["chat_template"]          # the --chat-template-file, not the GGUF's
    body = chat_body([{"role": "user", "content": "what is the weather in paris"}], [WEATHER], False,
                     tool_choice="required")
    data = post(srv, "/v1/chat/completions", body)
    choice = data["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and isinstance(call["id"], str) and call["id"]
    assert call["function"]["name"] == "get_weather"
    args = json.loads(call["function"]["arguments"])
    check_call("get_weather", args)
    assert not choice["message"].get("content")
    # the call token by token: <tool_call>, "\n", the JSON, "\n" closer, </tool_call>, <|im_end|>
    pieces = [t["token"] for t in choice["logprobs"]["content"]]
    assert pieces[:5] == ["<tool_call>", "\n", '{"', "name", '":'] and pieces[-2:] == ["</tool_call>", ""]
    assert "".join(pieces[2:-2]) == '{"name": "get_weather", "arguments": %s}\n' % json.dumps(args)
    print(f"\nMEASURED required call: {call['function']['name']} {call['function']['arguments']} "
          f"({data['usage']['completion_tokens']} tokens)")


def test_string_integer_enum_arguments(server: Callable[[str, str], LlamaServer]) -> None:
    srv = server("tools", "f32")
    seen = set()
    for q in ("book a table for two", "a table tonight", "dinner for four please"):
        data = post(srv, "/v1/chat/completions", chat_body([{"role": "user", "content": q}], [BOOK], False,
                                                           tool_choice="required"))
        choice = data["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        (call,) = choice["message"]["tool_calls"]
        args = json.loads(call["function"]["arguments"])
        check_call(call["function"]["name"], args)
        seen.add(call["function"]["arguments"])
    print(f"\nMEASURED book_table arguments: {sorted(seen)}")


def test_python_tokenizer_agrees_with_the_server(server: Callable[[str, str], LlamaServer]) -> None:
    """tinymodel.tokenize_ascii (used to pick the model's tool tokens) = llama-server's /tokenize."""
    from pytest_cachecheck.serve import ensure_vocab
    from pytest_cachecheck.tinymodel import load_vocab, tokenize_ascii

    srv = server("tools", "f32")
    vocab = load_vocab(ensure_vocab(_log), tool_call_tokens=True)
    tokens, merges = (vocab.tokenizer_kv[k].value for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"))
    args = '{"name": " green lamp", "guests": 12, "time": "dinner"}'
    call = {"id": "c1", "type": "function", "function": {"name": "book_table", "arguments": args}}
    messages: List[Dict[str, Any]] = [{"role": "user", "content": "book a table"},
                                      {"role": "assistant", "content": "", "tool_calls": [call]},
                                      {"role": "tool", "tool_call_id": "c1", "content": "done"}]
    text = post(srv, "/apply-template", {"messages": messages, "tools": list(DEMO_TOOLS)})["prompt"]
    specials = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
    assert tokenize_ascii(text, tokens, merges, specials) == prompt_ids(srv, messages, list(DEMO_TOOLS))


def test_auto_and_named_tool_choice(server: Callable[[str, str], LlamaServer]) -> None:
    srv = server("tools", "f32")
    moves = []
    tools = list(DEMO_TOOLS)
    named_choice = {"type": "function", "function": {"name": "book_table"}}
    for seed in range(8):
        messages = [{"role": "user", "content": say(random.Random(100 + seed), 6)}]
        auto = post(srv, "/v1/chat/completions", chat_body(messages, tools, False, tool_choice="auto"))
        choice = auto["choices"][0]
        if choice["message"].get("tool_calls"):
            assert choice["finish_reason"] == "tool_calls"
            for c in choice["message"]["tool_calls"]:
                check_call(c["function"]["name"], json.loads(c["function"]["arguments"]))
            moves.append(choice["message"]["tool_calls"][0]["function"]["name"])
        else:
            assert choice["finish_reason"] in ("stop", "length")
            assert "<tool_call>" not in choice["message"]["content"]
            moves.append("answer")
        # a named tool_choice object is not understood: the server logs "Wrong type supplied for
        # parameter 'tool_choice'" and uses the default, "auto"
        named = post(srv, "/v1/chat/completions", chat_body(messages, tools, False, tool_choice=named_choice))
        assert named["choices"][0]["message"] == auto["choices"][0]["message"]
    assert "Wrong type supplied for parameter 'tool_choice'" in srv.log_tail(2000)
    print(f"\nMEASURED tool_choice auto, first step of 8 conversations: {moves}")


def test_unbounded_string_argument_runs_into_max_tokens(server: Callable[[str, str], LlamaServer]) -> None:
    """Without a pattern the grammar never makes a string end; a call cut by max_tokens is an HTTP 500."""
    srv = server("tools", "f32")
    free = json.loads(json.dumps(WEATHER))
    del free["function"]["parameters"]["properties"]["city"]["pattern"]
    body = chat_body([{"role": "user", "content": "weather"}], [free], False, tool_choice="required",
                     max_tokens=40)
    resp = requests.post(srv.url + "/v1/chat/completions", json=body, timeout=600)
    assert resp.status_code == 500, resp.text[:500]
    assert "Failed to parse tool call arguments as JSON" in resp.json()["error"]["message"]


def test_episode_cache_hits(server: Callable[[str, str], LlamaServer]) -> None:
    """Each step with cache_prompt reuses what the previous step left in the slot: all of it after a tool
    call (prompt + answer - 1), only the prompt after a text answer (llama-server drops the answer's
    leading space when tools are present, so the template re-renders it as other tokens)."""
    srv = server("tools", "f32")
    after_call = after_answer = 0
    for seed in range(6):
        steps = run_episode(srv, seed, list(DEMO_TOOLS), True, 5, with_prompts=True)
        assert steps[0].cached == 0
        for prev, step in zip(steps, steps[1:]):
            assert step.cached == step.cache_n
            left = prev.prompt_ids + prev.ids[:-1]        # what the slot holds after the previous step
            assert step.cached == common_prefix(left, step.prompt_ids), (seed, prev.move())
            if prev.calls:
                assert step.cached == prev.prompt + prev.answer - 1, (seed, prev.move())
                after_call += 1
            else:
                if prev.answer > 1:  # not just <|im_end|>: the answer's first word starts with a space
                    assert post(srv, "/detokenize", {"tokens": prev.ids[:1]})["content"].startswith(" ")
                    assert not prev.content.startswith(" ")
                assert step.cached == prev.prompt, (seed, prev.move())
                after_answer += 1
    assert after_call and after_answer
    print(f"\nMEASURED episode hits: {after_call} steps after a tool call got prompt+answer-1, "
          f"{after_answer} steps after a text answer got the previous prompt only")


@pytest.mark.parametrize("ftype", ["f32", "q4_0"])
def test_plain_multi_turn_hits(server: Callable[[str, str], LlamaServer], ftype: str) -> None:
    """Without tools (demo model, server defaults) every turn reuses prompt + answer - 1 of the last one."""
    srv = server("plain", ftype)
    hits = []
    for seed in range(3):
        steps = run_episode(srv, seed, None, True, 6)
        assert steps[0].cached == 0
        for prev, step in zip(steps, steps[1:]):
            assert step.cached == step.cache_n == prev.prompt + prev.answer - 1, seed
            hits.append((prev.prompt, prev.answer, step.cached))
    print(f"\nMEASURED plain {ftype} (previous prompt, answer -> cached): {hits}")


@pytest.mark.parametrize("ftype", ["f32", "q4_0"])
def test_cache_vs_recompute_trajectories(server: Callable[[str, str], LlamaServer], ftype: str) -> None:
    """Cache path vs recompute path, each feeding its own answers forward: recorded, not assumed."""
    srv = server("tools", ftype)
    differ: List[Tuple[int, int]] = []
    moves = {"call": 0, "answer": 0}
    n = 8
    for seed in range(n):
        cached = run_episode(srv, seed, list(DEMO_TOOLS), True, 4)
        fresh = run_episode(srv, seed, list(DEMO_TOOLS), False, 4)
        assert [s.cached for s in fresh] == [0] * 4
        assert all(s.cached > 0 for s in cached[1:])
        for s in cached:
            moves[s.move()[0]] += 1
            for name, args in s.calls:
                check_call(name, args)
        first = next((k for k, (a, b) in enumerate(zip(cached, fresh)) if a.move() != b.move()), None)
        if first is not None:
            differ.append((seed, first))
    print(f"\nMEASURED {ftype}: {len(differ)} of {n} tool episodes (4 steps) took another trajectory with "
          f"the cache (seed, first differing step): {differ}; cache-path moves {moves}")
