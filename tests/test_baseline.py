"""Baseline comparison: statuses, verdicts, McNemar p-values, environment notes, loading, fail policies."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest

from pytest_cachecheck import __version__
from pytest_cachecheck.baseline import (
    Baseline,
    BaselineError,
    baseline_for,
    compare,
    env_of,
    load_baseline,
    should_fail,
)
from pytest_cachecheck.model import (
    STATUSES,
    Comparison,
    EpisodeRecord,
    Outcome,
    ProbeRecord,
    ProbeSet,
    ReportError,
    RunReport,
    Setup,
    Status,
    Tally,
    Verdict,
)
from pytest_cachecheck.settings import Settings
from pytest_cachecheck.stats import mcnemar_exact
from pytest_cachecheck.terminal import comparison_lines, matrix_lines
from tests.support import factories as f
from tests.support.emulator import Emulator


def rec(pid: str, outcome: str, fp: Optional[str] = None, target: Optional[str] = None) -> ProbeRecord:
    """A real probe record (a different one has two answers that differ)."""
    if outcome == "different":
        return f.record(pid, outcome, fingerprint=fp, target=target, cache="the answer is 42",
                        recompute="the answer is 41")
    return f.record(pid, outcome, fingerprint=fp, target=target)


def env(s: Optional[Settings] = None, setup: Optional[Setup] = None,
        probe_set: ProbeSet = f.PROBE_SET) -> Dict[str, Any]:
    """The environment of a run with these settings and this setup (the factories' defaults)."""
    return env_of((s or f.settings()).public(), setup or f.setup(), probe_set)


def cmp(before: List[ProbeRecord], after: List[ProbeRecord],
        after_env: Optional[Dict[str, Any]] = None) -> Comparison:
    return compare(f.baseline(before), after, after_env or env())


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
    lines = comparison_lines(c, verbose=True)
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
    ok, why = should_fail(c, "rate-increase")
    assert ok is False and "baseline has no valid probe" in why
    assert "n/a" in "\n".join(comparison_lines(c))


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
    verdict_line = next(ln for ln in comparison_lines(c) if ln.startswith("baseline verdict:"))
    assert "exact McNemar p = 0.0386" in verdict_line


# --------------------------------------------------------------------------- environment

def test_env_of_reads_settings_setup_and_probe_set() -> None:
    expected = {"server_kind": "vllm", "server_build": "0.34.0", "model": "emu/tiny-chat",
                "mode": "one-server", "max_tokens": 256, "hit_tolerance": 32, "skip_hit_check": False,
                "probe_set": "sha256:" + "ab" * 32, "plugin_version": __version__}
    assert env() == expected
    # the same from a report as written and read back (what a baseline file gives)
    loaded = RunReport.from_json(json.loads(json.dumps(f.report([rec("a", "same")]).to_json())))
    assert env_of(loaded.settings, loaded.targets[0].setup, loaded.probe_set) == expected
    assert baseline_for(loaded, None).env == expected
    assert env_of({}, None, None, None) == dict.fromkeys(expected)
    # without a resolved setup: the configured mode, and no model (the option was never checked)
    assert env_of(f.settings(mode="two-servers", model="m/x").public(), Setup(None, None), None) == \
        {**dict.fromkeys(expected), "mode": "two-servers", "model": None, "max_tokens": 256,
         "hit_tolerance": 32, "skip_hit_check": False, "plugin_version": __version__}


def test_no_env_warnings_when_nothing_changed() -> None:
    assert cmp([rec("a", "same")], [rec("a", "same")]).env_warnings == []


def test_env_warnings_and_notes() -> None:
    after = env(f.settings(max_tokens=128, hit_tolerance=0, skip_hit_check=True),
                f.setup(kind="sglang", build="0.5.23", model="other/model", mode="two-servers"),
                ProbeSet("mine", 3, "sha256:" + "cd" * 32))
    c = cmp([rec("a", "same")], [rec("a", "same")], after)
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
    assert all(x in comparison_lines(c) for x in w)


def test_only_build_change_gives_notes_only() -> None:
    c = cmp([rec("a", "same")], [rec("a", "same")], env(setup=f.setup(build="0.35.0")))
    assert c.env_warnings == ["note: server build changed: 0.34.0 -> 0.35.0 (expected in an upgrade)"]


# --------------------------------------------------------------------------- loading

def test_load_baseline_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "base.json"
    report = f.report([rec("a", "same"), rec("b", "different")])
    data = report.to_json()
    path.write_text(json.dumps(data), encoding="utf-8")
    loaded = load_baseline(str(path))
    assert loaded.to_json() == data
    assert loaded == report


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
    ({"schema_version": 3, "probes": []}, "unsupported schema_version 3; .* reads schema_version 1 and 2"),
    ({"schema_version": "1", "probes": []}, "unsupported schema_version '1'"),
    ({"schema_version": True, "probes": []}, "unsupported schema_version True"),
    ({"schema_version": 1}, "no 'probes' list"),
    # a damaged probe: the error names the field (it named "probe 0 ... no string 'id' and 'outcome'")
    ({"schema_version": 1, "probes": [{"id": "a"}]},
     r"field 'probes\[0\]\.outcome': expected a string, got null"),
    ({"schema_version": 1, "probes": [{"outcome": "same"}]}, r"field 'probes\[0\]\.id': expected a string"),
    ({"schema_version": 1, "probes": ["a"]}, r"field 'probes\[0\]': expected an object, got str"),
])
def test_load_baseline_wrong_content(tmp_path: Path, content: Any, message: str) -> None:
    path = tmp_path / "wrong.json"
    path.write_text(json.dumps(content), encoding="utf-8")
    with pytest.raises(BaselineError, match=message) as info:
        load_baseline(str(path))
    assert str(info.value).startswith(str(path))
    assert isinstance(info.value, ValueError)


