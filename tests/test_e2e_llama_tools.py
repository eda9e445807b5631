"""End to end: the built-in tool episodes on a real llama-server, with tool calls that really happened.

The model is ``serve.tools_model`` (``tinymodel.tool_model_config(builtin_tools())``: random weights
shaped so that every answer to a request with tools opens a ``<tool_call>`` and llama-server's grammar
completes it), served with ``--jinja --chat-template-file`` Qwen2.5's template from the llama.cpp sdist.
Each plugin run is a real ``pytest`` subprocess (``--cachecheck-episodes builtin -k <tool episodes>``);
everything is asserted from its JSON report. Whether the cache changes a trajectory is recorded and
printed (``MEASURED``), never assumed (tests/support/TOOLCALL_FINDINGS.md). At most one llama-server runs
at a time (the control's two), each stopped when its test ends. By default four tool episodes run (one
per tool family, to keep the file near 3 minutes on 2 cores); ``CACHECHECK_E2E_TOOL_EPISODES=all`` runs
all ten. With ``CI`` set, failing to obtain llama-server fails these tests instead of skipping them.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, Dict, Iterator, List, Sequence

import pytest

from tests.support.plugin_runs import Run, run_plugin
from tests.support.venv_server import log_stderr

pytest.importorskip("gguf")

from pytest_cachecheck.episodes import builtin_episodes  # noqa: E402
from pytest_cachecheck.llama_server import LlamaServer  # noqa: E402
from pytest_cachecheck.serve import ensure_template, tools_model  # noqa: E402

pytestmark = pytest.mark.e2e

TOOL_EPISODES = {e.id: set(e.tool_names) for e in builtin_episodes() if e.tools}
DEFAULT_EPISODES = ("weather-two-cities", "shopping-total", "calendar-week", "files-find-notes")


def selected() -> List[str]:
    return sorted(TOOL_EPISODES) if os.environ.get("CACHECHECK_E2E_TOOL_EPISODES") == "all" \
        else list(DEFAULT_EPISODES)


@contextlib.contextmanager
def serving(binary: str, ftype: str, *args: str, copies: int = 1) -> Iterator[List[LlamaServer]]:
    """``copies`` llama-servers on the tools model with Qwen2.5's template, stopped on exit."""
    flags = ("--jinja", "--chat-template-file", str(ensure_template(log_stderr))) + args
    servers = [LlamaServer(binary, tools_model(log_stderr, ftype), extra_args=flags) for _ in range(copies)]
    try:
        for srv in servers:
            try:
                srv.start(timeout=180)
            except Exception:
                log_stderr(srv.log_tail(80))
                raise
        yield servers
    finally:
        for srv in servers:
            srv.stop()


def tool_run(folder: Path, url: str, episodes: Sequence[str], *args: str) -> Run:
    return run_plugin(folder, f"--cachecheck-url={url}", "--cachecheck-episodes=builtin",
                      "-k", " or ".join(episodes), *args)


