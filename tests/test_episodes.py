"""Episodes: the file format, the built-in set, and the measurement of trajectories against a small
in-process server that keeps a llama-server-like slot (no HTTP)."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import xml.etree.ElementTree as ET
from typing import Any, Callable, Dict, List, Optional

import pytest

from pytest_cachecheck.clients import CLIENTS
from pytest_cachecheck.clients.base import Reply, ServerInfo
from pytest_cachecheck.clients.http import Http
from pytest_cachecheck.episodes import Episode, builtin_episodes, builtin_tools, load_episodes, parse_episode
from pytest_cachecheck.model import EpisodeRecord, Outcome
from pytest_cachecheck.probes import ProbeFileError
from pytest_cachecheck.protocol import Runner
from pytest_cachecheck.servers import ServerSetup
from pytest_cachecheck.settings import Settings
from pytest_cachecheck.trajectory import measure_episode

WORDS = "amber basil cedar delta ember fable grove harbor indigo juniper kelp lumen maple nectar orbit".split()
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def episode(**fields: Any) -> Episode:
    obj: Dict[str, Any] = {"id": "e1", "messages": [{"role": "user", "content": "Plan a walk."}],
                           "user_turns": ["And tomorrow?", "Thanks."]}
    obj.update(fields)
    return parse_episode(obj, path="e.jsonl", line=1, default_id="e-1")


class SlotServer:
    """A chat server with one llama-server-like slot: ``cache_prompt: true`` reuses the longest common token
    prefix with what the slot holds (prompt + answer - 1); answers are words chosen by a hash of the prompt;
    ``tool_choice: required`` (or a named tool) answers with a call. A past call is rendered back as the
    tokens generated, or (``rerender_calls`` false) as other text, or (``retokenize_calls``) as the same
    text in other tokens; the prompt's text is its tokens joined."""

    def __init__(self, diverge: Callable[[int, int], bool] = lambda step, cached: False,
                 rerender_calls: bool = True, recompute_reuses: bool = False, empty_at: int = 0,
                 retokenize_calls: bool = False,
                 arguments: Callable[[str], str] = lambda word: json.dumps({"city": word})) -> None:
        self.slot: List[str] = []
        self.arguments = arguments  # a call's arguments text, from the word the prompt chose
        self.empty_at = empty_at  # the step whose answer is empty (only the end token)
        self.diverge = diverge
        self.rerender_calls = rerender_calls
        self.retokenize_calls = retokenize_calls
        self.recompute_reuses = recompute_reuses
        self.calls: List[Dict[str, Any]] = []

    def render(self, messages: List[Dict[str, Any]]) -> List[str]:
        tokens: List[str] = []
        for m in messages:
            tokens += [f"<{m['role']}>"] + (m.get("content") or "").split()
            for call in m.get("tool_calls") or []:
                fn = call["function"]
                args = fn["arguments"] if self.rerender_calls else fn["arguments"].replace(": ", ":")
                tokens += [f"<call:{fn['name']}>"]
                tokens += [args[:3], args[3:]] if self.retokenize_calls else [args]
            tokens.append("<end>")
        return tokens + ["<assistant>"]

    def chat(self, messages: List[Dict[str, Any]], *, max_tokens: int, cache: Dict[str, Any],
             logprobs: bool = False, tools: Optional[List[Dict[str, Any]]] = None, tool_choice: Any = None) -> Reply:
        self.calls.append({"messages": json.loads(json.dumps(messages)), "cache": dict(cache), "logprobs": logprobs,
                           "tool_choice": tool_choice})
        prompt = self.render(messages)
        common = 0
        for x, y in zip(self.slot, prompt):
            if x != y:
                break
            common += 1
        reuse = cache.get("cache_prompt", True) or self.recompute_reuses
        cached = min(common, len(prompt) - 1) if reuse else 0
        step = sum(1 for m in messages if m["role"] == "assistant") + 1
        seed = int(hashlib.sha256(" ".join(prompt).encode()).hexdigest(), 16)
        if self.diverge(step, cached):
            seed += 7
        if tools and tool_choice not in (None, "auto", "none"):
            name = tool_choice["function"]["name"] if isinstance(tool_choice, dict) else tools[0]["function"]["name"]
            args = self.arguments(WORDS[seed % len(WORDS)])
            answer = [f"<call:{name}>", args]
            reply = Reply("", "tool_calls", len(prompt), len(answer) + 1, cached, tool_calls=[(name, args)])
        else:
            answer = [WORDS[(seed >> (4 * i)) % len(WORDS)] for i in range(3 + seed % 4)]
            if step == self.empty_at:
                answer = []
            reply = Reply(" ".join(answer), "stop", len(prompt), len(answer) + 1, cached)
        if logprobs:
            reply.logprobs = [(t, -0.1, 0.05) for t in answer]  # both paths: 0.1 together, a near-tie
        self.slot = prompt + answer  # the slot holds prompt + answer - the last sampled token (the end token)
        return reply


