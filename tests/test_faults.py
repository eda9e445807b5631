"""Faults and hostile inputs, end to end through pytest (pytester) against the vLLM/SGLang emulator.

A server fault must make the probe it hits an ERROR (never a failure, never a pass) with the cause in the
output, and the session goes on with the next probe. A server that dies, an interrupted run, a report path
that cannot be written and bad option values are each checked for what the user sees and for what is (or
is not) sent; conversation text must reach the server byte for byte.

Every run passes ``-p no:hypothesispytest -p no:benchmark``: pytester restores ``sys.modules`` after each
in-process run, so those plugins (and Hypothesis, which its terminal summary imports) would be imported and
assertion-rewritten again in every run: seconds per run, and nothing here needs them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
import requests  # noqa: F401  (see the note below)

# The plugin imports its measurement (and requests) only when it is switched on, so the first pytester run
# would import them and pytester's sys.modules restore would drop them again; later runs then mix classes
# of two imports of requests ("You can only merge into CookieJar"). Importing them here keeps one copy.
import pytest_cachecheck.protocol  # noqa: F401
from tests.support import emulator as emulator_module

FAST = ["-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:benchmark"]


@pytest.fixture(autouse=True)
def _emulator_without_nagle(monkeypatch: pytest.MonkeyPatch) -> None:
    # The emulator writes headers and body in two sends; with Nagle's algorithm on, the body waits for the
    # client's delayed ACK (~40 ms a request, ~0.25 s a probe). TCP_NODELAY changes no byte on the wire.
    monkeypatch.setattr(emulator_module._Handler, "disable_nagle_algorithm", True)


BUILTIN_ORDER = ["tea-steeping", "bike-chain", "bread-rising", "moon-phases", "houseplant-watering"]


def section(text: str, title: str) -> List[str]:
    """The lines of the terminal section headed ``title`` (up to the next ``====`` separator)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if title in line and line.startswith("="))
    out = []
    for line in lines[start + 1:]:
        if line.startswith("=" * 10):
            break
        out.append(line)
    return out


# -- one fault per probe ------------------------------------------------------------------------------
# (fault, the chat request it hits, words of the cause). Probe 2 (bike-chain) sends requests 7..12, in the
# order cache-1/turn-1, cache-1/turn-2, recompute-1, cache-2/turn-1, cache-2/turn-2, recompute-2; the
# faults are spread over those steps.
SETUP = 1  # chat requests before the first probe: the setup check of cached-token reporting (vLLM)
FAULTS = [
    ("429", 7, "HTTP 429: Too Many Requests"),
    ("500", 8, "HTTP 500: Internal Server Error"),
    ("503", 9, "HTTP 503: Service Unavailable"),
    ("not-json", 10, "HTTP 200 but the body is not JSON ('<html><body>502 Bad Gateway"),
    ("truncated", 11, "the body was cut short"),
    ("no-choices", 12, "the response has no choices"),
    ("no-usage", 8, "the response has no usage counts"),
    ("slow:3", 10, "no answer within 1 s (--cachecheck-timeout)"),
]


@pytest.mark.parametrize("fault, at, words", FAULTS, ids=[f[0].split(":")[0] for f in FAULTS])
def test_fault_errors_that_probe_and_the_session_goes_on(pytester, emulator, fault, at, words):
    emu = emulator(fault={SETUP + at: fault})
    timeout = ["--cachecheck-timeout=1"] if fault.startswith("slow") else []  # others keep the default
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", "--cachecheck-n=4", *timeout,
                                "--cachecheck-report=r.json", "-v", *FAST)
    result.assert_outcomes(passed=3, errors=1, failed=1)  # the gate: a fault is never a divergence
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "*probe[[]tea-steeping[]] PASSED*",
        "*probe[[]bike-chain[]] ERROR*",
        "*probe[[]bread-rising[]] PASSED*",
        "*probe[[]moon-phases[]] PASSED*",
        "cachecheck::gate FAILED*",
        "*ERROR at setup of probe[[]bike-chain[]]*",
        f"cachecheck: POST /v1/chat/completions to {emu.url}: {words}*",
        "probes: 4 | valid: 3 (same 3, different 0) | inconclusive: 0 | errors: 1",
        "cachecheck verdict: FAIL (errors)*",
    ])
    # the two probes after the fault were measured in full
    assert len(emu.requests_log) == SETUP + 6 + (at - 6) + 6 + 6
    data = json.loads((pytester.path / "r.json").read_text())
    outcomes = {p["id"]: p["outcome"] for p in data["probes"]}
    assert outcomes == {"tea-steeping": "same", "bike-chain": "error", "bread-rising": "same",
                        "moon-phases": "same"}
    errored = data["probes"][1]
    assert words.split(" (")[0] in errored["reason"]
    assert len(errored["requests"]) == at - 7  # what it measured before the fault


