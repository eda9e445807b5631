"""The HTML page: escaping, the divergence highlight, no credential leak, atomic writing, and a real
render in headless Chromium (skipped without chromium, except under CI where it must run)."""

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

from pytest_cachecheck.baseline import compare
from pytest_cachecheck.htmlreport import render_html, write_html
from pytest_cachecheck.protocol import excerpt, first_difference
from pytest_cachecheck.redact import Redactor
from pytest_cachecheck.report import Verdict, build_report

SCRIPT = "<script>alert('x')</script>"


def rec(pid: str, outcome: str, cache: Optional[str] = "the same answer",
        recompute: Optional[str] = "the same answer", reason: str = "") -> Dict[str, Any]:
    """A record in the layout of ProbeResult.to_dict, with a real divergence when the answers differ."""
    div = None
    if outcome == "different" and cache is not None and recompute is not None:
        at = first_difference(cache, recompute)
        assert at is not None
        div = {"char": at, "token": 3, "cache_excerpt": excerpt(cache, at),
               "recompute_excerpt": excerpt(recompute, at)}
        reason = reason or f"cache path and recompute path gave different turn-2 answers, from character {at}"
    return {"id": pid, "source": "test:1", "fingerprint": f"sha256:{pid}", "outcome": outcome,
            "reason": reason, "divergence": div, "checks": {},
            "answers": {"turn1": ["turn one", "turn one"], "cache": [cache, cache],
                        "recompute": [recompute, recompute]},
            "requests": [], "duration_s": 0.25}


def make_report(records: List[Dict[str, Any]], url: str = "http://gpu-box:8000/v1") -> Dict[str, Any]:
    settings: Dict[str, Any] = {
        "url": url, "mode": "auto", "nocache_url": None, "model": None, "probe_files": [], "n": None,
        "max_tokens": 256, "hit_tolerance": 32, "skip_hit_check": False, "api_key_set": True,
        "timeout": 300.0, "min_valid": 0.8}
    run = {"settings": settings, "mode": "one-server",
           "server": {"kind": "vllm", "build": "0.34.0", "model": "emu/tiny-chat", "details": {}},
           "nocache_server": None,
           "probe_set": {"name": "builtin", "count": len(records), "fingerprint": "sha256:" + "ab" * 32}}
    return build_report(run, records, [r["id"] for r in records],
                        Verdict("diverged", False, "1 valid probe(s) gave a different turn-2 answer"), 1)


def sample() -> Dict[str, Any]:
    return make_report([
        rec("alpha-probe", "different", cache="Hello world, the answer is 42.",
            recompute="Hello world, the answer is 41."),
        rec("beta-probe", "same"),
        rec("gamma-probe", "inconclusive", cache="x", recompute="y",
            reason="inconclusive: the two cache runs gave different turn-2 answers (from character 0)"),
        rec("delta-probe", "error", cache=None, recompute=None, reason="connection refused"),
    ])


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
    assert report["summary"]["valid"] == 2 and report["summary"]["rate"] == 0.5
    page = render_html(report)
    assert "divergence rate <b>50.0%</b> (1 of 2 valid probes)" in page


def test_conversation_text_is_escaped() -> None:
    report = make_report([
        rec(f"id-{SCRIPT}", "different", cache=f"same start {SCRIPT} tail", recompute=f"same start {SCRIPT}"),
        rec("b", "same", cache=SCRIPT, recompute=SCRIPT, reason=SCRIPT),
    ])
    report["server"]["model"] = SCRIPT
    report["summary"]["why"] = SCRIPT
    page = render_html(report)
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    # the answer that ends where the other goes on gets an explicit end marker
    assert '<mark class="end">(end of answer)</mark>' in page


def test_highlight_starts_at_the_divergence() -> None:
    page = render_html(make_report([rec("p", "different", cache="Hello world, the answer is 42.",
                                        recompute="Hello world, the answer is 41.")]))
    assert "<pre>Hello world, the answer is 4<mark>2.</mark></pre>" in page
    assert "<pre>Hello world, the answer is 4<mark>1.</mark></pre>" in page
    assert "first difference at character 28 (token 3)" in page


def test_highlight_escapes_both_parts() -> None:
    page = render_html(make_report([rec("p", "different", cache="a<b & c>d", recompute="a<b & c>e")]))
    assert "<pre>a&lt;b &amp; c&gt;<mark>d</mark></pre>" in page


def test_highlight_without_divergence_field_is_computed() -> None:
    r = rec("p", "different", cache="abcX", recompute="abcY")
    r["divergence"] = None
    page = render_html(make_report([r]))
    assert "<pre>abc<mark>X</mark></pre>" in page


def test_no_highlight_for_same_and_inconclusive() -> None:
    page = render_html(make_report([rec("s", "same"), rec("i", "inconclusive", cache="x", recompute="y")]))
    assert "<mark" not in page


def test_no_credentials_leak() -> None:
    report = sample()
    report["settings"]["url"] = "http://gpu-box:8000/v1?token=***"
    report["settings"]["nocache_url"] = "http://user:pass@nocache:9000"
    report["settings"]["api_key_set"] = True
    page = render_html(report)
    assert "http://gpu-box:8000/v1?token=***" in page
    assert "user:pass" not in page and "nocache:9000" not in page
    # even a URL with credentials in the settings (not what the plugin writes) is cleaned
    report["settings"]["url"] = "http://user:pass@gpu-box:8000/v1"
    page = render_html(report)
    assert "user:pass" not in page and "http://gpu-box:8000/v1" in page


def test_write_html_scrubs_secrets(tmp_path: Path) -> None:
    red = Redactor(["sk-very-secret"])
    report = make_report([rec("p", "different", cache="key sk-very-secret <i>",
                              recompute="key sk-very-other")])
    path = tmp_path / "r.html"
    write_html(str(path), report, scrub=red.scrub)
    page = path.read_text(encoding="utf-8")
    assert "sk-very-secret" not in page and "***" in page


def test_comparison_table() -> None:
    before = make_report([rec("alpha-probe", "same"), rec("beta-probe", "same"),
                          rec("gone", "different", cache="a", recompute="b")])
    current = sample()
    comparison = compare(before, current, current["probes"]).to_dict()
    page = render_html(current, comparison)
    assert 'id="baseline"' in page and 'id="baseline-rows"' in page
    assert '<span class="badge b-regressed">regressed</span>' in page
    assert "exact McNemar p = 1.000" in page
    assert '<a href="#probe-0">alpha-probe</a></td><td>same</td><td>different</td>' in page
    assert "newly diverged" in page and "not run" in page
    # a Comparison object is accepted as well
    assert render_html(current, compare(before, current, current["probes"])) == page
    assert 'id="baseline"' not in render_html(current)


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
    page = render_html({"schema_version": 1, "probes": [{"id": "x", "outcome": "weird"}]})
    assert "x" in page and "weird" in page
    assert "no probe ran" in render_html({})


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
    before = make_report([rec("alpha-probe", "same"), rec("beta-probe", "same")])
    report = sample()
    report["probes"][0]["answers"]["cache"][0] += " " + SCRIPT  # must show up as text, never run
    page = tmp_path / "report.html"
    write_html(str(page), report, compare(before, report, report["probes"]))
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
    json.dumps(report)  # the report stays JSON-able after rendering


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
