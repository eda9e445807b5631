"""What a user meets first (issue 19): an existing suite with strict settings, ini paths, the server-args
option, --collect-only, a model the server does not serve, recording a baseline, the gate item, and the
wording of the header and the summary."""

from __future__ import annotations

import importlib.util
import json
import re
import xml.etree.ElementTree as ET

import pytest

needs_xdist = pytest.mark.skipif(importlib.util.find_spec("xdist") is None,
                                 reason="pytest-xdist is not installed")
PYTEST_9 = int(pytest.__version__.split(".")[0]) >= 9
SMALL = ["--cachecheck-n=3", "-p", "no:cacheprovider"]


# -- existing suites: strict markers, warnings as errors, with and without xdist -----------------------------
@pytest.mark.compat
@pytest.mark.parametrize("xdist", [False, pytest.param(True, marks=needs_xdist)], ids=["no-xdist", "xdist"])
def test_strict_suite_runs_the_probes_without_a_warning(pytester, emulator, xdist):
    emu = emulator()
    pytester.makeini("[pytest]\nfilterwarnings = error\n" + ("strict = true\n" if PYTEST_9 else ""))
    pytester.makepyfile(test_mine="""
        import pytest

        @pytest.mark.cachecheck
        def test_mine():
            pass
    """)
    # pytest-benchmark, where installed, warns by itself under xdist
    args = [f"--cachecheck-url={emu.url}", *SMALL, "--strict-markers", "-W", "error", "-rA",
            "-p", "no:benchmark"]
    args += ["-n", "2"] if xdist else ["-p", "no:xdist"]
    result = pytester.runpytest_subprocess(*args)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == 0, out
    result.assert_outcomes(passed=5)  # the suite's test, 3 probes, the gate
    assert not re.search(r"\w*Warning\b|warnings summary|\d+ warnings?\b|INTERNALERROR", out), out
    # the same with only the probes selected
    result = pytester.runpytest_subprocess(*args, "-m", "cachecheck", "-k", "not mine")
    assert result.ret == 0, result.stdout.str()


# -- ini paths resolve against the ini file's folder ---------------------------------------------------------
@pytest.mark.compat
def test_ini_paths_resolve_against_the_ini_folder(pytester, emulator, monkeypatch):
    emu = emulator()
    pytester.mkdir("probes").joinpath("mine.jsonl").write_text(
        '{"id": "mine-1", "turn1": "Describe a kettle in three sentences.", "turn2": "Shorter."}\n')
    pytester.mkdir("out")
    pytester.makeini("[pytest]\ncachecheck_probes = probes/mine.jsonl\ncachecheck_report = out/report.json\n"
                     "cachecheck_html = out/page.html\n")
    sub = pytester.mkdir("sub")
    monkeypatch.chdir(sub)
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    report = pytester.path / "out" / "report.json"
    assert json.loads(report.read_text())["probes"][0]["id"] == "mine-1"
    assert (pytester.path / "out" / "page.html").is_file()
    # a baseline in the ini file too; a path on the command line stays relative to the invocation folder
    pytester.makeini("[pytest]\ncachecheck_probes = probes/mine.jsonl\n"
                     "cachecheck_baseline = out/report.json\n")
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", "-p", "no:cacheprovider",
                                "--cachecheck-report=here.json")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["*cachecheck baseline comparison*"])
    assert (sub / "here.json").is_file() and not (pytester.path / "here.json").exists()


def test_override_ini_paths_without_an_ini_file_resolve_against_the_invocation_folder(pytester, emulator):
    emu = emulator()
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL, "-o", "cachecheck_report=r.json")
    assert result.ret == 0
    assert (pytester.path / "r.json").is_file()


# -- --cachecheck-server-args --------------------------------------------------------------------------------
@pytest.mark.compat
def test_server_args_with_equals_reach_the_plugin_whole(pytester):
    pytester.path.joinpath("m.gguf").write_bytes(b"GGUF")
    # '--port' is refused by the plugin: the error shows the whole value arrived, '-c 8192' and all
    result = pytester.runpytest_subprocess("--cachecheck-serve=m.gguf",
                                           "--cachecheck-server-args=-c 8192 --port 1")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--cachecheck-server-args: '--port' is set by the plugin itself*"])
    pytester.makeini("[pytest]\ncachecheck_server_args = -ngl 99 --port 1\n")
    result = pytester.runpytest_subprocess("--cachecheck-serve=m.gguf")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--cachecheck-server-args: '--port' is set by the plugin itself*"])


