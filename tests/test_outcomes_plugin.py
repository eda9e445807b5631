"""Outcome checks in real plugin runs against the emulator: a flip is a failure whose message starts with the
flip (in pytest, JUnit, the JSON report and the HTML page), the summary's accuracies and flips agree with a
count made here from the raw answers, ``--cachecheck-gate-on flips`` passes a text-only divergence and fails a
flip, ``--cachecheck-max-flip-rate`` decides by rate, a bad ``expect`` is a usage error before any request, the
fixture's judge reports the same way, and the checks reach xdist workers.

The emulator answers deterministically, so a first run without checks shows the answers a probe gets on each
path; the checks of the second run are chosen from them (a word only one path's answer has)."""

from __future__ import annotations

import json
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from pytest_cachecheck.probes import named_probes

FAST = ["-p", "no:cacheprovider", "-p", "no:randomly"]
MARK = "MARKER-flip"
CONVERSATIONS = [  # id, turn 1, turn 2; the marked ones answer differently on a cache hit
    ("flip-down", f"Describe a lighthouse in three sentences. {MARK}", "Make it shorter."),
    ("flip-up", f"Describe a windmill in three sentences. {MARK}", "Make it shorter."),
    ("text-only", f"Describe a harbour in three sentences. {MARK}", "Make it shorter."),
    ("steady", "Describe a meadow in three sentences.", "Make it shorter."),
]


def write_probes(path: Path, expects: Dict[str, Any]) -> None:
    path.write_text("".join(json.dumps({"id": pid, "turn1": t1, "turn2": t2,
                                        **({"expect": expects[pid]} if pid in expects else {})}) + "\n"
                            for pid, t1, t2 in CONVERSATIONS))


def only_in(a: str, b: str) -> str:
    """A word of answer ``a`` that answer ``b`` does not contain."""
    return next(w for w in a.split() if w not in b)


@pytest.fixture
def flipping(pytester: pytest.Pytester, emulator: Any) -> Tuple[Any, Dict[str, Any]]:
    """The emulator, and checks that flip 'flip-down' (the cache path fails), flip 'flip-up' (the cache path
    passes), pass on both paths of 'text-only' and of 'steady', chosen from a first run's answers."""
    emu = emulator(diverge_on_hit={MARK})
    write_probes(pytester.path / "plain.jsonl", {})
    first = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", "--cachecheck-probes=plain.jsonl",
                                          "--cachecheck-report=plain.json", *FAST)
    assert first.ret == 1
    answers = {p["id"]: p["answers"] for p in json.loads((pytester.path / "plain.json").read_text())["probes"]}
    assert all(a["cache"][0] != a["recompute"][0] for pid, a in answers.items() if pid != "steady")
    down, up = answers["flip-down"], answers["flip-up"]
    expects = {"flip-down": {"contains": only_in(down["recompute"][0], down["cache"][0])},
               "flip-up": [{"regex": "[a-z]"}, {"contains": only_in(up["cache"][0], up["recompute"][0])}],
               "text-only": {"regex": "^[a-z]"}, "steady": {"not_contains": "DEFINITELY-ABSENT"}}
    write_probes(pytester.path / "checked.jsonl", expects)
    return emu, expects


def independent_count(report: Dict[str, Any], expects: Dict[str, Any]) -> Dict[str, Any]:
    """Accuracy and flips counted here, from the raw answers (first repetition of each path), with the checks'
    meaning written out again (not with the plugin's code)."""
    import re

    def passes(spec: Any, text: str) -> bool:
        specs = spec if isinstance(spec, list) else [spec]
        ok = True
        for one in specs:
            for kind, arg in one.items():
                ok &= {"contains": lambda: arg in text, "not_contains": lambda: arg not in text,
                       "regex": lambda: re.search(arg, text) is not None}[kind]()
        return ok

    counts = {"items": 0, "cache_passed": 0, "recompute_passed": 0, "cache_fails": 0, "cache_passes": 0}
    for p in report["probes"]:
        if p["id"] not in expects or p["outcome"] not in ("same", "different"):
            continue
        cache, recompute = (passes(expects[p["id"]], p["answers"][k][0]) for k in ("cache", "recompute"))
        counts["items"] += 1
        counts["cache_passed"] += cache
        counts["recompute_passed"] += recompute
        counts["cache_fails"] += recompute and not cache
        counts["cache_passes"] += cache and not recompute
    return counts


