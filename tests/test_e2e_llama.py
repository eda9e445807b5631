"""End to end against real llama-servers with tiny generated models (no mocks, no emulation).

The llama-server binary is found or built once (cached under ~/.cache/pytest-cachecheck); with ``CI`` set,
failing to obtain it fails these tests instead of skipping them. What the server does (same or
different) is recorded and reported, never assumed. Each plugin run is a real ``pytest`` subprocess,
made once per session and shared by the tests that read it.
"""

from __future__ import annotations

import fnmatch
import time
from typing import Any, Callable, Dict, Iterator, Tuple

import pytest
import requests

from tests.support.plugin_runs import PLAIN_EPISODES, Run, check_episode_run, episode_args
from tests.support.venv_server import log_stderr

from pytest_cachecheck.llama_server import LlamaServer, llama_release
from pytest_cachecheck.serve import demo_model

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")
def llama_servers(llama_binary: str) -> Iterator[Callable[..., LlamaServer]]:
    """Start (once per session and configuration) a llama-server on a tiny model."""
    started: Dict[Tuple[str, Tuple[str, ...], int], LlamaServer] = {}

    def get(ftype: str = "f32", *args: str, copy: int = 0) -> LlamaServer:
        key = (ftype, args, copy)
        if key not in started:
            model = demo_model(log_stderr, ftype)
            server = LlamaServer(llama_binary, model, extra_args=args)
            try:
                server.start(timeout=180)
            except Exception:
                log_stderr(server.log_tail(80))
                server.stop()
                raise
            started[key] = server
        assert started[key].is_alive(), started[key].log_tail(80)
        return started[key]

    yield get
    for server in started.values():
        server.stop()


def assert_hits_cover_turn1(probe: Dict[str, Any]) -> None:
    for hit in probe["checks"]["cache_hits"]:
        assert hit["cached_tokens"] > hit["turn1_prompt_tokens"], probe["id"]
        # llama-server reuses token by token: exactly turn-1 prompt + answer - 1
        assert hit["cached_tokens"] == hit["full_reuse"], (probe["id"], hit)
    for req in probe["requests"]:
        if req["step"].startswith("recompute") or req["step"].endswith("turn-1"):
            assert req["cached_tokens"] == 0, (probe["id"], req)


def check_llama_cpp_run(run: Run) -> None:
    counts = run.counts()
    assert counts.get("error", 0) == 0 and counts.get("inconclusive", 0) == 0, run.out[-4000:]
    assert len(run.data["probes"]) == 20
    different = counts.get("different", 0)
    assert f"{counts.get('same', 0) + (not different)} passed" in run.out  # and the gate, if no divergence
    if different:
        assert f"{different + 1} failed" in run.out  # and the gate, with the verdict
    assert run.ret == (1 if different else 0)
    assert f"{different} of 20 valid probes gave a different turn-2 answer on the cache path." in run.out
    assert run.target["mode"] == "llama.cpp" and run.target["server"]["kind"] == "llama.cpp"
    assert run.target["server"]["build"] and run.target["server"]["details"]["total_slots"] == 1
    for probe in run.data["probes"]:
        assert_hits_cover_turn1(probe)
        assert len(probe["requests"]) == 6
        if probe["outcome"] == "different":
            d = probe["divergence"]
            # llama-server names the token and both paths' top-2 margins
            assert d["token"] is not None and d["cache_token"] != d["recompute_token"]
            assert d["cache_margin"] is not None and d["recompute_margin"] is not None
            assert d["kind"] in ("near-tie", "large-gap")


@pytest.mark.parametrize("ftype", ["f32", "q4_0"])
def test_llama_cpp_mode_builtin_probes(plugin_run, llama_servers, ftype):
    run = plugin_run(f"--cachecheck-url={llama_servers(ftype).url}")
    run.figures(f"llama.cpp mode, tiny {ftype}")
    check_llama_cpp_run(run)