def runner(server: SlotServer, **settings: Any) -> Runner:
    r = Runner(Settings(url="http://127.0.0.1:9", mode="llama.cpp", **settings))
    cls = type("Slot", (CLIENTS["llama.cpp"],), {
        "chat": lambda self, *a, **k: server.chat(*a, **k),
        "render": lambda self, messages, tools=None: "".join(server.render(messages))})
    r.setup = ServerSetup("llama.cpp", cls(Http("http://127.0.0.1:9"), ServerInfo(kind="llama.cpp")), None, checked=True)
    return r


# -- the file format ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("fields, where", [
    ({"messages": [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "x"}]}, "messages[0].role"),
    ({"user_turns": "next"}, "user_turns"),
    ({"user_turns": ["ok", ""]}, "user_turns[1]"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER]}, "tool_results.get_weather"),
    ({"tools": [WEATHER], "tool_results": {"get_weather": "x", "other": "y"}}, "tool_results.other"),
    ({"tools": [WEATHER], "tool_results": {"get_weather": {"cases": [{"arguments": [], "result": "x"}]}}},
     "tool_results.get_weather.cases[0].arguments"),
    ({"tools": [WEATHER], "tool_results": {"get_weather": {}}}, "tool_results.get_weather"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_results": {"get_weather": "x"}, "tool_choice": ["auto", "search"]},
     "tool_choice[1]"),
    ({"max_steps": 0}, "max_steps"),
    ({"max_steps": 1e400}, "max_steps"),
    ({"turns": []}, "turns"),
])
def test_bad_episode_names_file_line_and_field(tmp_path, fields, where):
    obj = {"id": "e", "messages": [{"role": "user", "content": "Plan a walk."}]}
    obj.update(fields)
    path = tmp_path / "mine.jsonl"
    path.write_text('{"id": "ok", "messages": [{"role": "user", "content": "Hi."}]}\n' + json.dumps(obj) + "\n")
    with pytest.raises(ProbeFileError) as err:
        load_episodes([str(path)])
    assert str(err.value).startswith(f"{path}:2: field '{where}'"), str(err.value)


def test_tool_results_answer_by_exact_arguments():
    e = episode(tools=[WEATHER], tool_choice=["required", "auto"], tool_results={"get_weather": {
        "cases": [{"arguments": {"city": "Oslo"}, "result": "rain"}], "default": "sun"}})
    assert e.result("get_weather", '{ "city" : "Oslo" }') == "rain"  # the same JSON, spaced otherwise
    assert e.result("get_weather", '{"city": "Rome"}') == "sun"
    assert e.result("get_weather", "not json") == "sun"
    assert e.result("search", "{}").startswith("error: there is no tool named search")
    assert e.choice(1) == "required" and e.choice(2) == "auto" and e.choice(9) == "auto"
    named = episode(tools=[WEATHER], tool_results={"get_weather": "x"}, tool_choice="get_weather")
    assert named.choice(3) == {"type": "function", "function": {"name": "get_weather"}}
    assert episode().choice(1) is None
    assert e.fingerprint != episode().fingerprint and e.fingerprint == parse_episode(
        {**e.to_json(), "id": "other"}, path="x", line=9, default_id="y").fingerprint


