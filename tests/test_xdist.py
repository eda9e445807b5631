"""pytest-xdist: the probes of one server, and the tests that use the ``cachecheck`` fixture, run in one
worker, in order, under every ``--dist`` mode; a placement that fails anyway is caught, never measured.

These tests run in the version matrix of ``tests/run.sh`` (oldest and newest pytest and pytest-xdist).
"""

from __future__ import annotations

import importlib.util
import json
import re
import textwrap
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from pytest_cachecheck._collect import Placement
from pytest_cachecheck.errors import ConfigError
from pytest_cachecheck.identity import server_groups, server_identity
from pytest_cachecheck.model import Status, Tally
from pytest_cachecheck.probes import builtin_probes
from pytest_cachecheck.run import judge, placement_problem
from pytest_cachecheck.settings import resolve
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


def by_target(rows: List[Tuple[str, str]]) -> Dict[str, set]:
    """target -> the workers that ran its probes."""
    out: Dict[str, set] = {}
    for worker, ids in workers_of(rows, "cachecheck::probe[").items():
        for nodeid in ids:
            out.setdefault(nodeid.rsplit("@", 1)[1].rstrip("]"), set()).add(worker)
    return out


@needs_xdist
@pytest.mark.parametrize("dist", ["load", "loadfile", "worksteal"])
def test_target_matrix_one_worker_per_target(pytester, emulator, dist):
    a, b = emulator(), emulator()
    pytester.makepyfile(**{f"test_user{i}": "def test_a(): pass\n" for i in range(3)})
    result = pytester.runpytest_subprocess(f"--cachecheck-target=a={a.url}", f"--cachecheck-target=b={b.url}",
                                           "--cachecheck-n=4", "-n", "2", f"--dist={dist}", "-v",
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(passed=12)
    targets = by_target(placed(result.stdout.lines))
    assert set(targets) == {"a", "b"}
    assert all(len(w) == 1 for w in targets.values()), targets
    assert a.max_in_flight == 1 and b.max_in_flight == 1


MATRIX_FIXTURE_TESTS = textwrap.dedent("""
    def test_own_check_on_b(cachecheck):
        assert cachecheck.check(turn1="Name a colour and say why you like it.", turn2="And another?",
                                target="b").valid

    def test_own_check_on_a(cachecheck):
        assert cachecheck.check(turn1="Name a tree and where it grows.", turn2="Now a smaller one.").valid
""")


@needs_xdist
@pytest.mark.parametrize("dist", ["load", "loadfile", "worksteal"])
def test_target_matrix_with_fixture_tests_runs_in_one_worker(pytester, emulator, dist):
    """A test that uses the fixture may send to any target (``check(target="b")``), which only its run
    shows: with one, every target's probes and the fixture's tests run in one worker, in order, so no probe
    finds its server claimed by another worker ("not measured")."""
    a, b = emulator(), emulator()
    pytester.makepyfile(**{f"test_user{i}": "def test_a(): pass\n" for i in range(3)})
    pytester.makepyfile(test_own=MATRIX_FIXTURE_TESTS)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(f"--cachecheck-target=a={a.url}", f"--cachecheck-target=b={b.url}",
                                           "--cachecheck-n=4", "-n", "2", f"--dist={dist}", "-v",
                                           f"--cachecheck-report={report}", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=14)
    rows = placed(result.stdout.lines)
    targets = by_target(rows)
    assert set(targets) == {"a", "b"} and len(targets["a"] | targets["b"]) == 1, targets
    worker = next(iter(targets["a"]))
    assert set(workers_of(rows, "test_own.py::")) == {worker}
    ran = workers_of(rows, "cachecheck::probe[")[worker]
    ids = [p.id for p in builtin_probes()[:4]]
    assert ran == [f"cachecheck::probe[{i}@{t}]" for t in ("a", "b") for i in ids]  # target by target
    data = json.loads(report.read_text())
    records = data["probes"] + data["checks"]
    assert len(records) == 10 and {r["worker"] for r in records} == {worker}
    assert all(r["outcome"] != "error" for r in records), [r["reason"] for r in records]
    assert {c["target"] for c in data["checks"]} == {"a", "b"}
    assert a.max_in_flight == 1 and b.max_in_flight == 1


@needs_xdist
def test_targets_reaching_one_server_share_a_worker(pytester, emulator):
    """Two targets written differently (127.0.0.1, localhost) reach one server: their probes run in one
    worker, one target after the other; a third server's go on as they would."""
    one, other = emulator(), emulator()
    same = one.url.replace("127.0.0.1", "localhost")
    report = pytester.path / "report.json"
    where = [f"--cachecheck-target=a={one.url}", f"--cachecheck-target=b={same}",
             f"--cachecheck-target=c={other.url}"]
    result = pytester.runpytest_subprocess(*where, "--cachecheck-n=4", "-n", "2", "-v",
                                           f"--cachecheck-report={report}", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=13)
    rows = placed(result.stdout.lines)
    targets = by_target(rows)
    assert targets["a"] == targets["b"] and len(targets["a"]) == 1, targets
    worker = next(iter(targets["a"]))
    ran = [n for n in workers_of(rows, "cachecheck::probe[")[worker] if not n.endswith("@c]")]
    assert ran == [f"cachecheck::probe[{p.id}@{t}]" for t in ("a", "b") for p in builtin_probes()[:4]]
    assert one.max_in_flight == 1 and other.max_in_flight == 1
    assert json.loads(report.read_text())["summary"]["status"] == "passed"


@needs_xdist
def test_replicas_reaching_one_server_are_a_usage_error(pytester, emulator):
    """Two --cachecheck-url that reach one server would be measured from two workers at once: refused
    before any request, both named as written, without the credentials."""
    emu = emulator()
    secret = "hunter2hunter2"
    same = emu.url.replace("127.0.0.1", f"user:{secret}@localhost") + "/v1/"
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", f"--cachecheck-url={same}",
                                           "-n", "2", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    shown = emu.url.replace("127.0.0.1", "localhost") + "/v1/"  # display_url drops the credentials
    result.stderr.fnmatch_lines([f"*--cachecheck-url (ini cachecheck_url): '{emu.url}' and '{shown}' "
                                 f"reach one server*"])
    assert secret not in result.stdout.str() + result.stderr.str()
    assert emu.every_request == []


def test_server_identity():
    """A server's identity: scheme, resolved addresses, port (the scheme's default when none is written),
    path prefix; not the credentials, nor the query; never an error."""
    assert server_identity("http://127.0.0.1:8000").same_server(server_identity("http://localhost:8000/"))
    assert server_identity("http://127.0.0.1").same_server(server_identity("http://127.0.0.1:80"))
    assert server_identity("https://127.0.0.1").same_server(server_identity("https://localhost:443"))
    assert server_identity("http://u:longpassword@127.0.0.1:8000/llm?k=v").same_server(
        server_identity("http://localhost:8000/llm"))
    assert server_identity("http://0.0.0.0:8000").same_server(server_identity("http://[::1]:8000"))
    for a, b in [("http://127.0.0.1:8000", "http://127.0.0.1:8001"), ("http://127.0.0.1:80", "https://127.0.0.1:80"),
                 ("http://127.0.0.1:8000/a", "http://127.0.0.1:8000/b"), ("http://10.1.2.3:1", "http://10.1.2.4:1")]:
        assert not server_identity(a).same_server(server_identity(b)), (a, b)
    unresolved = "http://no-such-host.invalid:8000"
    assert server_identity(unresolved).same_server(server_identity(unresolved + "/"))
    assert not server_identity(unresolved).same_server(server_identity("http://other-host.invalid:8000"))
    for broken in ("http://[::1:8000", "http://127.0.0.1:99999", "not a url", ""):
        assert server_identity(broken).same_server(server_identity(broken))
    # grouped by server, with a chain joining groups (localhost may resolve to ::1 and 127.0.0.1)
    urls = ["http://127.0.0.1:1", "http://10.1.2.3:1", "http://localhost:1", "http://127.0.0.1:1"]
    assert server_groups(urls) == [[0, 2, 3], [1]]


def test_claims_are_by_server(tmp_path):
    """A worker that claimed a server owns every URL that reaches it; another worker is refused."""
    gw0, gw1 = Placement(str(tmp_path), (), False), Placement(str(tmp_path), (), False)
    assert gw0.claim("http://127.0.0.1:5001", "gw0") is None
    assert gw0.claim("http://localhost:5001/", "gw0") is None  # its own server under another name
    assert gw1.claim("http://user:longpassword@localhost:5001", "gw1") == "gw0"
    assert gw1.claim("http://127.0.0.1:5002", "gw1") is None
    assert gw0.claim("http://localhost:5002", "gw0") == "gw1"


def test_matrix_targets_on_one_server_share_a_unit(tmp_path):
    placement = Placement(str(tmp_path), (("a", "http://127.0.0.1:5001"), ("b", "http://localhost:5001"),
                                          ("c", "http://127.0.0.1:5002")), False)
    units = {t: placement.server_unit(f"cachecheck::probe[p1@{t}]") for t in "abc"}
    assert units["a"] == units["b"] != units["c"]
    (tmp_path / "fixture-users-gw0.json").write_text(json.dumps(["test_own.py::test_x"]))
    placement = Placement(str(tmp_path), placement.targets, False)
    assert {placement.server_unit(n) for n in ("cachecheck::probe[p1@a]", "cachecheck::episode[e1@c]",
                                                "test_own.py::test_x")} == {"cachecheck-server"}
    assert placement.server_unit("test_user.py::test_y") is None


def test_replicas_reaching_one_server_are_refused_by_the_settings():
    with pytest.raises(ConfigError, match=r"'http://127.0.0.1:8000' and 'http://localhost:8000/v1' "
                                          r"reach one server"):
        resolve({"url": ["http://127.0.0.1:8000", "http://10.1.2.3:8000",
                         "http://u:longpassword@localhost:8000/v1"]}, base_dir=Path("."))
    with pytest.raises(ConfigError, match="reach one server"):
        resolve({"url": ["http://10.1.2.3:8000", "http://10.1.2.3:8000/"]}, base_dir=Path("."))
    two = resolve({"url": ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]}, base_dir=Path("."))
    assert two is not None and len(two.replicas) == 2


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


def test_urls_reaching_one_server_count_as_one():
    """Two workers measured one server under two names: the placement check sees it, for each target that
    was measured on it (two targets may reach one server), and for no other target."""
    records = [record("a", "same", worker="gw0", url="http://127.0.0.1:1", target="a"),
               record("b", "same", worker="gw1", url="http://localhost:1", target="b"),
               record("c", "same", worker="gw1", url="http://10.1.2.3:1", target="c")]
    for target in ("a", "b"):
        why = placement_problem(records, target)
        assert why is not None and "http://127.0.0.1:1 and http://localhost:1 (one server)" in why \
            and "2 processes (gw0, gw1)" in why
    assert placement_problem(records, "c") is None


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
