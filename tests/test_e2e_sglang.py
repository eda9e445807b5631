"""End to end against the real SGLang 0.5.23 on the CPU (tests/support/sglang_server.py), no emulation.

SGLang is installed once into the cache (with ``CI`` set, failing to obtain it fails these tests instead of
skipping them); each server configuration starts once per session (``sglang_servers`` in tests/conftest.py).
The model is the tiny random-weight Qwen2 of tests/support/tiny_hf_model.py. Each plugin run is a real
``pytest`` subprocess in an empty folder, made once per set of arguments and shared by the tests that read it.
What the server does (same or different) is recorded, never assumed.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Tuple

import pytest


from tests.support.plugin_runs import (
    PLAIN_EPISODES,
    Run,
    batch_figures,
    check_batch_run,
    check_deployed_run,
    check_episode_run,
    check_no_early_stop,
    deployed_args,
    deployed_figures,
    episode_args,
    order_restored,
)
from tests.support.sglang_server import STARTED

pytestmark = pytest.mark.e2e

# SGLang decodes the tiny model at about 10-30 tokens/s on 2 cores (its scheduler's per-step overhead), and
# the tiny model's answers run 135-183 tokens: a run keeps CI time small by cutting answers at 32 tokens (a
# cut turn-1 answer still re-tokenizes as it was generated, so the turn-2 hit covers it) and by running 10
# of the 20 built-in probes (tests/support/SGLANG_FINDINGS.md has the figures of all 20)
MAX_TOKENS = "--cachecheck-max-tokens=32"
ONE_SERVER_ARGS: Tuple[str, ...] = (MAX_TOKENS, "--cachecheck-n=10")


@pytest.fixture(scope="module", autouse=True)
def _stop_servers_after_this_module(sglang_servers) -> Iterator[None]:
    yield
    sglang_servers.pool.stop_all()  # ~7 GB back for the tests that follow (they start again if asked for)


def check_requests(probe: Dict[str, Any]) -> None:
    """Page size 1: a valid probe's turn-2 hit is turn-1 prompt + answer - 1, or one more when the answer
    ended with EOS (SGLang's overlap scheduler had already computed its KV); turn 1 and the recompute path
    reuse 0."""
    for hit in probe["checks"]["cache_hits"]:
        assert hit["full_reuse"] <= hit["cached_tokens"] <= hit["full_reuse"] + 1, (probe["id"], hit)
        assert hit["cached_tokens"] > hit["turn1_prompt_tokens"], probe["id"]
    for req in probe["requests"]:
        if req["step"].startswith("recompute") or req["step"].endswith("turn-1"):
            assert req["cached_tokens"] == 0, (probe["id"], req)


def test_without_cache_report_probes_error_naming_the_flag(plugin_run, sglang_servers):
    run = plugin_run(f"--cachecheck-url={sglang_servers.url('noreport')}", "--cachecheck-n=2")
    assert run.counts() == {"error": 2}, run.out[-4000:]
    assert run.ret == 1
    assert "enable_cache_report false" in run.out and "--enable-cache-report" in run.out
    for probe in run.data["probes"]:
        assert probe["requests"] == []  # refused before any probe request


def test_one_server_mode_builtin_probes(plugin_run, sglang_servers):
    run = plugin_run(f"--cachecheck-url={sglang_servers.url('default')}", *ONE_SERVER_ARGS)
    run.figures("one-server mode, real SGLang 0.5.23, tiny Qwen2 bf16, 32 tokens")
    counts = run.counts()
    assert counts.get("error", 0) == 0 and counts.get("inconclusive", 0) == 0, run.out[-4000:]
    assert len(run.data["probes"]) == 10
    different = counts.get("different", 0)
    assert run.ret == (1 if different else 0)
    assert f"{different} of 10 valid probes gave a different turn-2 answer on the cache path." in run.out
    assert run.target["mode"] == "one-server"
    assert run.target["server"]["kind"] == "sglang" and run.target["server"]["build"] == "0.5.23"
    assert run.target["server"]["details"]["page_size"] == 1
    for probe in run.data["probes"]:
        check_requests(probe)
        assert len(probe["requests"]) == 6
        if probe["outcome"] == "different":
            d = probe["divergence"]
            assert d["cache_token"] != d["recompute_token"] and d["kind"] in ("near-tie", "large-gap")


def test_generating_health_is_warned_about(plugin_run, sglang_servers):
    run = plugin_run(f"--cachecheck-url={sglang_servers.url('default')}", *ONE_SERVER_ARGS)  # the run above
    assert "cachecheck: warning: SGLang's /health at" in run.out
    assert "runs a generation (it answered in" in run.out
    assert "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false" in run.out
    assert any("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION" in w for w in run.target["setup_warnings"])


def test_two_servers_mode(plugin_run, sglang_servers):
    cache, nocache = sglang_servers("default", "noradix")
    run = plugin_run(f"--cachecheck-url={cache.url}", f"--cachecheck-nocache-url={nocache.url}",
                     MAX_TOKENS, "--cachecheck-n=4")
    run.figures("two-servers mode, real SGLang 0.5.23 (recompute on --disable-radix-cache), 32 tokens")
    counts = run.counts()
    assert counts.get("error", 0) == 0 and counts.get("inconclusive", 0) == 0, run.out[-4000:]
    assert run.target["mode"] == "two-servers" and run.target["nocache_server"]["kind"] == "sglang"
    assert run.target["nocache_server"]["details"]["disable_radix_cache"] is True
    for probe in run.data["probes"]:
        check_requests(probe)
        assert [r["server"] for r in probe["requests"]] == ["cache", "cache", "nocache"] * 2  # cache-1, recompute-1, cache-2, recompute-2


#: the ten plain built-in episodes on real SGLang, 32 tokens a step (about a minute)
EPISODES = PLAIN_EPISODES


def test_plain_episodes_on_real_sglang(plugin_run, sglang_servers):
    """Episodes on real SGLang, one-server mode (one ``cache_salt`` for each cache-path walk, a new one for
    every recompute request). Page size 1: every cache-path step after the first reuses the previous prompt
    + answer - 1, or one more where that answer ended with EOS (the overlap scheduler); nothing else is
    reused; whether a trajectory changes is recorded, never assumed."""
    run = plugin_run(f"--cachecheck-url={sglang_servers.url('default')}", *episode_args(EPISODES, 32))
    run.episode_figures("real SGLang 0.5.23, bf16, plain episodes, 32 tokens a step")
    check_episode_run(run, EPISODES, over=1)
    assert run.target["mode"] == "one-server"


def test_plain_episodes_two_servers_mode_agrees(plugin_run, sglang_servers):
    """The same episodes with the recompute path on a ``--disable-radix-cache`` server instead of a new salt:
    the same trajectories change, at the same steps, so a salted recompute is a recompute from scratch and
    what changes the trajectories is the cache hit."""
    one = plugin_run(f"--cachecheck-url={sglang_servers.url('default')}", *episode_args(EPISODES, 32))
    cache, nocache = sglang_servers("default", "noradix")
    two = plugin_run(f"--cachecheck-url={cache.url}", f"--cachecheck-nocache-url={nocache.url}",
                     *episode_args(EPISODES, 32))
    two.episode_figures("real SGLang 0.5.23, two-servers mode (recompute on --disable-radix-cache)")
    check_episode_run(two, EPISODES, over=1)
    assert two.target["mode"] == "two-servers"

    def parted(run: Run) -> Dict[str, Any]:
        return {e["id"]: e["parting"] and e["parting"]["step"] for e in run.episodes}
    assert parted(two) == parted(one)


def test_setup_checks_refuse_swapped_servers(plugin_run, sglang_servers):
    """The /server_info checks: radix cache off on the server under test, on on the "nocache" one."""
    cache, nocache = sglang_servers("default", "noradix")
    run = plugin_run(f"--cachecheck-url={nocache.url}", f"--cachecheck-nocache-url={cache.url}",
                     "--cachecheck-n=2")
    assert run.counts() == {"error": 2}, run.out[-4000:]
    assert "the nocache server (sglang) reports prefix caching on" in run.out
    assert "--disable-radix-cache (SGLang)" in run.out
    for probe in run.data["probes"]:
        assert probe["requests"] == []
    alone = plugin_run(f"--cachecheck-url={nocache.url}", "--cachecheck-n=2")
    assert alone.counts() == {"error": 2}, alone.out[-4000:]
    assert "prefix caching is off on the sglang server under test" in alone.out


#: the background requests' length on SGLang: the tiny model ends its answer to them at 95 tokens; 3 of them
#: take 10-20 s on 2 cores, longer than a measured answer of 64 tokens (64 ended about when it came)
BATCH_TOKENS = 128


def test_batch_cache_under_load_and_order_from_pytest(plugin_run, sglang_servers):
    """The batch kind (--cachecheck-batch), the cache under load (--cachecheck-load-cache) and order and state
    (--cachecheck-order) on real SGLang, in one run (SGLang on 2 cores is the slowest server), 2 probes.
    The batch: every batch record valid (a fresh ``cache_salt`` on every request kept the radix cache out:
    nothing reused; the background in flight when each measured request was sent, and still running when some
    measured answer came: batched), and the background requests' ``ignore_eos`` honoured (they answer their
    whole ``max_tokens``, past the end token). The cache under load: every loaded record valid or inconclusive for
    the probe rules' reasons, each turn 2 sent amid the background, the recompute path reusing nothing, the
    hits covering turn 1, ``load_alone`` the batch record's outcome; every order record valid with each
    request's cached tokens; the summaries and the exit status a recount. With no cache field the server's
    shared prefix cache is on, so pass B's turn 1 (pass A's prompt again) reuses more than pass A's did.
    Whether an answer changes is recorded, never assumed."""
    url = sglang_servers.url("default")
    run = plugin_run(f"--cachecheck-url={url}", *deployed_args(BATCH_TOKENS))
    tallies = check_deployed_run(run, BATCH_TOKENS)
    tally = check_batch_run(run, BATCH_TOKENS, alone=False)
    assert run.target["server"]["build"] == "0.5.23"
    batch_figures(run, f"SGLang 0.5.23 (tiny Qwen2 bf16, page size 1; 3 background requests of 60 words, up "
                       f"to {BATCH_TOKENS} tokens; answers up to 64)", tally)
    print(f"MEASURED SGLang 0.5.23 background request: {check_no_early_stop(url, 60, BATCH_TOKENS)}")
    deployed_figures(run, f"SGLang 0.5.23 (tiny Qwen2 bf16, page size 1; 3 background requests of 60 words, "
                          f"up to {BATCH_TOKENS} tokens; answers up to 64)", tallies)
    assert order_restored(run), run.data["orders"]


def test_no_cuda_kernel_was_called():
    """Every server ran with the stand-in sgl_kernel, and SGLang never called one of its functions."""
    assert STARTED, "no SGLang server was started in this session"
    for server in STARTED:
        events = server.standin_events()
        assert ("import", "sgl_kernel") in events, (server, events[:5])  # the stand-in, not a real kernel
        assert server.standin_calls() == [], server