def test_flip_fails_first_in_every_output(pytester: pytest.Pytester, flipping: Any) -> None:
    emu, expects = flipping
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", "--cachecheck-probes=checked.jsonl",
                                           "--cachecheck-report=r.json", "--cachecheck-html=r.html",
                                           "--junitxml=j.xml", "-rA", *FAST)
    assert result.ret == 1
    result.assert_outcomes(passed=1, failed=4)  # 3 divergences (2 flips) and the gate
    result.stdout.fnmatch_lines([
        "_*_ probe[[]flip-down[]] _*_", "outcome flipped: the cache path fails `contains '*'` (not in the answer); "
        "the recompute path passes", "cache path and recompute path gave different turn-2 answers, *"])
    result.stdout.fnmatch_lines([
        "_*_ probe[[]flip-up[]] _*_", "outcome flipped: the recompute path fails `contains '*'` (not in the "
        "answer); the cache path passes"])
    result.stdout.fnmatch_lines(["_*_ probe[[]text-only[]] _*_", "cache path and recompute path gave different*"])
    result.stdout.fnmatch_lines([
        "outcome checks: 4 valid probes with checks | accuracy: cache path 3/4 (75.0%), recompute path 3/4 "
        "(75.0%) | flips: 1 cache fails, 1 cache passes (exact McNemar p = 1.000)",
        "flipped: flip-down, flip-up",
        "cachecheck verdict: FAIL (diverged): 3 valid probes gave a different turn-2 answer (2 flipped the outcome "
        "of their checks)"])
    report = json.loads((pytester.path / "r.json").read_text())
    summary = report["targets"][0]["check_summary"]
    assert {k: summary[k] for k in independent_count(report, expects)} == independent_count(report, expects)
    assert summary["flipped"] == ["flip-down", "flip-up"] and summary["mcnemar_p"] == 1.0
    by_id = {p["id"]: p for p in report["probes"]}
    assert by_id["flip-down"]["check_results"]["flip"] == "cache-fails"
    assert by_id["flip-up"]["check_results"]["flip"] == "cache-passes"
    assert by_id["text-only"]["check_results"]["flip"] is None and by_id["text-only"]["outcome"] == "different"
    assert by_id["steady"]["check_results"]["cache"] == {"passed": True, "reason": ""}
    cases = {c.get("name"): c for c in ET.parse(pytester.path / "j.xml").getroot().iter("testcase")}
    failure = cases["probe[flip-down]"].find("failure")
    assert failure is not None and failure.get("message", "").startswith(
        "Failed: outcome flipped: the cache path fails")
    props = {p.get("name"): p.get("value") for p in cases["probe[flip-down]"].iter("property")}
    assert props["cachecheck_flip"].startswith("cache-fails: outcome flipped: the cache path fails `contains")
    assert "cachecheck_flip" not in {p.get("name") for p in cases["probe[text-only]"].iter("property")}
    page = (pytester.path / "r.html").read_text()
    assert page.count('class="badge b-flipped"') >= 4  # two heads, two flip lines
    assert "flipped outcomes (2): " in page and 'id="checks"' in page
    assert "outcome flipped: the cache path fails <code>" not in page  # text, escaped, not markup


def test_gate_on_flips(pytester: pytest.Pytester, flipping: Any) -> None:
    emu, _ = flipping
    args = [f"--cachecheck-url={emu.url}", "--cachecheck-probes=checked.jsonl", "-rA", *FAST]
    result = pytester.runpytest_subprocess(*args, "--cachecheck-gate-on=flips", "--cachecheck-report=r.json")
    result.assert_outcomes(passed=1, failed=3, xfailed=1)
    out = result.stdout.str()
    assert "XFAIL cachecheck::probe[text-only] - a divergence that flipped no outcome" in out
    assert "cachecheck verdict: FAIL (diverged): 2 valid probes flipped the outcome of their checks" in out
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["settings"]["gate_on"] == "flips"
    assert report["summary"]["status"] == "diverged"

    tolerant = pytester.runpytest_subprocess(*args, "--cachecheck-max-flip-rate=0.5")
    tolerant.assert_outcomes(passed=2, xfailed=3)
    assert tolerant.ret == 0
    assert "cachecheck verdict: PASS (passed): probe flip rate 50.0% is within --cachecheck-max-flip-rate 0.5" \
        in tolerant.stdout.str()
    strict = pytester.runpytest_subprocess(*args, "--cachecheck-max-flip-rate=0.25")
    strict.assert_outcomes(passed=1, failed=1, xfailed=3)
    assert "FAIL (gate-failed): probe flip rate 50.0% (2 of 4) exceeds --cachecheck-max-flip-rate 0.25" \
        in strict.stdout.str()


def test_gate_on_flips_without_checks_fails(pytester: pytest.Pytester, emulator: Any) -> None:
    emu = emulator()
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", "--cachecheck-n=2",
                                           "--cachecheck-gate-on=flips", *FAST)
    assert result.ret == 1
    assert "FAIL (gate-failed): --cachecheck-gate-on flips: no valid probe or episode has outcome checks" \
        in result.stdout.str()