@pytest.mark.compat
@pytest.mark.parametrize("value", ["-c 8192", "-ngl 99", "-fa on", "-np 2", "--temp 0.5"])
def test_server_args_as_a_separate_word_is_caught_naming_the_option(pytester, value):
    pytester.path.joinpath("m.gguf").write_bytes(b"GGUF")
    result = pytester.runpytest_subprocess("--cachecheck-serve=m.gguf", "--cachecheck-server-args", value)
    assert result.ret == 4
    err = result.stderr.str()
    if value.startswith("-c ") and "Check your '-c/--config-file' option" in err:
        # newer pytest (9.2) refuses the missing config file ' 8192' before any plugin is loaded
        assert "Config file" in err and " 8192' not found" in err
        return
    result.stderr.fnmatch_lines([f"*--cachecheck-server-args: the value {value!r} starts with '-'*write it "
                                 f"with '=': --cachecheck-server-args='{value}'*"])
    assert "expected one argument" not in err


# -- --collect-only, and a model the server does not serve ---------------------------------------------------
@pytest.mark.compat
@pytest.mark.parametrize("extra", [[], pytest.param(["-n", "2"], marks=needs_xdist)], ids=["plain", "xdist"])
def test_collect_only_sends_no_request_of_any_kind(pytester, emulator, extra):
    emu = emulator()
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *SMALL, "--collect-only", *extra)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*<Function probe[[]tea-steeping[]]>*"])
    assert emu.every_request == []


@pytest.mark.compat
@pytest.mark.parametrize("extra", [[], pytest.param(["-n", "2"], marks=needs_xdist)], ids=["plain", "xdist"])
def test_a_model_not_served_is_a_usage_error_before_any_probe_request(pytester, emulator, extra):
    emu = emulator(models=["emu/other"])
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *SMALL,
                                           "--cachecheck-model=emu/nope", *extra)
    assert result.ret == 4, result.stdout.str()
    result.stderr.fnmatch_lines(["*cachecheck: --cachecheck-model 'emu/nope' is not served by "
                                 "http://127.0.0.1:*; it lists: emu/tiny-chat, emu/other*"])
    assert emu.requests_log == []  # no chat request: only what asked the server what it is
    assert all(method == "GET" for method, _ in emu.every_request)
    # several served and none chosen: the same kind of error
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *SMALL, *extra)
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*serves several models; choose one with --cachecheck-model: emu/tiny-chat, "
                                 "emu/other*"])
    assert emu.requests_log == []


def test_a_model_not_served_by_one_target_is_a_usage_error(pytester, emulator):
    a, b = emulator(), emulator(models=["emu/other"])
    result = pytester.runpytest(f"--cachecheck-target=a={a.url}", f"--cachecheck-target=b={b.url}", *SMALL,
                                "--cachecheck-model=emu/other")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*cachecheck: target a: --cachecheck-model 'emu/other' is not served by*"])
    assert a.requests_log == [] and b.requests_log == []


# -- recording a baseline ------------------------------------------------------------------------------------
@pytest.mark.compat
def test_record_a_baseline_that_diverges_passes_and_is_compared_later(pytester, emulator):
    flips = emulator(diverge_on_hit={"bicycle"})
    result = pytester.runpytest(f"--cachecheck-url={flips.url}", *SMALL, "--cachecheck-record=before.json",
                                "-rx")
    result.assert_outcomes(passed=3, xfailed=1)  # 2 probes and the gate pass; bike-chain is expected
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "cachecheck verdict: PASS (passed): baseline recorded: 1 of 3 valid probes differed*",
        "cachecheck: JSON report written to *before.json",
        "XFAIL cachecheck::probe[[]bike-chain[]] - *diverged; recorded as the baseline (--cachecheck-record)*",
    ])
    data = json.loads((pytester.path / "before.json").read_text())
    assert [p["outcome"] for p in data["probes"]] == ["same", "different", "same"]  # bike-chain second
    assert data["settings"]["record"] is True
    again = pytester.runpytest(f"--cachecheck-url={flips.url}", *SMALL, "--cachecheck-baseline=before.json")
    again.assert_outcomes(passed=3, xfailed=1)
    assert again.ret == 0


def test_record_fails_when_the_measurement_cannot_be_trusted(pytester, emulator):
    salt_ignored = emulator(honor_salt=False)  # every probe inconclusive
    result = pytester.runpytest(f"--cachecheck-url={salt_ignored.url}", *SMALL, "--cachecheck-record=b.json")
    result.assert_outcomes(skipped=3, failed=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["no probe was valid (of 3 probes), so nothing was measured; see the "
                                 "inconclusive reasons (cachecheck verdict: FAIL, too-few-valid)"])
    assert (pytester.path / "b.json").is_file()  # written all the same, to look at
    broken = emulator(fault={2: "500"})
    result = pytester.runpytest(f"--cachecheck-url={broken.url}", *SMALL, "--cachecheck-record=c.json")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["1 probe failed with a request or server error (cachecheck verdict: FAIL, "
                                 "errors)"])