def _damaged(edit: Callable[[Dict[str, Any]], None], matrix: bool = False) -> Dict[str, Any]:
    """A report as the plugin writes it, with one field broken by ``edit``."""
    if matrix:
        data = f.report(targets={"a": [rec("p1", "same", target="a")],
                                 "b": [rec("p1", "different", target="b")]}).to_json()
    else:
        data = f.report([rec("p1", "same"), rec("p2", "different")],
                        baselines={None: f.baseline([rec("p1", "same"), rec("p2", "same")])}).to_json()
    edit(data)
    return data


@pytest.mark.parametrize("edit, matrix, field", [
    (lambda d: d["probes"][1].update(outcome="weird"), False,
     r"probes\[1\]\.outcome': unknown value 'weird'"),
    (lambda d: d["probes"][0]["requests"][2].update(prompt_tokens="20"), False,
     r"probes\[0\]\.requests\[2\]\.prompt_tokens': expected a whole number, got str"),
    (lambda d: d["probes"][1]["divergence"].update(char=None), False,
     r"probes\[1\]\.divergence\.char': expected a whole number, got null"),
    (lambda d: d["summary"].update(status="fine"), False, r"summary\.status': unknown value 'fine'"),
    (lambda d: d.update(summary=[]), False, r"summary': expected an object, got list"),
    (lambda d: d["targets"][0]["baseline"]["rows"][0].update(id=7), False,
     r"targets\[0\]\.baseline\.rows\[0\]\.id': expected a string, got int"),
    (lambda d: d["targets"][0].update(setup_warnings="one"), False,
     r"targets\[0\]\.setup_warnings': expected a list, got str"),
    (lambda d: d["targets"][1].pop("name"), True, r"targets\[1\]\.name': expected a string, got null"),
    (lambda d: d["targets"].append("junk"), True, r"targets\[2\]': expected an object, got str"),
    (lambda d: d["targets"][1]["summary"].update(probes=1.5), True,
     r"targets\[1\]\.summary\.probes': expected a whole number, got float"),
    (lambda d: d["targets"][1]["vs_reference"].update(mcnemar_p="1"), True,
     r"targets\[1\]\.vs_reference\.mcnemar_p': expected a number, got str"),
], ids=["outcome", "request", "divergence", "status", "summary", "baseline-row", "setup-warnings",
        "target-name", "target-junk", "target-summary", "vs-reference"])
