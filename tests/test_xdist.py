"""pytest-xdist: the probes of one server, and the tests that use the ``cachecheck`` fixture, run in one
worker, in order, under every ``--dist`` mode; a placement that fails anyway is caught, never measured.

These tests run in the version matrix of ``tests/run.sh`` (oldest and newest pytest and pytest-xdist).
"""

from __future__ import annotations

import importlib.util
import json
import re
import textwrap
from typing import Dict, List, Tuple

import pytest

from pytest_cachecheck.model import Status, Tally
from pytest_cachecheck.probes import builtin_probes
from pytest_cachecheck.run import judge, placement_problem
from tests.support.factories import record



pytestmark = pytest.mark.compat
needs_xdist = pytest.mark.skipif(importlib.util.find_spec("xdist") is None, reason="pytest-xdist is not installed")
LINE = re.compile(r"^\[(gw\d+)\] \[\s*\d+%\] (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) (\S+)")
FIXTURE_TESTS = textwrap.dedent("""
    def test_own_check_a(cachecheck):
        assert cachecheck.check(turn1="Name a colour and say why you like it.", turn2="And another?").valid

    def test_own_check_b(cachecheck):
        assert cachecheck.check(turn1="Name a tree and where it grows.", turn2="Now a smaller one.").valid
""")


def placed(lines: List[str]) -> List[Tuple[str, str]]:
    """(worker, node id) of every test, in the order the workers reported them."""
    out = []
    for line in lines:
        m = LINE.match(line)
        if m:
            out.append((m.group(1), m.group(3)))
    return out


def workers_of(rows: List[Tuple[str, str]], prefix: str) -> Dict[str, List[str]]:
    by: Dict[str, List[str]] = {}
    for worker, nodeid in rows:
        if nodeid.startswith(prefix):
            by.setdefault(worker, []).append(nodeid)
    return by


@needs_xdist
@pytest.mark.parametrize("dist", ["load", "loadgroup", "loadfile", "loadscope", "worksteal"])
def test_one_server_one_worker_in_order(pytester, emulator, dist):
    emu = emulator()
    for i in range(4):
        pytester.makepyfile(**{f"test_user{i}": "def test_a(): pass\ndef test_b(): pass\n"})
    pytester.makepyfile(test_own=FIXTURE_TESTS)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", "--cachecheck-n=6", "-n", "2",
                                           f"--dist={dist}", "-v", f"--cachecheck-report={report}",
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(passed=17)  # and the gate, run by the controller
    rows = placed(result.stdout.lines)
    probes = workers_of(rows, "cachecheck::probe[")
    own = workers_of(rows, "test_own.py::")
    assert len(probes) == 1, probes  # every probe on one worker
    worker, ran = next(iter(probes.items()))
    assert ran == [f"cachecheck::probe[{p.id}]" for p in builtin_probes()[:6]]  # in collection order
    assert set(own) == {worker} and len(own[worker]) == 2, own  # the fixture's tests with them
    assert emu.max_in_flight == 1  # the server never saw two requests at once
    data = json.loads(report.read_text())
    assert {p["worker"] for p in data["probes"]} == {worker}
    assert {c["worker"] for c in data["checks"]} == {worker}
    assert data["summary"]["status"] == "passed" and data["summary"]["not_run"] == []