@pytest.mark.parametrize("args, words", [
    (["--cachecheck-record=a.json", "--cachecheck-report=b.json"],
     "--cachecheck-record writes the JSON report itself; it conflicts with --cachecheck-report"),
    (["--cachecheck-record=a.json", "--cachecheck-baseline=b.json"], "--cachecheck-record*conflicts with "
                                                                     "--cachecheck-baseline"),
    (["--cachecheck-record=a.json", "--cachecheck-max-rate=0.5"], "--cachecheck-record*conflicts with "
                                                                  "--cachecheck-max-rate"),
    (["--cachecheck-record=no/dir/a.json"], "--cachecheck-record (ini cachecheck_record): 'no/dir/a.json'"),
])
def test_record_usage_errors(pytester, emulator, args, words):
    emu = emulator()
    pytester.path.joinpath("b.json").write_text("{}")
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", *args)
    assert result.ret == 4
    result.stderr.fnmatch_lines([f"*{words}*"])
    assert emu.every_request == []


# -- the gate item -------------------------------------------------------------------------------------------
@pytest.mark.compat
def test_gate_item_fails_with_the_reason_and_passes_when_the_gate_passes(pytester, emulator):
    emu = emulator(diverge_on_hit={"bicycle"})  # 1 of 3 differs: 33%
    failing = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL, "--cachecheck-max-rate=0.2", "-v",
                                 "--junitxml=junit.xml")
    failing.assert_outcomes(passed=2, xfailed=1, failed=1)
    assert failing.ret == 1
    results = [line for line in failing.stdout.lines if line.startswith("cachecheck::")]
    assert results[-1].startswith("cachecheck::gate FAILED"), results
    failing.stdout.fnmatch_lines([
        "*_ gate _*",
        "divergence rate 33.3% (1 of 3) exceeds --cachecheck-max-rate 0.2 (cachecheck verdict: FAIL, "
        "gate-failed)",
        "FAILED cachecheck::gate - Failed: divergence rate 33.3% (1 of 3)*",
        "=* 1 failed, 2 passed, 1 xfailed in *",
    ])
    case = [c for c in ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")
            if c.get("name") == "gate"]
    assert len(case) == 1 and case[0].find("failure") is not None
    passing = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL, "--cachecheck-max-rate=0.5", "-v")
    passing.assert_outcomes(passed=3, xfailed=1)
    passing.stdout.fnmatch_lines(["cachecheck::gate PASSED*"])
    assert passing.ret == 0


@pytest.mark.compat
def test_gate_item_follows_the_probe_selection(pytester, emulator):
    emu = emulator()
    pytester.makepyfile("def test_mine(): pass")
    one = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL, "-k", "bread-rising", "-v")
    one.assert_outcomes(passed=2)
    one.stdout.fnmatch_lines(["cachecheck::probe[[]bread-rising[]] PASSED*", "cachecheck::gate PASSED*"])
    probes = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL, "-m", "cachecheck")
    probes.assert_outcomes(passed=4)
    suite = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL, "-m", "not cachecheck", "-v")
    suite.assert_outcomes(passed=1)
    assert "cachecheck::gate" not in suite.stdout.str()
    mine = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL, "-k", "mine")
    mine.assert_outcomes(passed=1)


def test_gate_item_fails_when_too_few_probes_are_valid(pytester, emulator):
    emu = emulator(honor_salt=False)
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL)
    result.assert_outcomes(skipped=3, failed=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["FAILED cachecheck::gate - Failed: no probe was valid*"])