def test_damaged_field_is_named(tmp_path: Path, edit: Callable[[Dict[str, Any]], None], matrix: bool,
                                field: str) -> None:
    """A report with one field of the wrong type or value: RunReport.from_json names the field, and
    load_baseline names the file and the field."""
    data = _damaged(edit, matrix)
    with pytest.raises(ReportError, match="^field '" + field):
        RunReport.from_json(data)
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(BaselineError, match=re.escape(f"{path}: field '") + field):
        load_baseline(str(path))


def test_partial_report_loads() -> None:
    """Fields the comparison does not need may be missing: null lists, no setup, no probe set, no checks."""
    data = {"schema_version": 1, "summary": {"status": "passed"},
            "probes": [{"id": "a", "outcome": "same", "fingerprint": "sha256:a"},
                       {"id": "b", "outcome": "different", "fingerprint": "sha256:b", "answers": None}]}
    report = RunReport.from_json(data)
    assert [(p.id, p.outcome) for p in report.probes] == [("a", Outcome.SAME), ("b", Outcome.DIFFERENT)]
    assert report.probe_set == ProbeSet("?", 2, "") and report.checks == [] and not report.matrix
    b = baseline_for(report, "any", "p.json")
    assert compare(b, [rec("a", "different"), rec("b", "different")], env()).verdict == "regressed"


def test_report_without_summary_loads() -> None:
    report = RunReport.from_json({"schema_version": 1, "probes": [{"id": "a", "outcome": "same"}]})
    assert report.summary.tally.probes == 1


# --------------------------------------------------------------------------- policies

def test_should_fail_new_divergence() -> None:
    c = cmp([rec("a", "same"), rec("b", "different")], [rec("a", "different"), rec("b", "same")])
    # which divergences are new is each record's expectation (run.expectation), given as ``unexpected``
    fail, why = should_fail(c, "new-divergence", unexpected=["a"])
    assert fail and "1 probe newly diverged against the baseline: a" == why
    assert should_fail(c, unexpected=["a"]) == (fail, why)  # the default policy
    fail, why = should_fail(cmp([rec("a", "different")], [rec("a", "different")]), "new-divergence")
    assert not fail and "no probe newly diverged" in why


def test_should_fail_new_divergence_lists_at_most_ten() -> None:
    c = cmp([rec(f"p{i:02}", "same") for i in range(12)], [rec(f"p{i:02}", "different") for i in range(12)])
    fail, why = should_fail(c, "new-divergence", unexpected=[f"p{i:02}" for i in range(12)])
    assert fail and why.startswith("12 probes newly diverged") and why.endswith("and 2 more")


def test_should_fail_rate_increase() -> None:
    base = [rec("a", "same"), rec("b", "same"), rec("c", "different"), rec("d", "same")]
    worse = cmp(base, [rec("a", "different"), rec("b", "same"), rec("c", "different"), rec("d", "same")])
    fail, why = should_fail(worse, "rate-increase")
    assert fail and "rose from 25.0% (1/4" in why and "to 50.0% (2/4" in why
    # equal rate on a different probe: not an increase (though one probe newly diverged)
    equal = cmp(base, [rec("a", "different"), rec("b", "same"), rec("c", "same"), rec("d", "same")])
    assert should_fail(equal, "rate-increase")[0] is False
    assert should_fail(equal, "new-divergence", unexpected=["a"])[0] is True
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

def test_lines_and_to_json() -> None:
    before = [rec("a", "same"), rec("b", "same"), rec("c", "different"), rec("d", "same")]
    after = [rec("a", "same"), rec("b", "different"), rec("c", "different"), rec("e", "same")]
    c = cmp(before, after)
    text = "\n".join(comparison_lines(c))
    assert "newly diverged" in text and "still different" in text and "not run" in text
    assert "(1 probe still same; -v lists them)" in text
    assert "baseline verdict: regressed (1 newly diverged vs 0 healed" in text
    assert "exact McNemar p = 1.000" in text
    assert "divergence rate: baseline 25.0% (1/4" in text
    verbose = "\n".join(comparison_lines(c, verbose=True))
    assert "still same" in verbose and "-v lists them" not in verbose
    d = c.to_json()
    assert json.loads(json.dumps(d)) == d
    assert d["verdict"] == "regressed" and d["newly_diverged"] == ["b"] and d["still_different"] == ["c"]
    assert d["counts"]["not run"] == 1 and d["counts"]["new probe"] == 1
    assert d["baseline_rate"]["different"] == 1 and d["baseline_rate"]["valid"] == 4
    assert len(d["baseline_rate"]["ci95"]) == 2
    assert c.baseline_rate is not None and c.baseline_rate.ci95 == tuple(d["baseline_rate"]["ci95"])
    assert c.current_rate is not None and c.current_rate.ci95[0] < 1 / 3 < c.current_rate.ci95[1]
    assert [r["id"] for r in d["rows"]] == [r.id for r in c.rows]