@pytest.mark.parametrize("ftype", ["f32", "q4_0"])
def test_logprobs_change_neither_answers_nor_cache_use(plugin_run, llama_servers, ftype):
    """Logprobs are asked for only on run 2's turn-2 requests of a probe whose run-1 paths parted; those
    answers and cached-token counts equal run 1's (asked for none) on every such probe, and a run that asks
    for none at all gives the same answers, counts and outcomes."""
    url = llama_servers(ftype).url
    with_lp = plugin_run(f"--cachecheck-url={url}", "--cachecheck-n=8")  # f32: houseplant-watering parts
    without = plugin_run(f"--cachecheck-url={url}", "--cachecheck-no-logprobs", "--cachecheck-n=8")
    parted = 0
    for probe in with_lp.data["probes"]:
        steps = {r["step"]: r for r in probe["requests"]}
        if steps["cache-1/turn-2"]["content"] == steps["recompute-1/turn-2"]["content"]:
            continue
        parted += 1  # run 2 asked for logprobs here
        for path in ("cache", "recompute"):
            one, two = steps[f"{path}-1/turn-2"], steps[f"{path}-2/turn-2"]
            assert (two["content"], two["cached_tokens"]) == (one["content"], one["cached_tokens"]), \
                (probe["id"], path)
        assert probe["outcome"] == "different", probe["id"]
        assert probe["divergence"]["cache_margin"] is not None, probe["id"]
    assert parted == with_lp.data["summary"]["different"] > 0  # the claim above was put to the test
    assert len(with_lp.data["probes"]) == len(without.data["probes"]) == 8
    for a, b in zip(with_lp.data["probes"], without.data["probes"]):
        assert a["id"] == b["id"]
        assert a["answers"] == b["answers"], a["id"]
        assert [r["cached_tokens"] for r in a["requests"]] == [r["cached_tokens"] for r in b["requests"]]
        assert a["outcome"] == b["outcome"]


def test_two_servers_mode(plugin_run, llama_servers):
    cache = llama_servers("f32")
    nocache = llama_servers("f32", "--no-cache-prompt")
    run = plugin_run(f"--cachecheck-url={cache.url}", f"--cachecheck-nocache-url={nocache.url}", "--cachecheck-n=8")
    run.figures("two-servers mode, tiny f32")
    counts = run.counts()
    assert counts.get("error", 0) == 0 and counts.get("inconclusive", 0) == 0, run.out[-4000:]
    assert run.target["mode"] == "two-servers" and run.target["nocache_server"]["kind"] == "llama.cpp"
    for probe in run.data["probes"]:
        assert_hits_cover_turn1(probe)
        assert [r["server"] for r in probe["requests"]] == ["cache", "cache", "nocache"] * 2


def test_both_caches_off_control(plugin_run, llama_servers):
    first = llama_servers("f32", "--no-cache-prompt")
    second = llama_servers("f32", "--no-cache-prompt", copy=1)
    run = plugin_run(f"--cachecheck-url={first.url}", f"--cachecheck-nocache-url={second.url}",
                     "--cachecheck-skip-hit-check")
    run.figures("both caches off (control), tiny f32")
    assert run.counts() == {"same": 20}, run.out[-4000:]
    for probe in run.data["probes"]:
        assert all(r["cached_tokens"] == 0 for r in probe["requests"])  # really no cache anywhere
    assert run.ret == 0 and "21 passed" in run.out  # and the gate


def test_two_urls_reaching_one_server(plugin_run, llama_servers):
    server = llama_servers("f32")
    run = plugin_run(f"--cachecheck-url={server.url}",
                     f"--cachecheck-nocache-url={server.url.replace('127.0.0.1', 'localhost')}", "--cachecheck-n=3")
    assert run.counts() == {"inconclusive": 3}
    assert "both URLs reach the same server" in run.data["summary"]["recompute_reuse_cause"]
    assert "cause: the recompute path reused cached tokens on every probe: likely both URLs" in run.out
    assert run.ret != 0


