"""The plugin through pytest itself (pytester), against the vLLM/SGLang emulation."""

from __future__ import annotations

import json
import textwrap
import xml.etree.ElementTree as ET

import importlib.util

import pytest

needs_xdist = pytest.mark.skipif(importlib.util.find_spec("xdist") is None, reason="pytest-xdist is not installed")
SMALL = ["--cachecheck-n=3", "-p", "no:cacheprovider"]
SETUP = 1  # chat requests before the first probe: the setup check of cached-token reporting (vLLM)


def chat_count(emu) -> int:
    return len(emu.requests_log)


# -- switched off -------------------------------------------------------------------------------------
@pytest.mark.compat
def test_help_lists_every_option(pytester):
    result = pytester.runpytest("--help")
    for flag in ("--cachecheck-url", "--cachecheck-mode", "--cachecheck-nocache-url", "--cachecheck-model",
                 "--cachecheck-probes", "--cachecheck-n", "--cachecheck-max-tokens",
                 "--cachecheck-hit-tolerance", "--cachecheck-skip-hit-check", "--cachecheck-report",
                 "--cachecheck-api-key", "--cachecheck-timeout", "--cachecheck-min-valid"):
        result.stdout.fnmatch_lines([f"*{flag}*"])
    out = result.stdout.str()
    assert "cachecheck_url" in out and "CACHECHECK_URL" in out and "CACHECHECK_API_KEY" in out


@pytest.mark.compat
def test_without_url_adds_nothing_and_sends_nothing(pytester, emulator):
    emu = emulator()
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "cachecheck:" not in result.stdout.str() and "cachecheck summary" not in result.stdout.str()
    assert chat_count(emu) == 0


@pytest.mark.compat
def test_plugin_can_be_disabled(pytester, emulator):
    emu = emulator()
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("-p", "no:cachecheck", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert chat_count(emu) == 0


# -- outcomes -----------------------------------------------------------------------------------------
@pytest.mark.compat
def test_empty_folder_runs_builtin_probes(pytester, emulator):
    emu = emulator()
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", "-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=21)  # and the gate
    assert result.ret == 0
    assert chat_count(emu) == SETUP + 120  # six requests a probe
    result.stdout.fnmatch_lines([
        "cachecheck: mode one-server (auto-detected) | server vllm 0.34.0 | model emu/tiny-chat",
        "*collected 20 items",  # the gate is not collected: it runs after the loop
        "cachecheck::probe[[]tea-steeping[]] PASSED*",
        "*cachecheck summary*",
        "probes: 20 | valid: 20 (same 20, different 0) | inconclusive: 0 | errors: 0",
        "0 of 20 valid probes gave a different turn-2 answer on the cache path.",
        "cachecheck verdict: PASS*",
    ])


@pytest.mark.compat
def test_divergence_fails_with_where_and_excerpts(pytester, emulator):
    emu = emulator(diverge_on_hit={"bicycle"})
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", "--cachecheck-n=3", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=2)  # bike-chain, and the gate with the verdict
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        "*cache path and recompute path gave different turn-2 answers, from character *",
        "*  cache: *>>>*",
        "*  recompute: *>>>*",
        "1 of 3 valid probes gave a different turn-2 answer on the cache path.",
        "cachecheck verdict: FAIL (diverged)*",
    ])


def test_salt_ignored_is_inconclusive_with_cause(pytester, emulator):
    emu = emulator(honor_salt=False)
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL, "-rs")
    result.assert_outcomes(skipped=3, failed=1)  # the gate
    assert result.ret == 1  # too few valid probes
    result.stdout.fnmatch_lines([
        "cause: the recompute path reused cached tokens on every probe: likely the server ignores cache_salt*",
        "cachecheck verdict: FAIL (too-few-valid): no probe was valid (of 3 probes)*",
        "SKIPPED * inconclusive: *recompute run 1 reused * cached tokens, expected 0*",
    ])


@pytest.mark.parametrize("flavor, flag", [("vllm", "--enable-prompt-tokens-details"),
                                          ("sglang", "--enable-cache-report")])
def test_reporting_off_errors_naming_the_flag(pytester, emulator, flavor, flag):
    emu = emulator(flavor=flavor, report_cached_tokens=False)
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL)
    result.assert_outcomes(errors=3, failed=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines([f"*server not usable: *not report cached tokens*{flag}*"])
    # caught before the first probe: vLLM by one one-token request, SGLang by its /server_info alone
    assert chat_count(emu) == (SETUP if flavor == "vllm" else 0)


def test_block_size_64_needs_tolerance(pytester, emulator):
    emu = emulator(block_size=64)
    # the server says its block size (vLLM /metrics): the default tolerance is raised to match
    auto = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL)
    auto.assert_outcomes(passed=4)
    auto.stdout.fnmatch_lines(["*hit_tolerance 63 (raised from 32 for the server's 64-token cache blocks)*",
                               "*| hit_tolerance 63*"])
    # an explicit tolerance below the block size is a setup error with the fix named
    small = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL, "--cachecheck-hit-tolerance=10")
    small.assert_outcomes(errors=3, failed=1)
    small.stdout.fnmatch_lines(["*caches in blocks of 64 tokens*use at least 63*"])
    ok = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL, "--cachecheck-hit-tolerance=63")
    ok.assert_outcomes(passed=4)