def test_long_ids_are_shortened_in_the_table() -> None:
    long_id = "x" * 80
    c = cmp([rec(long_id, "same")], [rec(long_id, "different")])
    row = next(ln for ln in comparison_lines(c) if ln.endswith("newly diverged"))
    assert "..." in row and len(row) < 100


def test_baseline_is_not_modified() -> None:
    base = f.baseline([rec("a", "same"), rec("b", "different")])
    snapshot = copy.deepcopy(base)
    compare(base, [rec("a", "different")], env())
    assert base == snapshot


# --------------------------------------------------------------------------- real records

def test_real_runs_against_the_emulation(emulator: Callable[..., Emulator], tmp_path: Path) -> None:
    """Two real runs of the measurement on the vLLM emulation: bread starts diverging in the second."""
    from pytest_cachecheck.probes import builtin_probes, probe_set_fingerprint
    from pytest_cachecheck.protocol import Runner
    from pytest_cachecheck.settings import Settings

    probes = [p for p in builtin_probes() if p.id in ("bike-chain", "bread-rising", "tea-steeping")]
    assert len(probes) == 3
    probe_set = ProbeSet("builtin", len(probes), probe_set_fingerprint(probes))

    def measure(markers: set) -> RunReport:
        emu = emulator(diverge_on_hit=markers)
        settings = Settings(url=emu.url, replicas=(emu.url,))
        runner = Runner(settings)
        records = [runner.run(p) for p in probes]
        assert runner.setup is not None
        return f.report(records, s=settings, setup_=runner.setup.describe(), probe_set=probe_set)

    before, after = measure({"bicycle"}), measure({"bicycle", "bread"})
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(before.to_json()), encoding="utf-8")
    t = after.targets[0]
    c = compare(baseline_for(load_baseline(str(path)), None, str(path)), t.probes,
                env_of(after.settings, t.setup, after.probe_set))
    assert statuses(c) == {"bread-rising": "newly diverged", "bike-chain": "still different",
                           "tea-steeping": "still same"}
    assert c.verdict == "regressed" and c.mcnemar_p == 1.0
    assert c.newly_diverged() == ["bread-rising"] and c.still_different() == {"bike-chain"}
    assert c.env_warnings == []  # same emulated server, same settings (the URL is not part of it)
    assert should_fail(c, "rate-increase")[0]
    # judged with the baseline, as the plugin judges it: bread-rising is the one new divergence
    gated = f.run(t.probes, s=Settings(url="http://x", replicas=("http://x",), baseline=str(path)),
                  baselines={None: baseline_for(load_baseline(str(path)), None, str(path))})
    assert not gated.verdict.ok and gated.verdict.why == "1 probe newly diverged against the baseline: bread-rising"
    assert {r.id: r.expected for r in t.probes if r.different} == {
        "bike-chain": "also differed in the baseline", "bread-rising": None}


# --------------------------------------------------------------------------- target matrices

def matrix_report() -> RunReport:
    """f16: both probes the same; q4: p1 differs."""
    return f.report(targets={"f16": [rec("p1", "same", target="f16"), rec("p2", "same", target="f16")],
                             "q4": [rec("p1", "different", target="q4"), rec("p2", "same", target="q4")]},
                    exit_status=1)


