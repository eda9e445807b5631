"""The HTML page: the verdict line, probes in order of importance, expected divergences, the chart, a style
for every status word, the stylesheet shipped in the package, every text of the report escaped, the
divergence highlight, no credential leak, atomic writing, setup
warnings, the target-matrix page, and a real render in headless Chromium (skipped without chromium,
except under CI where it must run)."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

import pytest

from pytest_cachecheck.baseline import Baseline
from pytest_cachecheck.htmlreport import EXPECTED, NEW, STYLES, passed, render_html, write_html
from pytest_cachecheck.model import (STATUSES, VERDICTS, NEAR_TIE_NATS, Outcome, ProbeRecord, ReportError,
                                     RunReport, Status, Tally)
from pytest_cachecheck.redact import Redactor, display_url
from pytest_cachecheck.kinds import PROBE
from pytest_cachecheck.run import Count, KindInput, TargetInput, judge, summarise
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


#: text that would break out of an element or an attribute, and control and bidi characters
HOSTILE = "<script>\"'><img src=x>\x1b\u202e"
_CONTROL = '<span class="control" style="color: var(--severe); font-weight: 600">{}</span>'
#: HOSTILE as the page shows it in text, and in an attribute or a <title> (no markup there)
HOSTILE_TEXT = ("&lt;script&gt;&quot;&#x27;&gt;&lt;img src=x&gt;" + _CONTROL.format("\\x1b")
                + _CONTROL.format("\\u202e"))
HOSTILE_PLAIN = "&lt;script&gt;&quot;&#x27;&gt;&lt;img src=x&gt;\\x1b\\u202e"


class _Tags(HTMLParser):
    """The elements and attribute names of a page."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tags: Set[str] = set()
        self.attributes: Set[str] = set()
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, Optional[str]]]) -> None:
        self.tags.add(tag)
        self.attributes |= {name for name, _ in attrs}


def _everything(report: RunReport) -> RunReport:
    """``report`` with setup warnings and checks, a recompute server, a summary warning and episodes (one
    changed with a tool call, one the same) on each target."""
    from pytest_cachecheck.model import (Divergence, EpisodeRecord, EpisodeStep, EpisodeSummary, Parting,
                                         Path as Trajectory, ToolCall)

    def path(name: str, second: str) -> Trajectory:
        call = ToolCall("get_weather", '{"city": "Oslo"}')
        return Trajectory(name=name, steps=[EpisodeStep(1, "", [call], "tool_calls", 40, 12, 0),
                                            EpisodeStep(2, second, [], "stop", 60, 9, 51)], ended="ran out")

    report.summary.not_run = ["omitted-probe"]
    report.summary.recompute_reuse_cause = "the recompute path reused the cache"
    for t in report.targets:
        t.setup.setup_warnings, t.setup.setup_checks = ["template drops reasoning"], ["chat template checked"]
        t.setup.nocache_server = f.setup(kind="sglang").server
        t.episodes = [EpisodeRecord("walk", "builtin:3", "sha256:w", Outcome.DIFFERENT, "parted at step 2",
                                    Parting(2, "text", Divergence(6, 2, "a", "b"), 2, 2),
                                    paths=[path("cache-1", "rainy and warm"),
                                           path("recompute-1", "rainy and cold")]),
                      EpisodeRecord("chat", "builtin:1", "sha256:c", Outcome.SAME, "",
                                    paths=[path("cache-1", "ok"), path("recompute-1", "ok")])]
        t.episode_summary = EpisodeSummary.of(t.episodes)
    return report