def test_sglang_page_size_without_metrics(pytester, emulator):
    emu = emulator(flavor="sglang", block_size=64)  # SGLang says its page size in /server_info
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL)
    result.assert_outcomes(passed=4)


@pytest.mark.parametrize("cache_cfg, nocache_cfg, words", [
    ({"prefix_caching": False}, None, "prefix caching is off on the vllm server under test"),
    ({}, {"prefix_caching": True}, "the nocache server (vllm) reports prefix caching on"),
    ({}, {"prefix_caching": False, "model": "emu/other"}, "the two servers serve different models"),
])
def test_setup_problems_are_caught(pytester, emulator, cache_cfg, nocache_cfg, words):
    emu = emulator(**cache_cfg)
    args = [f"--cachecheck-url={emu.url}", *SMALL]
    if nocache_cfg is not None:
        args.append(f"--cachecheck-nocache-url={emulator(**nocache_cfg).url}")
    result = pytester.runpytest(*args)
    result.assert_outcomes(errors=3, failed=1)
    result.stdout.fnmatch_lines([f"*server not usable: the server setup would spoil the measurement: *{words}*"])
    assert chat_count(emu) == 0


def test_server_error_is_an_error_not_a_failure(pytester, emulator):
    emu = emulator(fault={SETUP + 2: "500", SETUP + 9: "not-json"})
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL)
    result.assert_outcomes(passed=1, errors=2, failed=1)
    result.stdout.fnmatch_lines(["*ERROR at setup of probe[[]tea-steeping[]]*", "*HTTP 500*",
                                 "*body is not JSON*"])


def test_sglang_one_server(pytester, emulator):
    emu = emulator(flavor="sglang", block_size=1, diverge_on_hit={"bread"})
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", "--cachecheck-n=4", "-p", "no:cacheprovider",
                                "-rs")
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines(["cachecheck: mode one-server (auto-detected) | server sglang 0.5.23*"])
    # SGLang's /health generates: asked once before the first probe, to learn whether it does, never after
    assert emu.health_generations == 1


def test_two_servers_and_both_off_control(pytester, emulator):
    cache = emulator(diverge_on_hit={"bicycle"})
    nocache = emulator(prefix_caching=False)
    result = pytester.runpytest(f"--cachecheck-url={cache.url}", f"--cachecheck-nocache-url={nocache.url}",
                                *SMALL)
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["cachecheck: mode two-servers | server vllm*"])
    assert chat_count(cache) == SETUP + 12 and chat_count(nocache) == SETUP + 6
    both_off = emulator(prefix_caching=False)
    result = pytester.runpytest(f"--cachecheck-url={both_off.url}", f"--cachecheck-nocache-url={nocache.url}",
                                *SMALL, "--cachecheck-skip-hit-check")
    result.assert_outcomes(passed=4)


def test_two_urls_one_server_names_the_cause(pytester, emulator):
    emu = emulator()
    other = emu.url.replace("127.0.0.1", "localhost")
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", f"--cachecheck-nocache-url={other}", *SMALL)
    # vLLM says in /metrics that "both" servers cache: caught before any chat request
    result.assert_outcomes(errors=3, failed=1)
    result.stdout.fnmatch_lines(["*reports prefix caching on: both URLs may reach the same server*"])
    assert chat_count(emu) == 0
    # llama-server does not say whether it caches: there the recompute path shows it (test_e2e_llama.py)


def test_model_choice(pytester, emulator):
    emu = emulator(models=["emu/other"])
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL)
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # before any probe request (tests/test_suites.py)
    result.stderr.fnmatch_lines(["*serves several models; choose one with --cachecheck-model: emu/tiny-chat, "
                                 "emu/other*"])
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL, "--cachecheck-model=emu/other")
    result.assert_outcomes(passed=4)
    assert {r["model"] for r in emu.requests_log[-18:]} == {"emu/other"}


def test_an_answer_under_another_model_name_is_inconclusive(pytester, emulator):
    """A proxy that routes one request to another model: that probe (or episode) measured another model, so
    it is inconclusive with the name it answered under, and nothing more is sent for it; a setup check
    answered so is a setup problem."""
    # probe 2 (bike-chain) sends requests 7..12; its fifth, cache-2/turn-2, comes back as another model's
    emu = emulator(fault={SETUP + 11: "other-model"})
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL, "-rs", "--cachecheck-report=r.json")
    result.assert_outcomes(passed=2, skipped=1, failed=1)  # the gate: 2 of 3 valid, fewer than 0.8
    reason = (f"inconclusive: the server at {emu.url} answered as model 'emu/other-model', not 'emu/tiny-chat', "
              f"so the answer is another model's")
    result.stdout.fnmatch_lines([f"SKIPPED * {reason}"])
    assert chat_count(emu) == SETUP + 6 + 5 + 6  # bike-chain stopped at the answer under the other name
    data = json.loads((pytester.path / "r.json").read_text())
    bike = data["probes"][1]
    assert (bike["id"], bike["outcome"], bike["reason"]) == ("bike-chain", "inconclusive", reason)
    assert [p["outcome"] for p in data["probes"]] == ["same", "inconclusive", "same"]
    assert data["targets"][0]["server"]["model"] == "emu/tiny-chat"

    # an episode: its cache path's second step answered under another name
    emu = emulator(fault={SETUP + 2: "other-model"})
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", "--cachecheck-episodes=builtin", "-k",
                                "episode and bread", "-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1, failed=1)
    result.stdout.fnmatch_lines([f"SKIPPED * inconclusive: the server at {emu.url} answered as model "
                                 f"'emu/other-model', not 'emu/tiny-chat'*"])

    # the setup check's request (cached-token reporting): every probe errors with the setup problem
    emu = emulator(fault={SETUP: "other-model"})
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL)
    result.assert_outcomes(errors=3, failed=1)
    result.stdout.fnmatch_lines([f"*server not usable: the server setup would spoil the measurement: the server "
                                 f"at {emu.url} answered as model 'emu/other-model', not 'emu/tiny-chat'*"])
    assert chat_count(emu) == SETUP