def test_baseline_for_picks_the_target_of_a_matrix_report() -> None:
    report = matrix_report()
    loaded = RunReport.from_json(json.loads(json.dumps(report.to_json())))  # as load_baseline reads it
    q4 = baseline_for(loaded, "q4", "m.json")
    assert [(p.id, p.outcome) for p in q4.records] == [("p1", "different"), ("p2", "same")]
    assert Tally.of(q4.records).different == 1
    assert q4.env == env(setup=report.target("q4").setup) and q4.created == report.created
    with pytest.raises(BaselineError,
                       match="m.json: the baseline's targets are f16, q4; it has no target 'bf16'"):
        baseline_for(loaded, "bf16", "m.json")
    with pytest.raises(BaselineError, match="m.json: a target-matrix report"):
        baseline_for(loaded, None, "m.json")
    one = f.report([rec("p1", "same")])
    # a one-server report serves every target
    assert baseline_for(one, "q4") == baseline_for(one, None) == Baseline(one.probes, env(), one.created)
    assert compare(q4, [rec("p1", "different"), rec("p2", "different")], env()).verdict == "regressed"


def test_matrix_report_sums_counts_and_keeps_rates_per_target() -> None:
    report = matrix_report()
    data = report.to_json()
    assert data["summary"]["probes"] == 4 and data["summary"]["different"] == 1
    assert data["summary"]["rate"] is None and data["summary"]["rate_ci95"] is None
    assert [t["summary"]["rate"] for t in data["targets"]] == [0.0, 0.5]
    assert [p["target"] for p in data["probes"]] == ["f16", "f16", "q4", "q4"]
    assert all("probes" not in t and "schema_version" not in t for t in data["targets"])
    assert report.summary.rate is None and report.summary.tally.probes == 4
    assert RunReport.from_json(json.loads(json.dumps(data))).to_json() == data


def test_combine_verdicts() -> None:
    from pytest_cachecheck.run import combine_verdicts

    ok, bad = Verdict(Status.PASSED, True, "fine"), Verdict(Status.DIVERGED, False, "2 differed")
    assert combine_verdicts([("a", ok), ("b", ok)]) == Verdict(Status.PASSED, True, "a: fine; b: fine")
    assert combine_verdicts([("a", ok), ("b", bad), ("c", Verdict(Status.ERRORS, False, "1 error"))]) == \
        Verdict(Status.DIVERGED, False, "b: 2 differed; c: 1 error")
    none = Verdict(Status.NO_PROBES, True, "no probe ran")
    assert combine_verdicts([("a", none), ("b", none)]).status == "no-probes"
    assert combine_verdicts([("a", none), ("b", ok)]) == Verdict(Status.PASSED, True, "b: fine")


def test_matrix_lines_pair_each_target_with_the_first() -> None:
    report = matrix_report()
    q4 = report.target("q4")
    assert q4.vs_reference is not None and (q4.vs_reference.b, q4.vs_reference.c) == (1, 0)
    assert report.target("f16").vs_reference is None
    lines = matrix_lines(report.targets)
    assert lines[0].split()[:3] == ["target", "server", "valid"] and lines[0].endswith("vs f16")
    assert lines[1].split()[0] == "f16" and lines[1].endswith("(reference)")
    assert "50.0%" in lines[2] and "1 diverged only here, 0 only on f16; McNemar p = 1.000" in lines[2]
    # the reference ran nothing (its probes deselected)
    deselected = f.report(targets={"f16": [], "q4": [rec("p1", "different", target="q4")]})
    assert deselected.target("q4").vs_reference is None
    lines = matrix_lines(deselected.targets)
    assert lines[1].endswith("not run (no probe of this target was selected)")
    assert lines[2].endswith("n/a (f16 ran no probe)")


# --------------------------------------------------------------------------- baselines that are refused

def _episode(pid: str, outcome: str = "same", target: Optional[str] = None) -> Dict[str, Any]:
    """An episode record as a report holds it (the fields a comparison reads)."""
    return {"id": pid, "source": "test:1", "fingerprint": f"sha256:{pid}", "outcome": outcome,
            **({"target": target} if target else {})}


EPISODE_SET = ProbeSet("mine.jsonl", 2, "sha256:" + "ef" * 32)