def test_every_text_of_the_report_is_escaped() -> None:
    """A script in the conversation, the model name and the verdict's why is text; then HOSTILE appended to
    every string of the report (but the step and path names the page looks answers up by, and the settings'
    names) comes out escaped wherever the page shows it: no element or attribute the page does not have
    without it, no raw control or bidi character, every occurrence in its escaped form, field by field."""
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
    assert f"vllm 0.34.0 | model {escaped}" in page and f'<span class="why-text">{escaped}</span>' in page
    # the answer that ends where the other goes on gets an explicit end marker
    assert '<mark class="end">(end of answer)</mark>' in page

    records = [f.record("alpha-probe", "different", cache="Hello world, the answer is 42.",
                        recompute="Hello world, the answer is 41.", margins=(0.02, 0.05)),
               f.record("beta-probe", "different", cache="one", recompute="two"),
               f.record("gamma-probe", "inconclusive", cache="x", recompute="y"),
               f.record("delta-probe", "error", cache=None, recompute=None, reason="connection refused"),
               f.record("same-probe", "same")]
    before = f.baseline([f.record("beta-probe", "different", cache="one", recompute="two"),
                         f.record("alpha-probe", "same"), f.record("gone-probe", "same")])
    single = _everything(make_report(records, baselines={None: before}))
    matrix_ = _everything(matrix(warnings_b=["template drops reasoning"], baselines={"b": before}))
    for report in (single, matrix_):
        keep = set(report.settings) | {"cache-1", "recompute-1", "cache-1/turn-1", "cache-1/turn-2",
                                       "recompute-1/turn-2"}
        page = render_html(report, scrub=lambda s: s if s in keep else s + HOSTILE)
        clean = _Tags(render_html(report))
        shown = _Tags(page)
        assert shown.tags <= clean.tags and shown.attributes <= clean.attributes | {"style"}  # (_CONTROL)
        assert "<img" not in page and "<script" not in page.lower()
        assert "\x1b" not in page and "\u202e" not in page
        assert page.count("img src=x") == page.count("&gt;&lt;img src=x&gt;") > 20
        # the fields, one by one (a field the page stopped showing, or showed otherwise, fails here)
        t = report.targets[-1]
        assert t.setup.server is not None and t.setup.nocache_server is not None
        fields = [report.summary.why, t.summary.why, "omitted-probe", "the recompute path reused the cache",
                  "template drops reasoning", "chat template checked", t.setup.server.model,
                  t.setup.nocache_server.model, "<mark>2.", "<mark>1.", "turn one", report.probe_set.name,
                  report.probe_set.fingerprint, "gone-probe", "walk", "builtin:3", "parted at step 2",
                  "get_weather", "{&quot;city&quot;: &quot;Oslo&quot;}", "<mark>warm", "<mark>cold",
                  "ran out"]
        if report.matrix:
            fields += ["Target a", "Target b", f"b{HOSTILE_TEXT} vs a"]
            assert 'title="alpha-probe' + HOSTILE_PLAIN + "@b" + HOSTILE_PLAIN in page  # the probe index
        else:
            fields += ["connection refused", "<h4>beta-probe", "<h4>delta-probe", ">test:1"]
            assert "<title>alpha-probe" + HOSTILE_PLAIN + ": token" in page  # the chart's mark
        for field in fields:
            assert field + HOSTILE_TEXT in page, field


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
    assert "<h4>x</h4>" in page and "b-inconclusive" in page
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
    top = page[page.index("<h2>Summary</h2>"):page.index('<h2 id="probes">')]  # above the probes
    assert 'id="setup-warnings"' in top and "setup warnings (2)" in top
    escaped = "the chat template drops reasoning &lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;"
    assert f"<li>{escaped}</li>" in top
    assert "<li>second warning</li>" in top
    run = page[page.index("<h2>Run</h2>"):]
    assert "<th>setup checks</th>" in run and "<li>chat template: kept</li>" in run
    assert "<script" not in page.lower()
    assert "targets" not in run and 'id="targets"' not in page  # still a one-server page


# --------------------------------------------------------------------------- verdict, order, styles

def test_verdict_line_first_says_fail_and_why() -> None:
    page = render_html(sample())
    assert ('<div class="verdict fail" id="verdict"><span class="word fail">FAIL</span>'
            '<span class="badge b-diverged">diverged</span> <span class="why-text">1 valid probe gave a '
            'different turn-2 answer</span>') in page
    assert page.index('id="verdict"') < page.index("<h2>Summary</h2>") < page.index('<h2 id="probes">')
    assert "<title>pytest-cachecheck: FAIL (diverged)</title>" in page
    box = page[page.index('id="verdict"'):page.index("</div>", page.index('id="verdict"'))]
    # the probes that matter, linked from the verdict, most important first
    assert box.index('new divergences (1): <a href="#probe-0">alpha-probe</a>') \
        < box.index('errors (1): <a href="#probe-3">delta-probe</a>') \
        < box.index('inconclusive (1): <a href="#probe-2">gamma-probe</a>')
    assert "beta-probe" not in box  # a same probe does not matter