def test_keys_go_out_in_the_file_order_and_the_fingerprint_ignores_the_order():
    """What is sent keeps the file's key order (a chat template renders keys in the order it gets them);
    the fingerprint and the matching of a call's arguments to a case do not depend on it."""
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": {
        "type": "object", "required": ["zone", "city"], "properties": {"zone": {"type": "string"},
                                                                       "city": {"type": "string"}}}}}
    results = {"get_weather": {"cases": [{"arguments": {"zone": "A", "city": "Oslo"}, "result": "rain"}]}}
    e = episode(tools=[tool], tool_results=results)
    assert json.dumps(e.tool_schemas()) == json.dumps([tool])  # order-sensitive: byte for byte
    assert e.result("get_weather", '{"city": "Oslo", "zone": "A"}') == "rain"

    def reordered(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {k: reordered(obj[k]) for k in reversed(list(obj))}
        return [reordered(v) for v in obj] if isinstance(obj, list) else obj
    other = episode(tools=reordered([tool]), tool_results=reordered(results))
    assert json.dumps(other.tool_schemas()) != json.dumps(e.tool_schemas())
    assert other.fingerprint == e.fingerprint
    assert other.result("get_weather", '{"zone": "A", "city": "Oslo"}') == "rain"


def test_a_number_beyond_a_float_is_refused_with_its_field(tmp_path):
    """1e400 would be sent as Infinity, which is not JSON: refused before any request."""
    path = tmp_path / "mine.jsonl"
    path.write_text('{"id": "e", "messages": [{"role": "user", "content": "Hi."}], "tools": [{"type": '
                    '"function", "function": {"name": "f", "parameters": {"type": "object", '
                    '"maximum": 1e400}}}], '
                    '"tool_results": {"f": "x"}}\n')
    with pytest.raises(ProbeFileError) as err:
        load_episodes([str(path)])
    assert str(err.value) == (f"{path}:1: field 'tools[0].function.parameters.maximum': the number "
                              f"\"1e400\" is not allowed here")


def test_builtin_set():
    episodes = builtin_episodes()
    assert len(episodes) == 20 and len({e.id for e in episodes}) == 20
    plain = [e for e in episodes if not e.tools]
    tools = [e for e in episodes if e.tools]
    assert len(plain) == 10 and len(tools) == 10
    assert all(4 <= 1 + len(e.user_turns) <= 6 for e in plain)
    names = {n for e in tools for n in e.tool_names}
    assert {"get_weather", "calculate", "list_events", "add_event", "list_files", "read_file"} <= names
    assert all(e.choice(1) != "auto" for e in tools)  # every tool episode asks for a call first


# -- the measurement ---------------------------------------------------------------------------------------
def test_same_trajectory_and_the_cache_fields_of_each_step():
    server = SlotServer()
    record = measure_episode(runner(server), episode())
    assert record.outcome == Outcome.SAME, record.reason
    cache_1 = record.path("cache-1")
    assert cache_1 is not None and len(cache_1.steps) == 3 and cache_1.ended == "user turns ran out"
    fields = [c["cache"] for c in server.calls]
    assert fields[:3] == [{"cache_prompt": False}, {"cache_prompt": True}, {"cache_prompt": True}]  # cache 1
    assert fields[3:6] == [{"cache_prompt": False}] * 3  # recompute 1: every step from scratch
    assert len(server.calls) == 12 and not any(c["logprobs"] for c in server.calls)
    for prev, cur in zip(cache_1.steps, cache_1.steps[1:]):  # each hit reaches the previous answer exactly
        assert cur.cached_tokens == prev.prompt_tokens + prev.completion_tokens - 1
    # each path feeds its own answers forward: step 2's history carries step 1's answer, then the next turn
    second = server.calls[1]["messages"]
    assert second[-2] == {"role": "assistant", "content": cache_1.steps[0].content}
    assert second[-1] == {"role": "user", "content": "And tomorrow?"}


def test_changed_trajectory_names_the_step_and_asks_logprobs_there_only():
    server = SlotServer(diverge=lambda step, cached: step == 2 and cached > 0)
    record = measure_episode(runner(server), episode())
    assert record.outcome == Outcome.DIFFERENT, record.reason
    assert record.parting is not None and record.parting.step == 2 and record.parting.what == "text"
    d = record.parting.divergence
    assert d is not None and d.token is not None and d.cache_margin == 0.05 and d.kind == "near-tie"
    asked = [(i, c["cache"]) for i, c in enumerate(server.calls) if c["logprobs"]]
    assert [i for i, _ in asked] == [7, 10]  # step 2 of cache 2 and of recompute 2
    assert "parted at step 2 (text)" in record.reason and "near-tie" in record.reason
    # the record survives its JSON form
    assert EpisodeRecord.from_json(json.loads(json.dumps(record.to_json()))).to_json() == record.to_json()


def test_tool_calls_get_scripted_results_with_their_ids():
    e = episode(tools=[WEATHER], tool_choice=["required", "auto"],
                tool_results={"get_weather": {"cases": [], "default": "sunny, 20 C"}})
    server = SlotServer()
    record = measure_episode(runner(server), e)
    assert record.outcome == Outcome.SAME, record.reason
    first, second = server.calls[0], server.calls[1]
    assert first["tool_choice"] == "required" and second["tool_choice"] == "auto"
    call = second["messages"][-2]
    assert call["role"] == "assistant" and call["content"] is None
    assert call["tool_calls"][0]["id"] == "call_1_0" and call["tool_calls"][0]["function"]["name"] == "get_weather"
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_1_0", "content": "sunny, 20 C"}
    steps = record.path("cache-1").steps  # type: ignore[union-attr]
    assert steps[0].tool_calls[0].name == "get_weather" and not steps[1].tool_calls
    assert len(steps) == 4  # the call, its answer, then the two user turns


def test_a_call_s_arguments_go_forward_as_the_server_gave_them():
    """Not re-serialized: spacing, key order and escapes as the server wrote them."""
    given = '{ "zone":"A",  "city" : "%s\\u00e9" }'
    e = episode(tools=[WEATHER], tool_choice=["required", "auto"], tool_results={"get_weather": "sunny"})
    server = SlotServer(arguments=lambda word: given % word)
    record = measure_episode(runner(server), e)
    assert record.outcome == Outcome.SAME, record.reason
    sent = server.calls[1]["messages"][-2]["tool_calls"][0]["function"]["arguments"]
    assert sent == record.path("cache-1").steps[0].tool_calls[0].arguments  # type: ignore[union-attr]
    assert sent.startswith('{ "zone":"A",  "city" : "') and sent.endswith('\\u00e9" }')


@pytest.mark.parametrize("server, settings, cause", [
    (dict(rerender_calls=False), {},
     "; the chat template re-renders step 1's tool call as other text than the model generated: "
     'generated <call:get_weather>{"city": >>>  "*"}, '
     'rendered <call:get_weather>{"city": >>> "*"}<end><tool>sunny<end>*'),
    (dict(retokenize_calls=True), {},
     "; the chat template renders step 1's tool call as the text the model generated, but that text "
     "tokenizes into other tokens than the model's"),
    (dict(rerender_calls=False), dict(logprobs=False),
     "; the hit stopped inside step 1's tool call: the chat template re-renders the call as other text than "
     "the model generated, or the same text tokenizes into other tokens (not told apart: that needs the "
     "answer's tokens and the server's prompt text)"),
], ids=["other-text", "other-tokens", "not-told-apart"])
def test_a_hit_stopping_inside_a_tool_call_is_inconclusive_and_names_the_cause(server, settings, cause):
    """The cause comes from the call's tokens (logprobs asked at that step of cache 2) against the prompts
    the template renders before and after it; without logprobs both causes are named."""
    e = episode(tools=[WEATHER], tool_choice=["required", "auto"], tool_results={"get_weather": "sunny"})
    slot = SlotServer(**server)
    record = measure_episode(runner(slot, hit_tolerance=0, **settings), e)
    assert record.outcome == Outcome.INCONCLUSIVE
    problems = record.reason.split("; cache-2 step 2: ")
    assert len(problems) == 2 and problems[1].endswith("(after a tool call)")  # the cause is said once
    assert problems[0].startswith("inconclusive: cache-1 step 2: cache hit was 7 tokens, expected at least 8")
    assert fnmatch.fnmatchcase(problems[0].split(" (after a tool call)", 1)[1], cause), problems[0]
    asked = [i for i, c in enumerate(slot.calls) if c["logprobs"]]
    assert asked == ([] if settings else [8])  # cache 2's step 1 only (cache 1: 4 steps, recompute 1: 4)


def test_a_hit_after_an_empty_answer_is_inconclusive_and_says_why():
    """An empty answer (only the end of turn) leaves no answer token for the next step's hit to reach."""
    record = measure_episode(runner(SlotServer(empty_at=1), hit_tolerance=0), episode())
    assert record.outcome == Outcome.INCONCLUSIVE
    assert "cache-1 step 2: cache hit was" in record.reason and "not past step 1's prompt" in record.reason
    assert "step 1's answer was empty, so no answer token could be reused" in record.reason
    ok = measure_episode(runner(SlotServer(empty_at=0), hit_tolerance=0), episode())
    assert ok.outcome == Outcome.SAME and "empty" not in ok.reason


def test_a_server_that_ignores_tools_makes_a_tool_episode_inconclusive():
    """llama-server without --jinja answers a request with tools and tool_choice "required" with plain words:
    the episode is then not the one the file describes, and must not count as a same trajectory."""
    e = episode(tools=[WEATHER], tool_choice=["required", "auto"], tool_results={"get_weather": "sunny"})

    class Deaf(SlotServer):
        def chat(self, *a: Any, **k: Any) -> Reply:
            return super().chat(*a, **{**k, "tools": None})

    record = measure_episode(runner(Deaf()), e)
    assert record.outcome == Outcome.INCONCLUSIVE
    assert "answered without one, so the server ignores the tools" in record.reason
    assert "cache-1 step 1 (tool_choice 'required')" in record.reason
    assert measure_episode(runner(SlotServer()), e).outcome == Outcome.SAME  # the same episode, heard


def test_recompute_reuse_and_errors():
    record = measure_episode(runner(SlotServer(recompute_reuses=True)), episode())
    assert record.outcome == Outcome.INCONCLUSIVE and "recompute-1 step 2 reused" in record.reason

    class Failing(SlotServer):
        def chat(self, *a: Any, **k: Any) -> Reply:
            if len(self.calls) == 4:
                from pytest_cachecheck.errors import RequestError
                raise RequestError("POST /v1/chat/completions: HTTP 503: busy", status=503)
            return super().chat(*a, **k)

    record = measure_episode(runner(Failing()), episode())
    assert record.outcome == Outcome.ERROR and "HTTP 503" in record.reason
    assert [len(p.steps) for p in record.paths] == [3, 1]  # what was measured before the failure is kept


# -- through pytest, against the emulation (its model calls a tool when a call is required) ------------------
def test_builtin_episodes_run_as_items_with_real_tool_calls(pytester, emulator):
    emu = emulator(block_size=1)  # hits to the token, so the exact rule below can be checked
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", "--cachecheck-episodes=builtin",
                                           "--cachecheck-n=1", "--cachecheck-report=r.json", "-p", "no:cacheprovider",
                                           "--cachecheck-hit-tolerance=0")
    result.assert_outcomes(passed=22)  # 20 episodes, a probe, the gate
    assert result.ret == 0
    data = json.loads((pytester.path / "r.json").read_text())
    assert data["episode_set"]["count"] == 20 and len(data["episodes"]) == 20
    summary = data["targets"][0]["episode_summary"]
    assert summary["valid"] == 20 and summary["changed"] == 0
    calls = [c for e in data["episodes"] for p in e["paths"] for s in p["steps"] for c in s["tool_calls"]]
    assert len(calls) >= 40  # every tool episode calls at least once on each of its four paths
    weather = next(e for e in data["episodes"] if e["id"] == "weather-walk")
    assert [len(p["steps"]) for p in weather["paths"]] == [5] * 4  # the call, its answer, three user turns
    first = weather["paths"][0]["steps"]
    assert first[0]["tool_calls"][0]["name"] == "get_weather" and first[0]["content"] == ""
    for prev, cur in zip(first, first[1:]):  # each hit reaches the previous answer: the call re-renders exactly
        assert cur["cached_tokens"] == prev["prompt_tokens"] + prev["completion_tokens"] - 1
    result.stdout.fnmatch_lines(["episodes: 20 | valid: 20 (same 20, changed 0) | inconclusive: 0 | errors: 0",
                                 "0 of 20 valid episodes took a different trajectory on the cache path."])


