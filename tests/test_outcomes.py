"""The outcome checks (``expect``) without a server: every kind passing and failing, the load errors (file,
line, field), the flip and its direction, the tallies, the expectation rule under ``--cachecheck-gate-on
flips`` and the verdict's words."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, List

import pytest

from pytest_cachecheck.episodes import load_episodes, parse_episode
from pytest_cachecheck.model import (
    CACHE_FAILS,
    CACHE_PASSES,
    CheckResult,
    CheckResults,
    CheckTally,
    EpisodeRecord,
    EpisodeStep,
    Outcome,
    ProbeRecord,
    Request,
    Status,
    Tally,
    ToolCall,
)
from pytest_cachecheck.model import Path as EpisodePath
from pytest_cachecheck.outcomes import Answer, Expect, Judge, parse_expect
from pytest_cachecheck.probes import ProbeFileError, load_probe_file, load_probes, named_probes
from pytest_cachecheck.kinds import EPISODE as EPISODE_KIND, PROBE as PROBE_KIND
from pytest_cachecheck.run import Count, expectation, judge
from pytest_cachecheck.settings import Settings
from pytest_cachecheck.stats import mcnemar_exact


def expect(value: Any, episode: bool = False) -> Expect:
    return parse_expect(value, lambda f, why: ValueError(f"{f}: {why}"), episode=episode)


def failure(value: Any, text: str = "", calls: Any = ()) -> Any:
    result = expect(value, episode=True).evaluate(Answer(text, tuple(calls)))
    return None if result.passed else result.reason


PASS_FAIL = [
    ({"contains": "some words"}, "here are some words.", "here are some other words"),
    ({"not_contains": "sorry"}, "Sure, here it is.", "I am sorry, I cannot."),
    ({"regex": r"^\d{4}-\d{2}-\d{2}$"}, "2026-06-05", "5 June 2026"),
    ({"equals": "New  York\ncity"}, "  New York city\n", "New York City"),
    ({"number": {"value": 12.95, "tolerance": 0.01}}, "The total is 12.95 euros (or 13).", "about 13 euros"),
    ({"number": {"value": 15}}, "15", "no number here"),
    ({"number": {"value": -3}}, "it is -3 degrees", "it is 3 degrees"),
    ({"json": True}, '```json\n{"a": 1}\n```', "{a: 1}"),
    ({"json": {"required_keys": ["name", "age"]}}, ' {"name": "Ada", "age": 34} ', '{"name": "Ada"}'),
    ({"json": {"required_keys": ["name"]}}, '{"name": 1}', '["name"]'),
    ({"one_of": ["positive", "negative"]}, " negative\n", "Negative."),
    ({"contains": "a", "not_contains": "b"}, "a", "a b"),
    ([{"contains": "a"}, {"contains": "c"}], "a c", "a"),
]


@pytest.mark.parametrize("spec, good, bad", PASS_FAIL)
def test_each_kind_passes_and_fails(spec: Any, good: str, bad: str) -> None:
    assert failure(spec, good) is None
    why = failure(spec, bad)
    assert why is not None and why.startswith("`"), why


def test_failure_names_the_first_failing_check_and_why() -> None:
    assert failure({"contains": "x", "number": {"value": 2}}, "x is 3") == "`number 2 ± 0` (the first number is 3)"
    assert failure({"contains": "Paris"}, "Lyon") == "`contains 'Paris'` (not in the answer)"
    assert failure({"one_of": ["spam"]}, " Spam ") == "`one of 'spam'` (the answer is 'Spam')"
    assert "found at character 3" in failure({"not_contains": "bad"}, "so bad")


CALLS = [(1, "get_weather", '{"city": "Oslo", "day": "today"}'), (3, "get_weather", '{"city":"Oslo","day":"tomorrow"}'),
         (4, "calculate", "not json")]


@pytest.mark.parametrize("spec, passes", [
    ({"name": "get_weather"}, True),
    ({"name": "get_weather", "arguments": {"day": "tomorrow"}}, True),  # a subset, at any step
    ({"name": "get_weather", "arguments": {"day": "tomorrow"}, "step": 3}, True),
    ({"name": "get_weather", "arguments": {"day": "tomorrow"}, "step": 1}, False),
    ({"name": "get_weather", "arguments": {"city": "Oslo", "day": "today", "unit": "C"}}, False),
    ({"name": "get_weather", "step": 2}, False),
    ({"name": "calculate", "arguments": {"expression": "1"}}, False),  # arguments that are not JSON
    ({"name": "read_file"}, False),
])
def test_tool_called(spec: Any, passes: bool) -> None:
    why = failure({"tool_called": spec}, "", CALLS)
    assert (why is None) is passes, why
    if not passes:
        assert why.startswith("`tool_called 'get_weather'") or "no call of" in why or "was called with" in why


def test_tool_called_without_any_call_says_so() -> None:
    assert failure({"tool_called": {"name": "x"}}, "text") == "`tool_called 'x'` (no call of 'x' (no tool call at all))"


def test_judge_pass_fail_and_error() -> None:
    def is_short(answer: str) -> bool:
        assert len(answer) < 5, f"{len(answer)} characters"
        return True

    j = Expect(()).plus(Judge(is_short))
    assert j.evaluate(Answer("abc")) == CheckResult(True)
    assert j.evaluate(Answer("abcdefgh")) == CheckResult(False, "`judge test_judge_pass_fail_and_error.<locals>."
                                                               "is_short` (8 characters)")
    assert Expect((Judge(lambda a: 0),)).evaluate(Answer("x")).reason.endswith("(returned 0)")
    broken = Expect((Judge(lambda a: 1 / 0),)).evaluate(Answer("x"))
    assert broken.passed is None and "raised ZeroDivisionError" in broken.reason


# -- flips and tallies ------------------------------------------------------------------------------------
def probe_record(pid: str, outcome: Outcome, cache: str, recompute: str) -> ProbeRecord:
    return ProbeRecord(pid, "f:1", "sha256:x", outcome, requests=[
        Request("cache-1/turn-2", "cache", cache, "stop", 1, 1, 0), Request("recompute-1/turn-2", "cache", recompute,
                                                                           "stop", 1, 1, 0)])


def test_flip_directions_and_message() -> None:
    e = expect({"contains": "x"})
    r = probe_record("p", Outcome.DIFFERENT, "no", "x")
    r.check_results = e.judge(r)
    assert r.flip == CACHE_FAILS and r.flipped
    r.reason = "cache path and recompute path gave different turn-2 answers"
    assert r.message() == ("outcome flipped: the cache path fails `contains 'x'` (not in the answer); the "
                           "recompute path passes\ncache path and recompute path gave different turn-2 answers")
    r2 = probe_record("q", Outcome.DIFFERENT, "x", "no")
    r2.check_results = e.judge(r2)
    assert r2.flip == CACHE_PASSES and r2.message().startswith("outcome flipped: the recompute path fails")
    same = probe_record("s", Outcome.DIFFERENT, "x1", "x2")  # a text-only divergence
    same.check_results = e.judge(same)
    assert same.flip is None and same.message() == ""
    invalid = probe_record("i", Outcome.INCONCLUSIVE, "no", "x")
    invalid.check_results = e.judge(invalid)
    assert invalid.check_results.cache is None and invalid.flip is None
    back = ProbeRecord.from_json(json.loads(json.dumps(r.to_json())))
    assert back.check_results == r.check_results and back.to_json()["check_results"]["flip"] == CACHE_FAILS


def test_check_error_is_never_a_flip() -> None:
    c = CheckResults(["judge f"], CheckResult(None, "f raised"), CheckResult(True))
    assert c.flip is None and c.error == "f raised"


def test_tally_counts_accuracy_flips_and_mcnemar() -> None:
    e = expect({"contains": "x"})
    rows = [("a", Outcome.DIFFERENT, "no", "x"), ("b", Outcome.DIFFERENT, "no", "x"), ("c", Outcome.DIFFERENT, "x", "no"),
            ("d", Outcome.SAME, "x", "x"), ("e", Outcome.SAME, "n", "n"), ("f", Outcome.INCONCLUSIVE, "x", "n")]
    records = []
    for pid, outcome, cache, recompute in rows:
        r = probe_record(pid, outcome, cache, recompute)
        r.check_results = e.judge(r)
        records.append(r)
    records.append(probe_record("g", Outcome.SAME, "x", "x"))  # no checks: not counted
    t = CheckTally.of(records)
    assert t is not None
    assert (t.items, t.cache_passed, t.recompute_passed, t.cache_fails, t.cache_passes) == (5, 2, 3, 2, 1)
    assert t.accuracy("cache") == 0.4 and t.accuracy("recompute") == 0.6
    assert t.flipped == ["a", "b", "c"] and t.mcnemar_p == mcnemar_exact(2, 1)
    assert CheckTally.of(records[-1:]) is None


def test_episode_answers_final_text_and_calls() -> None:
    def path(name: str, day: str) -> EpisodePath:
        return EpisodePath(name=name, steps=[
            EpisodeStep(1, "", [ToolCall("get_weather", f'{{"day": "{day}"}}')], "tool_calls", 1, 1, 0),
            EpisodeStep(2, "It rains.", [], "stop", 1, 1, 0)])

    rec = EpisodeRecord("e", "f:1", "sha256:x", Outcome.DIFFERENT,
                        paths=[path("cache-1", "today"), path("recompute-1", "tomorrow")])
    e = expect([{"tool_called": {"name": "get_weather", "arguments": {"day": "tomorrow"}}}, {"contains": "rains"}],
               episode=True)
    rec.check_results = e.judge(rec)
    assert rec.flip == CACHE_FAILS
    assert "was called with" in rec.check_results.cache.reason


# -- reading expect: errors name the file, the line and the field --------------------------------------------
LOAD_ERRORS = [
    ({"regex": "(unclosed"}, "expect.regex", "not a valid Python regular expression"),
    ({"contains": 3}, "expect.contains", "must be a string"),
    ({"contains": ""}, "expect.contains", "must not be empty"),
    ({"startswith": "x"}, "expect", "unknown check \"startswith\"; the checks are contains"),
    ([{"contains": "a"}, {"number": {"value": "1"}}], "expect[1].number.value", "must be a number"),
    ({"number": {"value": 1, "tolerance": -1}}, "expect.number.tolerance", "must not be negative"),
    ({"number": 3}, "expect.number", '{"value": x'),
    ({"json": False}, "expect.json", "must be true or"),
    ({"json": {"required_keys": []}}, "expect.json.required_keys", "non-empty list"),
    ({"one_of": []}, "expect.one_of", "non-empty list"),
    ({"one_of": ["a", 1]}, "expect.one_of[1]", "must be a string"),
    ({"tool_called": {"name": "x"}}, "expect.tool_called", "goes with episodes"),
    ([], "expect", "must not be an empty list"),
    ({}, "expect", "at least one check"),
    ("contains x", "expect", "must be an object of checks"),
    ({"number": {"value": 1e400}}, "expect.number.value", "is not allowed here"),
]


@pytest.mark.parametrize("spec, field, words", LOAD_ERRORS)
def test_probe_file_load_error_names_file_line_field(tmp_path: Path, spec: Any, field: str, words: str) -> None:
    path = tmp_path / "mine.jsonl"
    lines = [{"turn1": "a", "turn2": "b"}, {"turn1": "c", "turn2": "d", "expect": spec}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    with pytest.raises(ProbeFileError) as err:
        load_probe_file(path)
    assert (err.value.path, err.value.line, err.value.field) == (str(path), 2, field)
    assert words in err.value.problem
    assert str(err.value).startswith(f"{path}:2: field '{field}': ")


def test_duplicate_key_inside_expect_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "dup.jsonl"
    path.write_text('{"turn1": "a", "turn2": "b", "expect": {"contains": "x", "contains": "y"}}\n')
    with pytest.raises(ProbeFileError, match=r"dup.jsonl:1: field 'expect.contains': appears more than once"):
        load_probe_file(path)


EPISODE = {"messages": [{"role": "user", "content": "hi"}],
           "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
           "tool_results": {"f": "ok"}}


@pytest.mark.parametrize("spec, field, words", [
    ({"tool_called": {"name": "f", "step": 0}}, "expect.tool_called.step", "a whole number from 1"),
    ({"tool_called": {"name": "f", "arguments": []}}, "expect.tool_called.arguments", "must be an object"),
    ({"tool_called": {"arguments": {}}}, "expect.tool_called", '{"name": ...'),
    ({"tool_called": {"name": "f", "when": 1}}, "expect.tool_called", '{"name": ...'),
])
def test_episode_load_errors(tmp_path: Path, spec: Any, field: str, words: str) -> None:
    path = tmp_path / "eps.jsonl"
    path.write_text(json.dumps(dict(EPISODE, expect=spec)) + "\n")
    with pytest.raises(ProbeFileError) as err:
        load_episodes([str(path)])
    assert (err.value.line, err.value.field) == (1, field) and words in err.value.problem


def test_simplest_form_as_written_and_fingerprints_ignore_checks(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a", "turn1": "x", "turn2": "y", "expect": {"contains": "some words"}}\n'
                    '{"id": "b", "turn1": "x", "turn2": "y"}\n')
    a, b = load_probe_file(path)
    assert a.expect is not None and a.expect.describe() == ["contains 'some words'"] and b.expect is None
    assert a.fingerprint == b.fingerprint  # the conversation is what the cache measures
    ep = parse_episode(dict(EPISODE, expect={"tool_called": {"name": "f"}}), path="e", line=1, default_id="e")
    plain = parse_episode(EPISODE, path="e", line=1, default_id="e")
    assert ep.fingerprint == plain.fingerprint and ep.to_json()["expect"] == {"tool_called": {"name": "f"}}
    again = parse_episode(ep.to_json(), path="e", line=1, default_id="e")  # the hand-off to xdist workers
    assert again.expect == ep.expect


def test_task_sets_ship_with_checks() -> None:
    probes = named_probes("tasks")
    assert len(probes) == 16 and all(p.expect is not None for p in probes)
    assert {p.source.split(":")[0] for p in probes} == {"tasks"}
    assert load_probes(["tasks", "builtin"])[16].id == named_probes("builtin")[0].id
    episodes = load_episodes(["tasks"])
    assert len(episodes) >= 6 and all(e.expect is not None and e.tools for e in episodes)
    assert all(any(c.kind == "tool_called" for c in e.expect.checks) for e in episodes)


# -- the expectation rule and the verdict -------------------------------------------------------------------
def flipped_and_text_only() -> List[ProbeRecord]:
    e = expect({"contains": "x"})
    out = []
    for pid, cache, recompute in (("flip", "no", "x"), ("text", "x1", "x2")):
        r = probe_record(pid, Outcome.DIFFERENT, cache, recompute)
        r.check_results = e.judge(r)
        out.append(r)
    return out


@pytest.mark.parametrize("changes, flip_expected, text_expected", [
    ({}, None, None),  # the default gate: any divergence fails
    ({"gate_on": "flips"}, None, "a divergence that flipped no outcome"),
    ({"gate_on": "flips", "max_flip_rate": 0.5}, "the flip-rate gate decides", "a divergence that flipped no"),
    ({"gate_on": "flips", "record": True}, "recorded as the baseline", "recorded as the baseline"),
    ({"max_rate": 0.5}, "the rate gate decides", "the rate gate decides"),
])
def test_expectation_under_each_gate(changes: Any, flip_expected: Any, text_expected: Any) -> None:
    settings = dataclasses.replace(Settings(url="http://x"), **changes)
    flip, text = flipped_and_text_only()
    for record, want in ((flip, flip_expected), (text, text_expected)):
        got = expectation(record, settings, {})
        assert (got is None) if want is None else (want in str(got)), got


def test_verdict_names_flips() -> None:
    t = Tally(3, 1, 2)
    v = judge([Count(PROBE_KIND, t, unexpected=1, flipped=1)], 0.0)
    assert v.status == Status.DIVERGED and v.why == "1 valid probe flipped the outcome of its checks"
    v = judge([Count(PROBE_KIND, t, unexpected=2, flipped=1)], 0.0)
    assert v.why == "2 valid probes gave a different turn-2 answer (1 flipped the outcome of its checks)"
    assert judge([Count(PROBE_KIND, t, unexpected=2)], 0.0).why == "2 valid probes gave a different turn-2 answer"
    v = judge([Count(PROBE_KIND, t, unexpected=1), Count(EPISODE_KIND, Tally(2, 0, 2), unexpected=2, flipped=2)], 0.0)
    assert v.why == ("1 valid probe gave a different turn-2 answer; 2 valid episodes flipped the outcome of their "
                     "checks")