@needs_xdist
@pytest.mark.compat
def test_gate_item_runs_after_every_probe_under_xdist(pytester, emulator):
    a, b = emulator(diverge_on_hit={"bicycle"}), emulator()
    pytester.makepyfile(**{f"test_user{i}": "def test_x(): pass" for i in range(3)})
    result = pytester.runpytest_subprocess(f"--cachecheck-target=a={a.url}", f"--cachecheck-target=b={b.url}",
                                           *SMALL, "--cachecheck-max-rate=0.2", "-n", "2", "-v",
                                           "--junitxml=junit.xml")
    result.assert_outcomes(passed=8, xfailed=1, failed=1)
    assert result.ret == 1
    lines = result.stdout.lines
    progress = lines[:next(i for i, line in enumerate(lines) if "= FAILURES =" in line)]
    tests = [line for line in progress if "PASSED" in line or "FAILED" in line or "XFAIL" in line]
    assert "cachecheck::gate" in tests[-1] and "FAILED" in tests[-1], tests
    assert sum("cachecheck::gate" in line for line in tests) == 1
    result.stdout.fnmatch_lines(["a: divergence rate 33.3% (1 of 3) exceeds --cachecheck-max-rate 0.2 "
                                 "(cachecheck verdict: FAIL, gate-failed)",
                                 "FAILED cachecheck::gate - Failed: a: divergence rate 33.3%*",
                                 "=* 1 failed, 8 passed, 1 xfailed in *"])
    cases = [c for c in ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")
             if c.get("name") == "gate"]
    assert len(cases) == 1 and cases[0].find("failure") is not None
    # -k one probe under xdist: the gate comes with it
    one = pytester.runpytest_subprocess(f"--cachecheck-url={b.url}", *SMALL, "-n", "2", "-k", "bread-rising")
    one.assert_outcomes(passed=2)
    assert one.ret == 0


# -- wording -------------------------------------------------------------------------------------------------
def test_min_valid_zero_with_no_valid_probe_is_no_pass(pytester, emulator):
    emu = emulator(honor_salt=False)
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", *SMALL, "--cachecheck-min-valid=0")
    result.assert_outcomes(skipped=3, failed=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["no valid probe: no turn-2 answers could be compared.",
                                 "cachecheck verdict: FAIL (too-few-valid): no probe was valid*"])
    assert "0 of 0" not in result.stdout.str()


def test_header_shows_the_tolerance_in_force(pytester, emulator):
    emu = emulator(block_size=64)
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", "--cachecheck-n=1", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["cachecheck: mode one-server (auto-detected) | * | hit_tolerance 63 (raised "
                                 "from 32 for the server's 64-token cache blocks)",
                                 "cachecheck: 1 probe (builtin) | max_tokens 256 | hit_tolerance 63"])
    assert "hit_tolerance 32" not in result.stdout.str().replace("raised from 32", "")
    result.stdout.fnmatch_lines(["0 of 1 valid probe gave a different turn-2 answer on the cache path.",
                                 "divergence rate 0.0% (95% Wilson interval *, 1 valid probe)"])


def test_judge_never_passes_without_a_valid_probe():
    from pytest_cachecheck.model import Status, Tally
    from pytest_cachecheck.run import judge

    for gates in (None, [(False, "divergence rate within --cachecheck-max-rate 0.5")]):
        verdict = judge(Tally(probes=3, inconclusive=3), 0.0, gates=gates)
        assert not verdict.ok and verdict.status == Status.TOO_FEW_VALID
        assert verdict.why.startswith("no probe was valid (of 3 probes)")
    assert judge(Tally(probes=3, same=1, inconclusive=2), 0.0).ok  # one valid probe is enough at 0


def test_wording_uses_the_right_number():
    from pytest_cachecheck import terminal
    from pytest_cachecheck.kinds import PROBE
    from pytest_cachecheck.model import Tally
    from pytest_cachecheck.run import Count, judge
    from tests.support import factories as f

    assert terminal.divergence_line(Tally(probes=2, inconclusive=2)) == \
        "no valid probe: no turn-2 answers could be compared."
    assert terminal.divergence_line(Tally(probes=1, different=1)) == \
        "1 of 1 valid probe gave a different turn-2 answer on the cache path."
    assert terminal.rate_line(Tally(probes=1, same=1)).endswith(", 1 valid probe)")
    assert terminal.trajectory_rate_line(Tally(probes=1, same=1)).endswith(", 1 valid episode)")
    assert judge([Count(PROBE, Tally(probes=1, different=1), unexpected=1)], 0.8).why == \
        "1 valid probe gave a different turn-2 answer"
    assert judge(Tally(probes=2, same=1, errors=1), 0.0).why == \
        "1 probe failed with a request or server error"
    result = f.run([f.record("a", "different", cache="one answer", recompute="another answer")])
    lines = [o.text if isinstance(o, terminal.Line) else o.title
             for o in terminal.summary(result.report(1), result.verdict, None, False)]
    assert not [line for line in lines
                if "(s)" in line or " 1 probes" in line or "1 valid probes" in line], lines