# -- selection, suites, xdist -------------------------------------------------------------------------
@pytest.mark.compat
def test_beside_a_suite_with_k_and_m(pytester, emulator):
    emu = emulator()
    pytester.makepyfile("def test_mine(): pass")
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", "-p", "no:cacheprovider", "-k", "moon-phases")
    result.assert_outcomes(passed=2)  # moon-phases and the gate
    assert chat_count(emu) == SETUP + 6
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL, "-m", "not cachecheck")
    result.assert_outcomes(passed=1)
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL)
    result.assert_outcomes(passed=5)


@pytest.mark.compat
def test_without_xdist_plugin(pytester, emulator):
    emu = emulator()
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL, "-p", "no:xdist")
    result.assert_outcomes(passed=4)


@needs_xdist
@pytest.mark.compat
def test_xdist_keeps_probes_in_one_worker(pytester, emulator):
    emu = emulator()
    pytester.makepyfile(**{f"test_user{i}": "def test_x(): pass" for i in range(4)})
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", "--cachecheck-n=6", "-n", "2", "-v",
                                           f"--cachecheck-report={report}", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=11)
    workers = [line.split("]")[0] for line in result.stdout.lines if "cachecheck::probe[" in line
               and "PASSED" in line]
    assert len(workers) == 6 and len(set(workers)) == 1, workers
    data = json.loads(report.read_text())
    assert len(data["probes"]) == 6
    assert data["summary"]["same"] == 6 and data["summary"]["not_run"] == []
    result.stdout.fnmatch_lines(["0 of 6 valid probes gave a different turn-2 answer on the cache path."])


@needs_xdist
@pytest.mark.compat
def test_xdist_each_is_refused(pytester, emulator):
    emu = emulator()
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", "-n", "2", "--dist", "each")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--dist each would send probes to one server from several workers*"])
    assert chat_count(emu) == 0


# -- usage errors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, words", [
    (["--cachecheck-url=localhost:8080"], "--cachecheck-url (ini cachecheck_url): 'localhost:8080' is not "
                                          "allowed; expected an http:// or https:// URL"),
    (["--cachecheck-url=http://:8080"], "expected an http:// or https:// URL with a host"),
    (["--cachecheck-url=http://h:99999"], "port is a number"),
    (["--cachecheck-mode=fast"], "'fast' is not allowed; expected one of auto, llama.cpp, one-server, two-servers"),
    (["--cachecheck-mode=two-servers"], "two-servers needs --cachecheck-nocache-url"),
    (["--cachecheck-mode=llama.cpp", "--cachecheck-nocache-url=http://127.0.0.1:2"], "conflicts"),
    (["--cachecheck-nocache-url=URL"], "same URL"),
    (["--cachecheck-skip-hit-check"], "only for the both-caches-off control in two-servers mode"),
    (["--cachecheck-n=0"], "--cachecheck-n (ini cachecheck_n): '0' is not allowed; expected a whole number"),
    (["--cachecheck-max-tokens=lots"], "--cachecheck-max-tokens (ini cachecheck_max_tokens): 'lots'"),
    (["--cachecheck-hit-tolerance=-1"], "--cachecheck-hit-tolerance"),
    (["--cachecheck-timeout=0"], "--cachecheck-timeout (ini cachecheck_timeout): '0' is not allowed; expected "
                                 "a number greater than 0"),
    (["--cachecheck-timeout=nan"], "--cachecheck-timeout"),
    (["--cachecheck-min-valid=1.5"], "--cachecheck-min-valid (ini cachecheck_min_valid): '1.5'"),
    (["--cachecheck-report=no/such/dir/r.json"], "--cachecheck-report (ini cachecheck_report): "
                                                 "'no/such/dir/r.json' is not allowed; expected a path in an "
                                                 "existing directory"),
    (["--cachecheck-probes=missing.jsonl"], "bad probe file: *missing.jsonl*"),
    (["--cachecheck-model="], "--cachecheck-model"),
])
def test_usage_errors_before_any_request(pytester, emulator, args, words):
    emu = emulator()
    args = [a.replace("=URL", "=" + emu.url) for a in args]
    if not any(a.startswith("--cachecheck-url") for a in args):
        args.insert(0, f"--cachecheck-url={emu.url}")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{words}*"])
    assert chat_count(emu) == 0