def test_a_changed_trajectory_fails_and_a_baseline_gates_it(pytester, emulator):
    clean, flips = emulator(), emulator(diverge_on_hit={"balcony"})  # garden-plan's opening
    common = ["--cachecheck-episodes=builtin", "-k", "episode and (garden or bread)", "-p", "no:cacheprovider"]
    first = pytester.runpytest_subprocess(f"--cachecheck-url={clean.url}", *common, "--cachecheck-report=before.json")
    first.assert_outcomes(passed=3)
    after = pytester.runpytest_subprocess(f"--cachecheck-url={flips.url}", *common, "--cachecheck-report=after.json",
                                          "--cachecheck-baseline=before.json", "--junitxml=j.xml")
    after.assert_outcomes(passed=1, failed=2)  # garden-plan and the gate
    assert after.ret == 1
    after.stdout.fnmatch_lines(["*episode[[]garden-plan[]]*", "*parted at step 2 (text)*",
                                "1 of 2 valid episodes took a different trajectory on the cache path.",
                                "first parting step: step 2: 1",
                                "*baseline comparison of the episodes*", "*garden-plan*newly diverged*",
                                "*FAIL (gate-failed): 1 episode newly changed trajectory against the baseline*"])
    data = json.loads((pytester.path / "after.json").read_text())
    garden = next(e for e in data["episodes"] if e["id"] == "garden-plan")
    assert garden["outcome"] == "different" and garden["parting"]["step"] == 2
    assert garden["parting"]["divergence"]["cache_margin"] is not None  # logprobs at the parting step
    target = data["targets"][0]
    assert target["episode_summary"]["parting_steps"] == {"2": 1}
    assert target["episode_baseline"]["newly_diverged"] == ["garden-plan"]
    # same episode set, server and settings: nothing to warn of (the probe set's fingerprint is not the
    # episode set's)
    assert target["episode_baseline"]["env_warnings"] == []
    # JUnit carries each episode's record as JSON, as it does a probe's (not a Python repr)
    cases = {c.get("name"): c for c in ET.parse(pytester.path / "j.xml").getroot().iter("testcase")}
    props = {p.get("name"): p.get("value") for p in cases["episode[garden-plan]"].iter("property")}
    assert json.loads(props["cachecheck_episode"])["outcome"] == "different"