def test_baseline_on_real_runs(plugin_run, llama_servers):
    """Against its own report a run is unchanged and passes; against a run where every probe was the same
    (the both-caches-off control), the probes that differ now are named as newly diverged and fail it."""
    url = llama_servers("f32").url
    first = plugin_run(f"--cachecheck-url={url}")
    again = plugin_run(f"--cachecheck-url={url}", f"--cachecheck-baseline={first.report}", "--cachecheck-n=8")
    cmp = again.target["baseline"]
    assert cmp["verdict"] == "unchanged", again.out[-3000:]
    assert again.ret == 0
    control = llama_servers("f32", "--no-cache-prompt")
    control_run = plugin_run(f"--cachecheck-url={control.url}",
                             f"--cachecheck-nocache-url={llama_servers('f32', '--no-cache-prompt', copy=1).url}",
                             "--cachecheck-skip-hit-check")
    against_control = plugin_run(f"--cachecheck-url={url}", f"--cachecheck-baseline={control_run.report}",
                                 "--cachecheck-n=8")
    differing = sorted(p["id"] for p in against_control.data["probes"] if p["outcome"] == "different")
    newly = sorted(r["id"] for r in against_control.target["baseline"]["rows"] if r["status"] == "newly diverged")
    print(f"\nMEASURED baseline (control -> llama.cpp mode, tiny f32): newly diverged {newly}")
    assert newly == differing
    if not differing:
        pytest.skip("no probe diverged on this build, so nothing could be newly diverged")
    assert against_control.ret == 1
    for pid in differing:
        assert pid in against_control.out
    assert against_control.target["baseline"]["verdict"] == "regressed"


def test_serve_demo(plugin_run, llama_binary):
    """Under pytest-xdist (the demo without it runs in the release check): the controller starts the server and
    hands its URL to the workers, which measure on it."""
    run = plugin_run("--cachecheck-serve=demo", "--cachecheck-n=2", "-n", "2")
    assert "cachecheck: serving the demo model (demo-f32-v1.gguf): tiny, RANDOM weights" in run.out
    assert "cachecheck: mode llama.cpp (auto-detected)" in run.out
    # the plugin's own build reports the llama.cpp release it was built from (not b0-unknown)
    release = llama_release()
    assert release is not None and f"| server llama.cpp b{release}-unknown |" in run.out, run.out[:2000]
    assert run.target["server"]["build"] == f"b{release}-unknown", run.target["server"]
    assert run.target["served"]["demo"] is True and run.target["served"]["log_tail"]
    assert run.target["served"]["tools"] is False and "--jinja" not in run.target["served"]["command"]
    assert sum(run.counts().get(k, 0) for k in ("same", "different")) == 2
    port = run.target["served"]["command"][run.target["served"]["command"].index("--port") + 1]
    assert {(p["server_url"], p["worker"]) for p in run.data["probes"]} in \
        ({(f"http://127.0.0.1:{port}", w)} for w in ("gw0", "gw1")), run.data["probes"]
    assert run.ret in (0, 1)


def test_two_replicas_under_xdist_match_one_server(plugin_run, llama_servers):
    one = llama_servers("f32")
    other = llama_servers("f32", copy=2)
    single = plugin_run(f"--cachecheck-url={one.url}", "--cachecheck-n=8")
    pair = plugin_run(f"--cachecheck-url={one.url}", f"--cachecheck-url={other.url}", "--cachecheck-n=8",
                      "-n", "2")
    outcomes = {p["id"]: p["outcome"] for p in pair.data["probes"]}
    assert outcomes == {p["id"]: p["outcome"] for p in single.data["probes"]}
    for a, b in zip(sorted(pair.data["probes"], key=lambda p: p["id"]),
                    sorted(single.data["probes"], key=lambda p: p["id"])):
        assert a["answers"] == b["answers"], a["id"]  # the same answers, whichever replica served them
    owner: Dict[str, str] = {}
    for p in pair.data["probes"]:
        assert owner.setdefault(p["worker"], p["server_url"]) == p["server_url"]
    assert sorted(owner.values()) == sorted([one.url, other.url])
    print(f"\nMEASURED replicas: one server {sum(p['duration_s'] for p in single.data['probes']):.1f} s of "
          f"probe time; two servers under -n 2, per worker "
          f"{ {w: round(sum(p['duration_s'] for p in pair.data['probes'] if p['worker'] == w), 1) for w in owner} }")