def test_bad_probe_file_names_file_line_field(pytester, emulator):
    emu = emulator()
    pytester.path.joinpath("mine.jsonl").write_text(
        '{"id": "a", "turn1": "hello there", "turn2": "and?"}\n'
        '{"id": "b", "messages": [{"role": "tool", "content": "x"}], "followup": "y"}\n')
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", "--cachecheck-probes=mine.jsonl")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*mine.jsonl:2: field 'messages[[]0[]].role'*"])
    assert chat_count(emu) == 0


# -- configuration sources ------------------------------------------------------------------------------
@pytest.mark.compat
def test_ini_env_and_command_line_precedence(pytester, emulator, monkeypatch):
    ini_emu, cli_emu, env_emu = emulator(), emulator(), emulator()
    pytester.makeini(f"[pytest]\ncachecheck_url = {ini_emu.url}\ncachecheck_n = 1\n")
    monkeypatch.setenv("CACHECHECK_URL", env_emu.url)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=2)
    assert (chat_count(ini_emu), chat_count(cli_emu), chat_count(env_emu)) == (SETUP + 6, 0, 0)
    pytester.runpytest(f"--cachecheck-url={cli_emu.url}").assert_outcomes(passed=2)
    assert (chat_count(ini_emu), chat_count(cli_emu), chat_count(env_emu)) == (SETUP + 6, SETUP + 6, 0)
    pytester.makeini("[pytest]\ncachecheck_n = 1\n")
    pytester.runpytest().assert_outcomes(passed=2)
    assert chat_count(env_emu) == SETUP + 6


def test_own_probe_files(pytester, emulator):
    emu = emulator()
    pytester.path.joinpath("a.jsonl").write_text(
        '{"id": "ours-1", "turn1": "Describe a lighthouse in three sentences.", "turn2": "Shorter."}\n')
    pytester.path.joinpath("b.json").write_text(json.dumps([
        {"messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "Describe a harbour in three sentences."}],
         "followup": "Now for a child."}]))
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", "--cachecheck-probes=a.jsonl",
                                "--cachecheck-probes=b.json", "-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*probe[[]ours-1[]] PASSED*", "*probe[[]b-1[]] PASSED*"])
    sent = emu.requests_log[-1]["messages"]
    assert sent[0] == {"role": "system", "content": "Be brief."}


# -- reports --------------------------------------------------------------------------------------------
def test_json_report_and_result_block(pytester, emulator):
    emu = emulator(diverge_on_hit={"bicycle"})
    report = pytester.path / "out" / "cc.json"
    report.parent.mkdir()
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL, "--cachecheck-report=out/cc.json")
    result.stdout.fnmatch_lines([
        "*cachecheck result (to share: no URL, key or conversation text)*",
        "pytest-cachecheck * | mode one-server | server vllm 0.34.0 | model emu/tiny-chat",
        "probes 3 | valid 3 | same 2 | different 1 | inconclusive 0 | errors 0",
        f"cachecheck: JSON report written to {report}",
    ])
    block = result.stdout.str().split("cachecheck result")[1]
    assert emu.url not in block and "127.0.0.1" not in block
    data = json.loads(report.read_text())
    assert data["schema_version"] == 2
    assert data["settings"]["url"] == emu.url and "api_key" not in data["settings"]
    # one server: one target, named null, with the server's URL (without credentials)
    [target] = data["targets"]
    assert target["name"] is None and target["url"] == emu.url and target["summary"] == data["summary"]
    assert target["server"]["kind"] == "vllm" and target["server"]["build"] == "0.34.0"
    assert data["summary"]["different"] == 1 and data["summary"]["exit_status"] == 1
    probe = {p["id"]: p for p in data["probes"]}["bike-chain"]
    assert probe["outcome"] == "different" and probe["divergence"]["char"] >= 0
    assert len(probe["requests"]) == 6
    for req in probe["requests"]:
        assert {"step", "server", "content", "finish_reason", "prompt_tokens", "completion_tokens",
                "cached_tokens"} <= set(req)
    assert probe["answers"]["cache"][0] != probe["answers"]["recompute"][0]
    assert not list(report.parent.glob(".cachecheck-*"))  # the temporary file was renamed away


@pytest.mark.compat
def test_pytest_json_report_and_junit(pytester, emulator):
    emu = emulator()
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL, "--json-report",
                                "--json-report-file=jr.json", "--junitxml=j.xml")
    result.assert_outcomes(passed=4)
    jr = json.loads((pytester.path / "jr.json").read_text())
    tests = [t for t in jr["tests"] if t["nodeid"].startswith("cachecheck::probe[")]
    assert len(tests) == 3
    assert [t["outcome"] for t in jr["tests"] if t["nodeid"] == "cachecheck::gate"] == ["passed"]
    assert all(t["metadata"]["cachecheck"]["outcome"] == "same" for t in tests)
    assert all(t["user_properties"][0]["cachecheck"]["outcome"] == "same" for t in tests)
    root = ET.parse(pytester.path / "j.xml").getroot()
    props = [p.get("name") for p in root.iter("property")]
    assert props.count("cachecheck") == 3


