"""Baseline comparison: statuses, verdicts, McNemar p-values, environment notes, loading, fail policies."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest

from pytest_cachecheck.baseline import (
    STATUSES,
    BaselineError,
    Comparison,
    compare,
    fingerprint_env,
    load_baseline,
    mcnemar_exact,
    should_fail,
)
from pytest_cachecheck.report import Verdict, build_report
from tests.support.emulator import Emulator


def rec(pid: str, outcome: str, fp: Optional[str] = None) -> Dict[str, Any]:
    """A per-probe record in the layout of ProbeResult.to_dict (only what the comparison reads, mostly)."""
    return {"id": pid, "source": "test", "fingerprint": fp or f"sha256:{pid}", "outcome": outcome,
            "reason": "" if outcome == "same" else f"{outcome} reason", "divergence": None, "checks": {},
            "answers": {"turn1": ["a", "a"], "cache": ["b", "b"], "recompute": ["b", "b"]},
            "requests": [], "duration_s": 0.1}


def run_info(**settings: Any) -> Dict[str, Any]:
    base: Dict[str, Any] = {
        "url": "http://127.0.0.1:8000", "mode": "auto", "nocache_url": None, "model": None, "probe_files": [],
        "n": None, "max_tokens": 256, "hit_tolerance": 32, "skip_hit_check": False, "api_key_set": False,
        "timeout": 300.0, "min_valid": 0.8}
    base.update(settings)
    return {"settings": base, "mode": "one-server",
            "server": {"kind": "vllm", "build": "0.34.0", "model": "emu/tiny-chat", "details": {}},
            "nocache_server": None,
            "probe_set": {"name": "builtin", "count": 20, "fingerprint": "sha256:" + "ab" * 32}}


def report(records: List[Dict[str, Any]], run: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    return build_report(run or run_info(), records, [r["id"] for r in records],
                        Verdict("passed", True, "test"), 0)


def cmp(before: List[Dict[str, Any]], after: List[Dict[str, Any]],
        run_before: Optional[Dict[str, Any]] = None,
        run_after: Optional[Dict[str, Any]] = None) -> Comparison:
    return compare(report(before, run_before), run_after or run_info(), after)


def statuses(c: Comparison) -> Dict[str, str]:
    return {r.id: r.status for r in c.rows}


# --------------------------------------------------------------------------- statuses

def test_every_status() -> None:
    before = [rec("ss", "same"), rec("dd", "different"), rec("sd", "same"), rec("ds", "different"),
              rec("si", "same"), rec("de", "different"), rec("ii", "inconclusive"), rec("ei", "error"),
              rec("is", "inconclusive"), rec("ed", "error"), rec("fp", "same", "sha256:old"),
              rec("gone", "same")]
    after = [rec("ss", "same"), rec("dd", "different"), rec("sd", "different"), rec("ds", "same"),
             rec("si", "inconclusive"), rec("de", "error"), rec("ii", "inconclusive"),
             rec("ei", "inconclusive"),
             rec("is", "same"), rec("ed", "different"), rec("fp", "different", "sha256:new"),
             rec("fresh", "different")]
    c = cmp(before, after)
    assert statuses(c) == {
        "ss": "still same", "dd": "still different", "sd": "newly diverged", "ds": "healed",
        "si": "newly inconclusive", "de": "newly inconclusive", "ii": "still inconclusive",
        "ei": "still inconclusive", "is": "newly valid", "ed": "newly valid", "fp": "conversation changed",
        "fresh": "new probe", "gone": "not run",
    }
    assert set(c.counts) == set(STATUSES)
    assert sum(c.counts.values()) == len(c.rows) == 13
    rows = {r.id: r for r in c.rows}
    assert (rows["fresh"].before, rows["fresh"].after) == (None, "different")
    assert (rows["gone"].before, rows["gone"].after) == ("same", None)
    assert (rows["de"].before, rows["de"].after) == ("different", "error")
    assert c.newly_diverged() == ["sd"]
    assert c.still_different() == {"dd"}
    # a changed conversation is never counted as a divergence or a heal
    assert "fp" not in c.newly_diverged()


def test_rows_sorted_by_importance() -> None:
    before = [rec("a", "same"), rec("b", "same"), rec("c", "different"), rec("d", "different"),
              rec("e", "same")]
    after = [rec("a", "same"), rec("b", "different"), rec("c", "same"), rec("d", "different"),
             rec("e", "inconclusive")]
    c = cmp(before, after)
    assert [r.status for r in c.rows] == ["newly diverged", "still different", "newly inconclusive", "healed",
                                          "still same"]
    lines = c.lines(verbose=True)
    table = [ln for ln in lines if ln.startswith("  ") and not ln.startswith("  id")]
    assert table[0].split()[0] == "b" and table[0].endswith("newly diverged")


def test_baseline_with_errors_only() -> None:
    before = [rec(f"p{i}", "error") for i in range(4)]
    after = [rec("p0", "same"), rec("p1", "different"), rec("p2", "error"), rec("p3", "inconclusive")]
    c = cmp(before, after)
    assert statuses(c) == {"p0": "newly valid", "p1": "newly valid", "p2": "still inconclusive",
                           "p3": "still inconclusive"}
    assert c.baseline_rate is None
    assert c.current_rate is not None and (c.current_rate.different, c.current_rate.valid) == (1, 2)
    assert c.verdict == "inconclusive"
    assert "only 0 of 4" in c.why
    assert should_fail(c, "new-divergence")[0] is False
    ok, why = should_fail(c, "rate-increase")
    assert ok is False and "baseline has no valid probe" in why
    assert "n/a" in "\n".join(c.lines())


# --------------------------------------------------------------------------- verdicts

def test_verdict_regressed() -> None:
    c = cmp([rec("a", "same"), rec("b", "same"), rec("c", "same")],
            [rec("a", "different"), rec("b", "same"), rec("c", "same")])
    assert c.verdict == "regressed"
    assert c.mcnemar_p == 1.0
    assert (c.b, c.c, c.paired, c.valid_in_both) == (1, 0, 3, 3)


def test_verdict_improved() -> None:
    c = cmp([rec("a", "different"), rec("b", "different"), rec("c", "same")],
            [rec("a", "same"), rec("b", "same"), rec("c", "different")])
    assert c.verdict == "improved"
    assert c.mcnemar_p == pytest.approx(1.0)


def test_verdict_unchanged() -> None:
    c = cmp([rec("a", "different"), rec("b", "same"), rec("c", "same")],
            [rec("a", "different"), rec("b", "same"), rec("c", "same"), rec("new", "different")])
    assert c.verdict == "unchanged"
    assert c.mcnemar_p == 1.0


def test_verdict_unchanged_with_balanced_discordance() -> None:
    c = cmp([rec("a", "different"), rec("b", "same")], [rec("a", "same"), rec("b", "different")])
    assert (c.b, c.c) == (1, 1)
    assert c.verdict == "unchanged"


def test_verdict_inconclusive_when_balanced_but_newly_inconclusive() -> None:
    c = cmp([rec("a", "same"), rec("b", "same"), rec("c", "same")],
            [rec("a", "same"), rec("b", "same"), rec("c", "inconclusive")])
    assert c.verdict == "inconclusive"
    assert "could tip it" in c.why


def test_verdict_inconclusive_when_fewer_than_half_valid() -> None:
    before = [rec("a", "same"), rec("b", "same"), rec("c", "same"), rec("d", "same"), rec("e", "same")]
    after = [rec("a", "different"), rec("b", "same"), rec("c", "error"), rec("d", "inconclusive"),
             rec("e", "inconclusive")]
    c = cmp(before, after)
    assert c.valid_in_both == 2 and c.paired == 5
    assert c.verdict == "inconclusive"  # even though b > c
    assert c.newly_diverged() == ["a"]


def test_exactly_half_valid_is_enough() -> None:
    c = cmp([rec("a", "same"), rec("b", "same")], [rec("a", "different"), rec("b", "error")])
    assert c.verdict == "regressed"


def test_verdict_inconclusive_without_pairs() -> None:
    c = cmp([rec("a", "same", "sha256:1")], [rec("a", "same", "sha256:2"), rec("b", "same")])
    assert c.paired == 0
    assert c.verdict == "inconclusive"
    assert c.counts["conversation changed"] == 1 and c.counts["new probe"] == 1


# --------------------------------------------------------------------------- McNemar

@pytest.mark.parametrize("b, c, p", [
    (5, 0, 0.0625),
    (0, 5, 0.0625),
    (10, 2, 0.0386),
    (2, 10, 0.0386),
    (0, 0, 1.0),
    (1, 0, 1.0),
    (3, 3, 1.0),
    (6, 1, 0.125),
    (6, 0, 0.03125),
])
def test_mcnemar_known_values(b: int, c: int, p: float) -> None:
    assert mcnemar_exact(b, c) == pytest.approx(p, abs=5e-5)


def test_mcnemar_exact_value_and_large_counts() -> None:
    assert mcnemar_exact(10, 2) == 2 * 79 / 4096  # 2 * (C(12,0) + C(12,1) + C(12,2)) / 2**12
    p = mcnemar_exact(1500, 0)  # 2**1500 would overflow a float
    assert 0.0 <= p < 1e-300
    assert 0.0 < mcnemar_exact(600, 500) < 0.01
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


def test_comparison_reports_mcnemar_on_discordant_pairs() -> None:
    before = [rec(f"p{i}", "same") for i in range(10)] + [rec(f"q{i}", "different") for i in range(2)]
    before += [rec(f"r{i}", "same") for i in range(8)]
    after = [rec(f"p{i}", "different") for i in range(10)] + [rec(f"q{i}", "same") for i in range(2)]
    after += [rec(f"r{i}", "same") for i in range(8)]
    c = cmp(before, after)
    assert (c.b, c.c) == (10, 2)
    assert c.mcnemar_p == pytest.approx(0.0386, abs=5e-5)
    assert "0.0386" in c.verdict_line()


# --------------------------------------------------------------------------- environment

def test_fingerprint_env_reads_report_layout() -> None:
    env = fingerprint_env(report([rec("a", "same")]))
    assert env == {"server_kind": "vllm", "server_build": "0.34.0", "model": "emu/tiny-chat",
                   "mode": "one-server", "max_tokens": 256, "hit_tolerance": 32, "skip_hit_check": False,
                   "probe_set": "sha256:" + "ab" * 32}
    assert fingerprint_env({}) == dict.fromkeys(env)


def test_no_env_warnings_when_nothing_changed() -> None:
    assert cmp([rec("a", "same")], [rec("a", "same")]).env_warnings == []


def test_env_warnings_and_notes() -> None:
    after = run_info(max_tokens=128, hit_tolerance=0, skip_hit_check=True)
    after["server"] = {"kind": "sglang", "build": "0.5.23", "model": "other/model"}
    after["mode"] = "two-servers"
    after["probe_set"] = {"name": "mine", "count": 3, "fingerprint": "sha256:" + "cd" * 32}
    c = cmp([rec("a", "same")], [rec("a", "same")], run_after=after)
    w = c.env_warnings
    assert "warning: max_tokens changed: 256 -> 128; comparisons may not be like for like" in w
    assert "warning: hit_tolerance changed: 32 -> 0; comparisons may not be like for like" in w
    assert "warning: skip_hit_check changed: False -> True; comparisons may not be like for like" in w
    assert "warning: mode changed: one-server -> two-servers; comparisons may not be like for like" in w
    assert "warning: server kind changed: vllm -> sglang; comparisons may not be like for like" in w
    assert "note: server build changed: 0.34.0 -> 0.5.23 (expected in an upgrade)" in w
    assert "note: model changed: emu/tiny-chat -> other/model (expected in an upgrade)" in w
    assert any(x.startswith("warning: probe set fingerprint changed: sha256:abababababab -> "
                            "sha256:cdcdcdcdcdcd;") for x in w)
    assert len(w) == 8
    assert all(x in c.lines() for x in w)


def test_only_build_change_gives_notes_only() -> None:
    after = run_info()
    after["server"]["build"] = "0.35.0"
    c = cmp([rec("a", "same")], [rec("a", "same")], run_after=after)
    assert c.env_warnings == ["note: server build changed: 0.34.0 -> 0.35.0 (expected in an upgrade)"]


# --------------------------------------------------------------------------- loading

def test_load_baseline_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "base.json"
    data = report([rec("a", "same"), rec("b", "different")])
    path.write_text(json.dumps(data), encoding="utf-8")
    assert load_baseline(str(path)) == data


def test_load_baseline_missing_file(tmp_path: Path) -> None:
    path = str(tmp_path / "nope.json")
    with pytest.raises(BaselineError, match="nope.json: cannot read the baseline report"):
        load_baseline(path)


def test_load_baseline_directory(tmp_path: Path) -> None:
    with pytest.raises(BaselineError, match="cannot read"):
        load_baseline(str(tmp_path))


def test_load_baseline_bad_json(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"schema_version": 1,\n "probes": [', encoding="utf-8")
    with pytest.raises(BaselineError, match=r"bad.json: the baseline report is not valid JSON \(line 2"):
        load_baseline(str(path))


def test_load_baseline_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin.json"
    path.write_bytes(b'{"x": "\xe9"}')
    with pytest.raises(BaselineError, match="latin.json: .*not UTF-8"):
        load_baseline(str(path))


@pytest.mark.parametrize("content, message", [
    ([1, 2], "not a pytest-cachecheck report .*list"),
    ({"tests": [], "summary": {}}, r"not a pytest-cachecheck report \(no schema_version\)"),
    ({"schema_version": 1, "tool": {"name": "pytest-json-report"}, "probes": []},
     "written by 'pytest-json-report'"),
    ({"schema_version": 2, "probes": []}, "unsupported schema_version 2; .* reads schema_version 1"),
    ({"schema_version": "1", "probes": []}, "unsupported schema_version '1'"),
    ({"schema_version": True, "probes": []}, "unsupported schema_version True"),
    ({"schema_version": 1}, "no 'probes' list"),
    ({"schema_version": 1, "probes": [{"id": "a"}]}, "probe 0 .* no string 'id' and 'outcome'"),
])
def test_load_baseline_wrong_content(tmp_path: Path, content: Any, message: str) -> None:
    path = tmp_path / "wrong.json"
    path.write_text(json.dumps(content), encoding="utf-8")
    with pytest.raises(BaselineError, match=message) as info:
        load_baseline(str(path))
    assert str(info.value).startswith(str(path))
    assert isinstance(info.value, ValueError)


# --------------------------------------------------------------------------- policies

def test_should_fail_new_divergence() -> None:
    c = cmp([rec("a", "same"), rec("b", "different")], [rec("a", "different"), rec("b", "same")])
    fail, why = should_fail(c, "new-divergence")
    assert fail and "1 probe(s) newly diverged against the baseline: a" == why
    assert should_fail(c) == (fail, why)  # the default policy
    fail, why = should_fail(cmp([rec("a", "different")], [rec("a", "different")]), "new-divergence")
    assert not fail and "no probe newly diverged" in why  # a known divergence is not a new one


def test_should_fail_new_divergence_lists_at_most_ten() -> None:
    c = cmp([rec(f"p{i:02}", "same") for i in range(12)], [rec(f"p{i:02}", "different") for i in range(12)])
    fail, why = should_fail(c, "new-divergence")
    assert fail and why.startswith("12 probe(s)") and why.endswith("and 2 more")


def test_should_fail_rate_increase() -> None:
    base = [rec("a", "same"), rec("b", "same"), rec("c", "different"), rec("d", "same")]
    worse = cmp(base, [rec("a", "different"), rec("b", "same"), rec("c", "different"), rec("d", "same")])
    fail, why = should_fail(worse, "rate-increase")
    assert fail and "rose from 25.0% (1/4" in why and "to 50.0% (2/4" in why
    # equal rate on a different probe: not an increase (though one probe newly diverged)
    equal = cmp(base, [rec("a", "different"), rec("b", "same"), rec("c", "same"), rec("d", "same")])
    assert should_fail(equal, "rate-increase")[0] is False
    assert should_fail(equal, "new-divergence")[0] is True
    # rates compare exactly, not as rounded floats: 1/3 vs 2/6
    third = cmp([rec("a", "different"), rec("b", "same"), rec("c", "same")],
                [rec(x, "different") for x in "ab"] + [rec(x, "same") for x in "cdef"])
    assert should_fail(third, "rate-increase")[0] is False
    none_now = cmp(base, [rec("a", "error")])
    assert should_fail(none_now, "rate-increase") == (
        False, "cannot compare divergence rates: this run has no valid probe")


def test_should_fail_never_and_unknown() -> None:
    c = cmp([rec("a", "same")], [rec("a", "different")])
    assert should_fail(c, "never")[0] is False
    with pytest.raises(ValueError, match="unknown baseline policy 'sometimes'"):
        should_fail(c, "sometimes")


# --------------------------------------------------------------------------- output

def test_lines_and_to_dict() -> None:
    before = [rec("a", "same"), rec("b", "same"), rec("c", "different"), rec("d", "same")]
    after = [rec("a", "same"), rec("b", "different"), rec("c", "different"), rec("e", "same")]
    c = cmp(before, after)
    text = "\n".join(c.lines())
    assert "newly diverged" in text and "still different" in text and "not run" in text
    assert "(1 probe(s) still same; -v lists them)" in text
    assert "baseline verdict: regressed (1 newly diverged vs 0 healed" in text
    assert "exact McNemar p = 1.000" in text
    assert "divergence rate: baseline 25.0% (1/4" in text
    verbose = "\n".join(c.lines(verbose=True))
    assert "still same" in verbose and "-v lists them" not in verbose
    d = c.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["verdict"] == "regressed" and d["newly_diverged"] == ["b"] and d["still_different"] == ["c"]
    assert d["counts"]["not run"] == 1 and d["counts"]["new probe"] == 1
    assert d["baseline_rate"]["different"] == 1 and d["baseline_rate"]["valid"] == 4
    assert len(d["baseline_rate"]["ci95"]) == 2
    assert c.baseline_ci95 == tuple(d["baseline_rate"]["ci95"])
    assert c.current_ci95 is not None and c.current_ci95[0] < 1 / 3 < c.current_ci95[1]
    assert [r["id"] for r in d["rows"]] == [r.id for r in c.rows]


def test_long_ids_are_shortened_in_the_table() -> None:
    long_id = "x" * 80
    c = cmp([rec(long_id, "same")], [rec(long_id, "different")])
    row = next(ln for ln in c.lines() if ln.endswith("newly diverged"))
    assert "..." in row and len(row) < 100


def test_baseline_is_not_modified() -> None:
    base = report([rec("a", "same"), rec("b", "different")])
    snapshot = copy.deepcopy(base)
    compare(base, run_info(), [rec("a", "different")])
    assert base == snapshot


# --------------------------------------------------------------------------- real records

def test_real_runs_against_the_emulation(emulator: Callable[..., Emulator], tmp_path: Path) -> None:
    """Two real runs of the measurement on the vLLM emulation: bread starts diverging in the second."""
    from pytest_cachecheck.probes import builtin_probes, probe_set_fingerprint
    from pytest_cachecheck.protocol import Runner
    from pytest_cachecheck.settings import Settings

    probes = [p for p in builtin_probes() if p.id in ("bike-chain", "bread-rising", "tea-steeping")]
    assert len(probes) == 3

    def measure(markers: set) -> Dict[str, Any]:
        emu = emulator(diverge_on_hit=markers)
        settings = Settings(url=emu.url)
        runner = Runner(settings)
        records = [runner.run(p).to_dict() for p in probes]
        run = {"settings": settings.public(), "probe_set": {"name": "builtin", "count": len(probes),
                                                            "fingerprint": probe_set_fingerprint(probes)},
               "mode": None, "server": None, "nocache_server": None}
        run.update(runner.target().describe())
        return build_report(run, records, [p.id for p in probes], Verdict("passed", True, ""), 0)

    before, after = measure({"bicycle"}), measure({"bicycle", "bread"})
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(before), encoding="utf-8")
    c = compare(load_baseline(str(path)), after, after["probes"])
    assert statuses(c) == {"bread-rising": "newly diverged", "bike-chain": "still different",
                           "tea-steeping": "still same"}
    assert c.verdict == "regressed" and c.mcnemar_p == 1.0
    assert c.newly_diverged() == ["bread-rising"] and c.still_different() == {"bike-chain"}
    assert c.env_warnings == []  # same emulated server, same settings (the URL is not part of it)
    assert should_fail(c, "new-divergence")[0] and should_fail(c, "rate-increase")[0]


# --------------------------------------------------------------------------- target matrices

def matrix_report() -> Dict[str, Any]:
    from pytest_cachecheck.report import build_matrix_report

    a = {"name": "f16", "url": "http://a:1", **build_report(run_info(), [rec("p1", "same"), rec("p2", "same")],
                                                            ["p1", "p2"], Verdict("passed", True, "ok"), None)}
    b = {"name": "q4", "url": "http://b:1", **build_report(run_info(), [rec("p1", "different"), rec("p2", "same")],
                                                           ["p1", "p2"], Verdict("diverged", False, "1"), None)}
    return build_matrix_report([a, b], Verdict("diverged", False, "q4: 1"), 1)


def test_baseline_for_picks_the_target_of_a_matrix_report() -> None:
    from pytest_cachecheck.baseline import baseline_for

    data = matrix_report()
    q4 = baseline_for(data, "q4", "m.json")
    assert [(p["id"], p["outcome"]) for p in q4["probes"]] == [("p1", "different"), ("p2", "same")]
    assert q4["summary"]["different"] == 1 and q4["schema_version"] == 1
    with pytest.raises(BaselineError, match="m.json: the baseline's targets are f16, q4; it has no target 'bf16'"):
        baseline_for(data, "bf16", "m.json")
    with pytest.raises(BaselineError, match="m.json: a target-matrix report"):
        baseline_for(data, None, "m.json")
    one = build_report(run_info(), [rec("p1", "same")], ["p1"], Verdict("passed", True, "ok"), None)
    assert baseline_for(one, "q4") == one  # a one-server report serves every target
    assert compare(q4, run_info(), [rec("p1", "different"), rec("p2", "different")]).verdict == "regressed"


def test_matrix_report_sums_counts_and_keeps_rates_per_target() -> None:
    data = matrix_report()
    assert data["summary"]["probes"] == 4 and data["summary"]["different"] == 1
    assert data["summary"]["rate"] is None and data["summary"]["rate_ci95"] is None
    assert [t["summary"]["rate"] for t in data["targets"]] == [0.0, 0.5]
    assert [p["target"] for p in data["probes"]] == ["f16", "f16", "q4", "q4"]
    assert all("probes" not in t and "schema_version" not in t for t in data["targets"])


def test_combine_verdicts() -> None:
    from pytest_cachecheck.report import combine_verdicts

    ok, bad = Verdict("passed", True, "fine"), Verdict("diverged", False, "2 differed")
    assert combine_verdicts([("a", ok), ("b", ok)]) == Verdict("passed", True, "a: fine; b: fine")
    assert combine_verdicts([("a", ok), ("b", bad), ("c", Verdict("errors", False, "1 error"))]) == \
        Verdict("diverged", False, "b: 2 differed; c: 1 error")
    none = Verdict("no-probes", True, "no probe ran")
    assert combine_verdicts([("a", none), ("b", none)]).status == "no-probes"
    assert combine_verdicts([("a", none), ("b", ok)]) == Verdict("passed", True, "b: fine")


def test_matrix_lines_pair_each_target_with_the_first() -> None:
    from pytest_cachecheck.report import matrix_lines

    data = matrix_report()
    data["targets"][1]["vs_reference"] = compare(baseline_for_first(data), run_info(),
                                                 [p for p in data["probes"] if p["target"] == "q4"]).to_dict()
    lines = matrix_lines(data["targets"])
    assert lines[0].split()[:3] == ["target", "server", "valid"] and lines[0].endswith("vs f16")
    assert lines[1].split()[0] == "f16" and lines[1].endswith("(reference)")
    assert "50.0%" in lines[2] and "1 diverged only here, 0 only on f16; McNemar p = 1.000" in lines[2]
    data["targets"][0]["summary"]["probes"] = 0  # the reference ran nothing (deselected)
    assert matrix_lines(data["targets"])[2].endswith("n/a (f16 ran no probe)")


def baseline_for_first(data: Dict[str, Any]) -> Dict[str, Any]:
    from pytest_cachecheck.baseline import baseline_for

    return baseline_for(data, "f16")
