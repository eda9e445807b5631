"""The outputs of fixed runs, byte for byte: the JSON report, the terminal summary, the HTML page and the
JUnit property, normalised only where a run cannot repeat itself (times, ports, temporary paths).

The files under ``tests/golden/`` were written by the code before the result model was typed; a
restructuring must leave them unchanged. ``CACHECHECK_GOLDEN_WRITE=1`` rewrites them (review the diff).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Dict, List

import pytest


GOLDEN = Path(__file__).parent / "golden"
WRITE = os.environ.get("CACHECHECK_GOLDEN_WRITE") == "1"


class Normaliser:
    def __init__(self, tmp: Path, urls: Dict[str, str]) -> None:
        self.subs = [(str(tmp), "TMP")] + [(url, name) for url, name in urls.items()]

    def text(self, text: str) -> str:
        for old, new in self.subs:
            text = text.replace(old, new)
        text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", "CREATED", text)
        text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", "CREATED", text)
        text = re.sub(r" in \d+\.\d+s( \(\d+:\d\d:\d\d\))?", " in TIME", text)
        text = re.sub(r'(["\']duration_s["\']): [0-9.e-]+', r'\1: 0', text)
        text = re.sub(r"\b\d+\.\d\d\d? s\b", "D s", text)
        text = re.sub(r"pytest-cachecheck \d+\.\d+\.\d+\S*", "pytest-cachecheck VERSION", text)
        text = re.sub(r'"version": "\d+\.\d+\.\d+[^"]*"', '"version": "VERSION"', text)
        return text

    def terminal(self, lines: List[str]) -> str:
        keep = []
        for line in lines:
            if re.match(r"(platform |rootdir:|plugins:|cachedir:|configfile:|benchmark:|cachecheck: reproduce with)", line):
                continue
            keep.append(line)
        text = self.text("\n".join(keep))
        # the closing line's padding depends on how long the run took
        return re.sub(r"(?m)^=+ (.* in TIME) =+$", r"== \1 ==", text) + "\n"


def compare(name: str, actual: str) -> None:
    path = GOLDEN / name
    if WRITE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(actual, encoding="utf-8")
        return
    expected = path.read_text(encoding="utf-8")
    assert actual == expected, f"{name} differs from tests/golden/{name}"


def junit_properties(path: Path) -> str:
    import xml.etree.ElementTree as ET

    root = ET.parse(path).getroot()
    return "\n".join(f"{case.get('name')}: {prop.get('value')}" for case in root.iter("testcase")
                     for prop in case.iter("property") if prop.get("name") == "cachecheck") + "\n"


@pytest.fixture(autouse=True)
def _same_terminal(monkeypatch):
    """pytest prints the short summary whole when it believes it runs on CI (``CI``, ``BUILD_NUMBER``)
    and cut to the terminal's width otherwise: pin both, so the goldens hold everywhere."""
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("BUILD_NUMBER", raising=False)
    monkeypatch.setenv("COLUMNS", "80")


def _pretty(text: str) -> str:
    return json.dumps(json.loads(text), indent=2, ensure_ascii=False, sort_keys=False) + "\n"


def test_one_server_with_baseline(pytester, emulator):
    clean = emulator()
    flips = emulator(diverge_on_hit={"bicycle"}, fault={20: "500"})  # bike-chain diverges; probe 4 errors
    norm = Normaliser(pytester.path, {clean.url: "http://CLEAN", flips.url: "http://FLIPS"})
    common = ["--cachecheck-n=6", "-p", "no:cacheprovider", "-rA"]
    first = pytester.runpytest_subprocess(f"--cachecheck-url={clean.url}", *common,
                                          "--cachecheck-report=before.json")
    assert first.ret == 0
    after = pytester.runpytest_subprocess(f"--cachecheck-url={flips.url}", *common,
                                          "--cachecheck-baseline=before.json", "--cachecheck-report=after.json",
                                          "--cachecheck-html=after.html", "--junitxml=junit.xml")
    assert after.ret == 1
    compare("one-server.before.json", norm.text((pytester.path / "before.json").read_text()))
    compare("one-server.after.json", norm.text((pytester.path / "after.json").read_text()))
    compare("one-server.after.html", norm.text((pytester.path / "after.html").read_text()))
    compare("one-server.after.txt", norm.terminal(after.stdout.lines))
    compare("one-server.junit.txt", norm.text(junit_properties(pytester.path / "junit.xml")))


def test_target_matrix_with_baseline(pytester, emulator):
    a, b, c = emulator(), emulator(diverge_on_hit={"bicycle"}), emulator(honor_salt=False)
    norm = Normaliser(pytester.path, {a.url: "http://A", b.url: "http://B", c.url: "http://C"})
    common = ["--cachecheck-n=4", "-p", "no:cacheprovider"]
    first = pytester.runpytest_subprocess(f"--cachecheck-url={a.url}", *common, "--cachecheck-report=base.json")
    assert first.ret == 0
    run = pytester.runpytest_subprocess(f"--cachecheck-target=a={a.url}", f"--cachecheck-target=b={b.url}",
                                        f"--cachecheck-target=c={c.url}", *common, "--cachecheck-min-valid=0",
                                        "--cachecheck-baseline=base.json", "--cachecheck-report=matrix.json",
                                        "--cachecheck-html=matrix.html")
    assert run.ret == 1
    compare("matrix.json", norm.text((pytester.path / "matrix.json").read_text()))
    compare("matrix.html", norm.text((pytester.path / "matrix.html").read_text()))
    compare("matrix.txt", norm.terminal(run.stdout.lines))


def test_gated_run_and_check_records(pytester, emulator):
    emu = emulator(diverge_on_hit={"bicycle"})
    norm = Normaliser(pytester.path, {emu.url: "http://EMU"})
    pytester.makepyfile(test_own="""
        def test_own(cachecheck):
            result = cachecheck.check(turn1="Describe a bicycle chain in three sentences.", turn2="Shorter.")
            assert result.valid
    """)
    run = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", "--cachecheck-n=3", "-p", "no:cacheprovider",
                                        "--cachecheck-max-rate=0.2", "--cachecheck-report=gated.json", "-rA")
    assert run.ret == 1
    compare("gated.json", norm.text((pytester.path / "gated.json").read_text()))
    compare("gated.txt", norm.terminal(run.stdout.lines))