@pytest.mark.parametrize("flags, words", [
    (("-np", "2"), "llama-server runs 2 slots that share one cache*start it with -np 1 --cache-ram 0"),
    (("--cache-ram", "64"), "llama-server restores prompts from its host-memory prompt cache*reused * of its * "
                            "tokens, though the slot then held only the * they share*start it with --cache-ram 0"),
])
def test_misconfigured_llama_server_is_caught(plugin_run, llama_servers, flags, words):
    """The setup checks against a real llama-server: more than one slot (read from /props), and the
    host-memory prompt cache (which /props does not report: found by what the server reuses)."""
    server = llama_servers("f32", *flags)
    run = plugin_run(f"--cachecheck-url={server.url}", "--cachecheck-n=2")
    assert run.counts() == {"error": 2}, run.out[-3000:]
    assert run.ret == 1
    assert any(fnmatch.fnmatch(line, f"*server not usable: the server setup would spoil the measurement: *{words}*")
               for line in run.out.splitlines()), run.out[-3000:]
    for probe in run.data["probes"]:  # caught before the first probe: no probe request was sent
        assert probe["requests"] == [] and "--" in probe["reason"]


def test_model_given_is_checked_against_what_llama_server_serves(pytester, plugin_run, llama_servers):
    """--cachecheck-model on a real llama-server (Q4_0 under two aliases): a made-up name, and the F32 file
    of the same model (a gate run pointed at the wrong server), are usage errors before any probe request,
    naming what the server serves; an alias, the file name and its stem pass setup and are what the run
    reports; without the option the run reports the server's file name. The server answers under its first
    alias whatever was asked, which is its model's name: no probe is inconclusive for it."""
    server = llama_servers("q4_0", "--alias", "tiny-prod,a-second")
    url = server.url

    def slot() -> Dict[str, Any]:
        return requests.get(f"{url}/slots", timeout=30).json()[0]

    assert "id_task" not in slot()  # no task yet on this server
    for wrong in ("made-up-model", "demo-f32-v1.gguf"):
        result = pytester.runpytest_subprocess(f"--cachecheck-url={url}", f"--cachecheck-model={wrong}",
                                               "--cachecheck-n=2", "-p", "no:cacheprovider")
        assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:]
        result.stderr.fnmatch_lines([
            f"*cachecheck: --cachecheck-model '{wrong}' is not served by {url}: llama-server serves one model, "
            f"named demo-q4_0-v1.gguf, a-second, tiny-prod, demo-q4_0-v1 (its file name with or without .gguf, "
            f"and any --alias); give one of those, or leave --cachecheck-model out"])
    assert "id_task" not in slot()  # the server was asked what it is, and nothing more
    for given, reported in ((None, "demo-q4_0-v1.gguf"), ("tiny-prod", "tiny-prod"),
                            ("demo-q4_0-v1", "demo-q4_0-v1")):
        run = plugin_run(f"--cachecheck-url={url}", "--cachecheck-n=2",
                         *([f"--cachecheck-model={given}"] if given else []))
        assert sum(run.counts().get(k, 0) for k in ("same", "different")) == 2, run.out[-3000:]
        assert run.target["server"]["model"] == reported
        assert f"| model {reported}" in run.out  # the header and the result block
    answered = requests.post(f"{url}/v1/chat/completions", json={"model": "made-up-model", "max_tokens": 1,
                             "messages": [{"role": "user", "content": "hi"}]}, timeout=60).json()
    assert answered["model"] == "a-second"  # what the rule reads: its own name, not the name asked for


def test_host_cache_check_passes_with_cache_ram_0(llama_servers):
    """The control for the host-memory cache check: with --cache-ram 0 (the plugin's own start flags) the
    same three requests find no restored prompt, and the check says what it measured."""
    from pytest_cachecheck.clients import Findings, LlamaCppClient, detect_server
    from pytest_cachecheck.clients.http import Http

    http = Http(llama_servers("f32").url, timeout=120)
    client = detect_server(http, None)
    assert isinstance(client, LlamaCppClient)
    found = Findings()
    client.check_host_cache(found)
    assert found.problems == [] and len(found.notes) == 1, found
    print(f"\nMEASURED host-memory cache check, --cache-ram 0: {found.notes[0]}")