def tool_steps(episode: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [st for p in episode["paths"] for st in p["steps"] if st["tool_calls"]]


@pytest.mark.parametrize("ftype", ["f32", "q4_0"])
def test_builtin_tool_episodes(llama_binary: str, tmp_path: Path, ftype: str) -> None:
    episodes = selected()
    with serving(llama_binary, ftype) as (srv,):
        run = tool_run(tmp_path, srv.url, episodes)
    assert sorted(e["id"] for e in run.episodes) == sorted(episodes), run.out[-3000:]
    assert run.data["probes"] == [] and run.data["mode"] == "llama.cpp"
    outcomes = run.outcomes()
    assert outcomes["error"] == 0, run.out[-4000:]
    calls: Counter = Counter()
    for e in run.episodes:
        assert e["outcome"] in ("same", "different", "inconclusive"), e
        if e["outcome"] != "same":
            assert e["reason"], e["id"]                      # a changed or inconclusive episode says why
        assert [p["path"] for p in e["paths"]] == ["cache-1", "recompute-1", "cache-2", "recompute-2"]
        for p in e["paths"]:
            # step 1 is tool_choice "required" in every built-in tool episode: the server returned tool_calls
            first = p["steps"][0]
            assert first["tool_calls"] and first["finish_reason"] == "tool_calls", (e["id"], p["path"], first)
        for st in tool_steps(e):
            assert st["finish_reason"] == "tool_calls" and not st["content"], (e["id"], st)
            for c in st["tool_calls"]:
                assert c["name"] in TOOL_EPISODES[e["id"]], (e["id"], c)
                assert isinstance(json.loads(c["arguments"]), dict), (e["id"], c)
                calls[c["name"]] += 1
        if e["outcome"] in ("same", "different"):
            # the hit after a call reaches through the previous step's answer: the template re-rendered the
            # call as (nearly) the tokens the model generated; count the exact ones
            for p in e["paths"][::2]:
                for prev, cur in zip(p["steps"], p["steps"][1:]):
                    assert cur["cached_tokens"] > prev["prompt_tokens"], (e["id"], p["path"], cur["step"])
    exact = sum(cur["cached_tokens"] == prev["prompt_tokens"] + prev["completion_tokens"] - 1
                for e in run.episodes for p in e["paths"][::2] for prev, cur in zip(p["steps"], p["steps"][1:])
                if prev["tool_calls"])
    after_call = sum(1 for e in run.episodes for p in e["paths"][::2] for prev in p["steps"][:-1] if prev["tool_calls"])
    assert sum(calls.values()) >= 4 * len(episodes)
    valid = outcomes["same"] + outcomes["different"]
    s = run.data["episode_summary"]
    assert (s["valid"], s["changed"], s["inconclusive"], s["errors"]) == \
        (valid, outcomes["different"], outcomes["inconclusive"], 0)
    assert run.ret == (1 if outcomes["different"] or outcomes["inconclusive"] else 0), run.out[-3000:]
    reasons = Counter(e["reason"].split(";")[0][:90] for e in run.episodes if e["outcome"] == "inconclusive")
    changed = [e["id"] for e in run.episodes if e["outcome"] == "different"]
    print(f"\nMEASURED tool episodes, tiny {ftype}: changed {outcomes['different']} of {valid} valid {changed}; "
          f"inconclusive {outcomes['inconclusive']} {dict(reasons)}; {sum(calls.values())} tool calls "
          f"{dict(calls)}; cache hits after a call: {exact} of {after_call} exactly prompt + answer - 1")


def test_both_caches_off_control(llama_binary: str, tmp_path: Path) -> None:
    """Two servers with the prompt cache off: the 'cache' and 'recompute' paths both compute from scratch,
    so no trajectory may change."""
    episodes = selected()[:2]
    with serving(llama_binary, "f32", "--no-cache-prompt", copies=2) as (first, second):
        run = tool_run(tmp_path, first.url, episodes, f"--cachecheck-nocache-url={second.url}",
                         "--cachecheck-skip-hit-check")
    print(f"\nMEASURED both caches off (control), tool episodes, tiny f32: "
          f"changed {run.outcomes()['different']} of {len(run.episodes)} {dict(run.outcomes())}")
    assert run.outcomes() == {"same": len(episodes)}, run.out[-4000:]
    for e in run.episodes:
        assert tool_steps(e)
        assert all(st["cached_tokens"] == 0 for p in e["paths"] for st in p["steps"])  # no cache anywhere
    assert run.ret == 0


def test_serve_demo_with_builtin_episodes_makes_tool_calls(llama_binary: str, tmp_path: Path) -> None:
    """``--cachecheck-serve demo`` with the built-in episodes serves the tool-call model with its template
    (the user's --cachecheck-server-args combine with the plugin's flags): the tool episodes are measured on
    real tool calls, not made inconclusive for the lack of them."""
    episodes = selected()
    run = run_plugin(tmp_path, "--cachecheck-serve=demo", "--cachecheck-episodes=builtin",
                     "--cachecheck-server-args=-c 8192", "-k", " or ".join(episodes))
    served = run.data["served"]
    assert (served["model"], served["demo"], served["tools"], served["args"]) == \
        ("tools-f32-v4.gguf", True, True, ["-c", "8192"]), served
    command = served["command"]
    assert command.count("--jinja") == 1 and command.count("--chat-template-file") == 1, command
    assert command[command.index("--chat-template-file") + 1].endswith("Qwen-Qwen2.5-7B-Instruct.jinja")
    assert command[-2:] == ["-c", "8192"], command
    assert "cachecheck: serving the tool-call demo model (tools-f32-v4.gguf, with Qwen2.5's chat" in run.out
    assert sorted(e["id"] for e in run.episodes) == sorted(episodes), run.out[-3000:]
    outcomes = run.outcomes()
    assert outcomes["same"] + outcomes["different"] == len(episodes), (dict(outcomes), run.out[-4000:])
    calls = 0
    for e in run.episodes:
        for p in e["paths"]:
            first = p["steps"][0]  # tool_choice "required": the server returned tool_calls
            assert first["tool_calls"] and first["finish_reason"] == "tool_calls", (e["id"], p["path"], first)
        for st in tool_steps(e):
            assert {c["name"] for c in st["tool_calls"]} <= TOOL_EPISODES[e["id"]], (e["id"], st)
            calls += len(st["tool_calls"])
    s = run.data["episode_summary"]
    assert (s["valid"], s["inconclusive"], s["errors"]) == (len(episodes), 0, 0)
    assert run.ret == (1 if outcomes["different"] else 0), run.out[-3000:]
    print(f"\nMEASURED --cachecheck-serve demo, tool episodes: changed {outcomes['different']} of "
          f"{s['valid']} valid; {calls} tool calls in {run.seconds:.0f} s")