def _with_episodes(data: Dict[str, Any], *episodes: Dict[str, Any]) -> Dict[str, Any]:
    return {**data, "episode_set": EPISODE_SET.to_json(), "episodes": list(episodes)}


def _write(folder: Path, data: Dict[str, Any], name: str = "base.json") -> str:
    path = folder / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def _one_server() -> Dict[str, Any]:
    return f.report([rec("p1", "same"), rec("p2", "different")]).to_json()


def _matrix() -> Dict[str, Any]:
    return matrix_report().to_json()


def _twice(data: Dict[str, Any], index: int) -> Dict[str, Any]:
    """``data`` with its probe ``index`` written twice."""
    return {**data, "probes": data["probes"] + [data["probes"][index]]}


@pytest.mark.parametrize("make, message", [
    (lambda: _twice(_one_server(), 0),
     ": two probes have the id 'p1'; a comparison pairs probes by id, so each must be unique: "
     "record it again"),
    (lambda: _with_episodes(_one_server(), _episode("walk"), _episode("tea"), _episode("walk", "different")),
     ": two episodes have the id 'walk'; "),
    (lambda: _twice(_matrix(), 3), ": target 'q4': two probes have the id 'p2'; "),
    (lambda: _with_episodes(_matrix(), _episode("walk", target="f16"), _episode("walk", target="q4"),
                            _episode("walk", target="q4")),
     ": target 'q4': two episodes have the id 'walk'; "),
], ids=["probes", "episodes", "matrix-probes", "matrix-episodes"])
def test_a_repeated_id_is_refused(tmp_path: Path, make: Callable[[], Dict[str, Any]], message: str) -> None:
    """Records are paired by id: a baseline in which two records of one target share an id is refused,
    naming the file, the target and the id (it kept the first of them without a word)."""
    path = _write(tmp_path, make())
    with pytest.raises(BaselineError, match=re.escape(path + message)):
        load_baseline(path)


def test_one_id_in_several_targets_and_kinds_is_no_repeat(tmp_path: Path) -> None:
    data = _with_episodes(_matrix(), _episode("p1", target="f16"), _episode("p1", target="q4"))
    q4 = baseline_for(load_baseline(_write(tmp_path, data)), "q4")
    assert [p.id for p in q4.records] == ["p1", "p2"] and [e.id for e in q4.episodes or []] == ["p1"]


def test_the_report_of_an_interrupted_run_is_refused(tmp_path: Path) -> None:
    data = _one_server()
    data["summary"].update(status="interrupted", why="the run was interrupted by SIGTERM")
    path = _write(tmp_path, data)
    with pytest.raises(BaselineError) as info:
        load_baseline(path)
    assert str(info.value) == (f"{path}: the baseline comes from an interrupted run (the run was interrupted "
                               f"by SIGTERM) and may lack what did not run: record it again with a run that "
                               f"completes")
    # a matrix whose session verdict names another failure first: the interrupted target is enough
    data = _matrix()
    data["summary"].update(status="errors", why="f16: 1 probe failed")
    data["targets"][1]["summary"].update(status="interrupted", why="the run was interrupted")
    with pytest.raises(BaselineError, match="the baseline comes from an interrupted run"):
        load_baseline(_write(tmp_path, data))


@pytest.mark.parametrize("record, status, refused", [
    (True, "errors", True), (True, "too-few-valid", True), (True, "unreliable", True),
    (True, "no-probes", True), (True, "passed", False), (False, "errors", False), (False, "diverged", False),
])
def test_a_failed_recording_is_refused(tmp_path: Path, record: bool, status: str, refused: bool) -> None:
    """A report written by --cachecheck-record whose verdict did not pass is no baseline; an ordinary
    report is one whatever its verdict (its divergences are what a baseline records)."""
    data = _one_server()
    data["settings"]["record"] = record
    data["summary"].update(status=status, why="1 probe failed with a request or server error")
    path = _write(tmp_path, data)
    if not refused:
        assert [p.id for p in load_baseline(path).probes] == ["p1", "p2"]
        return
    with pytest.raises(BaselineError) as info:
        load_baseline(path)
    assert str(info.value) == (f"{path}: the baseline was recorded (--cachecheck-record) by a run whose "
                               f"verdict was {status!r} (1 probe failed with a request or server error), so "
                               f"its measurement cannot be trusted: fix the cause and record it again")