def test_report_written_when_server_dies(pytester, emulator):
    emu = emulator(fail_after_requests=SETUP + 13)  # two probes, then one request of the third, then dead
    report = pytester.path / "r.json"
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", "--cachecheck-n=5",
                                f"--cachecheck-report={report}", "--cachecheck-timeout=5")
    result.assert_outcomes(passed=2, errors=3, failed=1)
    data = json.loads(report.read_text())
    assert [p["outcome"] for p in data["probes"]] == ["same", "same", "error", "error", "error"]
    assert len(data["probes"][2]["requests"]) == 1  # what the third probe measured before the server died


# -- for test authors -----------------------------------------------------------------------------------
@pytest.mark.compat
def test_cachecheck_fixture(pytester, emulator):
    emu = emulator(diverge_on_hit={"lighthouse"})
    pytester.makepyfile(textwrap.dedent("""
        def test_same(cachecheck):
            result = cachecheck.check(turn1="Describe a harbour in three sentences.", turn2="Shorter.")
            assert result.valid and result.same and result.cache_answer == result.recompute_answer

        def test_different(cachecheck):
            result = cachecheck.check(messages=[{"role": "user", "content": "Describe a lighthouse."}],
                                      followup="Shorter.")
            assert result.different and result.cache_answer != result.recompute_answer
            assert "different turn-2 answers" in result.reason

        def test_bad_input(cachecheck):
            import pytest
            with pytest.raises(ValueError, match="turn2"):
                cachecheck.check(turn1="only one turn")
    """))
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", "-m", "not cachecheck", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_cachecheck_fixture_skips_without_url(pytester):
    pytester.makepyfile("def test_x(cachecheck): pass")
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*cachecheck: no server given*"])


# -- gates: max rate and baseline -----------------------------------------------------------------------
def test_max_rate_gate(pytester, emulator):
    emu = emulator(diverge_on_hit={"bicycle"})  # 1 of 3 differs: rate 33%
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL, "--cachecheck-max-rate=0.5", "-rx")
    result.assert_outcomes(passed=3, xfailed=1)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["cachecheck verdict: PASS*within --cachecheck-max-rate 0.5*"])
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL, "--cachecheck-max-rate=0.2")
    result.assert_outcomes(passed=2, xfailed=1, failed=1)  # the gate fails with the reason
    assert result.ret == 1
    result.stdout.fnmatch_lines(["cachecheck verdict: FAIL (gate-failed): divergence rate 33.3% (1 of 3) "
                                 "exceeds --cachecheck-max-rate 0.2"])


@pytest.mark.compat
def test_baseline_unchanged_new_divergence_and_html(pytester, emulator):
    clean, flips = emulator(), emulator(diverge_on_hit={"bicycle"})
    base = pytester.path / "before.json"
    pytester.runpytest(f"--cachecheck-url={clean.url}", *SMALL, f"--cachecheck-report={base}")
    again = pytester.runpytest(f"--cachecheck-url={clean.url}", *SMALL, f"--cachecheck-baseline={base}")
    again.assert_outcomes(passed=4)
    assert again.ret == 0
    again.stdout.fnmatch_lines(["*cachecheck baseline comparison*", "*unchanged*"])
    after = pytester.runpytest(f"--cachecheck-url={flips.url}", *SMALL, f"--cachecheck-baseline={base}",
                               "--cachecheck-report=after.json", "--cachecheck-html=after.html")
    after.assert_outcomes(passed=2, failed=2)
    assert after.ret == 1
    after.stdout.fnmatch_lines(["*bike-chain*newly diverged*", "*regressed*"])
    data = json.loads((pytester.path / "after.json").read_text())
    assert data["targets"][0]["baseline"]["verdict"] == "regressed"
    assert "bike-chain" in (pytester.path / "after.html").read_text()
    # the same divergence against a baseline that had it too: an expected failure, the session passes
    same_again = pytester.runpytest(f"--cachecheck-url={flips.url}", *SMALL, "--cachecheck-baseline=after.json")
    same_again.assert_outcomes(passed=3, xfailed=1)
    assert same_again.ret == 0
    never = pytester.runpytest(f"--cachecheck-url={flips.url}", *SMALL, f"--cachecheck-baseline={base}",
                               "--cachecheck-fail-on=never")
    never.assert_outcomes(passed=3, xfailed=1)
    assert never.ret == 0


@pytest.mark.parametrize("args, words", [
    (["--cachecheck-baseline=nope.json"], "--cachecheck-baseline: *nope.json*"),
    (["--cachecheck-fail-on=sometimes"], "--cachecheck-fail-on (ini cachecheck_fail_on): 'sometimes' is not "
                                         "allowed; expected one of new-divergence, rate-increase, never"),
    (["--cachecheck-max-rate=2"], "--cachecheck-max-rate"),
    (["--cachecheck-html=no/dir/x.html"], "--cachecheck-html"),
    (["--cachecheck-server-args=-v"], "--cachecheck-server-args goes with --cachecheck-serve"),
    (["--cachecheck-serve=nofile.gguf"], "--cachecheck-serve*conflicts with --cachecheck-url"),
])
def test_gate_usage_errors(pytester, emulator, args, words):
    emu = emulator()
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", *args)
    assert result.ret == 4
    result.stderr.fnmatch_lines([f"*{words}*"])
    assert chat_count(emu) == 0