@needs_xdist
@pytest.mark.parametrize("dist", ["load", "loadfile", "worksteal"])
def test_target_matrix_one_worker_per_target(pytester, emulator, dist):
    a, b = emulator(), emulator()
    pytester.makepyfile(**{f"test_user{i}": "def test_a(): pass\n" for i in range(3)})
    pytester.makepyfile(test_own=FIXTURE_TESTS)
    result = pytester.runpytest_subprocess(f"--cachecheck-target=a={a.url}", f"--cachecheck-target=b={b.url}",
                                           "--cachecheck-n=4", "-n", "2", f"--dist={dist}", "-v",
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(passed=14)
    rows = placed(result.stdout.lines)
    on_a = workers_of(rows, "cachecheck::probe[")
    by_target: Dict[str, set] = {}
    for worker, ids in on_a.items():
        for nodeid in ids:
            by_target.setdefault(nodeid.rsplit("@", 1)[1].rstrip("]"), set()).add(worker)
    assert set(by_target) == {"a", "b"}
    assert all(len(w) == 1 for w in by_target.values()), by_target
    own = workers_of(rows, "test_own.py::")
    assert set(own) == by_target["a"]  # the fixture's checks go to the first target: they join its worker
    assert a.max_in_flight == 1 and b.max_in_flight == 1


HOSTILE_SCHEDULER = textwrap.dedent("""
    import pytest

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(config, log):
        from xdist.scheduler import LoadScheduling
        return LoadScheduling(config, log)  # spreads the probes over the workers
""")


@needs_xdist
def test_a_placement_that_fails_is_never_measured(pytester, emulator):
    """Another plugin's scheduler wins and spreads the probes over two workers: the second worker does not
    send a single request to the server; its probes error and name the cause."""
    emu = emulator()
    pytester.makeconftest(HOSTILE_SCHEDULER)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", "--cachecheck-n=8", "-n", "2", "-v",
                                           f"--cachecheck-report={report}", "-p", "no:cacheprovider")
    assert result.ret == 1
    data = json.loads(report.read_text())
    refused = [p for p in data["probes"] if p["outcome"] == "error"]
    measured = [p for p in data["probes"] if p["outcome"] != "error"]
    assert refused and measured, [p["worker"] for p in data["probes"]]
    assert len({p["worker"] for p in measured}) == 1
    assert {p["worker"] for p in refused} == {"gw0", "gw1"} - {measured[0]["worker"]}
    assert all("already sends to" in p["reason"] and not p["requests"] for p in refused)
    assert emu.max_in_flight == 1
    assert data["summary"]["status"] == "errors"
    result.stdout.fnmatch_lines(["*cachecheck verdict: FAIL (errors)*"])


def test_two_workers_on_one_server_make_the_run_unreliable():
    records = [record("a", "same", worker="gw0", url="http://127.0.0.1:1"),
               record("b", "different", cache="x1", recompute="x2", worker="gw0", url="http://127.0.0.1:1"),
               record("c", "same", worker="gw1", url="http://127.0.0.1:1")]
    why = placement_problem(records)
    assert why is not None and "2 processes (gw0, gw1)" in why and "http://127.0.0.1:1" in why
    verdict = judge(Tally.of(records), 0.8, unreliable=why)
    assert verdict.status == Status.UNRELIABLE and not verdict.ok
    # replicas: each worker on a server of its own is fine; a probe that sent nothing does not count
    assert placement_problem([record("a", "same", worker="gw0", url="http://a:1"),
                              record("b", "same", worker="gw1", url="http://b:1")]) is None
    refused = record("c", "error", cache=None, worker="gw1", url="http://127.0.0.1:1")
    refused.requests = [r for r in refused.requests if False]
    assert placement_problem([records[0], refused]) is None


@needs_xdist
@pytest.mark.parametrize("matrix", [False, True])
def test_not_run_is_exact_when_a_failure_stops_the_session(pytester, emulator, matrix):
    emu = emulator(diverge_on_hit={"bicycle"})  # the probe bike-chain (third) diverges
    report = pytester.path / "report.json"
    where = [f"--cachecheck-target=t={emu.url}"] if matrix else [f"--cachecheck-url={emu.url}"]
    result = pytester.runpytest_subprocess(*where, "--cachecheck-n=8", "-n", "2", "-x", "-v",
                                           f"--cachecheck-report={report}", "-p", "no:cacheprovider")
    assert result.ret in (1, 2)  # xdist ends a stopped session as interrupted
    data = json.loads(report.read_text())
    ids = [p.id for p in builtin_probes()[:8]]
    done = [p["id"] for p in data["probes"]]
    assert done and "bike-chain" in done
    suffix = "@t" if matrix else ""
    assert data["summary"]["not_run"] == [i + suffix for i in ids if i not in done]
    assert len(done) + len(data["summary"]["not_run"]) == 8