def test_verdict_line_says_pass() -> None:
    report = make_report([f.record("a", "same"), f.record("b", "same")])
    assert report.summary.exit_status == 1  # other tests failed: the page says so beside the PASS
    page = render_html(report)
    assert ('<div class="verdict pass" id="verdict"><span class="word pass">PASS</span>'
            '<span class="badge b-passed">passed</span> <span class="why-text">no valid probe differed</span>'
            in page)
    assert "pytest itself exited with status 1" in page and "FAIL" not in page
    report.summary.exit_status = 0
    assert "pytest itself exited" not in render_html(report)


def test_pass_or_fail_agrees_with_the_verdicts_the_session_gives() -> None:
    seen = set()
    cases = [judge(Tally(4, 4), 0.8), judge(Tally(4, 3, 1), 0.8), judge(Tally(4, 3, 0, 0, 1), 0.8),
             judge(Tally(4, 1, 0, 3), 0.8), judge(Tally(0), 0.8), judge(Tally(4, 4), 0.8, interrupted=True),
             judge(Tally(4, 4), 0.8, unreliable="two workers"),
             judge(Tally(4, 3, 1), 0.8, gates=[(True, "x")]),
             judge(Tally(4, 3, 1), 0.8, gates=[(False, "within")]),
             judge([Count(PROBE, Tally(4, 3, 1), unexpected=1)], 0.8),
             judge(Tally(3, 3), 0.8, not_measured=["p4"])]
    unwritten = f.run([f.record("a", "same")])
    unwritten.fail(Status.UNWRITTEN, "could not write r.json")
    cases.append(unwritten.verdict)
    for v in cases:
        assert passed(v.status) == v.ok, v
        seen.add(v.status)
    assert seen == set(Status)  # every status was judged once


def article(page: str, anchor: str) -> str:
    """The <article> of the probe with this anchor."""
    start = page.rindex("<article ", 0, page.index(f' id="{anchor}"'))
    return page[start:page.index("</article>", start)]


def _css_rules(page: str) -> List[Tuple[str, str]]:
    css = page[page.index("<style>") + 7:page.index("</style>")]
    return re.findall(r"([^{}]+)\{([^}]*)\}", css)


def test_every_status_word_has_a_style() -> None:
    """Every word a badge can show (outcomes, statuses, comparison rows and verdicts, the page's tags) has a
    CSS rule with a colour of its own; a new word without one fails here."""
    page = render_html(sample())
    coloured = {sel.strip() for sels, body in _css_rules(page) if "background" in body
                for sel in sels.split(",")}
    words = ([s.value for s in Status] + [o.value for o in Outcome] + list(STATUSES) + list(VERDICTS)
             + [NEW, EXPECTED])
    assert {"unreliable", "gate-failed", "still different", "no-probes"} <= set(words)
    for word in words:
        cls = "b-" + re.sub(r"[^a-z0-9]", "-", word)
        assert f".{cls}" in coloured, f"status word {word!r} has no style (.{cls})"
        assert word in STYLES
    # gate-failed is a failure, coloured as one (it used to be the only grey badge)
    rule = next(body for sels, body in _css_rules(page) if ".b-gate-failed" in sels.split(", "))
    assert "var(--bad)" in rule
    # a word the page does not know (a row status from some file) is grey, and never a class name
    report = sample(baselines={None: f.baseline([f.record("alpha-probe", "same")])})
    assert report.targets[0].baseline is not None
    report.targets[0].baseline.rows[0].status = "made up <b>"
    page = render_html(report)
    assert '<span class="badge b-unknown">made up &lt;b&gt;</span>' in page


def test_the_page_inlines_the_stylesheet_of_the_package() -> None:
    """The page's <style> is the package's data/report.css (shipped as package data, so it is there in an
    installed wheel too), its badge marker replaced by one colour rule per family: nothing else, nothing
    fetched."""
    from importlib.resources import files

    css = files("pytest_cachecheck").joinpath("data").joinpath("report.css").read_text(encoding="utf-8")
    marker = re.search(r"/\* @BADGES@[^*]*\*/\n", css)
    assert marker is not None and css.count("@BADGES@") == 1
    for page in (render_html(sample()), render_html(matrix())):
        style = page[page.index("<style>") + len("<style>"):page.index("</style>")]
        head, tail = "\n" + css[:marker.start()], css[marker.end():]
        assert style.startswith(head) and style.endswith(tail) and page.count("<style>") == 1
        badges = style[len(head):len(style) - len(tail)].splitlines()
        assert len(badges) == 7 and all(re.fullmatch(r"\.b-[a-z0-9-]+(, \.b-[a-z0-9-]+)* "
                                                     r"\{ background: var\(--[a-z]+\); \}", b) for b in badges)
    assert "url(" not in css and "@import" not in css  # nothing for the page to fetch