def test_serve_usage_errors_before_starting(pytester):
    result = pytester.runpytest("--cachecheck-serve=nofile.gguf")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--cachecheck-serve: 'nofile.gguf' is not a model file*"])
    pytester.path.joinpath("m.gguf").write_bytes(b"GGUF")
    result = pytester.runpytest("--cachecheck-serve=m.gguf", "--cachecheck-server-args=--port 1")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*'--port' is set by the plugin itself*"])
    # the episodes call tools, so the demo serves its tool-call model with the chat template it needs: the
    # template flags are the plugin's then, refused before any build or server start
    result = pytester.runpytest("--cachecheck-serve=demo", "--cachecheck-episodes=builtin",
                                "--cachecheck-server-args=-c 4096 --chat-template-file=mine.jinja")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--cachecheck-server-args: '--chat-template-file=mine.jinja': the episodes "
                                 "call tools, so the demo serves its tool-call model*(--jinja, --no-jinja, "
                                 "--chat-template, --chat-template-file are not allowed here)*"])


def test_template_flags_are_the_users_but_for_the_tool_call_demo(tmp_path):
    from pytest_cachecheck.errors import ConfigError
    from pytest_cachecheck.serve import check_serve_args

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    flags = "--jinja --chat-template-file t.jinja -c 4096"
    assert check_serve_args(str(model), flags, tools=True) == ["--jinja", "--chat-template-file", "t.jinja",
                                                               "-c", "4096"]
    assert check_serve_args("demo", flags, tools=False)[:2] == ["--jinja", "--chat-template-file"]
    assert check_serve_args("demo", "-c 4096", tools=True) == ["-c", "4096"]
    for flag in ("--jinja", "--no-jinja", "--chat-template=chatml", "--chat-template-file x.jinja"):
        with pytest.raises(ConfigError, match="the episodes call tools"):
            check_serve_args("demo", flag, tools=True)


def test_conftest_example_wires_a_suite(pytester, emulator):
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    emu = emulator(diverge_on_hit={"flat tyre"})
    pytester.path.joinpath("conftest.py").write_text((root / "conftest_example.py").read_text())
    pytester.path.joinpath("test_custom.py").write_text(
        (root / "examples" / "test_cachecheck_custom.py").read_text())
    pytester.path.joinpath("conversations.jsonl").write_text(
        (root / "examples" / "conversations_example.jsonl").read_text())
    pytester.makeini("[pytest]\ncachecheck_probes = conversations.jsonl\n")
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", "-v")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) >= 6 and "error" not in outcomes and "errors" not in outcomes
    lines = [line for line in result.stdout.lines if " PASSED" in line or " FAILED" in line]
    assert lines[0].startswith("test_custom.py::") and lines[-2].startswith("cachecheck::probe[")
    assert lines[-1].startswith("cachecheck::gate ")  # the verdict, after the probes the conftest sorted last
    # the fixture from conftest_example.py reached the server with its system prompt
    assert any(r["messages"][0]["content"].startswith("You are the support assistant of a bicycle shop")
               for r in emu.requests_log)
    # without a URL, the custom tests skip and nothing is sent
    before = len(emu.requests_log)
    quiet = pytester.runpytest()
    quiet.assert_outcomes(skipped=2)
    assert len(emu.requests_log) == before


@needs_xdist
@pytest.mark.compat
def test_replicas_one_server_per_worker(pytester, emulator):
    a, b = emulator(diverge_on_hit={"bicycle"}), emulator(diverge_on_hit={"bicycle"})
    report = pytester.path / "r.json"
    result = pytester.runpytest_subprocess(f"--cachecheck-url={a.url}", f"--cachecheck-url={b.url}",
                                           "--cachecheck-n=6", "-n", "2", f"--cachecheck-report={report}")
    result.assert_outcomes(passed=5, failed=2)
    data = json.loads(report.read_text())
    owner = {}
    for p in data["probes"]:
        assert owner.setdefault(p["worker"], p["server_url"]) == p["server_url"]  # a worker keeps its server
    assert sorted(owner.values()) == sorted([a.url, b.url])  # and no two workers share one
    assert len(a.requests_log) + len(b.requests_log) == 36 + 2 * SETUP
    for emu in (a, b):  # each worker checked its own server, once, before its probes; the controller sent none
        assert [r["max_tokens"] for r in emu.requests_log[:SETUP]] == [1] * SETUP
        assert all(r["max_tokens"] == 256 for r in emu.requests_log[SETUP:]) and emu.requests_log[SETUP:]
    single = pytester.runpytest(f"--cachecheck-url={a.url}", "--cachecheck-n=6", "--cachecheck-report=one.json")
    one = json.loads((pytester.path / "one.json").read_text())
    assert {p["id"]: p["outcome"] for p in one["probes"]} == {p["id"]: p["outcome"] for p in data["probes"]}
    assert single.ret == 1