# -- hostile or broken replies -------------------------------------------------------------------------
# (fault, words of the cause). Each hits probe 2's first request; run in a subprocess, so a blow-up of memory
# or an exception that escapes cannot take the test process with it.
HOSTILE = [
    ("huge", "the body is larger than 3145728 bytes once decoded (a reply of max_tokens=256"),
    ("gzip-bomb", "the body is larger than 3145728 bytes once decoded (a reply of max_tokens=256"),
    ("drip:0.2", "no answer within 2 s (--cachecheck-timeout)"),
    ("redirect", "HTTP 307 redirect to http://evil.invalid:9/v1/chat/completions (another origin); "),
    ("nested", "HTTP 200 but the body is malformed JSON (nested more than 64 levels deep)"),
    ("bigint", "HTTP 200 but the body is malformed JSON (an integer of 5001 digits)"),
    ("nan", "HTTP 200 but the body is malformed JSON (NaN, which is not JSON)"),
    ("surrogate", "HTTP 500: bad \ufffd answer (emulated fault on request 8)"),
    ("control", "HTTP 500: boom\\x1b[2K\\r\\x1b[32mPASSED\\x1b[0m\\nforged line \\u202etxt.exe (emulated"),
]


@pytest.mark.parametrize("fault, words", HOSTILE, ids=[f[0].split(":")[0] for f in HOSTILE])
def test_hostile_reply_errors_that_probe_and_the_report_is_intact(pytester, emulator, fault, words):
    emu = emulator(fault={SETUP + 7: fault})
    start = time.monotonic()
    result = pytester.runpytest_subprocess(
        f"--cachecheck-url={emu.url}", "--cachecheck-n=4", "--cachecheck-timeout=2", "-v",
        "--cachecheck-report=r.json", "--cachecheck-html=r.html", "--junitxml=junit.xml", *FAST)
    elapsed = time.monotonic() - start
    out = result.stdout.str()
    assert "INTERNALERROR" not in out + result.stderr.str()
    result.assert_outcomes(passed=3, errors=1, failed=1)
    assert words in out, out[-3000:]
    assert elapsed < 40, elapsed
    # no control character from the server reached the terminal
    for bad in ("\x1b", "\u202e", "\ud800"):
        assert bad not in out
    assert "forged line" not in out.replace("\\nforged line", "")
    report = pytester.path / "r.json"
    assert report.stat().st_size < 1_000_000
    data = json.loads(report.read_text(encoding="utf-8"), parse_constant=lambda c: pytest.fail(c))
    assert [p["outcome"] for p in data["probes"]] == ["same", "error", "same", "same"]
    assert words.split(" (")[0] in data["probes"][1]["reason"]
    for name in ("r.html", "junit.xml"):
        assert (pytester.path / name).read_bytes().decode("utf-8")