def test_target_matrix_f32_and_q4_0(plugin_run, llama_servers):
    """Two builds of one model as a target matrix: each target's outcomes are those of its own run."""
    f32, q4 = llama_servers("f32"), llama_servers("q4_0")
    matrix = plugin_run(f"--cachecheck-target=f32={f32.url}", f"--cachecheck-target=q4_0={q4.url}")
    assert [t["name"] for t in matrix.data["targets"]] == ["f32", "q4_0"]
    for name, server in (("f32", f32), ("q4_0", q4)):
        alone = plugin_run(f"--cachecheck-url={server.url}")
        mine = {p["id"]: p["outcome"] for p in matrix.data["probes"] if p["target"] == name}
        assert mine == {p["id"]: p["outcome"] for p in alone.data["probes"]}, name
        for probe in (p for p in matrix.data["probes"] if p["target"] == name):
            assert_hits_cover_turn1(probe)
            assert probe["server_url"] == server.url
        s = next(t for t in matrix.data["targets"] if t["name"] == name)["summary"]
        assert s["valid"] == 20 and s["rate_ci95"] is not None
        print(f"\nMEASURED target matrix, {name}: {s['different']} of {s['valid']} valid probes differed "
              f"(rate {s['rate']:.1%}, 95% interval {s['rate_ci95'][0]:.1%} to {s['rate_ci95'][1]:.1%})")
    lines = [line for line in matrix.out.splitlines() if line.startswith(("target ", "f32 ", "q4_0 "))]
    assert len(lines) == 3 and "vs f32" in lines[0] and "(reference)" in lines[1], matrix.out[-3000:]
    assert "McNemar p =" in lines[2]
    different = sum(t["summary"]["different"] for t in matrix.data["targets"])
    assert matrix.ret == (1 if different else 0)


# -- episodes: whole trajectories on real llama-servers ---------------------------------------------------------
#: the plain built-in episodes (multi-turn chats) run on the demo model; a tool episode rides along on the
#: F32 run, where the demo server (no --jinja) ignores tools: it must come out inconclusive, naming why
TOOL_EPISODES = ("weather-walk",)


@pytest.mark.parametrize("ftype", ["f32", "q4_0"])
def test_builtin_episodes_on_llama_server(plugin_run, llama_servers, ftype):
    """The built-in plain episodes, each path feeding its own answers forward through 4-6 user turns: one
    item per episode with a real outcome, the parting step of every changed trajectory, the rate."""
    ids = PLAIN_EPISODES + (TOOL_EPISODES if ftype == "f32" else ())
    run = plugin_run(f"--cachecheck-url={llama_servers(ftype).url}", *episode_args(ids))
    run.episode_figures(f"tiny {ftype}, plain episodes, 64 tokens a step")
    for eid in TOOL_EPISODES if ftype == "f32" else ():
        e = next(e for e in run.episodes if e["id"] == eid)
        assert e["outcome"] == "inconclusive" and "the server ignores the tools" in e["reason"], e["reason"]
    check_episode_run(run, PLAIN_EPISODES, besides=TOOL_EPISODES if ftype == "f32" else ())
    assert "trajectory change rate" in run.out and "95% Wilson interval" in run.out


def test_episodes_both_caches_off_control(plugin_run, llama_servers):
    """With the cache off on both servers, no trajectory may change: the control for the episode rate."""
    first = llama_servers("f32", "--no-cache-prompt")
    second = llama_servers("f32", "--no-cache-prompt", copy=1)
    run = plugin_run(f"--cachecheck-url={first.url}", f"--cachecheck-nocache-url={second.url}",
                     "--cachecheck-skip-hit-check", *episode_args(PLAIN_EPISODES[:6]))
    run.episode_figures("both caches off (control), tiny f32")
    assert [e["outcome"] for e in run.data["episodes"]] == ["same"] * 6, run.out[-3000:]
    for e in run.data["episodes"]:
        assert all(s["cached_tokens"] == 0 for p in e["paths"] for s in p["steps"])  # really no cache
    assert run.ret == 0