def _version_warning(before: str) -> str:
    return (f"warning: pytest-cachecheck version changed: {before} -> {__version__}; comparisons may not be "
            f"like for like")


def test_a_baseline_of_another_plugin_version_is_compared_with_a_warning(tmp_path: Path) -> None:
    data = _with_episodes(_one_server(), _episode("walk"))
    data["tool"]["version"] = "0.0.9"
    base = baseline_for(load_baseline(_write(tmp_path, data)), None)
    probes = compare(base, [rec("p1", "same"), rec("p2", "different")], env())
    assert probes.env_warnings == [_version_warning("0.0.9")] and probes.verdict == "unchanged"
    assert base.episodes is not None
    episodes = compare(Baseline(base.episodes, base.episode_env), [EpisodeRecord.from_json(_episode("walk"))],
                       env(probe_set=EPISODE_SET), unit="episode")
    assert episodes.env_warnings == [_version_warning("0.0.9")]
    assert _version_warning("0.0.9") in comparison_lines(episodes)
    # a report that does not say which version wrote it
    del data["tool"]
    base = baseline_for(load_baseline(_write(tmp_path, data)), None)
    assert compare(base, [rec("p1", "same")], env()).env_warnings == [_version_warning("?")]


def test_episodes_are_compared_in_the_episode_set_environment(tmp_path: Path) -> None:
    """The episodes' baseline environment holds the episode set's fingerprint, not the probe set's, and a
    change of it is worded for episodes."""
    loaded = load_baseline(_write(tmp_path, _with_episodes(_one_server(), _episode("walk"), _episode("tea"))))
    base = baseline_for(loaded, None)
    assert base.env == env() and base.episode_env == env(probe_set=EPISODE_SET)
    assert base.episodes is not None
    episodes = Baseline(base.episodes, base.episode_env)
    now = [EpisodeRecord.from_json(_episode("walk", "different")), EpisodeRecord.from_json(_episode("tea"))]
    same_set = compare(episodes, now, env(probe_set=EPISODE_SET), unit="episode")
    assert same_set.env_warnings == [] and same_set.newly_diverged() == ["walk"]
    assert same_set.why == "1 newly diverged vs 0 healed over 2 episodes valid in both runs"
    other = ProbeSet("mine.jsonl", 3, "sha256:" + "0f" * 32)
    changed = compare(episodes, now, env(probe_set=other), unit="episode")
    assert changed.env_warnings == ["warning: episode set fingerprint changed: sha256:efefefefefef -> "
                                    "sha256:0f0f0f0f0f0f; only episodes whose conversation is unchanged are "
                                    "compared"]
    none = compare(episodes, [], env(probe_set=EPISODE_SET), unit="episode")
    assert none.why == "no episode was measured in both runs with the same conversation"
    # a baseline without episodes has no episode environment
    assert baseline_for(load_baseline(_write(tmp_path, _one_server())), None).episode_env == {}


# --------------------------------------------------------------------------- through pytest