# -- the server dies mid-run --------------------------------------------------------------------------
def test_server_dies_mid_run_errors_quickly_and_reports_what_was_measured(pytester, emulator):
    emu = emulator(fail_after_requests=SETUP + 15)  # probes 1-2, then three requests of probe 3, then dead
    start = time.monotonic()
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", "--cachecheck-n=5", "--cachecheck-timeout=30",
                                "--cachecheck-report=r.json", *FAST)
    elapsed = time.monotonic() - start
    assert elapsed < 20, f"a dead server must not wait for the timeout ({elapsed:.1f} s)"
    result.assert_outcomes(passed=2, errors=3, failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "*ERROR at setup of probe[[]bread-rising[]]*",
        f"cachecheck: POST /v1/chat/completions to {emu.url}: connection failed (*)",
        "*ERROR at setup of probe[[]moon-phases[]]*",
        f"cachecheck: POST /v1/chat/completions to {emu.url}: connection failed (*)",  # refused, or closed
        "probes: 5 | valid: 2 (same 2, different 0) | inconclusive: 0 | errors: 3",
    ])
    data = json.loads((pytester.path / "r.json").read_text())
    assert data["summary"]["status"] == "errors" and data["summary"]["exit_status"] == 1
    assert data["summary"]["not_run"] == []
    probes = data["probes"]
    assert [p["id"] for p in probes] == BUILTIN_ORDER
    assert [p["outcome"] for p in probes] == ["same", "same", "error", "error", "error"]
    for p in probes[:2]:
        assert len(p["requests"]) == 6
        assert all(isinstance(a, str) and a for group in p["answers"].values() for a in group)
    third = probes[2]
    assert [r["step"] for r in third["requests"]] == ["cache-1/turn-1", "cache-1/turn-2", "recompute-1/turn-2"]
    assert third["answers"]["turn1"][0] and third["answers"]["cache"][0]
    for p in probes[2:]:
        assert "connection failed" in p["reason"]


def test_server_dies_summary_names_the_cause_in_one_line(pytester, emulator):
    emu = emulator(fail_after_requests=SETUP + 6)
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", "--cachecheck-n=3", *FAST)
    result.assert_outcomes(passed=1, errors=2, failed=1)
    summary = section(result.stdout.str(), "cachecheck summary")
    causes = [line for line in summary if "connection" in line]
    assert len(causes) == 1, summary


# -- interruption -------------------------------------------------------------------------------------
@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process")
def test_sigint_writes_an_interrupted_report(pytester, emulator):
    emu = emulator(fault={SETUP + 15: "slow:30"})  # probe 3's third request hangs
    report = pytester.path / "r.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", f"--cachecheck-url={emu.url}", "--cachecheck-n=5",
         f"--cachecheck-report={report}", "--cachecheck-timeout=60", *FAST],
        cwd=str(pytester.path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while len(emu.requests_log) < SETUP + 15 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(emu.requests_log) >= SETUP + 15, "the run did not get to the slow request"
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
        assert time.monotonic() - sent < 15
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "cachecheck verdict: FAIL (interrupted)" in out
    data = json.loads(report.read_text())
    assert data["summary"]["status"] == "interrupted" and data["summary"]["exit_status"] == 2
    assert [(p["id"], p["outcome"]) for p in data["probes"]] == [("tea-steeping", "same"),
                                                                ("bike-chain", "same")]
    assert all(len(p["requests"]) == 6 for p in data["probes"])
    assert set(data["summary"]["not_run"]) >= {"moon-phases", "houseplant-watering"}
    assert not list(pytester.path.glob(".cachecheck-*"))


# -- a report path that cannot be written ---------------------------------------------------------------
def _report_paths(root: Path) -> Dict[str, str]:
    (root / "plainfile").write_text("x")
    return {
        "parent-is-a-file": "plainfile/r.json",
        "parent-of-parent-is-a-file": str(root / "plainfile" / "sub" / "r.json"),
        "absolute-missing-dir": str(root / "missing" / "r.json"),
        "is-a-directory": str(root),
        "proc": "/proc/cachecheck-report.json",
    }


@pytest.mark.parametrize("case", ["parent-is-a-file", "parent-of-parent-is-a-file", "absolute-missing-dir",
                                  "is-a-directory", "proc"])
def test_unwritable_report_is_a_usage_error_before_any_request(pytester, emulator, case):
    if case == "proc" and not os.path.isdir("/proc"):
        pytest.skip("no /proc here")
    emu = emulator()
    path = _report_paths(pytester.path)[case]
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", f"--cachecheck-report={path}", *FAST)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--cachecheck-report (ini cachecheck_report):*is not allowed*"])
    assert emu.requests_log == []


