"""The HTML page: escaping, the divergence highlight, no credential leak, atomic writing, setup warnings,
the target-matrix page, and a real render in headless Chromium (skipped without chromium, except under
CI where it must run)."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from pytest_cachecheck.baseline import Baseline
from pytest_cachecheck.htmlreport import render_html, write_html
from pytest_cachecheck.model import ProbeRecord, ReportError, RunReport
from pytest_cachecheck.redact import Redactor, display_url
from pytest_cachecheck.run import TargetInput, summarise
from tests.support import factories as f

SCRIPT = "<script>alert('x')</script>"
URL = "http://gpu-box:8000/v1"


def make_report(records: List[ProbeRecord], url: str = URL, **kwargs: Any) -> RunReport:
    """The run report of these records, measured on one server at ``url`` (an API key set)."""
    s = f.settings(url=url, replicas=(url,), api_key="sk-test-key-0000")
    return f.report(records, exit_status=1, s=s, **kwargs)


def sample_records() -> List[ProbeRecord]:
    return [
        f.record("alpha-probe", "different", cache="Hello world, the answer is 42.",
                 recompute="Hello world, the answer is 41."),
        f.record("beta-probe", "same"),
        f.record("gamma-probe", "inconclusive", cache="x", recompute="y",
                 reason="inconclusive: the two cache runs gave different turn-2 answers (from character 0)"),
        f.record("delta-probe", "error", cache=None, recompute=None, reason="connection refused"),
    ]


def sample(**kwargs: Any) -> RunReport:
    return make_report(sample_records(), **kwargs)


def loaded(report: RunReport) -> RunReport:
    """The report as written to JSON and read back."""
    return RunReport.from_json(json.loads(json.dumps(report.to_json())))


# --------------------------------------------------------------------------- unit tests

def test_page_is_self_contained() -> None:
    page = render_html(sample())
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page, re.IGNORECASE)
    assert "<link" not in page.lower() and "@import" not in page
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    for pid in ("alpha-probe", "beta-probe", "gamma-probe", "delta-probe"):
        assert pid in page
    assert 'id="count-probes"><b class="num">4</b>' in page
    assert 'id="count-different"><b class="num">1</b>' in page
    assert "50.0%" in page and "95% Wilson interval 9.5% to 90.5%" in page  # 1 of 2 valid probes
    assert "connection refused" in page and "(no answer)" in page


def test_rate_uses_summary() -> None:
    report = sample()
    assert report.summary.tally.valid == 2 and report.summary.rate is not None
    assert report.summary.rate.value == 0.5
    page = render_html(report)
    assert "divergence rate <b>50.0%</b> (1 of 2 valid probes)" in page


def test_conversation_text_is_escaped() -> None:
    report = make_report([
        f.record(f"id-{SCRIPT}", "different", cache=f"same start {SCRIPT} tail",
                 recompute=f"same start {SCRIPT}"),
        f.record("b", "same", cache=SCRIPT, recompute=SCRIPT, reason=SCRIPT),
    ], setup_=f.setup(model=SCRIPT))
    report.summary.why = SCRIPT
    page = render_html(report)
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    escaped = "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;"
    assert f"vllm 0.34.0 | model {escaped}" in page and f'<span class="why">{escaped}</span>' in page
    # the answer that ends where the other goes on gets an explicit end marker
    assert '<mark class="end">(end of answer)</mark>' in page


def test_highlight_starts_at_the_divergence() -> None:
    page = render_html(make_report([f.record("p", "different", cache="Hello world, the answer is 42.",
                                             recompute="Hello world, the answer is 41.")]))
    assert "<pre>Hello world, the answer is 4<mark>2.</mark></pre>" in page
    assert "<pre>Hello world, the answer is 4<mark>1.</mark></pre>" in page
    assert "first difference at character 28 (token 3)" in page


def test_highlight_escapes_both_parts() -> None:
    page = render_html(make_report([f.record("p", "different", cache="a<b & c>d", recompute="a<b & c>e")]))
    assert "<pre>a&lt;b &amp; c&gt;<mark>d</mark></pre>" in page


def test_highlight_without_divergence_field_is_computed() -> None:
    r = f.record("p", "different", cache="abcX", recompute="abcY")
    r.divergence = None
    page = render_html(make_report([r]))
    assert "<pre>abc<mark>X</mark></pre>" in page


def test_no_highlight_for_same_and_inconclusive() -> None:
    page = render_html(make_report([f.record("s", "same"),
                                    f.record("i", "inconclusive", cache="x", recompute="y")]))
    assert "<mark" not in page


def test_no_credentials_leak() -> None:
    # as the plugin writes it: Settings.public() strips the credentials and masks query values
    url = "http://gpu-box:8000/v1?token=sekrit-token"
    s = f.settings(url=url, replicas=(url,), nocache_url="http://user:pass@nocache:9000",
                   api_key="sk-test-key-0000")
    page = render_html(f.report(sample_records(), s=s))
    assert "http://gpu-box:8000/v1?token=***" in page
    assert "sekrit-token" not in page and "sk-test-key-0000" not in page
    assert "user:pass" not in page and "nocache:9000" not in page
    report = sample()
    report.settings["url"] = "http://gpu-box:8000/v1?token=***"
    report.settings["nocache_url"] = "http://user:pass@nocache:9000"
    report.settings["api_key_set"] = True
    page = render_html(report)
    assert "http://gpu-box:8000/v1?token=***" in page
    assert "user:pass" not in page and "nocache:9000" not in page
    # even a URL with credentials in the settings (not what the plugin writes) is cleaned
    report.settings["url"] = "http://user:pass@gpu-box:8000/v1"
    page = render_html(report)
    assert "user:pass" not in page and "http://gpu-box:8000/v1" in page


def test_write_html_scrubs_secrets(tmp_path: Path) -> None:
    red = Redactor(["sk-very-secret"])
    report = make_report([f.record("p", "different", cache="key sk-very-secret <i>",
                                   recompute="key sk-very-other")])
    path = tmp_path / "r.html"
    write_html(str(path), report, scrub=red.scrub)
    page = path.read_text(encoding="utf-8")
    assert "sk-very-secret" not in page and "***" in page
    assert "<pre>key sk-very-<mark>secret &lt;i&gt;</mark></pre>" in render_html(report)  # there to scrub


def test_comparison_table() -> None:
    before = f.baseline([f.record("alpha-probe", "same"), f.record("beta-probe", "same"),
                         f.record("gone", "different", cache="a", recompute="b")])
    current = sample(baselines={None: before})  # the comparison the plugin makes, kept in the report
    assert current.targets[0].baseline is not None
    page = render_html(current)
    assert 'id="baseline"' in page and 'id="baseline-rows"' in page
    assert '<span class="badge b-regressed">regressed</span>' in page
    assert "exact McNemar p = 1.000" in page
    assert '<a href="#probe-0">alpha-probe</a></td><td>same</td><td>different</td>' in page
    assert "newly diverged" in page and "not run" in page
    # the report read back from its JSON carries the same comparison
    assert render_html(loaded(current)) == page
    assert 'id="baseline"' not in render_html(sample())


def test_write_html_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "out.html"
    path.write_text("old", encoding="utf-8")
    write_html(str(path), sample())
    assert path.read_text(encoding="utf-8") == render_html(sample())
    assert [p.name for p in tmp_path.iterdir()] == ["out.html"]

    def boom(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_html(str(path), make_report([]))
    assert path.read_text(encoding="utf-8") == render_html(sample())  # untouched
    assert [p.name for p in tmp_path.iterdir()] == ["out.html"]  # temp file removed


def test_sparse_report_renders() -> None:
    page = render_html(RunReport.from_json({"schema_version": 1, "summary": {"status": "passed"},
                                            "probes": [{"id": "x", "outcome": "inconclusive"}]}))
    assert "<h3>x</h3>" in page and "b-inconclusive" in page
    assert "no probe ran" in render_html(make_report([]))
    # an outcome this version does not know is no longer shown: reading the report names the field
    with pytest.raises(ReportError, match=r"^field 'probes\[0\]\.outcome': unknown value 'weird'"):
        RunReport.from_json({"schema_version": 1, "summary": {"status": "passed"},
                             "probes": [{"id": "x", "outcome": "weird"}]})
    with pytest.raises(ReportError, match="no schema_version"):
        RunReport.from_json({})


def test_single_report_shows_setup_warnings_and_checks() -> None:
    report = sample()
    assert 'id="setup-warnings"' not in render_html(report)  # none: no box
    report.targets[0].setup.setup_warnings = [f"the chat template drops reasoning {SCRIPT}", "second warning"]
    report.targets[0].setup.setup_checks = ["chat template: kept", f"host cache {SCRIPT}"]
    page = render_html(report)
    run = page[page.index("<h2>Run</h2>"):page.index('<h2 id="probes">')]
    assert 'id="setup-warnings"' in run and "setup warnings (2)" in run
    escaped = "the chat template drops reasoning &lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;"
    assert f"<li>{escaped}</li>" in run
    assert "<li>second warning</li>" in run
    assert "<th>setup checks</th>" in run and "<li>chat template: kept</li>" in run
    assert "<script" not in page.lower()
    assert "targets" not in run and 'id="targets"' not in page  # still a one-server page


# --------------------------------------------------------------------------- target matrix

def matrix(url_b: str = "http://gpu-b:8000/v1", warnings_b: Optional[List[str]] = None,
           baselines: Optional[Dict[Optional[str], Baseline]] = None) -> RunReport:
    """Target a (vllm): every probe the same; target b (sglang): alpha-probe differs. Probe ids repeat
    across targets. Built as the plugin builds it: records per target, then ``summarise``."""
    url_a = "http://gpu-a:8000/v1"
    s = f.settings(url=url_a, replicas=(url_a,), targets=(("a", url_a), ("b", url_b)))
    setups = {"a": f.setup(setup_checks=["chat template checked on a"]),
              "b": f.setup(kind="sglang", setup_warnings=list(warnings_b or []),
                           setup_checks=["chat template checked on b"])}
    records = [f.record("alpha-probe", "same", target="a", url=display_url(url_a)),
               f.record("beta-probe", "same", target="a", url=display_url(url_a)),
               f.record("alpha-probe", "different", target="b", url=display_url(url_b),
                        cache="Hello world, the answer is 42.", recompute="Hello world, the answer is 41."),
               f.record("beta-probe", "same", target="b", url=display_url(url_b))]
    inputs = [TargetInput(name, url, setups[name]) for name, url in s.targets]
    result = summarise(s, f.PROBE_SET, ["alpha-probe", "beta-probe"], inputs, {r.key: r for r in records}, [],
                       None, baselines or {}, False)
    report = result.report(1)
    report.created = "2026-12-05T00:00:00Z"
    return report


def element_ids(page: str) -> List[str]:
    return re.findall(r'\sid="([^"]*)"', page)


def probe_anchors(page: str) -> Dict[str, str]:
    """The label of each probe section (``<id>@<target>`` in a matrix) -> its anchor."""
    found = re.findall(r'<section class="probe [^"]*" id="([^"]+)"><div class="probe-head"><h3>([^<]*)</h3>',
                       page)
    assert len(found) == len({label for _, label in found})
    return {label: anchor for anchor, label in found}


def test_matrix_anchors_are_unique_and_resolve() -> None:
    page = render_html(matrix())
    ids = element_ids(page)
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    links = set(re.findall(r'href="#([^"]*)"', page))
    assert links and links <= set(ids)
    # the same probe id on both targets: two sections, labelled <id>@<target>, each its own anchor
    by_label = probe_anchors(page)
    assert sorted(by_label) == ["alpha-probe@a", "alpha-probe@b", "beta-probe@a", "beta-probe@b"]
    assert len(set(by_label.values())) == 4
    # the index: one row per probe id, one linked outcome per target
    assert (f'<tr><td>alpha-probe</td><td><a href="#{by_label["alpha-probe@a"]}" title="alpha-probe@a">'
            f'<span class="badge b-same">same</span></a></td><td><a href="#{by_label["alpha-probe@b"]}" '
            f'title="alpha-probe@b"><span class="badge b-different">different</span></a></td></tr>') in page
    # probes grouped by target, in target order
    assert page.index('<h2 id="probes-0">Probes on a (2)</h2>') < page.index("<h3>alpha-probe@a</h3>") \
        < page.index('<h2 id="probes-1">Probes on b (2)</h2>') < page.index("<h3>alpha-probe@b</h3>")
    assert "<pre>Hello world, the answer is 4<mark>2.</mark></pre>" in page


def test_matrix_targets_table_shows_both_rates() -> None:
    page = render_html(matrix())
    table = page[page.index('id="targets-table"'):]
    table = table[:table.index("</table>")]
    row_a = table[table.index('id="targets-row-0"'):table.index('id="targets-row-1"')]
    row_b = table[table.index('id="targets-row-1"'):]
    assert '<a href="#target-0">a</a>' in row_a and "vllm 0.34.0 | model emu/tiny-chat" in row_a
    assert "one-server" in row_a and "b-passed" in row_a
    assert '<td class="num">0.0%</td>' in row_a and "0.0% to 65.8%" in row_a and "(reference)" in row_a
    assert '<a href="#target-1">a</a>' not in row_b and '<a href="#target-1">b</a>' in row_b
    assert "sglang 0.34.0" in row_b and "b-diverged" in row_b
    assert '<td class="num">50.0%</td>' in row_b and "9.5% to 90.5%" in row_b
    assert "1 diverged only here, 0 only on a; McNemar p = 1.000" in row_b
    assert "<th>vs a</th>" in table
    # the combined summary has no rate of its own: it points at the table
    assert "divergence rate: per target" in page and 'href="#targets"' in page
    assert 'id="count-probes"><b class="num">4</b>' in page


def test_matrix_vs_reference_section() -> None:
    page = render_html(matrix())
    assert 'id="vs-reference-0"' not in page  # the reference is not compared with itself
    section = page[page.index('id="target-1"'):]
    section = section[:section.index("</section>")]
    vs = section[section.index('id="vs-reference-1"'):]
    assert "b vs a (the first target)" in vs
    assert '<span class="badge b-regressed">regressed</span>' in vs and "exact McNemar p = 1.000" in vs
    assert "divergence rate: a 0.0% (0/2, 95% CI 0.0% to 65.8%) &rarr; b 50.0% (1/2" in vs
    assert '<table class="grid" id="vs-reference-1-rows"><tr><th>id</th><th>a</th><th>b</th>' in vs
    anchor = probe_anchors(page)
    # the id links to b's probe, the reference outcome to a's
    assert (f'<tr><td><a href="#{anchor["alpha-probe@b"]}">alpha-probe</a></td>'
            f'<td><a href="#{anchor["alpha-probe@a"]}">same</a></td><td>different</td>'
            '<td><span class="badge b-newly-diverged">newly diverged</span></td></tr>') in vs
    assert "baseline written" not in vs  # the reference is part of this run


def test_matrix_setup_warnings_are_escaped_per_target() -> None:
    page = render_html(matrix(warnings_b=[f"template drops reasoning {SCRIPT}"]))
    assert "<script" not in page.lower()
    escaped = "template drops reasoning &lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;"
    run = page[page.index("<h2>Run</h2>"):page.index('id="targets"')]
    assert f"<li>b: {escaped}</li>" in run  # the combined list names the target
    b = page[page.index('id="target-1"'):]
    b = b[:b.index("</section>")]
    assert 'id="setup-warnings-1"' in b and f"<li>{escaped}</li>" in b
    a = page[page.index('id="target-0"'):page.index('id="target-1"')]
    assert "setup-warnings" not in a and "<li>chat template checked on a</li>" in a


def test_matrix_target_urls_are_scrubbed(tmp_path: Path) -> None:
    report = matrix(url_b="http://alice:hunter22@gpu-b:8000/v1?api_key=sk-query-secret")
    page = render_html(report)
    assert "alice" not in page and "hunter22" not in page and "sk-query-secret" not in page
    assert "http://gpu-b:8000/v1?api_key=***" in page and "http://gpu-a:8000/v1" in page
    # through write_html with the plugin's redactor: every secret it knows of goes, everywhere
    red = Redactor(["sk-api-key-123"])
    red.add_url("http://alice:hunter22@gpu-b:8000/v1?api_key=sk-query-secret")
    report.targets[1].setup.setup_warnings = ["the server echoed sk-api-key-123 and hunter22"]
    report.probes[0].reason = "saw http://bob:pw-in-text@elsewhere:1/ and sk-query-secret"
    path = tmp_path / "m.html"
    write_html(str(path), report, scrub=red.scrub)
    text = path.read_text(encoding="utf-8")
    for secret in ("alice", "hunter22", "sk-query-secret", "sk-api-key-123", "pw-in-text"):
        assert secret not in text, secret
    assert "the server echoed *** and ***" in text


def test_matrix_baseline_comparisons_per_target(tmp_path: Path) -> None:
    old_b = f.baseline([f.record("alpha-probe", "same"), f.record("beta-probe", "same")])
    report = matrix(baselines={"b": old_b})  # b's comparison, as the plugin keeps it in b's entry
    assert report.target("a").baseline is None and report.target("b").baseline is not None
    page = render_html(report)
    assert 'id="baseline-0"' not in page and 'id="baseline"' not in page
    b = page[page.index('id="target-1"'):]
    b = b[:b.index("</section>")]
    assert "Baseline comparison of b" in b and 'id="baseline-1-rows"' in b
    assert b.index('id="baseline-1"') < b.index('id="vs-reference-1"')
    assert "<th>before</th><th>after</th>" in b and "newly diverged" in b
    anchor = probe_anchors(page)
    assert f'<a href="#{anchor["alpha-probe@b"]}">alpha-probe</a></td><td>same</td><td>different</td>' in b
    assert render_html(loaded(report)) == page  # the comparison survives the JSON report
    ids = element_ids(page)
    assert len(ids) == len(set(ids))
    # a comparison on a only: shown for a alone
    only_a = render_html(matrix(baselines={"a": old_b}))
    assert 'id="baseline-0"' in only_a and 'id="baseline-1"' not in only_a
    # write_html scrubs the comparisons as well
    red = Redactor(["alpha-probe"])
    path = tmp_path / "m.html"
    write_html(str(path), report, scrub=red.scrub)
    text = path.read_text(encoding="utf-8")
    assert "alpha-probe" not in text and 'id="baseline-1"' in text


def test_sparse_matrix_report_renders() -> None:
    """A matrix report with only what is required (each target's name and status): a probe without an
    outcome is refused naming the field; a target that is not an object, or has no name, too."""
    data: Dict[str, Any] = {
        "schema_version": 1,
        "targets": [{"name": "x", "summary": {"status": "passed"}},
                    {"name": "y", "summary": {"status": "passed"}}],
        "probes": [{"id": "p", "target": "x", "outcome": "same"}, {"id": "q", "target": "x"}]}
    with pytest.raises(ReportError, match=r"^field 'probes\[1\]\.outcome': expected a string, got null"):
        RunReport.from_json(data)
    data["probes"][1]["outcome"] = "error"
    page = render_html(RunReport.from_json(data))
    assert "<h3>p@x</h3>" in page and "<h3>q@x</h3>" in page and "Probes on y (0)" in page
    ids = element_ids(page)
    assert len(ids) == len(set(ids))
    assert set(re.findall(r'href="#([^"]*)"', page)) <= set(ids)
    assert "no probe ran" in render_html(RunReport.from_json({**data, "probes": []}))
    for junk, field in (("junk", r"targets\[1\]': expected an object"),
                        ({}, r"targets\[1\]\.name': expected a string")):
        with pytest.raises(ReportError, match="^field '" + field):
            RunReport.from_json({**data, "targets": [data["targets"][0], junk]})


def test_probe_of_an_unknown_target_is_refused_not_lost() -> None:
    data: Dict[str, Any] = {"schema_version": 1, "targets": [{"name": "x", "summary": {"status": "passed"}}],
                            "probes": [{"id": "p", "target": "x", "outcome": "same"},
                                       {"id": "p", "target": "ghost", "outcome": "same"}]}
    with pytest.raises(ReportError, match=r"probes\[1\]\.target.*'ghost' names none of the report's targets"):
        RunReport.from_json(data)


def test_matrix_page_through_the_plugin(pytester: pytest.Pytester, emulator: Any) -> None:
    """A real matrix run with a matrix baseline: per-target baseline comparisons reach the page."""
    clean, flips = emulator(), emulator(diverge_on_hit={"bicycle"})
    targets = [f"--cachecheck-target=a={clean.url}",
               f"--cachecheck-target=b={clean.url.replace('://', '://carol:pa55word@')}/?key=qsecret"]
    args = ["--cachecheck-n=3", "-p", "no:cacheprovider"]
    first = pytester.runpytest(*targets, *args, "--cachecheck-report=base.json")
    assert first.ret == 0, first.stdout.str()
    targets[1] = f"--cachecheck-target=b={flips.url.replace('://', '://carol:pa55word@')}/?key=qsecret"
    run = pytester.runpytest(*targets, *args, "--cachecheck-baseline=base.json", "--cachecheck-html=m.html")
    run.assert_outcomes(passed=5, failed=2)
    page = (pytester.path / "m.html").read_text(encoding="utf-8")
    assert "carol" not in page and "pa55word" not in page and "qsecret" not in page
    ids = element_ids(page)
    assert len(ids) == len(set(ids))
    assert set(re.findall(r'href="#([^"]*)"', page)) <= set(ids)
    for pid in ("tea-steeping", "bike-chain", "bread-rising"):
        assert f"<h3>{pid}@a</h3>" in page and f"<h3>{pid}@b</h3>" in page
    assert 'id="baseline-0"' in page and 'id="baseline-1"' in page and 'id="vs-reference-1"' in page
    b = page[page.index('id="target-1"'):]
    b = b[:b.index("</section>")]
    assert "newly diverged" in b and "1 diverged only here, 0 only on a" in page


# --------------------------------------------------------------------------- headless Chromium

def _chromium() -> str:
    exe = shutil.which("chromium")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed, but CI is set: CI must install it "
                        "(apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install -y chromium); the real-render test needs it")
    return exe


def _chromium_cmd(exe: str, tmp_path: Path) -> List[str]:
    return [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'chromium-profile'}"]


def _env(tmp_path: Path) -> Dict[str, str]:
    env = dict(os.environ)
    env["HOME"] = str(tmp_path)  # keep chromium's crash and config files out of the real home
    return env


def test_real_render_in_headless_chromium(tmp_path: Path) -> None:
    exe = _chromium()
    before = f.baseline([f.record("alpha-probe", "same"), f.record("beta-probe", "same")])
    report = sample(baselines={None: before})
    cache_1 = next(r for r in report.probes[0].requests if r.step == "cache-1/turn-2")
    cache_1.content += " " + SCRIPT  # must show up as text, never run
    page = tmp_path / "report.html"
    write_html(str(page), report)
    url = page.resolve().as_uri()

    dom = subprocess.run(_chromium_cmd(exe, tmp_path) + ["--dump-dom", url], check=False, capture_output=True,
                         text=True, timeout=180, env=_env(tmp_path))
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    for pid in ("alpha-probe", "beta-probe", "gamma-probe", "delta-probe"):
        assert f"<h3>{pid}</h3>" in html
    assert re.search(r'id="count-probes"><b class="num">4</b>', html)
    assert re.search(r'id="count-same"><b class="num">1</b>', html)
    assert re.search(r'id="count-different"><b class="num">1</b>', html)
    assert "Hello world, the answer is 4<mark>2. &lt;script&gt;" in html
    assert "Hello world, the answer is 4<mark>1.</mark>" in html
    assert "<script" not in html.lower()  # the conversation's script is text, not an element
    assert "regressed" in html and "newly diverged" in html

    png = tmp_path / "report.png"
    shot = subprocess.run(_chromium_cmd(exe, tmp_path) + [f"--screenshot={png}", "--window-size=1200,1600",
                                                            "--hide-scrollbars", url],
                          check=False, capture_output=True, text=True, timeout=180, env=_env(tmp_path))
    assert shot.returncode == 0, shot.stderr[-2000:]
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1200, 1600)
    assert len(data) > 40_000, f"screenshot is only {len(data)} bytes: a blank page?"
    keep = os.environ.get("CACHECHECK_KEEP_SCREENSHOT")
    if keep:  # to look at it: CACHECHECK_KEEP_SCREENSHOT=/tmp/shot.png
        shutil.copyfile(png, keep)
        (Path(keep).with_suffix(".dom.html")).write_text(html, encoding="utf-8")
    json.dumps(report.to_json())  # the report stays JSON-able after rendering


def test_real_render_of_a_matrix_in_headless_chromium(tmp_path: Path) -> None:
    exe = _chromium()
    report = matrix(url_b="http://alice:hunter22@gpu-b:8000/v1", warnings_b=[f"warned {SCRIPT}"])
    page = tmp_path / "matrix.html"
    write_html(str(page), report)
    dom = subprocess.run(_chromium_cmd(exe, tmp_path) + ["--dump-dom", page.resolve().as_uri()], check=False,
                         capture_output=True, text=True, timeout=180, env=_env(tmp_path))
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    for label in ("alpha-probe@a", "alpha-probe@b", "beta-probe@a", "beta-probe@b"):
        assert f"<h3>{label}</h3>" in html
    assert 'id="targets-table"' in html and "50.0%" in html and "9.5% to 90.5%" in html
    assert 'id="vs-reference-1"' in html and "1 diverged only here, 0 only on a" in html
    assert "warned &lt;script&gt;" in html and "<script" not in html.lower()
    assert "hunter22" not in html and "alice" not in html
    ids = element_ids(html)
    assert len(ids) == len(set(ids))


def test_missing_chromium_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="chromium is not installed"):
        _chromium()


def test_missing_chromium_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must install it"):
        _chromium()