def test_demo_says_it_ends_red_and_how_to_go_on(tmp_path):
    from pytest_cachecheck import terminal
    from pytest_cachecheck.llama_server import LlamaServer
    from pytest_cachecheck.probes import builtin_probes
    from pytest_cachecheck.serve import Served
    from pytest_cachecheck.session import CheckSession
    from tests.support import factories as f

    server = LlamaServer(tmp_path / "llama-server", tmp_path / "demo-f32-v1.gguf", port=8081,
                         log_path=tmp_path / "server.log")
    served = Served(server, tmp_path / "demo-f32-v1.gguf", True, [])
    session = CheckSession(f.settings(serve="demo"), builtin_probes()[:1], f.PROBE_SET, {}, served)
    header = terminal.header(session, {})
    assert header[1].startswith("cachecheck: expect the demo to end red: on random weights the cache path "
                                "and the recompute path part ways on some probes"), header
    assert "cachecheck: 1 probe (builtin) | max_tokens 256 | hit_tolerance 32" in header
    result = f.run([f.record("a", "different", cache="one answer", recompute="another answer")])
    report = result.report(1)
    last = terminal.summary(report, result.verdict, None, False)[-1]
    assert isinstance(last, terminal.Line) and "measure your own server" not in last.text
    report.targets[0].served = served.describe()
    last = terminal.summary(report, result.verdict, None, False)[-1]
    assert isinstance(last, terminal.Line) and last.text.startswith("cachecheck: that was the demo") and \
        last.text.endswith("measure your own server with: pytest --cachecheck-url http://HOST:PORT")


def test_demo_header_names_the_model_it_serves(tmp_path):
    """The plain demo model, or (when the episodes call tools) the tool-call one: the header names which, and
    the JSON report's ``served`` says so too."""
    from pytest_cachecheck import terminal
    from pytest_cachecheck.llama_server import LlamaServer
    from pytest_cachecheck.probes import builtin_probes
    from pytest_cachecheck.serve import Served
    from pytest_cachecheck.session import CheckSession
    from tests.support import factories as f

    def header(name, tools):
        server = LlamaServer(tmp_path / "llama-server", tmp_path / name, port=8081,
                             log_path=tmp_path / "s.log")
        served = Served(server, tmp_path / name, True, [], tools)
        session = CheckSession(f.settings(serve="demo"), builtin_probes()[:1], f.PROBE_SET, {}, served)
        return terminal.header(session, {}), served.describe()

    plain, described = header("demo-f32-v1.gguf", False)
    assert plain[0].startswith("cachecheck: serving the demo model (demo-f32-v1.gguf): tiny, RANDOM weights")
    assert "part ways on some probes" in plain[1]
    assert (described["model"], described["demo"], described["tools"]) == ("demo-f32-v1.gguf", True, False)
    tools, described = header("tools-f32-v4.gguf", True)
    assert tools[0].startswith("cachecheck: serving the tool-call demo model (tools-f32-v4.gguf, with "
                               "Qwen2.5's chat template, as the episodes call tools): tiny, RANDOM "
                               "weights"), tools[0]
    assert "without tools it answers with <tool_call> markers over and over" in tools[0]
    assert "part ways on some episodes" in tools[1]
    assert (described["model"], described["demo"], described["tools"]) == ("tools-f32-v4.gguf", True, True)


def test_the_example_workflow_records_then_gates(pytester, emulator):
    """The two pytest steps of examples/serving-upgrade-gate.yml, as written there, against emulated servers:
    recording a baseline that diverges passes; a candidate that newly diverges fails at the gate."""
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "examples" / "serving-upgrade-gate.yml").read_text()
    assert "|| true" not in text
    steps = [shlex.split(block.replace("\\\n", " ")) for block in
             re.findall(r"run: \|\n((?:          .*\n)+)", text)]
    assert [s[:3] for s in steps] == [["pytest", "-m", "cachecheck"]] * 2
    current, candidate = emulator(diverge_on_hit={"bicycle"}), emulator(diverge_on_hit={"bicycle", "bread"})

    def run(step):
        args = [a.replace("$CURRENT_URL", current.url).replace("$CANDIDATE_URL", candidate.url)
                .replace("$MODEL", "emu/tiny-chat") for a in step[1:]]
        return pytester.runpytest(*args, *SMALL)

    record = run(steps[0])
    assert record.ret == 0, record.stdout.str()  # bike-chain differs on the current server: expected
    record.assert_outcomes(passed=3, xfailed=1)
    gate = run(steps[1])
    assert gate.ret == 1
    gate.assert_outcomes(passed=1, xfailed=1, failed=2)  # bread-rising newly diverged, and the gate
    gate.stdout.fnmatch_lines(["FAILED cachecheck::gate - Failed: 1 probe newly diverged against the "
                               "baseline*"])
    assert (pytester.path / "after.json").is_file() and (pytester.path / "after.html").is_file()