def test_report_path_with_trailing_slash_is_refused(pytester, emulator):
    emu = emulator()
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", "--cachecheck-report=newdir/",
                                "--cachecheck-n=1", *FAST)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert emu.requests_log == []


@pytest.mark.parametrize("option", ["--cachecheck-report", "--cachecheck-probes"])
def test_unknown_home_directory_is_a_usage_error(pytester, emulator, option):
    emu = emulator()
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", f"{option}=~no-such-user-cc/x.json",
                                "--cachecheck-n=1", *FAST)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert option in result.stderr.str()


def test_report_lost_at_session_end_fails_the_run(pytester, emulator):
    out = pytester.path / "out"
    out.mkdir()

    def remove_dir(messages: Any) -> bool:  # runs inside the emulator on every chat request
        shutil.rmtree(out, ignore_errors=True)
        return False

    emu = emulator(diverge_on_hit=remove_dir)
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", "--cachecheck-n=1",
                                "--cachecheck-report=out/r.json", *FAST)
    result.assert_outcomes(passed=2)  # the gate passes: the report is lost afterwards, at session end
    result.stdout.fnmatch_lines(["cachecheck: could not write *out/r.json*"])
    assert result.ret != 0


# -- bad option values ----------------------------------------------------------------------------------
# (arguments, words in stderr). "URL" is replaced with the emulator's URL; without any --cachecheck-url the
# emulator's is added first, unless the case says "NOURL". test_plugin.py covers: localhost:8080,
# http://:8080, port 99999, mode fast, two-servers without nocache, llama.cpp + nocache, same nocache URL,
# skip-hit-check alone, n=0, max-tokens=lots, hit-tolerance=-1, timeout=0/nan, min-valid=1.5, a report
# in a missing directory, a missing probe file, an empty model, and the baseline/html/serve options.
PROBES_UNNAMED = ()
BAD = [
    # URL: no scheme, wrong scheme, no host, bad port, fragment, empty
    (["--cachecheck-url=//127.0.0.1:8080"], "--cachecheck-url*'//127.0.0.1:8080' is not allowed"),
    (["--cachecheck-url=127.0.0.1"], "--cachecheck-url*http:// or https://"),
    (["--cachecheck-url=ftp://127.0.0.1:21"], "--cachecheck-url*'ftp://127.0.0.1:21'*http:// or https://"),
    (["--cachecheck-url=ws://127.0.0.1:8080"], "--cachecheck-url*http:// or https://"),
    (["--cachecheck-url=file:///tmp/server"], "--cachecheck-url*http:// or https://"),
    (["--cachecheck-url=http//127.0.0.1:8080"], "--cachecheck-url*http:// or https://"),
    (["--cachecheck-url=http://"], "--cachecheck-url*with a host"),
    (["--cachecheck-url=https:///v1"], "--cachecheck-url*with a host"),
    (["--cachecheck-url="], "--cachecheck-url*with a host"),
    (["--cachecheck-url=http://127.0.0.1:abc"], "--cachecheck-url*port is a number"),
    (["--cachecheck-url=http://127.0.0.1:-1"], "--cachecheck-url*port is a number"),
    (["--cachecheck-url=http://127.0.0.1:65536"], "--cachecheck-url*port is a number"),
    (["--cachecheck-url=http://user:pw@127.0.0.1:99999"], "--cachecheck-url*port is a number"),
    (["--cachecheck-url=URL#frag"], "--cachecheck-url*without a #fragment"),
    pytest.param(["--cachecheck-url=http://127.0.0.1:0"], "--cachecheck-url*port is a number", id="url-port-0"),
    pytest.param(["--cachecheck-url=http://[::1"], "--cachecheck-url",
                 id="url-broken-ipv6"),
    # mode
    (["--cachecheck-mode=AUTO"], "--cachecheck-mode*'AUTO' is not allowed"),
    (["--cachecheck-mode=one_server"], "--cachecheck-mode*'one_server'"),
    (["--cachecheck-mode=vllm"], "--cachecheck-mode*'vllm'*expected one of auto"),
    # nocache URL: bad value, conflicts, without the URL under test
    (["--cachecheck-nocache-url=127.0.0.1:9"], "--cachecheck-nocache-url*http:// or https://"),
    (["--cachecheck-nocache-url=ftp://127.0.0.1:9"], "--cachecheck-nocache-url*http:// or https://"),
    (["--cachecheck-nocache-url=URL/"], "--cachecheck-nocache-url is the same URL"),
    (["--cachecheck-mode=one-server", "--cachecheck-nocache-url=http://127.0.0.1:2"],
     "--cachecheck-nocache-url*conflicts with --cachecheck-mode one-server"),
    (["NOURL", "--cachecheck-nocache-url=http://127.0.0.1:2"],
     "--cachecheck-nocache-url: needs --cachecheck-url"),
    (["--cachecheck-skip-hit-check", "--cachecheck-mode=one-server"],
     "--cachecheck-skip-hit-check*one-server"),
    # model
    (["--cachecheck-model=   "], "--cachecheck-model*non-empty"),
    # whole numbers: wrong type, out of range
    (["--cachecheck-n=-1"], "--cachecheck-n*'-1'"),
    (["--cachecheck-n=1.5"], "--cachecheck-n*'1.5'*whole number"),
    (["--cachecheck-n=abc"], "--cachecheck-n*'abc'"),
    (["--cachecheck-n=1e3"], "--cachecheck-n*'1e3'"),
    (["--cachecheck-n=2000000"], "--cachecheck-n*from 1 to 1000000"),
    (["--cachecheck-n="], "--cachecheck-n*''"),
    (["--cachecheck-max-tokens=0"], "--cachecheck-max-tokens*'0'"),
    (["--cachecheck-max-tokens=-5"], "--cachecheck-max-tokens*'-5'"),
    (["--cachecheck-max-tokens=131073"], "--cachecheck-max-tokens*from 1 to 131072"),
    (["--cachecheck-max-tokens=1.0"], "--cachecheck-max-tokens*'1.0'"),
    (["--cachecheck-max-tokens=inf"], "--cachecheck-max-tokens*'inf'"),
    (["--cachecheck-hit-tolerance=x"], "--cachecheck-hit-tolerance*'x'"),
    (["--cachecheck-hit-tolerance=1.5"], "--cachecheck-hit-tolerance*'1.5'"),
    (["--cachecheck-hit-tolerance=1000001"], "--cachecheck-hit-tolerance*from 0 to 1000000"),
    # numbers: wrong type, out of range, not finite
    (["--cachecheck-timeout=-1"], "--cachecheck-timeout*'-1'"),
    (["--cachecheck-timeout=inf"], "--cachecheck-timeout*'inf'"),
    (["--cachecheck-timeout=abc"], "--cachecheck-timeout*'abc'"),
    (["--cachecheck-timeout=86401"], "--cachecheck-timeout*at most 86400"),
    (["--cachecheck-timeout=1,5"], "--cachecheck-timeout*'1,5'"),
    (["--cachecheck-timeout=0.0"], "--cachecheck-timeout*greater than 0"),
    (["--cachecheck-min-valid=-0.1"], "--cachecheck-min-valid*'-0.1'"),
    (["--cachecheck-min-valid=nan"], "--cachecheck-min-valid*'nan'"),
    (["--cachecheck-min-valid=x"], "--cachecheck-min-valid*'x'"),
    (["--cachecheck-min-valid=80%"], "--cachecheck-min-valid*'80%'"),
    (["--cachecheck-max-rate=-0.1"], "--cachecheck-max-rate*'-0.1'"),
    (["--cachecheck-max-rate=nan"], "--cachecheck-max-rate*'nan'"),
    (["--cachecheck-max-rate=5%"], "--cachecheck-max-rate*'5%'"),
    # policies and files
    (["--cachecheck-fail-on=never"], "--cachecheck-fail-on goes with --cachecheck-baseline"),
    (["--cachecheck-html=plainfile/x.html"], "--cachecheck-html*'plainfile/x.html'"),
    pytest.param(["--cachecheck-probes=plainfile"], "bad probe file*plainfile*", marks=PROBES_UNNAMED,
                 id="probes-not-json"),
    pytest.param(["--cachecheck-probes=."], "bad probe file*is a directory", marks=PROBES_UNNAMED,
                 id="probes-directory"),
    pytest.param(["--cachecheck-report="], "--cachecheck-report",
                 id="report-empty"),
    # the one xdist mode that sends every test to every worker
    (["-n", "2", "--dist=each"], "--dist each would send probes to one server*"),
]
INI_AND_ENV_BAD = [
    # (ini text, environment, words)
    pytest.param("[pytest]\ncachecheck_url = URL\ncachecheck_n = lots\n", {},
                 "--cachecheck-n (ini cachecheck_n): 'lots'", id="ini-n-lots"),
    pytest.param("[pytest]\ncachecheck_url = URL\ncachecheck_timeout = -3\n", {}, "--cachecheck-timeout*'-3'",
                 id="ini-timeout-negative"),
    pytest.param("[pytest]\ncachecheck_url = URL\ncachecheck_mode = fast\n", {}, "--cachecheck-mode*'fast'",
                 id="ini-mode-fast"),
    pytest.param("[pytest]\ncachecheck_url = localhost:1234\n", {}, "--cachecheck-url (ini cachecheck_url)*",
                 id="ini-url-no-scheme"),
    pytest.param("", {"CACHECHECK_URL": "localhost:1234"}, "--cachecheck-url*'localhost:1234'*",
                 id="env-url-no-scheme"),
    pytest.param("", {"CACHECHECK_URL": "ftp://127.0.0.1:21"}, "--cachecheck-url*http:// or https://",
                 id="env-url-ftp"),
    pytest.param("[pytest]\ncachecheck_url = URL\ncachecheck_skip_hit_check = maybe\n", {},
                 "cachecheck_skip_hit_check",
                 id="ini-skip-hit-check-maybe"),
]


