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
    assert run.data["probes"] == [] and run.target["mode"] == "llama.cpp"
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
    s = run.target["episode_summary"]
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


# -- outcome checks: the task sets on the tools model, flips counted again here from the raw answers --------
def _first_number(text: str) -> Any:
    import re

    found = re.search(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?", text)
    return float(found.group()) if found else None


def _passes(spec: Any, text: str, calls: List[Any]) -> bool:
    """The meaning of the task sets' checks, written out again from the README (not the plugin's code)."""
    import re

    def one(kind: str, arg: Any) -> bool:
        if kind == "contains":
            return arg in text
        if kind == "not_contains":
            return arg not in text
        if kind == "regex":
            return re.search(arg, text) is not None
        if kind == "equals":
            return text.split() == arg.split()
        if kind == "number":
            n = _first_number(text)
            return n is not None and abs(n - arg["value"]) <= arg.get("tolerance", 0)
        if kind == "one_of":
            return text.strip() in arg
        if kind == "json":
            body = text.strip()
            if body.startswith("```") and body.endswith("```") and "\n" in body:
                body = body[body.index("\n") + 1:-3].strip()
            try:
                value = json.loads(body)
            except ValueError:
                return False
            return arg is True or (isinstance(value, dict) and all(k in value for k in arg["required_keys"]))
        assert kind == "tool_called", kind
        for step, name, args in calls:
            if name != arg["name"] or arg.get("step", step) != step:
                continue
            try:
                given = json.loads(args)
            except ValueError:
                continue
            if isinstance(given, dict) and all(given.get(k, object()) == v for k, v in arg.get("arguments", {}).items()):
                return True
        return False

    return all(one(k, v) for group in (spec if isinstance(spec, list) else [spec]) for k, v in group.items())


def _recount(records: List[Dict[str, Any]], specs: Dict[str, Any], answer: Any) -> Dict[str, Any]:
    n = {"items": 0, "cache_passed": 0, "recompute_passed": 0, "cache_fails": 0, "cache_passes": 0, "flipped": []}
    for r in records:
        if r["outcome"] not in ("same", "different"):
            continue
        cache, recompute = (_passes(specs[r["id"]], *answer(r, path)) for path in ("cache", "recompute"))
        n["items"] += 1
        n["cache_passed"] += cache
        n["recompute_passed"] += recompute
        n["cache_fails"] += recompute and not cache
        n["cache_passes"] += cache and not recompute
        if cache != recompute:
            n["flipped"].append(r["id"])
    return n


def _probe_answer(r: Dict[str, Any], path: str) -> Any:
    return r["answers"][path][0], []


def _episode_answer(r: Dict[str, Any], path: str) -> Any:
    steps = next(p for p in r["paths"] if p["path"] == f"{path}-1")["steps"]
    return (steps[-1]["content"] if steps else "",
            [(s["step"], c["name"], c["arguments"]) for s in steps for c in s["tool_calls"]])


def test_task_sets_flips_counted_again(llama_binary: str, tmp_path: Path) -> None:
    """``--cachecheck-probes tasks --cachecheck-episodes tasks`` on the tools model at Q4_0 (the first four task
    probes, which the tools model answers in text no check passes, and the first two task episodes): the report's accuracies and flips (probes and episodes) equal a count made here from
    the raw per-path answers, every flipped item diverged and failed with the flip first, and the exact McNemar
    p is the one of its flips."""
    from pytest_cachecheck.stats import mcnemar_exact

    data = Path(__file__).resolve().parents[1] / "pytest_cachecheck" / "data"
    specs = {}
    for name in ("tasks_probes.jsonl", "tasks_episodes.jsonl"):
        for line in (data / name).read_text().splitlines():
            record = json.loads(line)
            specs[record["id"]] = record["expect"]
    # two of the six task episodes, for CI time (all six took most of 13 minutes here)
    episodes = tmp_path / "task_episodes.jsonl"
    episodes.write_text("\n".join((data / "tasks_episodes.jsonl").read_text().splitlines()[:2]) + "\n")
    with serving(llama_binary, "q4_0") as (srv,):
        run = run_plugin(tmp_path, f"--cachecheck-url={srv.url}", "--cachecheck-probes=tasks",
                         "--cachecheck-n=4", f"--cachecheck-episodes={episodes}", "--cachecheck-max-tokens=48")
    d = run.data
    assert d["probe_set"]["name"] == "tasks" and len(d["probes"]) == 4 and len(d["episodes"]) == 2, run.out[-3000:]
    assert not [r for r in d["probes"] + d["episodes"] if r["outcome"] == "error"], run.out[-3000:]
    for key, records, answer in (("check_summary", d["probes"], _probe_answer),
                                 ("episode_check_summary", d["episodes"], _episode_answer)):
        mine = _recount(records, specs, answer)
        theirs = run.target[key]
        assert {k: theirs[k] for k in mine} == mine, (key, theirs, mine)
        assert theirs["mcnemar_p"] == mcnemar_exact(mine["cache_fails"], mine["cache_passes"])
        assert all(r["outcome"] == "different" for r in records if r["id"] in mine["flipped"])  # a flip diverged
        for r in records:
            if r["id"] in mine["flipped"]:
                assert "outcome flipped: the " in run.out and r["check_results"]["flip"], r["id"]
        print(f"\nMEASURED {key} tasks, tools model q4_0: {mine['items']} valid with checks; accuracy cache "
              f"{mine['cache_passed']}/{mine['items']}, recompute {mine['recompute_passed']}/{mine['items']}; flips "
              f"{mine['cache_fails']} cache fails, {mine['cache_passes']} cache passes {mine['flipped']}; "
              f"divergent {sum(r['outcome'] == 'different' for r in records)}; inconclusive "
              f"{sum(r['outcome'] == 'inconclusive' for r in records)}; {run.seconds:.0f} s")
    episode_calls = sum(len(s["tool_calls"]) for e in d["episodes"] for p in e["paths"] for s in p["steps"])
    assert episode_calls >= 4 * len(d["episodes"])  # real tool calls, which the tool_called checks read


def test_serve_demo_with_builtin_episodes_makes_tool_calls(llama_binary: str, tmp_path: Path) -> None:
    """``--cachecheck-serve demo`` with the built-in episodes serves the tool-call model with its template
    (the user's --cachecheck-server-args combine with the plugin's flags): the tool episodes are measured on
    real tool calls, not made inconclusive for the lack of them."""
    episodes = selected()
    run = run_plugin(tmp_path, "--cachecheck-serve=demo", "--cachecheck-episodes=builtin",
                     "--cachecheck-server-args=-c 8192", "-k", " or ".join(episodes))
    served = run.target["served"]
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
    s = run.target["episode_summary"]
    assert (s["valid"], s["inconclusive"], s["errors"]) == (len(episodes), 0, 0)
    assert run.ret == (1 if outcomes["different"] else 0), run.out[-3000:]
    print(f"\nMEASURED --cachecheck-serve demo, tool episodes: changed {outcomes['different']} of "
          f"{s['valid']} valid; {calls} tool calls in {run.seconds:.0f} s")
