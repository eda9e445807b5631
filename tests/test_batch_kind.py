"""The batch kind from pytest (``--cachecheck-batch N``): items ``cachecheck::batch[<probe id>]`` against the
vLLM emulator, a real HTTP server in the test process, with the plugin run in a subprocess.

The controls: a server whose answers depend on the batch (``batch_variant``) fails the run with the batch
divergence in every output, each naming the conditions; the same server without the fault passes. Then the
selection (``-k batch``), the rate gate, the placement under pytest-xdist, bad option values (usage errors
before any request), and llama-server's slot problem turned into a warning under --cachecheck-batch.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Dict, List

import pytest
import requests  # noqa: F401  (one copy of requests across pytester runs; see tests/test_faults.py)
import responses

import pytest_cachecheck.protocol  # noqa: F401
from pytest_cachecheck.errors import ServerSetupError
from pytest_cachecheck.model import BatchRecord, Outcome, RunReport, Tally
from pytest_cachecheck.redact import Redactor
from pytest_cachecheck.servers import resolve as resolve_setup
from pytest_cachecheck.settings import Settings
from tests.support import emulator as emulator_module

FAST = ["-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:benchmark", "-p", "no:randomly"]
# two background requests of 20 words, 8 tokens each: the emulator's compute_seconds (0.5 s a request, well
# past the 0.2 s the measured request waits, also on a loaded machine) gives them their time
BATCH = [
    "--cachecheck-n=2",
    "--cachecheck-batch=2",
    "--cachecheck-batch-prompt-words=20",
    "--cachecheck-batch-max-tokens=8",
    "--cachecheck-batch-seed=7",
]
SHAPE = "batch: 2 background requests of 20 words, up to 8 tokens, seed 7; cache off"
IDS = ["tea-steeping", "bike-chain"]


@pytest.fixture(autouse=True)
def _emulator_without_nagle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emulator_module._Handler, "disable_nagle_algorithm", True)  # see tests/test_faults.py


def _report(path: Any) -> Dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    RunReport.from_json(data)  # it reads back
    return data


def _recount(records: List[Dict[str, Any]]) -> Dict[str, int]:
    """The counts of these records, read back by the model."""
    t = Tally.of([BatchRecord.from_json(r) for r in records])
    return {
        "probes": t.probes,
        "valid": t.valid,
        "same": t.same,
        "different": t.different,
        "inconclusive": t.inconclusive,
        "errors": t.errors,
    }


def test_positive_control_fails_the_run_in_every_output(pytester, emulator):
    emu = emulator(batch_variant=True, compute_seconds=0.5)
    result = pytester.runpytest_subprocess(
        f"--cachecheck-url={emu.url}",
        *BATCH,
        "--cachecheck-report=r.json",
        "--cachecheck-html=r.html",
        "--junitxml=j.xml",
        "-rA",
        *FAST,
    )
    assert result.ret == 1
    # the cache probes run no batch (one request at a time): they pass; the batch items fail
    result.assert_outcomes(passed=2, failed=3)
    out = result.stdout.str()
    for pid in IDS:
        assert f"PASSED cachecheck::probe[{pid}]" in out
        assert f"FAILED cachecheck::batch[{pid}] - Failed: [batch: " in out  # the line is cut to the width
    assert out.count(f"\n[{SHAPE}] under load (run ") == 2  # the failures, in full
    assert f"cachecheck: {SHAPE}: each probe is measured again" in out  # the header
    assert f"{SHAPE}: batch probes 2 | valid 2 (same 0, different 2) | inconclusive 0 | errors 0" in out
    assert f"{SHAPE}: 2 of 2 valid batch probes answered differently amid other requests." in out
    assert (
        f"{SHAPE}: batch divergence rate 100.0% (95% Wilson interval 34.2% to 100.0%, 2 valid batch probes)"
        in out
    )
    assert (
        f"cachecheck verdict: FAIL (diverged): 2 valid batch probes answered differently amid other requests "
        f"({SHAPE})"
    ) in out
    # the attribution: each cause on its own line under its conditions, then each probe that differed with
    # its outcome under every cause (the cache probes ran quiet and stayed the same)
    section = out.split("cachecheck attribution: each cause measured apart, on the same probes")[1]
    assert "\ncache: 0 of 2 valid probes differed, 0.0% (95% interval 0.0% to 65.8%); 0 inconclusive, 0 errors [a " \
        "quiet server, one request at a time: a cache hit against a recompute]" in section
    assert f"\nbatch: 2 of 2 valid batch probes answered differently amid other requests, 100.0% (95% interval " \
        f"34.2% to 100.0%); 0 inconclusive, 0 errors [{SHAPE[len('batch: '):]}]" in section  # named once
    for pid in IDS:
        assert f"\n{pid}: cache same, batch different" in section
    # the JSON report: the batch records, valid and different, counted as the summary says
    data = _report(pytester.path / "r.json")
    assert [b["id"] for b in data["batches"]] == IDS
    assert all(
        b["kind"] == "batch" and b["outcome"] == "different" and b["divergence"] for b in data["batches"]
    )
    assert all(
        b["conditions"] == {"concurrent": 2, "prompt_words": 20, "max_tokens": 8, "seed": 7, "lead_s": 0.2}
        for b in data["batches"]
    )
    assert all(x["in_flight_at_send"] == 2 for b in data["batches"] for x in b["loads"])
    summary = data["targets"][0]["batch_summary"]
    assert (
        {k: summary[k] for k in _recount(data["batches"])}
        == _recount(data["batches"])
        == {"probes": 2, "valid": 2, "same": 0, "different": 2, "inconclusive": 0, "errors": 0}
    )
    assert summary["conditions"]["concurrent"] == 2 and data["settings"]["batch"] == 2
    assert data["summary"]["status"] == "diverged" and SHAPE in data["summary"]["why"]
    # the HTML page: the section under its conditions, each probe's answers alone and amid other requests
    page = (pytester.path / "r.html").read_text(encoding="utf-8")
    assert '<h2 id="batches">Batch probes (2)</h2>' in page and f"<b>{SHAPE}</b>" in page
    assert "Answered differently amid other requests (2)" in page
    assert "batch divergence rate <b>100.0%</b> (2 of 2 valid batch probes)" in page
    # its attribution: both causes in one table, each probe that differed with its outcome under each
    attributed = page.split('<h2 id="attribution">Attribution</h2>')[1]
    assert f"<td>{SHAPE[len('batch: '):]}</td>" in attributed and "<td>cache</td>" in attributed
    assert "Probes that differed under any cause (2)" in attributed
    for pid in IDS:
        assert re.search(rf"<td>{pid}</td><td><span class=\"badge b-same\">same</span></td><td><span "
                         rf"class=\"badge b-different\">different</span></td>", attributed)
    # JUnit: each batch item's failure is its record's message, naming the conditions
    cases = {c.get("name"): c for c in ET.parse(pytester.path / "j.xml").getroot().iter("testcase")}
    for pid in IDS:
        failure = cases[f"batch[{pid}]"].find("failure")
        assert failure is not None and failure.get("message", "").startswith(f"Failed: [{SHAPE}] under load")
        props = {p.get("name"): p.get("value") for p in cases[f"batch[{pid}]"].iter("property")}
        assert json.loads(props["cachecheck_batch"])["outcome"] == "different"


def test_negative_control_no_fault_passes(pytester, emulator):
    emu = emulator(compute_seconds=0.5)
    result = pytester.runpytest_subprocess(
        f"--cachecheck-url={emu.url}", *BATCH, "--cachecheck-report=r.json", *FAST
    )
    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=5)
    out = result.stdout.str()
    assert f"{SHAPE}: 0 of 2 valid batch probes answered differently amid other requests." in out
    assert (
        "cachecheck verdict: PASS (passed): no valid probe differed and no valid batch probe answered "
        "differently amid other requests" in out
    )
    data = _report(pytester.path / "r.json")
    assert [b["outcome"] for b in data["batches"]] == ["same", "same"]
    assert emu.max_in_flight == 3  # the measured request and both background requests at once


def test_without_the_option_nothing_changes(pytester, emulator):
    emu = emulator()
    result = pytester.runpytest_subprocess(
        f"--cachecheck-url={emu.url}", "--cachecheck-n=2", "--cachecheck-report=r.json", *FAST
    )
    result.assert_outcomes(passed=3)
    assert "batch" not in result.stdout.str()
    data = _report(pytester.path / "r.json")
    assert (
        "batches" not in data
        and "batch_summary" not in data["targets"][0]
        and "batch" not in data["settings"]
    )


def test_k_batch_selects_only_the_batch_items_and_the_gate_judges(pytester, emulator):
    emu = emulator(batch_variant=True, compute_seconds=0.5)
    result = pytester.runpytest_subprocess(
        f"--cachecheck-url={emu.url}", *BATCH, "-k", "batch", "-v", "--cachecheck-report=r.json", *FAST
    )
    assert result.ret == 1
    ran = re.findall(r"^(cachecheck::\S+) (PASSED|FAILED)", result.stdout.str(), re.M)
    assert ran == [(f"cachecheck::batch[{p}]", "FAILED") for p in IDS] + [("cachecheck::gate", "FAILED")]
    assert len([b for b in emu.requests_log if b.get("messages")]) > 0
    data = _report(pytester.path / "r.json")
    assert data["probes"] == [] and len(data["batches"]) == 2
    # the result block counts what ran: the batch probes, no "probes 0" line for the probes that did not
    block = result.stdout.str().split("cachecheck result (to share")[1]
    assert "batch probes 2 | valid 2" in block.replace(" (same 0, different 2)", "")
    assert not re.search(r"^probes 0 \|", block, re.M) and "no valid probe differed" not in block


@pytest.mark.parametrize("max_rate, ok", [("1", True), ("0.4", False)])
def test_the_rate_gate_judges_the_batch_kind(pytester, emulator, max_rate, ok):
    emu = emulator(batch_variant=True, compute_seconds=0.5)
    result = pytester.runpytest_subprocess(
        f"--cachecheck-url={emu.url}", *BATCH, f"--cachecheck-max-rate={max_rate}", "-rA", *FAST
    )
    out = result.stdout.str()
    assert result.ret == (0 if ok else 1), out
    # divergences are expected failures: the gate decides
    assert (
        "XFAIL cachecheck::batch[tea-steeping] - diverged; the rate gate decides (--cachecheck-max-rate)"
        in out
    )
    if ok:
        assert "batch divergence rate 100.0% is within --cachecheck-max-rate 1" in out
    else:
        assert (
            "cachecheck verdict: FAIL (gate-failed): batch divergence rate 100.0% (2 of 2) exceeds "
            "--cachecheck-max-rate 0.4"
        ) in out


def test_under_xdist_batch_items_share_the_worker_of_their_servers_probes(pytester, emulator):
    emu = emulator(compute_seconds=0.5)
    pytester.makepyfile(**{f"test_user{i}": "def test_a(): pass\n" for i in range(3)})
    result = pytester.runpytest_subprocess(
        f"--cachecheck-url={emu.url}", *BATCH, "-n", "2", "-v", "--cachecheck-report=r.json", *FAST
    )
    assert result.ret == 0, result.stdout.str()
    workers = {}
    for worker, nodeid in re.findall(
        r"^\[(gw\d+)\] \[\s*\d+%\] PASSED (cachecheck::\S+)", result.stdout.str(), re.M
    ):
        workers[nodeid] = worker
    items = [f"cachecheck::{k}[{p}]" for k in ("probe", "batch") for p in IDS]
    assert set(items) <= set(workers) and len({workers[i] for i in items}) == 1, workers
    data = _report(pytester.path / "r.json")
    assert len({r["worker"] for r in data["probes"] + data["batches"]}) == 1


@pytest.mark.parametrize(
    "args, words",
    [
        (["--cachecheck-batch=0"], "--cachecheck-batch"),
        (["--cachecheck-batch=2", "--cachecheck-batch-prompt-words=x"], "--cachecheck-batch-prompt-words"),
        (["--cachecheck-batch-seed=3"], "they go with --cachecheck-batch N"),
        (
            ["--cachecheck-batch=2", "--cachecheck-nocache-url=http://127.0.0.1:9"],
            "conflicts with two-servers mode",
        ),
    ],
)
def test_bad_values_are_usage_errors_before_any_request(pytester, emulator, args, words):
    emu = emulator()
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *args, *FAST)
    assert result.ret == 4, result.stdout.str()
    assert words in result.stderr.str()
    assert emu.requests_log == []


URL = "http://127.0.0.1:8080"


def _llama_server(slots: int) -> None:
    responses.get(
        URL + "/props",
        json={
            "build_info": "b1",
            "total_slots": slots,
            "model_path": "/m/tiny.gguf",
            "model_alias": "tiny.gguf",
            "default_generation_settings": {"n_ctx": 4096},
        },
    )
    responses.get(
        URL + "/v1/models",
        json={
            "object": "list",
            "data": [
                {"id": "tiny.gguf", "aliases": ["tiny.gguf"], "object": "model", "owned_by": "llamacpp"}
            ],
        },
    )


@responses.activate
def test_llama_server_slots_are_a_setup_problem_unless_the_batch_kind_is_on():
    _llama_server(4)
    with pytest.raises(ServerSetupError, match="llama-server runs 4 slots that share one cache"):
        resolve_setup(Settings(url=URL), Redactor())
    setup = resolve_setup(Settings(url=URL, batch=3), Redactor())
    assert setup.mode == "llama.cpp" and len(setup.warnings) == 1
    assert setup.warnings[0].startswith("llama-server runs 4 slots that share one cache")
    assert "kept as a warning because --cachecheck-batch needs several slots" in setup.warnings[0]
    assert "the cache hit must cover turn 1" in setup.warnings[0]
    assert setup.describe().setup_warnings == setup.warnings  # the report's setup warnings


@responses.activate
@pytest.mark.parametrize("slots, batch, said", [
    (1, 3, "batched with nothing: it is computed alone (the one-slot negative control)"),
    (3, 3, "batched with at most 2 of them; start it with -np 4 or more to batch it with all 3"),
    (4, 3, None), (8, 2, None)])
def test_fewer_slots_than_the_batch_sends_is_a_setup_warning(slots, batch, said):
    """The measured request and N background ones need N + 1 slots to be computed together: with fewer, the
    measured request waits for a slot, and the warning says with how many it is batched (none: the negative
    control). Without --cachecheck-batch the slot count is only the cache probes' setup problem."""
    _llama_server(slots)
    setup = resolve_setup(Settings(url=URL, batch=batch), Redactor())
    few = [w for w in setup.warnings if "waits for a slot" in w]
    if said is None:
        assert few == []
    else:
        assert len(few) == 1 and said in few[0]
        assert few[0].startswith(f"llama-server runs {slots} slot{'s' if slots > 1 else ''}, so with "
                                 f"--cachecheck-batch {batch} the measured request waits for a slot")