def _bad_id(case: Any) -> str:
    args, words = case
    return " ".join(a for a in args if a != "NOURL")[:60]


@pytest.mark.parametrize("args, words", [c if hasattr(c, "marks") else pytest.param(*c, id=_bad_id(c))
                                         for c in BAD])
def test_bad_option_value_is_a_usage_error(pytester, emulator, args, words):
    emu = emulator()
    (pytester.path / "plainfile").write_text("x")
    option = next(a.split("=")[0] for a in args if a.startswith("--"))
    args = [a.replace("URL", emu.url) if a.startswith("--cachecheck-") and "URL" in a else a for a in args]
    if "NOURL" in args:
        args.remove("NOURL")
    elif not any(a.startswith("--cachecheck-url") for a in args):
        args.insert(0, f"--cachecheck-url={emu.url}")
    # one probe at most, should a bad value get through (a case's own --cachecheck-n comes later and wins)
    result = pytester.runpytest("--cachecheck-n=1", *args, *FAST)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines([f"*{words}*"])
    assert option in result.stderr.str()
    assert emu.requests_log == []


@pytest.mark.parametrize("ini, env, words", INI_AND_ENV_BAD)
def test_bad_ini_or_environment_value_is_a_usage_error(pytester, emulator, monkeypatch, ini, env, words):
    emu = emulator()
    if ini:
        pytester.makeini(ini.replace("URL", emu.url))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = pytester.runpytest(*FAST)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines([f"*{words}*"])
    assert emu.requests_log == []