@pytest.mark.parametrize("args, words", [
    (["--cachecheck-gate-on=outcomes"], "--cachecheck-gate-on (ini cachecheck_gate_on): 'outcomes' is not allowed"),
    (["--cachecheck-max-flip-rate=2"], "--cachecheck-max-flip-rate (ini cachecheck_max_flip_rate): '2' is not"),
    (["--cachecheck-max-flip-rate=0.1", "--cachecheck-gate-on=divergence"], "conflicts with --cachecheck-gate-on"),
    (["--cachecheck-max-flip-rate=0.1", "--cachecheck-record=b.json"], "it conflicts with --cachecheck-max-flip"),
])
def test_bad_gate_options_are_usage_errors(pytester: pytest.Pytester, emulator: Any, args: List[str],
                                           words: str) -> None:
    emu = emulator()
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *args, *FAST)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert words in result.stderr.str()
    assert emu.served_requests == 0


def test_bad_expect_is_a_usage_error_before_any_request(pytester: pytest.Pytester, emulator: Any) -> None:
    emu = emulator()
    (pytester.path / "mine.jsonl").write_text('{"turn1": "a", "turn2": "b"}\n'
                                              '{"turn1": "a", "turn2": "b", "expect": {"regex": "(x"}}\n')
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", "--cachecheck-probes=mine.jsonl", *FAST)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--cachecheck-probes: bad probe file: *mine.jsonl:2: field 'expect.regex': not a "
                                 "valid Python regular expression*"])
    assert emu.served_requests == 0


JUDGED = textwrap.dedent("""
    import pytest
    from pytest_cachecheck.errors import JudgeError

    T1, T2 = "Describe a lighthouse in three sentences. MARKER-flip", "Make it shorter."

    def test_judged(cachecheck):
        first = cachecheck.check(turn1=T1, turn2=T2)
        word = next(w for w in first.recompute_answer.split() if w not in first.cache_answer)

        def mentions(answer):
            assert word in answer, f"no {word!r}"
            return True

        result = cachecheck.check(turn1=T1, turn2=T2, judge=mentions, id="judged")
        assert result.flip == "cache-fails"
        assert result.message().startswith(f"outcome flipped: the cache path fails `judge test_judged.<locals>."
                                            f"mentions` (no {word!r}); the recompute path passes")

    def test_broken_judge(cachecheck):
        with pytest.raises(JudgeError, match="ZeroDivisionError"):
            cachecheck.check(turn1=T1, turn2=T2, judge=lambda answer: 1 / 0, id="broken")

    def test_declared(cachecheck):
        assert cachecheck.check(turn1=T1, turn2=T2, expect={"regex": "[a-z]"}, id="declared").flip is None
""")


def test_fixture_judge_reports_the_same_way(pytester: pytest.Pytester, emulator: Any) -> None:
    emu = emulator(diverge_on_hit={MARK})
    pytester.makepyfile(test_judged=JUDGED)
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", "--cachecheck-n=1",
                                           "--cachecheck-report=r.json", "-k", "judged or broken or declared", *FAST)
    result.assert_outcomes(passed=3, deselected=1)
    checks = {c["id"]: c for c in json.loads((pytester.path / "r.json").read_text())["checks"]}
    assert checks["judged"]["check_results"]["flip"] == "cache-fails"
    # the summary counts the tests' own measurements and their flips (each test decided its own outcome)
    result.stdout.fnmatch_lines(["tests' own measurements (cachecheck.check(), .episode()): 4 | valid: 4 (same 0, "
                                 "different 4) | inconclusive: 0 | errors: 0",
                                 "outcome checks: 2 valid measurements with checks | accuracy: cache path 1/2 "
                                 "(50.0%), recompute path 2/2 (100.0%) | flips: 1 cache fails, 0 cache passes *",
                                 "flipped: judged", "outcome checks: 1 measurement whose check could not be evaluated"])
    assert checks["broken"]["check_results"]["cache"]["passed"] is None  # an error of the check, kept
    assert checks["broken"]["check_results"]["flip"] is None
    assert checks["declared"]["check_results"]["checks"] == ["regex '[a-z]'"]


def test_task_sets_under_xdist_keep_their_checks(pytester: pytest.Pytester, emulator: Any) -> None:
    pytest.importorskip("xdist")
    emu = emulator()
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", "--cachecheck-probes=tasks",
                                           "--cachecheck-episodes=tasks", "--cachecheck-max-tokens=96",
                                           "--cachecheck-report=r.json", "-n", "2", *FAST)
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["probe_set"]["name"] == "tasks" and report["episode_set"]["name"] == "tasks"
    assert [p["id"] for p in report["probes"]] == [p.id for p in named_probes("tasks")]
    assert all(p["check_results"]["checks"] for p in report["probes"] + report["episodes"])
    assert report["targets"][0]["check_summary"]["items"] == report["summary"]["valid"]
    assert "episode_check_summary" in report["targets"][0], result.stdout.str()[-2000:]
    result.stdout.fnmatch_lines(["*outcome checks: * valid probes with checks | accuracy: cache path *",
                                 "*outcome checks: * valid episode* with checks | accuracy: *"])
