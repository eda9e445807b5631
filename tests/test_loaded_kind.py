"""The cache under load from pytest (``--cachecheck-load-cache`` with ``--cachecheck-batch N``): items
``cachecheck::loaded[<probe id>]`` against the vLLM emulator, with the plugin run in a subprocess.

The controls: a cache fault that appears only amid other requests (``diverge_on_hit_under_load``) fails the
loaded items, and only them (the quiet probes and the batch probes pass), in every output, each naming the
conditions; with the batch fault too (``batch_variant``) the load alone explains the divergence, and the summary
says so; the same server without a fault passes. Then: off by default (and with --cachecheck-batch alone),
a usage error without --cachecheck-batch, the rate gate per kind, the placement under pytest-xdist.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from typing import Any, Dict

import pytest
import requests  # noqa: F401  (one copy of requests across pytester runs; see tests/test_faults.py)

import pytest_cachecheck.protocol  # noqa: F401
from pytest_cachecheck.model import RunReport
from tests.support import emulator as emulator_module

FAST = ["-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:benchmark", "-p", "no:randomly"]
# the emulator's 1 s a generation keeps the background in flight well past the 0.2 s lead, also on a loaded
# machine (with 0.5 s, a CI run under load once saw a background end inside the lead)
LOADED = ["--cachecheck-n=2", "--cachecheck-batch=2", "--cachecheck-batch-prompt-words=20",
          "--cachecheck-batch-max-tokens=8", "--cachecheck-batch-seed=7", "--cachecheck-load-cache"]
SHAPE = "cache under load: 2 background requests of 20 words, up to 8 tokens, seed 7"
IDS = ["tea-steeping", "bike-chain"]


@pytest.fixture(autouse=True)
def _emulator_without_nagle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emulator_module._Handler, "disable_nagle_algorithm", True)  # see tests/test_faults.py


def _report(path: Any) -> Dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    RunReport.from_json(data)  # it reads back
    return data


def test_positive_control_a_fault_only_under_load_fails_only_the_loaded_items(pytester, emulator):
    emu = emulator(diverge_on_hit_under_load=True, compute_seconds=1.0)
    result = pytester.runpytest_subprocess(
        f"--cachecheck-url={emu.url}", *LOADED, "--cachecheck-report=r.json", "--cachecheck-html=r.html",
        "--junitxml=j.xml", "-rA", *FAST)
    assert result.ret == 1
    result.assert_outcomes(passed=4, failed=3)  # probes and batch probes pass; loaded items and the gate fail
    out = result.stdout.str()
    for pid in IDS:
        assert f"PASSED cachecheck::probe[{pid}]" in out and f"PASSED cachecheck::batch[{pid}]" in out
        assert f"FAILED cachecheck::loaded[{pid}] - Failed: [cache under load: " in out  # cut to the width
    assert out.count(f"\n[{SHAPE}] cache path and recompute path gave different turn-2 answers") == 2
    failures = out.split("= FAILURES =")[1].split("short test summary info")[0]  # CI shows them again there
    assert failures.count("\n  the load alone (batch kind, cache off): same") == 2
    assert f"cachecheck: {SHAPE}: each probe's cache and recompute paths are measured again" in out  # header
    assert f"{SHAPE}: loaded probes 2 | valid 2 (same 0, different 2) | inconclusive 0 | errors 0" in out
    assert (f"{SHAPE}: 2 of 2 valid loaded probes diverged under load; the load alone (batch, cache off) changed "
            f"0 of those 2.") in out
    assert (f"{SHAPE}: divergence rate under load 100.0% (95% Wilson interval 34.2% to 100.0%, 2 valid loaded "
            f"probes)") in out
    assert (f"cachecheck verdict: FAIL (diverged): 2 valid loaded probes diverged under load "
            f"({SHAPE})") in out
    section = out.split("cachecheck attribution: each cause measured apart, on the same probes")[1]
    for pid in IDS:
        assert f"\n{pid}: cache same, batch same, cache under load different" in section
    # the JSON report: the loaded records, with their load runs and the batch kind's word on each
    data = _report(pytester.path / "r.json")
    assert [x["id"] for x in data["loaded"]] == IDS
    for x in data["loaded"]:
        assert x["kind"] == "loaded" and x["outcome"] == "different" and x["load_alone"] == "same"
        assert x["conditions"]["concurrent"] == 2 and len(x["loads"]) == 4
        assert all(r["in_flight_at_send"] >= 1 for r in x["loads"])
        assert x["checks"]["cache_hits"][0]["cached_tokens"] > 0
    summary = data["targets"][0]["loaded_summary"]
    assert (summary["probes"], summary["valid"], summary["different"]) == (2, 2, 2)
    assert (summary["load_alone_different"], summary["load_alone_same"]) == (0, 2)
    assert data["settings"]["load_cache"] is True and SHAPE in data["summary"]["why"]
    assert [p["outcome"] for p in data["probes"]] == ["same", "same"]
    # the HTML page
    page = (pytester.path / "r.html").read_text(encoding="utf-8")
    assert '<h2 id="loaded">Cache under load (2)</h2>' in page and f"<b>{SHAPE}</b>" in page
    assert "Diverged under load (2)" in page and "divergence rate under load <b>100.0%</b>" in page
    assert "the load alone (batch kind, cache off): same" in page
    # JUnit: the failure is the record's message; the record is a property
    cases = {c.get("name"): c for c in ET.parse(pytester.path / "j.xml").getroot().iter("testcase")}
    for pid in IDS:
        failure = cases[f"loaded[{pid}]"].find("failure")
        assert failure is not None and failure.get("message", "").startswith(f"Failed: [{SHAPE}] cache path")
        props = {p.get("name"): p.get("value") for p in cases[f"loaded[{pid}]"].iter("property")}
        assert json.loads(props["cachecheck_loaded"])["load_alone"] == "same"


def test_the_load_alone_explains_a_divergence_when_the_batch_changed_the_answer_too(pytester, emulator):
    emu = emulator(diverge_on_hit_under_load=True, batch_variant=True, compute_seconds=1.0)
    result = pytester.runpytest_subprocess(
        f"--cachecheck-url={emu.url}", *LOADED, "--cachecheck-report=r.json", *FAST)
    assert result.ret == 1
    out = result.stdout.str()
    assert (f"{SHAPE}: 2 of 2 valid loaded probes diverged under load; the load alone (batch, cache off) changed "
            f"2 of those 2.") in out
    data = _report(pytester.path / "r.json")
    assert [b["outcome"] for b in data["batches"]] == ["different", "different"]
    assert [x["load_alone"] for x in data["loaded"]] == ["different", "different"]
    assert data["targets"][0]["loaded_summary"]["load_alone_different"] == 2


def test_negative_control_no_fault_passes(pytester, emulator):
    emu = emulator(compute_seconds=1.0)
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *LOADED, "--cachecheck-report=r.json",
                                           *FAST)
    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=7)
    out = result.stdout.str()
    assert f"{SHAPE}: 0 of 2 valid loaded probes diverged under load." in out
    assert ("cachecheck verdict: PASS (passed): no valid probe differed and no valid batch probe answered "
            "differently amid other requests and no valid loaded probe diverged under load") in out
    data = _report(pytester.path / "r.json")
    assert [x["outcome"] for x in data["loaded"]] == ["same", "same"]
    assert [x["load_alone"] for x in data["loaded"]] == ["same", "same"]


def test_off_by_default_and_with_the_batch_kind_alone(pytester, emulator):
    emu = emulator(compute_seconds=0.2)
    result = pytester.runpytest_subprocess(
        f"--cachecheck-url={emu.url}", *LOADED[:-1], "--cachecheck-report=r.json", *FAST)
    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=5)
    assert "loaded" not in result.stdout.str() and "under load:" not in result.stdout.str()
    data = _report(pytester.path / "r.json")
    assert "loaded" not in data and "loaded_summary" not in data["targets"][0]
    assert "load_cache" not in data["settings"]


def test_without_the_batch_kind_it_is_a_usage_error_before_any_request(pytester, emulator):
    emu = emulator()
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", "--cachecheck-load-cache", *FAST)
    assert result.ret == 4, result.stdout.str()
    assert "--cachecheck-load-cache measures the cache amid the batch kind's background; it goes with " \
        "--cachecheck-batch N" in result.stderr.str()
    assert emu.requests_log == []


@pytest.mark.parametrize("max_rate, ok", [("1", True), ("0.4", False)])
def test_the_rate_gate_judges_the_loaded_kind(pytester, emulator, max_rate, ok):
    emu = emulator(diverge_on_hit_under_load=True, compute_seconds=1.0)
    result = pytester.runpytest_subprocess(
        f"--cachecheck-url={emu.url}", *LOADED, f"--cachecheck-max-rate={max_rate}", "-rA", *FAST)
    out = result.stdout.str()
    assert result.ret == (0 if ok else 1), out
    assert "XFAIL cachecheck::loaded[tea-steeping] - diverged; the rate gate decides (--cachecheck-max-rate)" in out
    if ok:
        assert "divergence rate under load 100.0% is within --cachecheck-max-rate 1" in out
    else:
        assert ("cachecheck verdict: FAIL (gate-failed): divergence rate under load 100.0% (2 of 2) exceeds "
                "--cachecheck-max-rate 0.4") in out


def test_under_xdist_loaded_items_share_the_worker_of_their_servers_probes(pytester, emulator):
    emu = emulator(compute_seconds=1.0)
    pytester.makepyfile(**{f"test_user{i}": "def test_a(): pass\n" for i in range(3)})
    result = pytester.runpytest_subprocess(
        f"--cachecheck-url={emu.url}", *LOADED, "-n", "2", "-v", "--cachecheck-report=r.json", *FAST)
    assert result.ret == 0, result.stdout.str()
    workers = {nodeid: worker for worker, nodeid in re.findall(
        r"^\[(gw\d+)\] \[\s*\d+%\] PASSED (cachecheck::\S+)", result.stdout.str(), re.M)}
    items = [f"cachecheck::{k}[{p}]" for k in ("probe", "batch", "loaded") for p in IDS]
    assert set(items) <= set(workers) and len({workers[i] for i in items}) == 1, workers
    data = _report(pytester.path / "r.json")
    assert len({r["worker"] for r in data["probes"] + data["batches"] + data["loaded"]}) == 1
    assert [x["load_alone"] for x in data["loaded"]] == ["same", "same"]  # the batch record on the same worker