def test_a_batch_record_outcome_is_judged_as_a_probe():
    from pytest_cachecheck.run import expectation
    from pytest_cachecheck.settings import resolve

    record = BatchRecord(id="a", source="s", fingerprint="f", outcome=Outcome.DIFFERENT, reason="r")
    plain = resolve({"url": [URL], "batch": "2"}, base_dir=Path("."))
    gated = resolve({"url": [URL], "batch": "2", "max_rate": "0.5"}, base_dir=Path("."))
    assert plain is not None and gated is not None
    assert expectation(record, plain, {}) is None
    assert expectation(record, gated, {}) == "diverged; the rate gate decides (--cachecheck-max-rate)"


def test_a_target_matrix_measures_each_target_under_its_name(pytester, emulator):
    a, b = emulator(compute_seconds=0.5), emulator(batch_variant=True, compute_seconds=0.5)
    result = pytester.runpytest_subprocess(
        f"--cachecheck-target=a={a.url}", f"--cachecheck-target=b={b.url}", *BATCH[1:], "--cachecheck-n=1",
        "--cachecheck-report=r.json", "-v", *FAST
    )
    assert result.ret == 1
    out = result.stdout.str()
    assert "cachecheck::batch[tea-steeping@a] PASSED" in out and "cachecheck::batch[tea-steeping@b] FAILED" in out
    assert f"b: {SHAPE}: 1 of 1 valid batch probe answered differently amid other requests." in out
    assert "cachecheck verdict: FAIL (diverged): b: 1 valid batch probe answered differently" in out
    data = _report(pytester.path / "r.json")
    assert [(r["target"], r["outcome"]) for r in data["batches"]] == [("a", "same"), ("b", "different")]
    assert [t["batch_summary"]["different"] for t in data["targets"]] == [0, 1]


def test_a_failed_request_errors_the_batch_item_in_setup(pytester, emulator):
    # chat requests: 1 the setup check, 2 turn 1, 3 alone run 1, 4 and 5 load run 1's background
    emu = emulator(compute_seconds=0.5, fault={4: "500"})
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *BATCH, "-k", "batch", "-rE",
                                           "--cachecheck-report=r.json", *FAST)
    assert result.ret == 1
    result.assert_outcomes(passed=1, errors=1, failed=1)  # the second probe passes; the gate fails
    out = result.stdout.str()
    assert "ERROR at setup of batch[tea-steeping]" in out and f"cachecheck: [{SHAPE}] load run 1: " in out
    assert "HTTP 500: Internal Server Error" in out
    assert "cachecheck verdict: FAIL (errors): 1 probe or batch probe failed with a request or server error" in out
    data = _report(pytester.path / "r.json")
    assert [b["outcome"] for b in data["batches"]] == ["error", "same"]