# -- conversation text is sent exactly as given ----------------------------------------------------------
SPACES = "   Describe a lighthouse, with leading and trailing spaces.   "
CRLF = "First line.\r\nSecond line after CRLF.\r\n\r\nAfter a blank CRLF line.\r\n"
TABS = "\tcolumn one\tcolumn two\t\ttrailing tab\t"
EMOJI = "Tea 🫖, family 👩\u200d👩\u200d👧, flag 🇺🇦, wave 👋🏽, cup ☕\ufe0f, star ⭐"
RTL = "مرحبا بالعالم — שלום עולם \u200f(rtl mark)\u200e and \u202bembedded\u202c"
COMBINING = "cafe\u0301 vs caf\u00e9, n\u0303, Z\u0351\u0308\u0364a\u0367l\u0350g\u0309o, \u1100\u1161\u11a8"
ODD_SPACES = "no\u00a0break, zero\u200bwidth, mid\ufeffBOM, ideographic\u3000space, lone\rCR"
CONVERSATIONS = [
    {"id": "spaces", "turn1": SPACES, "turn2": "  then shorter.  "},
    {"id": "crlf", "turn1": CRLF, "turn2": "Again,\r\nshorter.\r\n"},
    {"id": "tabs", "turn1": TABS, "turn2": "\tShorter\t"},
    {"id": "emoji", "turn1": EMOJI, "turn2": "Now only emoji: 🫖🫖 👩🏽\u200d🔬"},
    {"id": "rtl", "messages": [{"role": "system", "content": "  Answer in Hebrew or Arabic.\n"},
                               {"role": "user", "content": RTL}], "followup": "عربي؟ \u200fעברית?"},
    {"id": "combining", "turn1": COMBINING, "turn2": "e\u0301e\u0301e\u0301"},
    {"id": "odd-spaces", "messages": [{"role": "user", "content": ODD_SPACES},
                                      {"role": "assistant", "content": " an earlier answer \r\n"},
                                      {"role": "user", "content": "\n\ncontinue\n"}],
     "followup": " ok "},
]


