"""What pytest and the plugins users combine do around the items: the verdict must tell the truth and the
measured report must survive. Each test is a real plugin run (pytester, subprocess) against the vLLM
emulation, with the real pytest features and plugins (pytest-timeout, pytest-rerunfailures,
pytest-randomly, pytest-json-report): ``--lf`` after a failed gate, a probe cut by a timeout, ``--reruns``,
``--collect-only`` and empty selections with a report named in the ini file, a baseline against which a
probe is new, a report that cannot be written, secrets in JUnit XML and pytest-json-report.

A plugin that is not installed skips its test: the main suite installs pytest-timeout, pytest-rerunfailures
and pytest-json-report; pytest-randomly (which reorders every test it sees) only the matrix venv
``pytest 9.2 + xdist 3.8 + plugins`` (tests/support/matrix.py), which runs this file.
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import textwrap
from pathlib import Path

import pytest

from tests.test_secrets import echo_server  # noqa: F401 - a fixture

SMALL = ["--cachecheck-n=3", "-p", "no:randomly"]  # pytest-randomly only where a test asks for it
PER_PROBE = 6  # chat requests a probe costs


def needs(module: str) -> pytest.MarkDecorator:
    """Skip without the plugin: the test extras install pytest-timeout, pytest-rerunfailures and
    pytest-json-report, and the version matrix's plugins venv pytest-randomly too."""
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"{module} is not installed")


def chats(emu) -> int:
    return len(emu.requests_log)


def posts(emu) -> list:
    return [r for r in emu.every_request if r[0] == "POST"]


def report(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


# -- --lf -----------------------------------------------------------------------------------------------
@pytest.mark.compat
def test_last_failed_after_a_failed_gate_measures_the_probes_again(pytester, emulator):
    """Every probe xfails under the rate gate and only the gate fails: ``--lf`` must rerun the probes with
    the gate (measuring them again), never the gate alone."""
    emu = emulator(diverge_on_hit={"bicycle"})
    first = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *SMALL, "--cachecheck-max-rate=0")
    first.assert_outcomes(passed=2, xfailed=1, failed=1)
    assert first.ret == 1
    sent = chats(emu)
    again = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *SMALL, "--cachecheck-max-rate=0", "--lf")
    assert again.ret == 1
    assert chats(emu) - sent >= 3 * PER_PROBE  # the probes were measured again
    again.stdout.fnmatch_lines(["*FAILED cachecheck::gate*divergence rate 33.3% (1 of 3) exceeds*"])
    assert "1 passed" not in again.stdout.str().splitlines()[-1]


def test_the_gate_cannot_be_selected_alone(pytester, emulator):
    """The gate is never collected (it runs after the loop, in every mode), so no selection picks it without
    the probes it judges: a last-failed list naming only the gate (as an older version of the plugin left
    it) selects nothing of its own, pytest's --lf runs everything, and the gate judges what was measured."""
    emu = emulator()
    measured = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *SMALL, "--collect-only", "-q")
    assert "cachecheck::gate" not in measured.stdout.str()
    lastfailed = pytester.path / ".pytest_cache" / "v" / "cache" / "lastfailed"
    lastfailed.parent.mkdir(parents=True, exist_ok=True)
    lastfailed.write_text(json.dumps({"cachecheck::gate": True}), encoding="utf-8")
    sent = chats(emu)
    again = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *SMALL, "--lf", "-v")
    again.assert_outcomes(passed=4)  # three probes and the gate
    assert again.ret == 0
    assert chats(emu) - sent >= 3 * PER_PROBE
    assert again.stdout.lines[-1].count("passed") == 1
    again.stdout.fnmatch_lines(["cachecheck::gate PASSED*"])
    for selection in (["-k", "gate"], ["--deselect", "cachecheck::gate"]):
        picked = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *SMALL, *selection)
        assert picked.ret == (5 if selection[0] == "-k" else 0), selection  # -k gate selects no item at all