def test_probes_in_order_of_importance_same_ones_folded() -> None:
    records = [f.record("s1", "same"), f.record("err", "error", cache=None, recompute=None),
               f.record("inc", "inconclusive", cache="x", recompute="y"), f.record("s2", "same"),
               f.record("div", "different", cache="abcX", recompute="abcY")]
    page = render_html(make_report(records))
    order = [page.index(x) for x in ('id="group-new"', "<h4>div</h4>", 'id="group-inconclusive"',
                                     "<h4>inc</h4>", 'id="group-errors"', "<h4>err</h4>", 'id="group-same"',
                                     "<h4>s1</h4>", "<h4>s2</h4>")]
    assert order == sorted(order)
    same = page[page.index('<details class="group" id="group-same">'):]
    assert same.index("<h4>s1</h4>") < same.index("</details>", same.index("<h4>s2</h4>"))
    assert "Same (2)" in same and 'id="group-expected"' not in page
    # a same probe shows its answer once; a divergence shows both paths
    assert same.count("turn 2, both paths") == 2 and "turn 2, cache path" not in same
    div = article(page, "probe-4")
    assert "turn 2, cache path" in div and "turn 2, both paths" not in div


def test_expected_divergences_against_a_baseline() -> None:
    before = f.baseline([f.record("old", "different", cache="a1", recompute="a2"), f.record("fresh", "same")])
    now = [f.record("old", "different", cache="b1", recompute="b2"),
           f.record("fresh", "different", cache="c1", recompute="c2"),
           f.record("added", "different", cache="d1", recompute="d2")]
    report = make_report(now, baselines={None: before})
    assert report.summary.status == Status.GATE_FAILED
    page = render_html(report)
    articles = {a: article(page, a) for a in ("probe-0", "probe-1", "probe-2")}
    assert 'class="probe o-different k-expected"' in articles["probe-0"]
    assert '<span class="badge b-expected-divergence">expected divergence</span>' in articles["probe-0"]
    assert "also differed in the baseline" in articles["probe-0"]
    assert 'class="probe o-different k-new"' in articles["probe-1"]
    assert "new divergence" in articles["probe-1"]
    # new since the baseline: as much a new divergence as one that was same there (the item fails too)
    assert 'class="probe o-different k-new"' in articles["probe-2"]
    assert "new probe, absent in the baseline" in articles["probe-2"]
    assert page.index('id="group-new"') < page.index('id="probe-1"') < page.index('id="group-expected"') \
        < page.index('id="probe-0"')
    assert "New divergences (2)" in page and "Expected divergences (1)" in page
    assert "1 probe newly diverged" not in report.summary.why and "2 probes newly diverged" in report.summary.why
    # the chart colours them apart as well
    assert page.count('class="pt-new"') == 2 and page.count('class="pt-expected"') == 1


@pytest.mark.parametrize("extra, why", [
    ({"max_rate": 0.6}, "diverged; the rate gate decides (--cachecheck-max-rate)"),
    ({"baseline": "b.json", "fail_on": "rate-increase"},
     "diverged; the baseline policy rate-increase decides (--cachecheck-fail-on)"),
    ({"baseline": "b.json", "fail_on": "never"}, "diverged; the baseline policy never decides (--cachecheck-fail-on)"),
])
def test_expected_divergences_under_a_gate(extra: Dict[str, Any], why: str) -> None:
    s = f.settings(url=URL, replicas=(URL,), **extra)
    baselines = {None: f.baseline([f.record("alpha-probe", "same")])} if "baseline" in extra else {}
    report = f.report(sample_records(), s=s, baselines=baselines)
    page = render_html(report)
    alpha = article(page, "probe-0")
    assert '<span class="badge b-expected-divergence">expected divergence</span>' in alpha
    assert f"expected: {why}" in alpha
    assert 'id="group-new"' not in page and 'id="group-expected"' in page
    # without a gate the same probe is a new divergence
    plain = render_html(f.report(sample_records(), s=f.settings(url=URL, replicas=(URL,))))
    assert 'class="probe o-different k-new"' in plain and "expected divergence" not in plain


