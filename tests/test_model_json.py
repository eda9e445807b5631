"""The report's JSON: one generic writer and reader over the model's dataclasses (every record class
round-trips, a wrong field is named by its path), schema_version 2, and schema_version 1 still read."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path as FilePath
from typing import Any, Dict, List

import pytest

from pytest_cachecheck import model
from pytest_cachecheck.model import (BatchRecord, BatchShape, BatchSummary, CheckResult, CheckResults,
                                     Divergence, EpisodeRecord, EpisodeStep, EpisodeSummary, LoadedRecord,
                                     LoadedSummary, LoadRun, OrderConditions, OrderRecord, OrderSummary, Outcome,
                                     Parting, Path,
                                     ProbeSet, ReportError, Request, RunReport,
                                     ServerDescription, Setup, Status, Summary, Tally, TargetReport,
                                     ToolCall)
from tests.support import factories as f

GOLDEN = FilePath(__file__).parent / "golden"
V1 = GOLDEN / "v1"  # the goldens as schema_version 1 wrote them, before version 2 (users' saved baselines)


def _through_json(data: Any) -> Any:
    return json.loads(json.dumps(data))


def _episode(target: str = "") -> EpisodeRecord:
    def path(name: str, text: str) -> Path:
        return Path(name=name, ended="user turns ran out", steps=[
            EpisodeStep(step=1, content="", tool_calls=[ToolCall(name="get_weather", arguments='{"city": "Oslo"}')],
                        finish_reason="tool_calls", prompt_tokens=40, completion_tokens=12, cached_tokens=0),
            EpisodeStep(step=2, content=text, tool_calls=[], finish_reason="stop", prompt_tokens=60,
                        completion_tokens=9, cached_tokens=51)])

    return EpisodeRecord(
        id="walk", source="builtin:3", fingerprint="sha256:w", outcome=Outcome.DIFFERENT, reason="parted at step 2",
        parting=Parting(step=2, what="text", divergence=Divergence(char=6, token=2, cache_excerpt="a",
                                                                   recompute_excerpt="b", cache_margin=0.5,
                                                                   recompute_margin=0.25, cache_token="x",
                                                                   recompute_token="y"),
                        cache_steps=2, recompute_steps=2),
        hit_tolerance=32, paths=[path("cache-1", "warm"), path("recompute-1", "cold")], duration_s=1.5,
        target=target or None, server_url="http://127.0.0.1:8000", worker="gw0", run=f.setup(hit_tolerance=15),
        test="test_x.py::test_walk", expected="also changed in the baseline",
        check_results=CheckResults(checks=["contains 'warm'"], cache=CheckResult(passed=True),
                                   recompute=CheckResult(passed=False, reason="`contains 'warm'` (not in it)")))


def _batch(target: str = "") -> BatchRecord:
    return BatchRecord(
        id="a", source="builtin:1", fingerprint="sha256:a", outcome=Outcome.DIFFERENT, reason="under load",
        shape=BatchShape(concurrent=2, prompt_words=20, max_tokens=8, seed=7, lead_s=0.1),
        divergence=Divergence(char=40, token=40, cache_excerpt="a", recompute_excerpt="b"), parted_run=2,
        requests=[Request(step="turn-1", server="cache", content="hi", finish_reason="stop", prompt_tokens=9,
                          completion_tokens=2, cached_tokens=0)],
        loads=[LoadRun(run=1, background=2, in_flight_at_send=2, in_flight_at_answer=1, measured_s=0.5,
                       background_s=0.75)],
        alone_s=[0.25, 0.5], duration_s=2.0, target=target or None, server_url="http://127.0.0.1:8000",
        worker="gw0", run=f.setup(), expected="diverged; the rate gate decides (--cachecheck-max-rate)")


def _order(target: str = "") -> OrderRecord:
    return OrderRecord(
        id="a", source="builtin:1", fingerprint="sha256:a", outcome=Outcome.DIFFERENT, reason="pass B",
        conditions=OrderConditions(between=2, prompt_words=20, max_tokens=8, seed=3, cache_ram=8192),
        divergence=Divergence(char=40, token=40, cache_excerpt="a", recompute_excerpt="b"), parted_turn=1,
        positions=[1, 2], requests=[Request(step="A/turn-1", server="cache", content="hi",
                                            finish_reason="stop", prompt_tokens=9, completion_tokens=2,
                                            cached_tokens=0)],
        duration_s=2.0, target=target or None, server_url="http://127.0.0.1:8000", worker="gw0",
        run=f.setup(),
        expected="diverged; the rate gate decides (--cachecheck-max-rate)")


def _loaded(target: str = "") -> LoadedRecord:
    return LoadedRecord(
        id="a", source="builtin:1", fingerprint="sha256:a", outcome=Outcome.DIFFERENT, reason="differed",
        divergence=Divergence(char=40, token=40, cache_excerpt="a", recompute_excerpt="b"),
        shape=BatchShape(concurrent=2, prompt_words=20, max_tokens=8, seed=7, lead_s=0.1),
        loads=[LoadRun(run=i, background=2, in_flight_at_send=2, in_flight_at_answer=1, measured_s=0.5,
                       background_s=0.75) for i in (1, 2, 3, 4)],
        load_alone="different", duration_s=2.0, target=target or None, server_url="http://127.0.0.1:8000",
        worker="gw0", run=f.setup())


def _report() -> RunReport:
    """A report with a baseline comparison, episodes and their summary, checks and a flip."""
    base = f.baseline([f.record("a", "same"), f.record("b", "same")])
    rep = f.report([f.record("a", "same"), f.record("b", "different", cache="x1", recompute="x2", margins=(0.1, 0.2))],
                   baselines={None: base}, exit_status=1)
    t = rep.targets[0]
    t.episodes = [_episode()]
    t.episode_summary = EpisodeSummary.of(t.episodes, not_run=["tea"])
    t.served = {"demo": True, "command": ["llama-server"]}
    t.setup.nocache_server = ServerDescription(kind="llama.cpp", build="b1", model="m", details={"n": 1})
    rep.episode_set = ProbeSet(name="builtin", count=2, fingerprint="sha256:e")
    t.batches = [_batch()]
    t.batch_summary = BatchSummary.of(t.batches, t.batches[0].shape, not_run=["b"])
    t.loaded = [_loaded()]
    t.loaded_summary = LoadedSummary.of(t.loaded, t.loaded[0].shape, not_run=["b"])
    t.orders = [_order()]
    t.order_summary = OrderSummary.of(t.orders, t.orders[0].conditions, not_run=["b"])
    return rep


def _records_of(rep: RunReport) -> Dict[type, Any]:
    """One instance of every record class, found in a report."""
    t = rep.targets[0]
    probe = next(p for p in t.probes if p.divergence is not None)
    episode = (t.episodes or [])[0]
    batch = (t.batches or [])[0]
    order = (t.orders or [])[0]
    assert t.baseline is not None and t.episode_summary is not None and t.setup.server is not None
    assert probe.checks is not None and episode.parting is not None and episode.check_results is not None
    found = [rep, t, t.setup, t.setup.server, t.summary, t.summary.tally, t.baseline, t.baseline.rows[0],
             t.baseline.current_rate, rep.probe_set, probe, probe.requests[0], probe.divergence, probe.checks,
             probe.checks.cache_hits[0], episode, episode.paths[0], episode.paths[0].steps[0],
             episode.paths[0].steps[0].tool_calls[0], episode.parting, episode.check_results,
             episode.check_results.recompute, t.episode_summary, batch, batch.shape, batch.loads[0],
             t.batch_summary, (t.loaded or [])[0], t.loaded_summary, order, order.conditions, t.order_summary]
    return {type(x): x for x in found}


def _record_classes() -> List[type]:
    out, todo = [], list(model._Json.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if "__dataclass_fields__" in vars(cls):
            out.append(cls)
    return out


def test_every_record_class_round_trips() -> None:
    """Each class written by the generic writer reads back equal (through JSON text). Written only, never
    read: CheckTally (a target's check_summary is derived from its records)."""
    found = _records_of(_report())
    missing = {c.__name__ for c in _record_classes()} - {c.__name__ for c in found} - {"CheckTally"}
    assert not missing, f"add an instance of {missing} to _records_of"
    for cls, obj in found.items():
        if cls is TargetReport:  # a target's records are the report's, written once at the top
            obj = dataclasses.replace(obj, probes=[], episodes=None, batches=None, loaded=None, orders=None)
        data = _through_json(obj.to_json())
        back = RunReport.from_json(data) if cls is RunReport else cls.from_json(data)
        assert back == obj, cls.__name__
        assert back.to_json() == data, cls.__name__


def test_derived_values_are_written_and_not_read() -> None:
    rep = _report()
    t = rep.targets[0]
    data = rep.to_json()
    target = data["targets"][0]
    assert target["summary"]["rate"] == 0.5 and target["summary"]["valid"] == 2  # Summary's derived values
    assert list(target["summary"])[:8] == ["probes", "valid", "same", "different", "inconclusive", "errors",
                                           "rate", "rate_ci95"]
    probe = data["probes"][1]
    assert probe["answers"]["cache"] == ["x1", "x1"] and probe["divergence"]["kind"] == "large-gap"
    assert target["episode_summary"]["changed"] == 1 and target["episode_summary"]["parting_steps"] == {"2": 1}
    assert target["episode_check_summary"]["cache_fails"] == 0 and target["episode_check_summary"]["flips"] == 1
    assert "check_summary" not in target  # no probe had checks
    assert data["episodes"][0]["check_results"]["flip"] == "cache-passes"
    assert "probes" not in target and "episodes" not in target  # written once, at the top
    # a derived value in the JSON is never read back: a wrong one changes nothing
    target["summary"]["valid"] = 99
    assert RunReport.from_json(data).targets[0].summary == t.summary


@pytest.mark.parametrize("edit, named", [
    (lambda d: d["episodes"][0]["paths"][1]["steps"][0]["tool_calls"][0].update(name=5),
     "episodes[0].paths[1].steps[0].tool_calls[0].name': expected a string, got int"),
    (lambda d: d["episodes"][0]["parting"].update(step="2"), "episodes[0].parting.step': expected a whole number"),
    (lambda d: d["episodes"][0]["check_results"]["cache"].update(passed="yes"),
     "episodes[0].check_results.cache.passed': expected true or false, got str"),
    (lambda d: d["targets"][0]["episode_summary"].update(changed=[]),
     "targets[0].episode_summary.changed': expected a whole number, got list"),
    (lambda d: d["targets"][0]["nocache_server"].update(details=[]),
     "targets[0].nocache_server.details': expected an object, got list"),
    (lambda d: d["targets"][0]["baseline"]["current_rate"].update(valid=None),
     "targets[0].baseline.current_rate.valid': expected a whole number, got null"),
    (lambda d: d["probes"][1]["checks"]["cache_hits"][1].update(full_reuse=1.5),
     "probes[1].checks.cache_hits[1].full_reuse': expected a whole number, got float"),
    (lambda d: d["targets"][0].update(summary={"status": "fine"}), "targets[0].summary.status': unknown value 'fine'"),
    (lambda d: d["episode_set"].update(count="2"), "episode_set.count': expected a whole number, got str"),
])
def test_a_wrong_field_is_named_by_its_path(edit: Any, named: str) -> None:
    data = _report().to_json()
    edit(data)
    with pytest.raises(ReportError, match="^field '" + named.replace("[", r"\[").replace("]", r"\]")):
        RunReport.from_json(data)


def test_tolerant_reads_fill_what_a_sparse_record_lacks() -> None:
    """Null or missing: the field's default, its declared ``missing`` value, or empty (lists, optional values)."""
    assert Setup.from_json({}) == Setup(mode=None, server=None)
    assert ServerDescription.from_json({"kind": None}) == ServerDescription(kind="?")
    assert Summary.from_json({"status": "passed"}) == Summary(tally=Tally(), status=Status.PASSED, why="")
    assert Parting.from_json({"step": 1}) == Parting(step=1, what="text", divergence=None, cache_steps=0,
                                                     recompute_steps=0)
    assert "target" not in f.record("a", "same").to_json()  # an optional key left out when None


@pytest.mark.parametrize("name", ["one-server.before", "one-server.after", "matrix", "gated"])
def test_a_schema_version_1_report_reads_as_its_version_2(name: str) -> None:
    """The goldens as version 1 wrote them (flat without a matrix) and as version 2 writes them now, of one
    run each: both read to the same RunReport, and it writes the version 2 file."""
    v1 = json.loads((V1 / f"{name}.json").read_text(encoding="utf-8"))
    v2 = json.loads((GOLDEN / f"{name}.json").read_text(encoding="utf-8"))
    assert v1["schema_version"] == 1 and v2["schema_version"] == 2
    old, new = RunReport.from_json(v1), RunReport.from_json(v2)
    assert old == new
    assert old.to_json() == v2
    assert old.matrix == (name == "matrix") and len(old.targets) == (3 if name == "matrix" else 1)


def test_a_schema_version_1_flat_report_names_its_own_fields() -> None:
    v1 = json.loads((V1 / "one-server.after.json").read_text(encoding="utf-8"))
    v1["setup_warnings"] = "one"
    with pytest.raises(ReportError, match=r"^field 'setup_warnings': expected a list, got str"):
        RunReport.from_json(v1)


@pytest.mark.parametrize("version", [3, 0, "2", 2.0, True])
def test_another_schema_version_is_refused(version: Any) -> None:
    data = {**_report().to_json(), "schema_version": version}
    with pytest.raises(ReportError, match=r"unsupported schema_version .*; this version of pytest-cachecheck reads "
                                          r"schema_version 1 and 2"):
        RunReport.from_json(data)


def test_version_2_has_one_shape() -> None:
    """Every report has targets: one, named null, without a matrix; the run's keys stay at the top."""
    data = f.report([f.record("a", "same")]).to_json()
    assert list(data) == ["schema_version", "tool", "created", "settings", "probe_set", "summary", "targets",
                          "probes"]
    [target] = data["targets"]
    assert target["name"] is None and target["url"] == f.URL and target["summary"] == data["summary"]
    with pytest.raises(ReportError, match=r"^field 'targets': expected a list of at least one target"):
        RunReport.from_json({**data, "targets": []})