# -- selected but never measured ------------------------------------------------------------------------
@needs("pytest_timeout")
def test_a_probe_cut_by_pytest_timeout_is_never_a_pass(pytester, emulator):
    emu = emulator(fault={1 + PER_PROBE + 1: "slow:30"})  # the setup check, one probe, then the 2nd hangs
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *SMALL, "--timeout=3",
                                           "--cachecheck-report=cc.json", "-p", "no:cacheprovider")
    assert result.ret == 1
    data = report(pytester.path / "cc.json")
    assert data["summary"]["status"] == "not-measured", data["summary"]
    assert "bike-chain" in data["summary"]["why"] and "bike-chain" in data["summary"]["not_run"]
    result.stdout.fnmatch_lines(["cachecheck verdict: FAIL (not-measured)*"])


def test_an_unexpected_exception_keeps_an_error_record(pytester, emulator):
    """A server answer no parser foresaw (here: the measurement raising) is an error record, not a lost one."""
    emu = emulator()
    pytester.makeconftest(textwrap.dedent("""
        from pytest_cachecheck.protocol import Runner
        real = Runner.run
        def run(self, probe):
            if probe.id == "bike-chain":
                raise TypeError("'int' object is not iterable")
            return real(self, probe)
        Runner.run = run
    """))
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *SMALL, "--cachecheck-report=cc.json",
                                           "-p", "no:cacheprovider")
    assert result.ret == 1
    data = report(pytester.path / "cc.json")
    errored = [p for p in data["probes"] if p["outcome"] == "error"]
    assert [p["id"] for p in errored] == ["bike-chain"]
    assert "unexpected TypeError" in errored[0]["reason"]
    assert data["summary"]["status"] == "errors"


@pytest.mark.compat
def test_exitfirst_lists_what_it_did_not_measure(pytester, emulator):
    emu = emulator(diverge_on_hit={"tea"})
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *SMALL, "-x", "-p", "no:cacheprovider",
                                           "--cachecheck-report=cc.json")
    assert result.ret == 1
    data = report(pytester.path / "cc.json")
    assert data["summary"]["status"] == "diverged"
    assert data["summary"]["not_run"] == ["bike-chain", "bread-rising"]


# -- reruns ---------------------------------------------------------------------------------------------
@needs("pytest_rerunfailures")
def test_reruns_cannot_make_a_divergence_vanish(pytester, emulator):
    """pytest-rerunfailures runs a failed probe item again: the probe is measured once, and the rerun
    reports the same divergence (a divergence that shows once is a divergence)."""
    calls = {"n": 0}

    def flaky(messages) -> bool:  # diverges on the first measurement's cache hits only
        text = json.dumps(messages)
        if "bicycle" in text:
            calls["n"] += 1
            return calls["n"] <= 2  # both cache runs of the first measurement
        return False

    emu = emulator(diverge_on_hit=flaky)
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *SMALL, "--reruns=2",
                                           "-p", "no:cacheprovider", "--cachecheck-report=cc.json")
    assert result.ret == 1
    outcomes = result.parseoutcomes()
    assert (outcomes.get("passed"), outcomes.get("failed"), outcomes.get("rerun")) == (2, 2, 4), outcomes
    data = report(pytester.path / "cc.json")
    assert data["summary"]["status"] == "diverged"
    assert [p["outcome"] for p in data["probes"] if p["id"] == "bike-chain"] == ["different"]
    assert chats(emu) == 1 + 3 * PER_PROBE  # measured once each, whatever was rerun


# -- runs that measure nothing ----------------------------------------------------------------------------
@pytest.mark.compat
@pytest.mark.parametrize("args", [["--collect-only"], ["-m", "not cachecheck"], ["-k", "no_such_test"]],
                         ids=["collect-only", "marker", "keyword"])
def test_a_run_that_selects_no_probe_keeps_the_reports_and_sends_nothing(pytester, emulator, args):
    emu = emulator()
    pytester.makeini("[pytest]\ncachecheck_report = cc.json\ncachecheck_html = cc.html\n")
    pytester.makepyfile("def test_plain(): pass")
    first = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *SMALL, "-p", "no:cacheprovider")
    assert first.ret == 0
    files = {name: (pytester.path / name).read_text(encoding="utf-8") for name in ("cc.json", "cc.html")}
    emu.every_request.clear()
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *SMALL, "-p", "no:cacheprovider", *args)
    assert result.ret in (0, 5)
    for name, text in files.items():
        assert (pytester.path / name).read_text(encoding="utf-8") == text, name
    assert posts(emu) == []  # nothing that generates, no /tokenize
    if args != ["--collect-only"]:
        result.stdout.fnmatch_lines(["cachecheck: nothing was measured*left as they were: *cc.json, *cc.html"])