def test_refused_baselines_are_usage_errors_before_any_request(pytester: pytest.Pytester,
                                                               emulator: Callable[..., Emulator]) -> None:
    """A failed recording, an interrupted run and a repeated id, each as --cachecheck-baseline: the run
    stops with a usage error that names the file and why, and sends no request."""
    common = ["--cachecheck-n=1", "-p", "no:cacheprovider"]
    failing = emulator(fault={2: "500"})  # the probe's first request (after the setup check) fails
    recorded = pytester.runpytest_subprocess(f"--cachecheck-url={failing.url}", *common,
                                             "--cachecheck-record=failed.json")
    assert recorded.ret == 1
    recorded.stdout.fnmatch_lines(["cachecheck verdict: FAIL (errors)*"])
    pytester.makepyfile(test_stop="def test_stop():\n    raise KeyboardInterrupt\n")
    cut = pytester.runpytest_subprocess(f"--cachecheck-url={emulator().url}", *common,
                                        "--cachecheck-report=cut.json")
    assert cut.ret == pytest.ExitCode.INTERRUPTED
    assert json.loads((pytester.path / "cut.json").read_text())["summary"]["status"] == "interrupted"
    _write(pytester.path, _twice(_one_server(), 0), "twice.json")
    quiet = emulator()
    whys = {"failed.json": "the baseline was recorded (--cachecheck-record) by a run whose verdict was "
                           "'errors' (1 probe failed with a request or server error), *: fix the cause and "
                           "record it again",
            "cut.json": "the baseline comes from an interrupted run (the run was interrupted; *) and may "
                        "lack what did not run: record it again with a run that completes",
            "twice.json": "two probes have the id 'p1'; *: record it again"}
    for name, why in whys.items():
        result = pytester.runpytest_subprocess(f"--cachecheck-url={quiet.url}", *common,
                                               f"--cachecheck-baseline={name}")
        assert result.ret == pytest.ExitCode.USAGE_ERROR, name
        result.stderr.fnmatch_lines([f"*--cachecheck-baseline: {pytester.path / name}: {why}"])
    assert quiet.requests_log == []


def test_episode_baseline_compares_episode_sets_and_names_the_plugin_versions(
        pytester: pytest.Pytester, emulator: Callable[..., Emulator]) -> None:
    """The episodes' comparison warns of a changed episode set (not of the probe set, which did not
    change), and both comparisons name the version that wrote the baseline and this one."""
    walk = {"id": "walk", "messages": [{"role": "user", "content": "Plan a walk by the sea."}],
            "user_turns": ["Shorter, please."]}
    tea = {"id": "tea", "messages": [{"role": "user", "content": "How long should green tea steep?"}],
           "user_turns": ["And black tea?"]}
    (pytester.path / "one.jsonl").write_text(json.dumps(walk) + "\n")
    (pytester.path / "two.jsonl").write_text(json.dumps(walk) + "\n" + json.dumps(tea) + "\n")
    emu = emulator()
    common = [f"--cachecheck-url={emu.url}", "--cachecheck-n=1", "-p", "no:cacheprovider"]
    first = pytester.runpytest_subprocess(*common, "--cachecheck-episodes=one.jsonl",
                                          "--cachecheck-report=before.json")
    assert first.ret == 0
    before = json.loads((pytester.path / "before.json").read_text())
    before["tool"]["version"] = "0.0.1"
    _write(pytester.path, before, "before.json")
    after = pytester.runpytest_subprocess(*common, "--cachecheck-episodes=two.jsonl",
                                          "--cachecheck-baseline=before.json",
                                          "--cachecheck-report=after.json")
    assert after.ret == 0
    data = json.loads((pytester.path / "after.json").read_text())
    fingerprints = before["episode_set"]["fingerprint"][:19], data["episode_set"]["fingerprint"][:19]
    episode_set = ("warning: episode set fingerprint changed: %s -> %s; only episodes whose conversation is "
                   "unchanged are compared" % fingerprints)
    target = data["targets"][0]
    assert target["baseline"]["env_warnings"] == [_version_warning("0.0.1")]
    assert target["episode_baseline"]["env_warnings"] == [episode_set, _version_warning("0.0.1")]
    rows = {r["id"]: r["status"] for r in target["episode_baseline"]["rows"]}
    assert rows == {"walk": "still same", "tea": "new probe"}
    after.stdout.fnmatch_lines(["*cachecheck baseline comparison (*", _version_warning("0.0.1"),
                                "*cachecheck baseline comparison of the episodes*", episode_set,
                                _version_warning("0.0.1")])
    assert "probe set fingerprint" not in after.stdout.str()


def test_an_episode_comparison_speaks_of_episodes() -> None:
    c = cmp([rec("a", "same"), rec("b", "same")], [rec("a", "same"), rec("b", "different")])
    episode = "\n".join(comparison_lines(c, unit="episode"))
    assert "(1 episode still same; -v lists them)" in episode
    assert "trajectory change rate: baseline 0.0% (0/2" in episode and "divergence rate" not in episode
    assert "divergence rate: baseline" in "\n".join(comparison_lines(c))