# --------------------------------------------------------------------------- the chart

def chart_marks(page: str, ident: str = "chart") -> Dict[str, Dict[str, float]]:
    """Per probe anchor: the mark's y (cy: both paths' margins added), or the no-margin mark's y."""
    svg = page[page.index(f'<svg class="chart" id="{ident}"'):]
    svg = svg[:svg.index("</svg>")]
    out: Dict[str, Dict[str, float]] = {}
    for anchor, body in re.findall(r'<a href="#([^"]+)">(.*?)</a>', svg):
        marks: Dict[str, float] = {}
        m = re.search(r'<circle [^>]*cy="([0-9.]+)"', body)
        if m:
            marks["sum"] = float(m.group(1))
        m = re.search(r'<path [^>]*d="M([0-9.]+) ([0-9.]+)', body)
        if m:
            marks["strip"] = float(m.group(2)) + 6
        out[anchor] = marks
    return out


def test_chart_places_each_divergence_by_token_and_margin() -> None:
    records = [f.record("tie", "different", cache="xa", recompute="xb", margins=(0.02, 0.05)),
               f.record("gap", "different", cache="ya", recompute="yb", margins=(3.0, 0.5)),
               f.record("blind", "different", cache="za", recompute="zb"),  # a token index, no logprobs
               f.record(f"lost{SCRIPT}", "different", cache="wa", recompute="wb"),
               f.record("bad", "different", cache="va", recompute="vb", margins=(float("nan"), -1.0)),
               f.record("s", "same")]
    records[1].divergence.token = 200  # type: ignore[union-attr]
    records[3].divergence.token = None  # type: ignore[union-attr]
    page = render_html(make_report(records))
    svg = page[page.index('<svg class="chart"'):page.index("</svg>")]
    tie = re.search(r'<line class="tie" [^>]*y1="([0-9.]+)"', svg)
    assert tie is not None
    tie_y = float(tie.group(1))
    marks = chart_marks(page)
    assert set(marks) == {"probe-0", "probe-1", "probe-2", "probe-4"}  # "lost" has no token index
    assert marks["probe-0"]["sum"] > tie_y  # 0.07 together: below the line, a near-tie
    assert marks["probe-1"]["sum"] < tie_y  # 3.5 together: far above it
    assert set(marks["probe-2"]) == {"strip"} and marks["probe-2"]["strip"] > 176  # under the plot
    assert set(marks["probe-4"]) == {"strip"}  # NaN and negative margins are no margins
    assert "nan" not in svg.lower()
    # x: the token index, up to max_tokens
    link = r'<a href="#(probe-[01])"><title>[^<]*</title><circle class="[^"]*" cx="([0-9.]+)"'
    xs = dict(re.findall(link, svg))
    assert float(xs["probe-0"]) < float(xs["probe-1"])
    assert f"near-tie threshold {NEAR_TIE_NATS:g} nats" in svg and "(0 to 256)" in svg
    assert "tie: token 3, margin 0.02 (cache) and 0.05 (recompute) nats: near-tie" in svg
    assert "gap: token 200, margin 3 (cache) and 0.5 (recompute) nats: large-gap" in svg
    caption = page[page.index("<figcaption>"):page.index("</figcaption>")]
    assert "Not placed (no token index): <a href=\"#probe-3\">lost&lt;script&gt;" in caption
    assert "<script" not in page
    ids = element_ids(page)
    assert set(re.findall(r'href="#([^"]*)"', page)) <= set(ids)
    # no divergence, no chart
    assert "<svg" not in render_html(make_report([f.record("s", "same")]))


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
    result = summarise(s, [KindInput(PROBE, f.PROBE_SET, ["alpha-probe", "beta-probe"], {r.key: r for r in records})],
                       inputs, baselines or {}, False)
    report = result.report(1)
    report.created = "2026-12-05T00:00:00Z"
    return report


def element_ids(page: str) -> List[str]:
    return re.findall(r'\sid="([^"]*)"', page)