def _turn1(conv: Dict[str, Any]) -> List[Dict[str, str]]:
    if "messages" in conv:
        return conv["messages"]
    return [{"role": "user", "content": conv["turn1"]}]


def _turn2(conv: Dict[str, Any]) -> str:
    return conv.get("followup", conv.get("turn2"))


def test_conversation_text_reaches_the_server_exactly(pytester, emulator):
    emu = emulator()
    # JSONL with a BOM and CRLF line ends, non-ASCII written raw; then a JSON array, everything \\u-escaped
    half = len(CONVERSATIONS) // 2
    jsonl = "\r\n".join(json.dumps(c, ensure_ascii=False) for c in CONVERSATIONS[:half]) + "\r\n"
    (pytester.path / "text.jsonl").write_bytes(b"\xef\xbb\xbf" + jsonl.encode("utf-8"))
    (pytester.path / "text.json").write_text(json.dumps(CONVERSATIONS[half:], ensure_ascii=True, indent=1),
                                             encoding="ascii")
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", "--cachecheck-probes=text.jsonl",
                                "--cachecheck-probes=text.json", "--cachecheck-max-tokens=64", *FAST)
    result.assert_outcomes(passed=len(CONVERSATIONS) + 1)
    log = emu.requests_log[SETUP:]
    assert len(log) == 6 * len(CONVERSATIONS)
    for i, conv in enumerate(CONVERSATIONS):
        sent = [r["messages"] for r in log[6 * i: 6 * i + 6]]
        turn1 = _turn1(conv)
        for k in (0, 3):  # the two turn-1 requests (sent first in each run)
            assert sent[k] == turn1, conv["id"]
        for k in (1, 2, 4, 5):  # the four turn-2 requests
            assert sent[k][:len(turn1)] == turn1, conv["id"]
            assert sent[k][len(turn1)]["role"] == "assistant"
            assert sent[k][len(turn1) + 1:] == [{"role": "user", "content": _turn2(conv)}], conv["id"]
    # == above compared code point by code point: no strip, no NFC/NFD, no newline or tab change
    sent_texts = {m["content"] for r in log for m in r["messages"]}
    for text in (SPACES, CRLF, TABS, EMOJI, RTL, COMBINING, ODD_SPACES):
        assert text in sent_texts