def test_episodes_under_xdist_stay_with_their_server(pytester, emulator):
    emu = emulator()
    pytester.makepyfile(**{f"test_user{i}": "def test_a(): pass\n" for i in range(3)})
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", "--cachecheck-episodes=builtin",
                                           "--cachecheck-n=2", "-k", "not episode or calendar or garden", "-n", "2",
                                           "-v", "--cachecheck-report=r.json", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=9)
    data = json.loads((pytester.path / "r.json").read_text())
    workers = {r["worker"] for r in data["probes"] + data["episodes"]}
    assert len(workers) == 1 and emu.max_in_flight == 1
    assert data["targets"][0]["episode_summary"]["not_run"] == []


def test_cachecheck_episode_fixture_and_bad_files(pytester, emulator):
    emu = emulator()
    pytester.makepyfile(test_own="""
        def test_walk(cachecheck):
            record = cachecheck.episode([{"role": "user", "content": "Plan a walk by the sea."}],
                                        ["Shorter, please.", "Thanks."])
            assert record.valid and record.same, record.reason
            assert len(record.path("cache-1").steps) == 3
    """)
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", "-k", "test_walk",
                                           "--cachecheck-report=r.json", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    checks = json.loads((pytester.path / "r.json").read_text())["episode_checks"]
    assert [c["test"] for c in checks] == ["test_own.py::test_walk"] and checks[0]["outcome"] == "same"
    bad = pytester.path / "mine.jsonl"
    bad.write_text('{"id": "x", "messages": [{"role": "user", "content": "Hi."}], "max_steps": 99}\n')
    before = len(emu.requests_log)
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", f"--cachecheck-episodes={bad}",
                                           "-p", "no:cacheprovider")
    assert result.ret == 4
    result.stderr.fnmatch_lines([f"*--cachecheck-episodes: bad episode file: {bad}:1: field 'max_steps'*"])
    assert len(emu.requests_log) == before