def test_batch_measurement_four_slots_and_the_one_slot_control(llama_servers):
    """The batch measurement (pytest_cachecheck/batch.py) on a real llama-server, tiny F16 model: 6 built-in
    probes' turn 2 (12 took 5-7 minutes per server on a loaded machine; cut for CI time), cache off, alone and amid 3 background requests, on 4 slots (what the server does is
    recorded, not assumed) and on 1 slot, the negative control: the measured request queues behind the
    background and computes alone, so it is valid (sent while they were in flight) and never differs."""
    from pytest_cachecheck.batch import BatchRunner, BatchShape, summary_line
    from pytest_cachecheck.clients import detect_server
    from pytest_cachecheck.clients.http import Http
    from pytest_cachecheck.model import Tally
    from pytest_cachecheck.probes import builtin_probes

    shape = BatchShape(concurrent=3, prompt_words=60, max_tokens=64)
    tallies = {}
    for slots in (4, 1):
        server = llama_servers("f16", "-np", str(slots))
        client = detect_server(Http(server.url, timeout=300), None)
        assert client.info.details["total_slots"] == slots
        runner = BatchRunner(client, shape, max_tokens=128)
        start = time.monotonic()
        records = [runner.run(p) for p in builtin_probes()[:6]]
        seconds = time.monotonic() - start
        tallies[slots] = t = Tally.of(records)  # type: ignore[arg-type]
        alone = sum(s for r in records for s in r.alone_s) / max(1, 2 * len(records))
        loaded = sum(x.measured_s for r in records for x in r.loads) / max(1, 2 * len(records))
        print(f"\nMEASURED batch, {slots} slot(s): {summary_line(records, shape)}; {seconds:.1f} s; measured "
              f"request {alone:.2f} s alone, {loaded:.2f} s under load (mean)")
        for r in records:
            if not r.same:
                print(f"MEASURED   {r.line()}: {r.reason}")
        assert t.errors == 0 and t.inconclusive == 0, [r.reason for r in records if not r.valid]
        for r in records:
            assert all(q.cached_tokens == 0 for q in r.requests), r.id
            assert all(x.in_flight_at_send >= 1 for x in r.loads), r.id
        if slots == 1:  # queued: answered after every background request had ended
            assert all(x.in_flight_at_answer == 0 for r in records for x in r.loads)
        else:  # batched: some background was still running when the measured answer came
            assert any(x.in_flight_at_answer > 0 for r in records for x in r.loads)
    assert tallies[1].different == 0  # the negative control


def test_batch_kind_from_pytest_on_four_slots(plugin_run, llama_servers):
    """The batch kind as users run it (--cachecheck-batch) on a real llama-server with 4 slots, tiny F16
    model, 4 built-in probes: the slot problem is a setup warning (not an error) under --cachecheck-batch,
    each probe has a valid batch record (cache off, background in flight when sent), and the batch summary's
    counts are a recount of the records. What the server does (same or different) is recorded, not assumed."""
    server = llama_servers("f16", "-np", "4")
    run = plugin_run(f"--cachecheck-url={server.url}", "--cachecheck-n=4", "--cachecheck-batch=3",
                     "--cachecheck-batch-prompt-words=60", "--cachecheck-batch-max-tokens=64",
                     "--cachecheck-max-tokens=128", "-p", "no:randomly")
    from pytest_cachecheck.model import BatchRecord, Tally

    batches = run.data["batches"]
    s = run.target["batch_summary"]
    print(f"\nMEASURED batch kind, 4 slots: {s['different']} of {s['valid']} valid batch probes answered "
          f"differently amid other requests ({s['inconclusive']} inconclusive, {s['errors']} errors) in "
          f"{run.seconds:.0f} s; cache probes {run.counts()}")
    assert [b["id"] for b in batches] == [p["id"] for p in run.data["probes"]] and len(batches) == 4
    warning = next(w for w in run.target["setup_warnings"] if w.startswith("llama-server runs 4 slots"))
    assert "kept as a warning because --cachecheck-batch" in warning
    assert f"setup warning: {warning}" in run.out
    records = [BatchRecord.from_json(b) for b in batches]
    assert all(r.valid for r in records), [r.reason for r in records if not r.valid]
    for r in records:
        assert all(q.cached_tokens == 0 for q in r.requests), r.id
        assert [(x.background, x.in_flight_at_send >= 1) for x in r.loads] == [(3, True), (3, True)], r.id
        assert r.shape.concurrent == 3 and r.shape.prompt_words == 60 and r.shape.max_tokens == 64
    t = Tally.of(records)  # type: ignore[arg-type]
    assert (s["probes"], s["valid"], s["same"], s["different"], s["inconclusive"], s["errors"]) == (
        t.probes, t.valid, t.same, t.different, t.inconclusive, t.errors)
    label = "batch: 3 background requests of 60 words, up to 64 tokens, seed 0; cache off"
    said = f"{label}: {t.different} of {t.valid} valid batch probes answered differently amid other requests."
    assert said in run.out
    different = t.different + run.counts().get("different", 0)
    assert run.ret == (1 if different else 0), run.out[-4000:]