def probe_anchors(page: str) -> Dict[str, str]:
    """The label of each probe section (``<id>@<target>`` in a matrix) -> its anchor."""
    found = re.findall(r'<article class="probe [^"]*" id="([^"]+)"><div class="probe-head"><h4>([^<]*)</h4>',
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
    # the index: one row per probe id, one linked outcome per target (and the divergence's tag)
    assert (f'<tr><td>alpha-probe</td><td><a href="#{by_label["alpha-probe@a"]}" title="alpha-probe@a">'
            f'<span class="badge b-same">same</span></a></td><td><a href="#{by_label["alpha-probe@b"]}" '
            f'title="alpha-probe@b"><span class="badge b-different">different</span>'
            f'<span class="badge b-new-divergence">new divergence</span></a></td></tr>') in page
    # probes grouped by target, in target order, each in its target's section
    assert page.index('id="target-0"') < page.index('<h3 id="probes-0">Probes on a (2)</h3>') \
        < page.index("<h4>alpha-probe@a</h4>") < page.index('id="target-1"') \
        < page.index('<h3 id="probes-1">Probes on b (2)</h3>') < page.index("<h4>alpha-probe@b</h4>")
    assert "<pre>Hello world, the answer is 4<mark>2.</mark></pre>" in page


def test_matrix_verdict_per_target() -> None:
    page = render_html(matrix())
    box = page[page.index('id="verdict"'):page.index("</div>", page.index('id="verdict"'))]
    assert box.startswith('id="verdict"><span class="word fail">FAIL</span><span class="badge b-diverged">')
    assert ('<li id="verdict-0"><span class="word pass">PASS</span><a href="#target-0">a</a> '
            '<span class="badge b-passed">passed</span>') in box
    assert ('<li id="verdict-1"><span class="word fail">FAIL</span><a href="#target-1">b</a> '
            '<span class="badge b-diverged">diverged</span>') in box
    b_line = box[box.index('id="verdict-1"'):]
    anchor = probe_anchors(page)["alpha-probe@b"]
    assert f'new divergences (1): <a href="#{anchor}">alpha-probe@b</a>' in b_line
    assert "<title>pytest-cachecheck: FAIL (diverged) (target matrix)</title>" in page


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
    assert "1 diverged only here, 0 only on a (McNemar p = 1.000)" in row_b
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
    top = page[page.index("<h2>Summary</h2>"):page.index('id="targets"')]
    assert '<a href="#setup-warnings-1">b (1)</a>' in top  # the summary points at the target's warnings
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
    assert "<h4>p@x</h4>" in page and "<h4>q@x</h4>" in page and "Probes on y (0)" in page
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
        assert f"<h4>{pid}@a</h4>" in page and f"<h4>{pid}@b</h4>" in page
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


def png_top(data: bytes, rows: int) -> Tuple[int, int, bytes]:
    """The first ``rows`` rows of an 8-bit RGB or RGBA PNG (as Chromium writes them): width, bytes per
    pixel and the pixel bytes."""
    pos, idat, head = 8, b"", b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            head = body
        elif kind == b"IDAT":
            idat += body
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", head)
    assert depth == 8 and colour in (2, 6) and interlace == 0
    bpp = 3 if colour == 2 else 4
    stride = width * bpp
    raw = zlib.decompressobj().decompress(idat, (stride + 1) * rows)
    out, prev = bytearray(), bytearray(stride)
    for y in range(min(rows, height)):
        start = y * (stride + 1)
        kind_of_filter, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
            if kind_of_filter == 1:
                line[i] = (line[i] + a) & 255
            elif kind_of_filter == 2:
                line[i] = (line[i] + b) & 255
            elif kind_of_filter == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind_of_filter == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out += line
        prev = line
    return width, bpp, bytes(out)


def count_colour(pixels: bytes, bpp: int, rgb: Tuple[int, int, int]) -> int:
    """How many pixels have this colour (within 2 per channel)."""
    return sum(1 for i in range(0, len(pixels), bpp)
               if all(abs(pixels[i + k] - rgb[k]) <= 2 for k in range(3)))


FAIL_BG, PASS_BG = (0xFF, 0xEB, 0xE9), (0xDA, 0xFB, 0xE1)  # the verdict box's backgrounds


def screenshot(exe: str, tmp_path: Path, url: str, png: Path, size: str = "1200,1600") -> bytes:
    args = [f"--screenshot={png}", f"--window-size={size}", "--hide-scrollbars", "--force-color-profile=srgb"]
    shot = subprocess.run(_chromium_cmd(exe, tmp_path) + args + [url], check=False, capture_output=True,
                          text=True, timeout=180, env=_env(tmp_path))
    assert shot.returncode == 0, shot.stderr[-2000:]
    return png.read_bytes()


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
        assert f"<h4>{pid}</h4>" in html
    assert re.search(r'id="count-probes"><b class="num">4</b>', html)
    assert re.search(r'id="count-same"><b class="num">1</b>', html)
    assert re.search(r'id="count-different"><b class="num">1</b>', html)
    assert "Hello world, the answer is 4<mark>2. &lt;script&gt;" in html
    assert "Hello world, the answer is 4<mark>1.</mark>" in html
    assert "<script" not in html.lower()  # the conversation's script is text, not an element
    assert "regressed" in html and "newly diverged" in html

    assert '<svg class="chart" id="chart"' in html and "<figcaption>" in html  # the chart is in the DOM
    assert '<div class="verdict fail" id="verdict">' in html

    png = tmp_path / "report.png"
    data = screenshot(exe, tmp_path, url, png)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1200, 1600)
    assert len(data) > 40_000, f"screenshot is only {len(data)} bytes: a blank page?"
    # the FAIL box is drawn, red, at the top of the page
    _, bpp, top = png_top(data, 200)
    assert count_colour(top, bpp, FAIL_BG) > 20_000 and count_colour(top, bpp, PASS_BG) == 0
    keep = os.environ.get("CACHECHECK_KEEP_SCREENSHOT")
    if keep:  # to look at it: CACHECHECK_KEEP_SCREENSHOT=/tmp/shot.png (the matrix: /tmp/shot.matrix.png)
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
        assert f"<h4>{label}</h4>" in html
    assert 'id="targets-table"' in html and "50.0%" in html and "9.5% to 90.5%" in html
    assert 'id="vs-reference-1"' in html and "1 diverged only here, 0 only on a" in html
    assert "warned &lt;script&gt;" in html and "<script" not in html.lower()
    assert "hunter22" not in html and "alice" not in html
    ids = element_ids(html)
    assert len(ids) == len(set(ids))
    png = tmp_path / "matrix.png"
    data = screenshot(exe, tmp_path, page.resolve().as_uri(), png, "1200,2400")
    _, bpp, top = png_top(data, 260)
    assert count_colour(top, bpp, FAIL_BG) > 20_000  # the FAIL box, with a line per target
    keep = os.environ.get("CACHECHECK_KEEP_SCREENSHOT")
    if keep:
        shutil.copyfile(png, Path(keep).with_suffix(".matrix.png"))


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