@needs_xdist
def test_replicas_need_a_server_per_worker(pytester, emulator):
    a, b = emulator(), emulator()
    result = pytester.runpytest_subprocess(f"--cachecheck-url={a.url}", f"--cachecheck-url={b.url}", "-n", "3")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*-n 3 workers but 2 --cachecheck-url servers*"])
    assert not a.requests_log and not b.requests_log


# -- setup checks that ask the server to do something (checks.py) -----------------------------------------
def test_sglang_generating_health_is_warned(pytester, emulator):
    generating = emulator(flavor="sglang", block_size=1)
    report = pytester.path / "r.json"
    result = pytester.runpytest(f"--cachecheck-url={generating.url}", *SMALL, f"--cachecheck-report={report}")
    result.assert_outcomes(passed=4)  # a warning, not a stop: the probes themselves never call /health
    result.stdout.fnmatch_lines(["cachecheck: warning: SGLang's /health at * runs a generation*"
                                 "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false*",
                                 "setup warning: SGLang's /health*runs a generation*"])
    assert any("runs a generation" in w for w in json.loads(report.read_text())["targets"][0]["setup_warnings"])
    quiet = emulator(flavor="sglang", block_size=1, health_generates=False)
    result = pytester.runpytest(f"--cachecheck-url={quiet.url}", *SMALL, f"--cachecheck-report={report}")
    result.assert_outcomes(passed=4)
    assert "runs a generation" not in result.stdout.str()
    assert json.loads(report.read_text())["targets"][0]["setup_warnings"] == []
    assert quiet.health_generations == 0


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_template_dropping_past_reasoning(pytester, emulator, flavor):
    # the template alone (thinking off): a warning, and the probes measure as usual
    template_only = emulator(flavor=flavor, block_size=1, chat_template="drop-reasoning", health_generates=False)
    result = pytester.runpytest(f"--cachecheck-url={template_only.url}", *SMALL)
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["cachecheck: warning: the chat template drops earlier turns' reasoning*"])
    # a model that reasons behind that template: every probe inconclusive, and the skip says why
    thinking = emulator(flavor=flavor, block_size=1, chat_template="drop-reasoning", reasoning=True,
                        health_generates=False)
    result = pytester.runpytest(f"--cachecheck-url={thinking.url}", *SMALL, "-rs")
    result.assert_outcomes(skipped=3, failed=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*inconclusive: cache run 1: turn-2 cache hit was * tokens, expected at least*"
                                 "characters of reasoning*turn thinking off for this check*"])
    result.stdout.fnmatch_lines(["cachecheck verdict: FAIL (too-few-valid)*"])


def test_template_that_breaks_the_turn2_prefix_is_caught(pytester, emulator):
    emu = emulator(chat_template="empty-think-prompt")
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL)
    result.assert_outcomes(errors=3, failed=1)
    result.stdout.fnmatch_lines(["*server not usable: the server setup would spoil the measurement: the chat "
                                 "template does not re-render the history as it was generated*--chat-template*"])
    assert chat_count(emu) == SETUP  # found before the first probe: no probe request was sent


# -- target matrix ----------------------------------------------------------------------------------------
@pytest.mark.compat
def test_target_matrix_side_by_side(pytester, emulator):
    f16 = emulator()
    q4 = emulator(diverge_on_hit={"bicycle", "bread"})
    report = pytester.path / "m.json"
    result = pytester.runpytest(f"--cachecheck-target=f16={f16.url}", f"--cachecheck-target=q4={q4.url}",
                                "--cachecheck-n=4", f"--cachecheck-report={report}", "-v", "-p",
                                "no:cacheprovider")
    result.assert_outcomes(passed=6, failed=3)
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        f"cachecheck: target matrix of 2: every probe runs on f16 ({f16.url}), q4 ({q4.url})",
        "cachecheck: target f16: mode one-server (auto-detected) | server vllm 0.34.0*",
        "cachecheck: target q4: mode one-server (auto-detected) | server vllm 0.34.0*",
        "*cachecheck::probe[[]tea-steeping@f16[]] PASSED*",
        "*cachecheck::probe[[]bike-chain@q4[]] FAILED*",
        "target  server * valid  same  diff  inconcl  errors  rate * 95% interval * vs f16",
        "f16 * 4 * 4 * 0 * 0 * 0 * 0.0% * 0.0% to 49.0% * (reference)",
        "q4 * 4 * 2 * 2 * 0 * 0 * 50.0% * 15.0% to 85.0% * 2 diverged only here, 0 only on f16; McNemar p = 0.500",
        "cachecheck verdict: FAIL (diverged): q4: 2 valid probes gave a different turn-2 answer",
        "[[]f16[]] probes 4 | valid 4 | same 4 | different 0 | inconclusive 0 | errors 0",
        "[[]q4[]] probes 4 | valid 4 | same 2 | different 2 | inconclusive 0 | errors 0",
    ])
    # every probe ran on each target's own server, and only there
    assert chat_count(f16) == SETUP + 24 and chat_count(q4) == SETUP + 24
    data = json.loads(report.read_text())
    assert [t["name"] for t in data["targets"]] == ["f16", "q4"]
    assert [t["url"] for t in data["targets"]] == [f16.url, q4.url]
    assert data["targets"][0]["summary"]["rate"] == 0.0 and data["targets"][1]["summary"]["rate"] == 0.5
    assert data["targets"][1]["summary"]["rate_ci95"] == pytest.approx([0.150, 0.850], abs=0.001)
    assert "vs_reference" not in data["targets"][0]
    vs = data["targets"][1]["vs_reference"]
    assert vs["newly_diverged_count"] == 2 and vs["healed_count"] == 0
    assert {r["id"] for r in vs["rows"] if r["status"] == "newly diverged"} == {"bike-chain", "bread-rising"}
    assert data["summary"]["probes"] == 8 and data["summary"]["different"] == 2 and data["summary"]["rate"] is None
    assert sorted((p["target"], p["id"], p["outcome"]) for p in data["probes"] if p["outcome"] != "same") == [
        ("q4", "bike-chain", "different"), ("q4", "bread-rising", "different")]
    assert {p["server_url"] for p in data["probes"] if p["target"] == "q4"} == {q4.url}