def test_builtin_tools_each_once_in_order_of_first_use() -> None:
    tools = builtin_tools()
    assert [t["function"]["name"] for t in tools] == ["get_weather", "calculate", "list_events", "add_event",
                                                      "list_files", "read_file"]
    by_name = {s["function"]["name"]: s for e in builtin_episodes() for s in e.tool_schemas() or []}
    assert all(t == by_name[t["function"]["name"]] for t in tools)


ORDERED_EPISODE = (
    '{"id": "ordered", "messages": [{"role": "user", "content": "Where?"}], "tools": [{"type": "function", '
    '"function": {"name": "lookup", "description": "Find a place, \u00e9t\u00e9 2.50", "parameters": {'
    '"type": "object", "required": ["zone", "area"], "properties": {"zone": {"type": "string", '
    '"maxLength": 40}, "area": {"type": "number", "minimum": 2.50}}}}}], "tool_results": {"lookup": {'
    '"cases": [{"arguments": {"zone": "x"}, "result": "here"}], "default": "there"}}, '
    '"tool_choice": ["required", "auto"], "user_turns": ["Thanks."], "max_steps": 4}')


def run_ordered(pytester: Any, url: str) -> Any:
    """A real plugin run of ORDERED_EPISODE alone (and the gate) against ``url``, reported to r.json."""
    (pytester.path / "mine.jsonl").write_text(ORDERED_EPISODE + "\n", encoding="utf-8")
    return pytester.runpytest_subprocess(f"--cachecheck-url={url}", "--cachecheck-episodes=mine.jsonl", "-k",
                                         "episode", "--cachecheck-report=r.json", "-p", "no:cacheprovider")