# -- a baseline -------------------------------------------------------------------------------------------
@pytest.mark.compat
@pytest.mark.parametrize("before", ["absent", "error"])
def test_a_probe_new_since_the_baseline_that_diverges_fails_everywhere(pytester, emulator, before):
    """New since the baseline (or errored in it), and different now: the item, the gate, the verdict, the
    JSON status, the HTML page and the exit status all say it failed."""
    ok = emulator()
    if before == "absent":
        probes = pytester.path / "two.jsonl"
        probes.write_text("".join(json.dumps({"id": pid, "turn1": t1, "turn2": "Say more."}) + "\n"
                                  for pid, t1 in (("tea", "How long should green tea steep?"),
                                                  ("bike", "How do I oil a bicycle chain?"))), encoding="utf-8")
        one = pytester.path / "one.jsonl"
        one.write_text(probes.read_text(encoding="utf-8").splitlines()[0] + "\n", encoding="utf-8")
        recorded = pytester.runpytest_subprocess(f"--cachecheck-url={ok.url}", f"--cachecheck-probes={one}",
                                                 "--cachecheck-record=base.json", "-p", "no:cacheprovider")
        args = [f"--cachecheck-probes={probes}"]
    else:
        broken = emulator(fault={1 + PER_PROBE * 1 + 1: "500"})  # bike-chain errors in the baseline
        recorded = pytester.runpytest_subprocess(f"--cachecheck-url={broken.url}", *SMALL,
                                                 "--cachecheck-report=base.json", "-p", "no:cacheprovider")
        args = SMALL
    assert (pytester.path / "base.json").is_file(), recorded.stdout.str()
    now = emulator(diverge_on_hit={"bicycle"})
    result = pytester.runpytest_subprocess(f"--cachecheck-url={now.url}", *args, "--cachecheck-baseline=base.json",
                                           "--cachecheck-report=now.json", "--cachecheck-html=now.html",
                                           "-p", "no:cacheprovider", "-rA")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["FAILED cachecheck::probe[[]bike*", "FAILED cachecheck::gate*newly diverged*"])
    data = report(pytester.path / "now.json")
    assert data["summary"]["status"] == "gate-failed"
    bike = next(p for p in data["probes"] if p["id"].startswith("bike"))
    assert bike["outcome"] == "different" and "expected" not in bike
    page = (pytester.path / "now.html").read_text(encoding="utf-8")
    assert 'id="group-new"' in page and 'id="group-expected"' not in page


@pytest.mark.compat
def test_recording_shows_divergences_as_expected(pytester, emulator):
    emu = emulator(diverge_on_hit={"bicycle"})
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *SMALL, "--cachecheck-record=base.json",
                                           "--cachecheck-html=base.html", "-p", "no:cacheprovider")
    assert result.ret == 0
    page = (pytester.path / "base.html").read_text(encoding="utf-8")
    assert 'id="group-expected"' in page and 'id="group-new"' not in page
    assert "recorded as the baseline" in page


# -- outputs ----------------------------------------------------------------------------------------------
def test_a_report_that_cannot_be_written_fails_the_verdict(pytester, emulator):
    full = pytester.path / "full"
    try:
        os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))  # /dev/full's numbers, in this test's folder
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device node here: {exc}")
    emu = emulator()
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *SMALL, f"--cachecheck-report={full}",
                                           "--cachecheck-html=cc.html", "-p", "no:cacheprovider")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["cachecheck verdict: FAIL (report-not-written): could not write*full*",
                                 "cachecheck: could not write*No space left on device*"])
    assert "report-not-written" in (pytester.path / "cc.html").read_text(encoding="utf-8")
    assert stat.S_ISCHR(full.stat().st_mode)