def test_order_measurement_both_caches_off_and_the_host_cache_on(llama_servers):
    """The order measurement (pytest_cachecheck/order.py) on a real llama-server, 1 slot, tiny F16 model, 3
    built-in probes (answers up to 48 tokens, for time) sent as an application would (no cache field: the
    server's defaults), in file order, then reversed with 1 other conversation before each. The negative control, both caches off (--no-cache-prompt
    --cache-ram 0): nothing reused, every probe valid and the same. Then the host-memory cache on (--cache-ram
    8192): what the server does to the answers is recorded, not assumed; the state evidence (each request's
    cached tokens) must be there, and some pass B turn 1, whose slot state the other conversation replaced,
    reuses more than pass A's did (restored from the host cache: without it only the template's opening is
    shared)."""
    from pytest_cachecheck.clients import detect_server
    from pytest_cachecheck.clients.http import Http
    from pytest_cachecheck.model import OrderConditions, Tally
    from pytest_cachecheck.order import OrderRunner
    from pytest_cachecheck.probes import builtin_probes

    def cached(record: Any, step: str) -> Any:
        return next(q.cached_tokens for q in record.requests if q.step == step)

    for name, args in (("both caches off", ("--no-cache-prompt", "--cache-ram", "0")),
                       ("host cache on", ("--cache-ram", "8192"))):
        server = llama_servers("f16", *args)
        client = detect_server(Http(server.url, timeout=300), None)
        assert client.info.details["total_slots"] == 1
        start = time.monotonic()
        records = OrderRunner(client, OrderConditions(between=1), max_tokens=48).run(builtin_probes()[:3])
        seconds = time.monotonic() - start
        t = Tally.of(records)  # type: ignore[arg-type]
        reuse = "; ".join(f"{r.id} " + ", ".join(f"{q.step} {q.cached_tokens}/{q.prompt_tokens}"
                                                 for q in r.requests) for r in records)
        print(f"\nMEASURED order, {name} ({' '.join(args)}): {t.different} of {t.valid} valid order probes "
              f"answered differently ({t.inconclusive} inconclusive, {t.errors} errors) in {seconds:.1f} s; "
              f"cached tokens: {reuse}")
        for r in records:
            if not r.same:
                print(f"MEASURED   {r.line()}: {r.reason}")
        assert t.errors == 0 and t.inconclusive == 0, [r.reason for r in records if not r.valid]
        assert all(q.cached_tokens is not None for r in records for q in r.requests)  # the state evidence
        assert [r.positions for r in records] == [[1, 3], [2, 2], [3, 1]]
        if name == "both caches off":  # the negative control
            assert all(q.cached_tokens == 0 for r in records for q in r.requests)
            assert t.different == 0
        else:
            assert any(cached(r, "B/turn-1") > cached(r, "A/turn-1") for r in records), reuse