def test_the_request_carries_the_tools_as_the_file_wrote_them(pytester, emulator):
    """Through a real run: the tools array of every request is the file's, keys in the file's order (the
    emulated model's call names the first property, so the order reaches the answer too), and a call's
    arguments go forward as the server gave them."""
    emu = emulator(block_size=1)
    result = run_ordered(pytester, emu.url)
    result.assert_outcomes(passed=2)  # the episode and the gate
    expected = json.dumps(json.loads(ORDERED_EPISODE)["tools"], ensure_ascii=False)
    sent = [r for r in emu.requests_log if "tools" in r]
    assert len(sent) == 4 * 3  # four paths of three steps: the call, its answer, the user turn
    assert all(json.dumps(r["tools"], ensure_ascii=False) == expected for r in sent)  # order-sensitive
    data = json.loads((pytester.path / "r.json").read_text())
    first = data["episodes"][0]["paths"][0]["steps"][0]["tool_calls"][0]
    assert first["name"] == "lookup" and list(json.loads(first["arguments"])) == ["zone"]
    assert sent[1]["messages"][1]["tool_calls"][0]["function"]["arguments"] == first["arguments"]


def test_tool_call_arguments_nested_too_deep_error_the_episode_and_keep_its_record(pytester, emulator):
    """A hostile server's call with arguments nested 5000 deep (request 3: the setup check, then the
    episode's first path, step 2) is an error of that episode with the cause, not a crash."""
    emu = emulator(fault={3: "nested-arguments"})
    result = run_ordered(pytester, emu.url)
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.assert_outcomes(errors=1, failed=1)  # the episode, and the gate that counts its error
    reason = (f"POST /v1/chat/completions to {emu.url}: the server's tool-call arguments are nested more "
              f"than 64 levels deep")
    result.stdout.fnmatch_lines([f"*{reason}*"])
    (record,) = json.loads((pytester.path / "r.json").read_text())["episodes"]
    assert record["id"] == "ordered" and record["outcome"] == "error" and reason in record["reason"]
    assert [len(p["steps"]) for p in record["paths"]] == [1]  # step 1, measured before the fault, is kept