@needs("pytest_jsonreport")
def test_json_report_file_may_not_be_the_plugins_report(pytester, emulator):
    emu = emulator()
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *SMALL, "--cachecheck-report=r.json",
                                           "--json-report", "--json-report-file=r.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--cachecheck-report*--json-report-file*name the same file*"])
    assert posts(emu) == []


@needs("pytest_jsonreport")
def test_secrets_echoed_by_a_server_stay_out_of_junit_and_json_report(pytester, echo_server):
    key = "sk-echo-secret-4242"
    result = pytester.runpytest_subprocess(f"--cachecheck-url={echo_server.url}", "--cachecheck-n=2",
                                           f"--cachecheck-api-key={key}", "--junitxml=j.xml", "--json-report",
                                           "--json-report-file=jr.json", "--cachecheck-report=cc.json",
                                           "-p", "no:cacheprovider")
    assert result.ret == 1
    assert echo_server.seen  # the server was asked, and echoed the key back
    for name in ("j.xml", "jr.json", "cc.json"):
        text = (pytester.path / name).read_text(encoding="utf-8")
        assert key not in text, name
    entries = report(pytester.path / "jr.json")["tests"]
    meta = [t["metadata"]["cachecheck"] for t in entries if "cachecheck" in t.get("metadata", {})]
    assert meta and all(m["kind"] == "probe" and m["outcome"] == "error" and "***" in m["reason"] for m in meta)
    assert all("requests" in m and "fingerprint" in m for m in meta)  # the whole record, as the README says


# -- pytest-randomly ----------------------------------------------------------------------------------------
@pytest.mark.compat
@needs("pytest_randomly")
def test_randomly_reordered_probes_still_end_with_the_gate(pytester, emulator):
    emu = emulator(diverge_on_hit={"bicycle"})
    pytester.makepyfile("def test_a(): pass\ndef test_b(): pass")
    for seed in ("1", "2", "3"):
        result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", "--cachecheck-n=3", "-p", "randomly",
                                               "-p", "no:cacheprovider", f"--randomly-seed={seed}", "-v")
        assert result.ret == 1
        lines = [x for x in result.stdout.lines if " PASSED" in x or " FAILED" in x]
        assert lines[-1].startswith("cachecheck::gate FAILED"), lines
        result.stdout.fnmatch_lines(["cachecheck verdict: FAIL (diverged)*"])


# -- a path option in the space form --------------------------------------------------------------------------
@pytest.mark.compat
def test_a_path_option_in_the_space_form_is_noted_in_the_header(pytester, emulator):
    """pytest reads ``--cachecheck-report cc.json``'s value as a test path while it chooses its rootdir (its
    own rule, before plugins' options are known): the header says so where users look."""
    emu = emulator()
    spaced = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *SMALL, "-p", "no:cacheprovider",
                                           "--cachecheck-report", "cc.json")
    assert spaced.ret == 0 and (pytester.path / "cc.json").is_file()
    spaced.stdout.fnmatch_lines(["cachecheck: note: --cachecheck-report cc.json: pytest read 'cc.json' as a test "
                                 "path while choosing its rootdir (*) and ini file (*); write "
                                 "--cachecheck-report=cc.json to keep it out of that choice"])
    joined = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *SMALL, "-p", "no:cacheprovider",
                                           "--cachecheck-report=cc.json")
    assert "cachecheck: note: --cachecheck-report" not in joined.stdout.str()


# -- the tests' own checks ------------------------------------------------------------------------------------
@pytest.mark.compat
def test_a_check_that_fails_with_a_request_error_fails_the_verdict(pytester, emulator):
    emu = emulator(fault={2: "500"})  # the setup check, then the test's first request fails
    pytester.makepyfile(test_own="""
        def test_own(cachecheck):
            cachecheck.check(turn1="How do I oil a bicycle chain?", turn2="And how often?")
    """)
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *SMALL, "-p", "no:cacheprovider",
                                           "-k", "test_own", "--cachecheck-report=cc.json")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["cachecheck verdict: FAIL (errors): 1 check of a test (cachecheck.check() or "
                                 ".episode()) failed with a request or server error"])
    assert report(pytester.path / "cc.json")["summary"]["status"] == "errors"