def test_loaded_kind_from_pytest_on_four_slots_and_a_stolen_slot(plugin_run, llama_servers):
    """The cache under load (--cachecheck-load-cache) on a real llama-server with 4 slots, tiny F16 model, 2
    built-in probes, 3 background requests: each loaded probe is the probe protocol with every turn 2 amid the
    background (the cache path pinned to slot 0, the background on slots 1 to 3). Asserted only what must
    hold: every measured request under load was sent with the background in flight, and each loaded probe is
    valid (the hit covered turn 1, the recompute path reused nothing) or inconclusive for those rules' reasons;
    its load_alone is the batch record's outcome. Then the stolen slot: as many unpinned background requests
    (as the batch kind sends them) as the server has slots, so one of them runs on slot 0, and the probe's own
    hit rule must make the probe inconclusive, never a divergence."""
    server = llama_servers("f16", "-np", "4")
    run = plugin_run(f"--cachecheck-url={server.url}", "--cachecheck-n=2", "--cachecheck-batch=3",
                     "--cachecheck-batch-prompt-words=30", "--cachecheck-batch-max-tokens=32",
                     "--cachecheck-max-tokens=32", "--cachecheck-load-cache", "-p", "no:randomly")
    from pytest_cachecheck.model import LOADED_STEPS, BatchShape, LoadedRecord, Outcome, Tally
    from pytest_cachecheck.probes import builtin_probes
    from pytest_cachecheck.protocol import Runner
    from pytest_cachecheck.settings import Settings

    s = run.target["loaded_summary"]
    records = [LoadedRecord.from_json(x) for x in run.data["loaded"]]
    print(f"\nMEASURED cache under load, 4 slots, 3 background requests: {s['different']} of {s['valid']} valid "
          f"loaded probes diverged under load ({s['inconclusive']} inconclusive, {s['errors']} errors; the load "
          f"alone changed {s['load_alone_different']} of those); loads in flight at send "
          f"{[[x.in_flight_at_send for x in r.loads] for r in records]}, at answer "
          f"{[[x.in_flight_at_answer for x in r.loads] for r in records]}; batch "
          f"{[b['outcome'] for b in run.data['batches']]}; quiet probes {run.counts()}; {run.seconds:.0f} s")
    assert [r.id for r in records] == [p["id"] for p in run.data["probes"]] and len(records) == 2
    batch = {b["id"]: b["outcome"] for b in run.data["batches"]}
    for r in records:
        assert r.outcome != Outcome.ERROR, r.reason
        assert len(r.loads) == 4 and all(x.background == 3 and x.in_flight_at_send >= 1 for x in r.loads), r.id
        if r.outcome == Outcome.INCONCLUSIVE:
            assert "cache hit was" in r.reason or "reused" in r.reason, r.reason
        else:
            assert r.checks is not None and all(h.cached_tokens == h.full_reuse for h in r.checks.cache_hits)
        assert r.load_alone == (batch[r.id] if batch[r.id] in ("same", "different") else "not measured")
        assert [q.step for q in r.requests if q.step in LOADED_STEPS] == list(LOADED_STEPS)
    t = Tally.of(records)  # type: ignore[arg-type]
    assert (s["probes"], s["valid"], s["different"]) == (t.probes, t.valid, t.different)
    label = "cache under load: 3 background requests of 30 words, up to 32 tokens, seed 0"
    assert f"{label}: loaded probes 2 | valid {t.valid}" in run.out
    # the stolen slot: 4 background requests unpinned (id_slot -1) on 4 slots, so one of them runs on slot 0
    runner = Runner(Settings(url=server.url, max_tokens=32, batch=4))
    client = runner.prepare().cache
    client.beside_cache = lambda i: client.unpinned()  # type: ignore[method-assign]
    stolen = runner.run(builtin_probes()[0], load=BatchShape(concurrent=4, prompt_words=30, max_tokens=32))
    print(f"MEASURED stolen slot (4 unpinned background requests on 4 slots): {stolen.outcome.value}: "
          f"{stolen.reason[:300]}")
    assert stolen.outcome == Outcome.INCONCLUSIVE, stolen.reason
    assert "turn-2 cache hit was" in stolen.reason, stolen.reason