def test_target_matrix_selection_ini_and_check_fixture(pytester, emulator):
    f16, q4 = emulator(), emulator(diverge_on_hit={"lighthouse"})
    pytester.makeini(f"[pytest]\ncachecheck_target =\n    f16={f16.url}\n    q4={q4.url}\ncachecheck_n = 3\n")
    pytester.makepyfile(textwrap.dedent("""
        import pytest

        def test_each_target(cachecheck):
            assert cachecheck.targets == ["f16", "q4"]
            on_f16 = cachecheck.check(turn1="Describe a lighthouse in three sentences.", turn2="Shorter.")
            on_q4 = cachecheck.check(turn1="Describe a lighthouse in three sentences.", turn2="Shorter.",
                                     target="q4")
            assert on_f16.same and on_q4.different
            with pytest.raises(ValueError, match="the targets are f16, q4"):
                cachecheck.check(turn1="x", turn2="y", target="bf16")
    """))
    # -k with a target's name selects that target's probe items (their ids end in @<target>)
    only_q4 = pytester.runpytest("-p", "no:cacheprovider", "-k", "q4 and cachecheck")
    only_q4.assert_outcomes(passed=4, deselected=4)  # q4's probes and the gate
    only_q4.stdout.fnmatch_lines(["f16 * 0 * 0 * 0 * 0 * 0 * n/a * n/a * not run (no probe of this target was "
                                  "selected)", "[[]f16[]] no probe ran"])
    assert chat_count(f16) == SETUP  # the header's setup check only; no probe went to f16
    before = chat_count(f16), chat_count(q4)
    own = pytester.runpytest("-p", "no:cacheprovider", "-m", "not cachecheck")
    own.assert_outcomes(passed=1)
    assert chat_count(f16) - before[0] == SETUP + 6 and chat_count(q4) - before[1] == SETUP + 6


@needs_xdist
@pytest.mark.compat
def test_target_matrix_under_xdist_gives_each_target_one_worker(pytester, emulator):
    a, b = emulator(), emulator(diverge_on_hit={"bicycle"})
    args = [f"--cachecheck-target=a={a.url}", f"--cachecheck-target=b={b.url}", "--cachecheck-n=4"]
    single = pytester.runpytest_subprocess(*args, "--cachecheck-report=one.json")
    pair = pytester.runpytest_subprocess(*args, "-n", "2", "--cachecheck-report=two.json")
    single.assert_outcomes(passed=7, failed=2)
    pair.assert_outcomes(passed=7, failed=2)
    one, two = (json.loads((pytester.path / f).read_text()) for f in ("one.json", "two.json"))
    assert {(p["target"], p["id"]): p["outcome"] for p in one["probes"]} == \
           {(p["target"], p["id"]): p["outcome"] for p in two["probes"]}
    owner = {}
    for p in two["probes"]:  # a target's probes stay in one worker, one at a time on its server
        assert owner.setdefault(p["target"], p["worker"]) == p["worker"]
    assert two["targets"][1]["summary"]["different"] == 1


@pytest.mark.parametrize("args, words", [
    (["--cachecheck-target=f16"], "'f16' is not allowed; expected NAME=URL"),
    (["--cachecheck-target=bad@name=URL"], "expected NAME=URL, where NAME is 1-40 letters"),
    (["--cachecheck-target=a=URL", "--cachecheck-target=a=http://127.0.0.1:2"], "'a' is given twice"),
    (["--cachecheck-target=a=URL", "--cachecheck-target=b=URL"], "this URL is given twice"),
    (["--cachecheck-target=a=ftp://x"], "NAME=URL with an http:// or https:// URL"),
    (["--cachecheck-target=a=URL", "--cachecheck-url=URL"], "it conflicts with --cachecheck-url"),
    (["--cachecheck-target=a=URL", "--cachecheck-nocache-url=http://127.0.0.1:2"], "two-servers mode"),
])
def test_target_matrix_usage_errors(pytester, emulator, args, words):
    emu = emulator()
    result = pytester.runpytest(*[a.replace("=URL", "=" + emu.url) for a in args])
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{words}*"])
    assert chat_count(emu) == 0
