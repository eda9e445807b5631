"""The order kind from pytest (``--cachecheck-order``): items ``cachecheck::order[<probe id>]`` against the
vLLM emulator, a real HTTP server in the test process, with the plugin run in a subprocess.

The controls: a server whose answer changes when a request reuses cached state (``diverge_on_hit``: the
emulator's prefix cache is shared by requests without a salt, as an application's are) fails the run with the
order divergence in every output, each naming the conditions; the same server without the fault passes. Then
the selection (``-k``: only the selected order items are sent), the rate gate, the placement under
pytest-xdist, a failed request, bad option values (usage errors before any request), and the host-memory cache
problem turned into a warning under --cachecheck-order.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from typing import Any, Dict

import pytest
import requests  # noqa: F401  (one copy of requests across pytester runs; see tests/test_faults.py)

import pytest_cachecheck.protocol  # noqa: F401
from pytest_cachecheck import servers
from pytest_cachecheck.clients import Findings
from pytest_cachecheck.clients.llama_cpp import HOST_CACHE_PROBLEM
from pytest_cachecheck.errors import ServerSetupError
from pytest_cachecheck.model import OrderRecord, RunReport
from pytest_cachecheck.probes import builtin_probes
from tests.support import emulator as emulator_module

FAST = ["-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:benchmark", "-p", "no:randomly"]
ORDER = ["--cachecheck-n=3", "--cachecheck-order"]
CONDITIONS = "order: server defaults, no cache fields; reversed, 1 other conversation between"
IDS = ["tea-steeping", "bike-chain", "bread-rising"]


@pytest.fixture(autouse=True)
def _emulator_without_nagle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emulator_module._Handler, "disable_nagle_algorithm", True)  # see tests/test_faults.py


def _report(path: Any) -> Dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    RunReport.from_json(data)  # it reads back
    return data


def _fresh(record: Dict[str, Any]) -> bool:
    """Pass A's turn 1 reused no state: where the cache-dependent fault must make pass B's answer differ."""
    return next(q["cached_tokens"] for q in record["requests"] if q["step"] == "A/turn-1") == 0


def _sent(emu: Any, probe_id: str) -> int:
    """How many of the emulator's requests carried this probe's conversation."""
    first = next(p for p in builtin_probes() if p.id == probe_id).turn1_messages()
    return sum(1 for b in emu.requests_log if b.get("messages", [])[:len(first)] == first)


def test_positive_control_fails_the_run_in_every_output(pytester, emulator):
    emu = emulator(diverge_on_hit=lambda messages: True)
    result = pytester.runpytest_subprocess(
        f"--cachecheck-url={emu.url}", *ORDER, "-k", "order", "--cachecheck-report=r.json",
        "--cachecheck-html=r.html", "--junitxml=j.xml", "--json-report", "--json-report-file=jr.json", "-rA",
        *FAST
    )
    assert result.ret == 1
    out = result.stdout.str()
    data = _report(pytester.path / "r.json")
    orders = data["orders"]
    assert [o["id"] for o in orders] == IDS and all(o["kind"] == "order" for o in orders)
    different = [o["id"] for o in orders if o["outcome"] == "different"]
    assert different == [o["id"] for o in orders if _fresh(o)] and different, orders
    same = len(IDS) - len(different)
    result.assert_outcomes(passed=same, failed=len(different) + 1)  # and the gate
    for pid in different:
        assert f"FAILED cachecheck::order[{pid}] - Failed: [order: " in out
    assert out.count(f"\n[{CONDITIONS}] pass B (reversed, after other conversations) gave another turn-1") \
        == len(different)
    assert f"cachecheck: {CONDITIONS}: the probe set is sent twice as an application would" in out  # header
    n = len(different)
    assert (f"{CONDITIONS}: order probes 3 | valid 3 (same {same}, different {n}) | inconclusive 0 | errors 0"
            in out)
    said = f"{n} of 3 valid order probes answered differently in another order and state."
    assert f"{CONDITIONS}: {said}" in out
    assert f"{CONDITIONS}: order divergence rate " in out
    assert (f"cachecheck verdict: FAIL (diverged): {n} valid order probe{'s' * (n != 1)} answered "
            f"differently in another order and state ({CONDITIONS})") in out
    # the JSON report: the records with both passes' requests and the state each reused, and the summary
    assert all([q["step"] for q in o["requests"]] == ["A/turn-1", "A/turn-2", "B/turn-1", "B/turn-2"]
               for o in orders)
    assert all(q["cached_tokens"] > 0 for o in orders for q in o["requests"] if q["step"] == "B/turn-1")
    assert [o["positions"] for o in orders] == [[1, 3], [2, 2], [3, 1]]
    summary = data["targets"][0]["order_summary"]
    assert {k: summary[k] for k in ("probes", "valid", "same", "different")} == {
        "probes": 3, "valid": 3, "same": same, "different": n}
    assert summary["conditions"] == orders[0]["conditions"] == {
        "between": 1, "prompt_words": 60, "max_tokens": 32, "seed": 0, "cache_ram": None}
    assert data["settings"]["order"] is True and data["settings"]["order_between"] == 1
    assert data["summary"]["status"] == "diverged" and CONDITIONS in data["summary"]["why"]
    assert data["probes"] == []
    # the HTML page: the section under its conditions, each probe's two passes side by side
    page = (pytester.path / "r.html").read_text(encoding="utf-8")
    assert '<h2 id="orders">Order probes (3)</h2>' in page and f"<b>{CONDITIONS}</b>" in page
    assert f"Answered differently in another order and state ({n})" in page
    assert "pass A, turn 1 (position 1)" in page and "cached tokens: A/turn-1 0 of " in page
    # JUnit: each order item's failure is its record's message, naming the conditions; the record a property
    cases = {c.get("name"): c for c in ET.parse(pytester.path / "j.xml").getroot().iter("testcase")}
    for pid in different:
        failure = cases[f"order[{pid}]"].find("failure")
        assert failure is not None and failure.get("message", "").startswith(f"Failed: [{CONDITIONS}] pass B")
        props = {p.get("name"): p.get("value") for p in cases[f"order[{pid}]"].iter("property")}
        assert OrderRecord.from_json(json.loads(props["cachecheck_order"])).different
    # pytest-json-report: each order item's record as metadata.cachecheck, with its kind
    tests = json.loads((pytester.path / "jr.json").read_text(encoding="utf-8"))["tests"]
    meta = {t["nodeid"]: t.get("metadata", {}).get("cachecheck") for t in tests}
    for o in orders:
        got = meta[f"cachecheck::order[{o['id']}]"]
        assert got is not None and got["kind"] == "order" and got["outcome"] == o["outcome"], got


def test_negative_control_no_fault_passes(pytester, emulator):
    emu = emulator()
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *ORDER,
                                           "--cachecheck-report=r.json", "-v", *FAST)
    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=7)
    out = result.stdout.str()
    assert f"{CONDITIONS}: 0 of 3 valid order probes answered differently in another order and state." in out
    assert ("cachecheck verdict: PASS (passed): no valid probe differed and no valid order probe answered "
            "differently in another order and state") in out
    # the attribution puts the two causes side by side
    assert re.search(r"\norder: 0 of 3 valid order probes answered differently in another order and state, 0\.0% "
                     r"\(95% interval 0\.0% to [0-9.]+%\); 0 inconclusive, 0 errors \[server defaults, no cache "
                     r"fields; reversed, 1 other conversation between\]\n", out)
    # the order items run after the probes, and the probes' salted requests left the order kind no state
    ran = re.findall(r"^(cachecheck::\w+)\[", out, re.M)
    assert ran == ["cachecheck::probe"] * 3 + ["cachecheck::order"] * 3
    data = _report(pytester.path / "r.json")
    assert [o["outcome"] for o in data["orders"]] == ["same"] * 3
    assert all(_fresh(o) or o["id"] != "tea-steeping" for o in data["orders"])


def test_without_the_option_nothing_changes(pytester, emulator):
    emu = emulator()
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", "--cachecheck-n=2",
                                           "--cachecheck-report=r.json", *FAST)
    result.assert_outcomes(passed=3)
    assert "order probe" not in result.stdout.str() and "cachecheck::order" not in result.stdout.str()
    data = _report(pytester.path / "r.json")
    assert "orders" not in data and "order_summary" not in data["targets"][0]
    assert "order" not in data["settings"]


def test_k_selects_a_subset_and_only_those_are_sent(pytester, emulator):
    emu = emulator()
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *ORDER, "-k",
                                           "order and (tea or bread)", "-v", "--cachecheck-report=r.json",
                                           *FAST)
    assert result.ret == 0, result.stdout.str()
    ran = re.findall(r"^(cachecheck::\S+) (PASSED|FAILED)", result.stdout.str(), re.M)
    assert ran == [("cachecheck::order[tea-steeping]", "PASSED"),
                   ("cachecheck::order[bread-rising]", "PASSED"), ("cachecheck::gate", "PASSED")]
    assert (_sent(emu, "tea-steeping"), _sent(emu, "bread-rising"), _sent(emu, "bike-chain")) == (4, 4, 0)
    data = _report(pytester.path / "r.json")
    assert [(o["id"], o["positions"]) for o in data["orders"]] == [("tea-steeping", [1, 2]),
                                                                    ("bread-rising", [2, 1])]


@pytest.mark.parametrize("max_rate, ok", [("1", True), ("0", False)])
def test_the_rate_gate_judges_the_order_kind(pytester, emulator, max_rate, ok):
    emu = emulator(diverge_on_hit=lambda messages: True)
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *ORDER, "-k", "order",
                                           f"--cachecheck-max-rate={max_rate}", "-rA", *FAST)
    out = result.stdout.str()
    assert result.ret == (0 if ok else 1), out
    assert ("XFAIL cachecheck::order[tea-steeping] - diverged; the rate gate decides (--cachecheck-max-rate)"
            in out)
    if ok:
        assert "order divergence rate " in out and "is within --cachecheck-max-rate 1" in out
    else:
        assert "cachecheck verdict: FAIL (gate-failed): order divergence rate " in out


def test_under_xdist_order_items_share_one_worker_with_their_servers_probes(pytester, emulator):
    emu = emulator()
    pytester.makepyfile(**{f"test_user{i}": "def test_a(): pass\n" for i in range(3)})
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *ORDER, "-n", "2", "-v",
                                           "--cachecheck-report=r.json", *FAST)
    assert result.ret == 0, result.stdout.str()
    workers = dict((nodeid, worker) for worker, nodeid in re.findall(
        r"^\[(gw\d+)\] \[\s*\d+%\] PASSED (cachecheck::\S+)", result.stdout.str(), re.M))
    items = [f"cachecheck::{k}[{p}]" for k in ("probe", "order") for p in IDS]
    assert set(items) <= set(workers) and len({workers[i] for i in items}) == 1, workers
    data = _report(pytester.path / "r.json")
    assert len({r["worker"] for r in data["probes"] + data["orders"]}) == 1
    assert [o["positions"] for o in data["orders"]] == [[1, 3], [2, 2], [3, 1]]  # one set, measured once


def test_a_failed_request_errors_the_order_item_in_setup(pytester, emulator):
    # chat requests: 1 the setup check, then pass A: 2 and 3 the first probe's turns
    emu = emulator(fault={3: "500"})
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *ORDER, "-k", "order", "-rE",
                                           "--cachecheck-report=r.json", *FAST)
    assert result.ret == 1
    result.assert_outcomes(passed=2, errors=1, failed=1)  # the others pass; the gate fails
    out = result.stdout.str()
    assert "ERROR at setup of order[tea-steeping]" in out and f"cachecheck: [{CONDITIONS}] " in out
    assert "HTTP 500: Internal Server Error" in out
    assert ("cachecheck verdict: FAIL (errors): 1 probe or order probe failed with a request or server "
            "error") in out
    data = _report(pytester.path / "r.json")
    assert [o["outcome"] for o in data["orders"]] == ["error", "same", "same"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--cachecheck-order-between=2"], "it goes with --cachecheck-order"),
        (["--cachecheck-order", "--cachecheck-order-between=x"], "--cachecheck-order-between"),
        (["--cachecheck-order", "--cachecheck-nocache-url=http://127.0.0.1:9"],
         "conflicts with two-servers mode"),
        (["--cachecheck-order", "--cachecheck-serve-cache-ram=8"], "it goes with --cachecheck-serve"),
    ],
)
def test_bad_values_are_usage_errors_before_any_request(pytester, emulator, args, words):
    emu = emulator()
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", *args, *FAST)
    assert result.ret == 4, result.stdout.str()
    assert words in result.stderr.str()
    assert emu.requests_log == []


def test_the_host_cache_needs_the_order_kind(pytester):
    result = pytester.runpytest_subprocess("--cachecheck-serve=demo", "--cachecheck-serve-cache-ram=8", *FAST)
    assert result.ret == 4
    assert "--cachecheck-serve-cache-ram turns on a cache" in result.stderr.str()
    assert "it goes with --cachecheck-order" in result.stderr.str()


def test_the_host_cache_problem_is_a_warning_under_the_order_kind(monkeypatch):
    problem = f"{HOST_CACHE_PROBLEM}: a prompt sent again after another reused 90 of its 100 tokens"
    monkeypatch.setattr(servers, "run_checks", lambda *a: Findings(problems=[problem, "another problem"]))
    setup = servers.ServerSetup("llama.cpp", None, None)  # type: ignore[arg-type]
    with pytest.raises(ServerSetupError, match="restores prompts from its host-memory") as got:
        setup.check(False)
    assert "another problem" in str(got.value)
    setup = servers.ServerSetup("llama.cpp", None, None)  # type: ignore[arg-type]
    with pytest.raises(ServerSetupError) as got:
        setup.check(False, order=True)
    assert "another problem" in str(got.value) and HOST_CACHE_PROBLEM not in str(got.value)
    monkeypatch.setattr(servers, "run_checks", lambda *a: Findings(problems=[problem]))
    setup = servers.ServerSetup("llama.cpp", None, None)  # type: ignore[arg-type]
    setup.check(False, order=True)
    assert len(setup.warnings) == 1 and setup.warnings[0].startswith(problem)
    assert "kept as a warning because --cachecheck-order measures what that cache does" in setup.warnings[0]


def test_the_served_server_starts_with_the_cache_ram_asked_for(tmp_path):
    from pytest_cachecheck.llama_server import LlamaServer

    cmd = LlamaServer(tmp_path / "llama-server", tmp_path / "m.gguf", port=1, cache_ram=8192).command()
    assert cmd[cmd.index("--cache-ram") + 1] == "8192"
    cmd = LlamaServer(tmp_path / "llama-server", tmp_path / "m.gguf", port=1).command()
    assert cmd[cmd.index("--cache-ram") + 1] == "0"


def test_a_target_matrix_measures_each_target_under_its_name(pytester, emulator):
    a, b = emulator(), emulator(diverge_on_hit=lambda messages: True)
    result = pytester.runpytest_subprocess(f"--cachecheck-target=a={a.url}", f"--cachecheck-target=b={b.url}",
                                           "--cachecheck-order", "--cachecheck-n=1", "-k", "order",
                                           "--cachecheck-report=r.json", "-v", *FAST)
    assert result.ret == 1
    out = result.stdout.str()
    assert "cachecheck::order[tea-steeping@a] PASSED" in out
    assert "cachecheck::order[tea-steeping@b] FAILED" in out
    assert (f"b: {CONDITIONS}: 1 of 1 valid order probe answered differently in another order and state."
            in out)
    data = _report(pytester.path / "r.json")
    assert [(r["target"], r["outcome"]) for r in data["orders"]] == [("a", "same"), ("b", "different")]
    assert [t["order_summary"]["different"] for t in data["targets"]] == [0, 1]
    assert (_sent(a, "tea-steeping"), _sent(b, "tea-steeping")) == (4, 4)  # each target measured its own set