def test_episodes_side_by_side_with_the_parting_step_marked() -> None:
    from pytest_cachecheck.model import EpisodeRecord, EpisodeStep, Outcome, Parting, Path, ToolCall
    from pytest_cachecheck.model import Divergence, EpisodeSummary

    def path(name: str, second: str) -> Path:
        return Path(name=name, ended="user turns ran out",
                    steps=[EpisodeStep(1, "", [ToolCall("get_weather", '{"city": "Oslo"}')], "tool_calls", 40, 12, 0),
                           EpisodeStep(2, second, [], "stop", 60, 9, 51)])

    changed = EpisodeRecord("walk", "builtin:3", "sha256:w", Outcome.DIFFERENT, "parted at step 2",
                            Parting(2, "text", Divergence(6, 2, "a", "b"), 2, 2),
                            paths=[path("cache-1", f"rainy {SCRIPT}"), path("recompute-1", "rainy and cold")])
    same = EpisodeRecord("chat", "builtin:1", "sha256:c", Outcome.SAME, "",
                         paths=[path("cache-1", "ok"), path("recompute-1", "ok")])
    report = make_report([])
    t = report.targets[0]
    t.episodes = [changed, same]
    t.episode_summary = EpisodeSummary.of(t.episodes)
    page = render_html(report)
    assert '<h2 id="episodes">Episodes (2)</h2>' in page and "first parting step: step 2: <b>1</b>" in page
    assert "trajectory change rate <b>50.0%</b>" in page
    article = page[page.index('id="episode-0"'):page.index("</article>", page.index('id="episode-0"'))]
    assert article.count('class="parted"') == 1 and "step 2 (parted)" in article
    assert "get_weather({&quot;city&quot;: &quot;Oslo&quot;})" in article
    assert "<mark>" in article and SCRIPT not in page  # the difference marked, the text escaped
    assert page.index('id="episode-0"') < page.index("Same trajectory (1)")  # changed before the folded same
