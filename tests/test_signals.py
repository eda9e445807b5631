"""Signals end a run the way Ctrl-C does, and nothing a second signal does can lose what was measured.

SIGTERM (CI cancellation, ``timeout``, ``docker stop``) writes the JSON report, the HTML page and the
summary, exit status 2; a second Ctrl-C, wherever it lands until the process ends, cannot turn the verdict
into a pass nor the exit status into a traceback; Ctrl-C while the server is being detected still writes the
report; under pytest-xdist every record that reached the controller counts, and the probe that was being
measured is named.

Each test runs pytest in a process of its own (a new session, so a signal can go to the whole process
group as a terminal's Ctrl-C or ``timeout`` sends it) against the emulator, with a request held back by
the emulator's ``slow`` fault so that the signal lands mid-probe; a second signal is sent by the run
itself, from a conftest hook, at an exact point.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from pytest_cachecheck.probes import builtin_probes
from tests.support import emulator as emulator_module

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
needs_xdist = pytest.mark.skipif(importlib.util.find_spec("xdist") is None,
                                 reason="pytest-xdist is not installed")
FAST = ["-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:benchmark"]
SETUP = 1  # chat requests before the first probe: the setup check of cached-token reporting (vLLM)
IDS = [p.id for p in builtin_probes()]


@pytest.fixture(autouse=True)
def _emulator_without_nagle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emulator_module._Handler, "disable_nagle_algorithm", True)


class Run:
    """A pytest run in a process group of its own, with the JSON report and the HTML page asked for."""

    def __init__(self, folder: Path, emu: Any, *args: str) -> None:
        self.report = folder / "r.json"
        self.html = folder / "r.html"
        self.emu = emu
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", f"--cachecheck-url={emu.url}",
             f"--cachecheck-report={self.report}", f"--cachecheck-html={self.html}",
             "--cachecheck-timeout=60", "-v", *args, *FAST],
            cwd=str(folder), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        self.err = ""

    def wait_for_requests(self, n: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self.emu.requests_log) < n and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(self.emu.requests_log) >= n, (len(self.emu.requests_log), self.proc.poll())

    def signal(self, signum: int, group: bool = False) -> None:
        if group:
            os.killpg(self.proc.pid, signum)
        else:
            self.proc.send_signal(signum)

    def finish(self, timeout: float = 60) -> str:
        """Wait for the run; its standard output (its standard error is kept in ``err``)."""
        try:
            out, self.err = self.proc.communicate(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.communicate()
        return out

    def data(self) -> Dict[str, Any]:
        assert self.report.is_file(), "no JSON report was written"
        return json.loads(self.report.read_text())


def measured(data: Dict[str, Any]) -> List[str]:
    return [p["id"] for p in data["probes"]]


def check_interrupted(run: Run, out: str, data: Dict[str, Any], how: str) -> None:
    """What every interrupted run must show: exit status 2 everywhere, FAIL (interrupted), the HTML page,
    and not_run exactly the probes without a record."""
    assert run.proc.returncode == pytest.ExitCode.INTERRUPTED, out + run.err
    assert "Traceback" not in out + run.err, out + run.err
    summary = data["summary"]
    assert summary["status"] == "interrupted" and summary["exit_status"] == 2, summary
    assert how in summary["why"], summary["why"]
    assert "cachecheck verdict: FAIL (interrupted)" in out, out
    assert "cachecheck: JSON report written to" in out
    assert run.html.is_file() and "interrupted" in run.html.read_text()
    done = measured(data)
    assert summary["not_run"] == [i for i in IDS[:len(done) + len(summary["not_run"])] if i not in done]
    assert not list(run.report.parent.glob(".cachecheck-*"))


# -- SIGTERM ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("group", [False, True], ids=["to-pytest", "to-the-group"])
def test_sigterm_ends_the_run_like_ctrl_c(pytester, emulator, group):
    """``docker stop`` signals pytest alone; ``timeout`` signals its whole process group."""
    emu = emulator(fault={SETUP + 15: "slow:30"})  # probe 3 (bread-rising) hangs on its third request
    run = Run(pytester.path, emu, "--cachecheck-n=5")
    run.wait_for_requests(SETUP + 15)
    sent = time.monotonic()
    run.signal(signal.SIGTERM, group)
    out = run.finish()
    assert time.monotonic() - sent < 20
    data = run.data()
    check_interrupted(run, out, data, "SIGTERM")
    assert measured(data) == IDS[:2]
    assert all(len(p["requests"]) == 6 for p in data["probes"])
    assert data["summary"]["not_run"] == IDS[2:5]
    assert "while bread-rising was being measured" in data["summary"]["why"]


@pytest.mark.parametrize("on", [False, True], ids=["plugin-off", "plugin-on"])
def test_sigterm_handler_only_while_the_plugin_is_on(pytester, on):
    pytester.makepyfile(test_handler=textwrap.dedent("""
        import signal

        def test_handler(request):
            handler = signal.getsignal(signal.SIGTERM)
            assert (handler is not signal.SIG_DFL) == (request.config.getoption("cachecheck_url") is not None)
    """))
    url = ["--cachecheck-url=http://127.0.0.1:9", "-k", "test_handler"] if on else []
    result = pytester.runpytest_subprocess(*url, *FAST)
    result.assert_outcomes(passed=1, deselected=20 if on else 0)


def test_a_users_own_sigterm_handler_is_left_alone(pytester):
    pytester.makeconftest(textwrap.dedent("""
        import signal

        def mine(signum, frame):
            pass

        def pytest_configure(config):
            signal.signal(signal.SIGTERM, mine)

        def pytest_sessionfinish(session):
            assert signal.getsignal(signal.SIGTERM) is mine
    """))
    pytester.makepyfile(test_mine="def test_ok(): pass\n")
    result = pytester.runpytest_subprocess("--cachecheck-url=http://127.0.0.1:9", "-k", "test_ok", *FAST)
    result.assert_outcomes(passed=1, deselected=20)


def test_restore_puts_back_the_previous_handlers():
    from pytest_cachecheck.interrupts import Interrupts

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    interrupts = Interrupts(hold_after_first=True)
    interrupts.install(sigint=True)
    try:
        assert signal.getsignal(signal.SIGTERM) == interrupts.handle
        assert signal.getsignal(signal.SIGINT) == interrupts.handle
    finally:
        interrupts.restore()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_a_second_signal_waits_for_the_report_and_a_third_abandons_it():
    from pytest_cachecheck.interrupts import ABANDON_AFTER, Interrupts

    interrupts = Interrupts(hold_after_first=True)
    with pytest.raises(KeyboardInterrupt):
        interrupts.handle(signal.SIGINT, None)
    interrupts.handle(signal.SIGINT, None)  # held: pytest is still ending the run
    assert interrupts.received == ["SIGINT", "SIGINT"]
    with interrupts.hold():
        with pytest.raises(KeyboardInterrupt):
            interrupts.handle(signal.SIGTERM, None)  # the third
    assert interrupts.received == ["SIGINT", "SIGINT", "SIGTERM"]
    # the report is written: pytest is tidying up, and any number of signals is absorbed
    for _ in range(ABANDON_AFTER + 1):
        interrupts.handle(signal.SIGINT, None)
    # a hold again (the summary): the abandon rule again
    with interrupts.hold():
        with pytest.raises(KeyboardInterrupt):
            interrupts.handle(signal.SIGINT, None)
    # without a first signal, one arriving while the report is written waits for it, and later ones too
    calm = Interrupts(hold_after_first=True)
    with calm.hold():
        calm.handle(signal.SIGINT, None)
    calm.handle(signal.SIGINT, None)
    assert calm.received == ["SIGINT", "SIGINT"]
    # on a worker nothing is held
    worker = Interrupts(hold_after_first=False)
    for _ in range(2):
        with pytest.raises(KeyboardInterrupt):
            worker.handle(signal.SIGTERM, None)


# -- a second Ctrl-C -------------------------------------------------------------------------------------
SIGNAL_AT = """
    import atexit
    import os
    import signal

    import pytest

    POINTS = {points!r}


    def send(point, note=""):
        if point in POINTS:
            with open("sent", "a") as f:
                f.write(point + note + "\\n")
            os.kill(os.getpid(), signal.SIGINT)


    @pytest.hookimpl(hookwrapper=True)
    def pytest_sessionstart(session):
        outcome = yield
        if outcome.excinfo is not None:
            send("sessionstart")  # inside the plugin's wrapper: its report is not written yet


    def pytest_keyboard_interrupt(excinfo):
        send("keyboard_interrupt")


    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(session):
        send("sessionfinish")  # after the plugin's, which wrote the report


    @pytest.hookimpl(tryfirst=True)
    def pytest_unconfigure(config):
        send("unconfigure-first")


    class Last:
        @pytest.hookimpl(trylast=True)
        def pytest_unconfigure(self, config):
            send("unconfigure-last")  # after pytest's own


    def at_exit():  # registered before the plugin's, so it runs after it
        send("atexit", " (ignored)" if signal.getsignal(signal.SIGINT) == signal.SIG_IGN else "")


    def pytest_configure(config):
        config.pluginmanager.register(Last(), "last")
        atexit.register(at_exit)
"""
POINTS = ["sessionstart", "keyboard_interrupt", "sessionfinish", "unconfigure-first", "unconfigure-last",
          "atexit"]  # in the order pytest reaches them


def check_second_signals(run: Run, points: List[str], before_the_report: str) -> None:
    """Each point sent its SIGINT; the one before the report was written waited for it, later ones were
    absorbed (at exit, the signal is ignored)."""
    sent = (run.report.parent / "sent").read_text().splitlines()
    assert sent == [p + (" (ignored)" if p == "atexit" else "") for p in POINTS if p in points]
    err = run.err
    held = before_the_report in points
    assert err.count("writing the report of the interrupted run first") == held, err
    absorbed = len(points) - held - ("atexit" in points)
    assert err.count("pytest is ending the run: signal ignored") == absorbed, err


@pytest.mark.parametrize("points", [["keyboard_interrupt"], ["sessionfinish"], ["unconfigure-first"],
                                    ["unconfigure-last"], ["atexit"],
                                    [p for p in POINTS if p != "sessionstart"]],
                         ids=["before-the-report", "after-the-report", "unconfigure-first",
                              "unconfigure-last", "atexit", "at-every-point"])
def test_a_second_ctrl_c_is_still_an_interrupted_run(pytester, emulator, points):
    """A second SIGINT sent by the run itself at an exact point after the first: exit status 2, no
    traceback, the report written, whenever it comes (before the report it waits for it; once the report
    is written pytest is only tidying up, and it is absorbed)."""
    pytester.makeconftest(textwrap.dedent(SIGNAL_AT.format(points=points)))
    emu = emulator(fault={SETUP + 15: "slow:30"})
    run = Run(pytester.path, emu, "--cachecheck-n=5")
    run.wait_for_requests(SETUP + 15)
    run.signal(signal.SIGINT)
    out = run.finish()
    data = run.data()
    check_interrupted(run, out, data, "interrupted")
    assert measured(data) == IDS[:2] and data["summary"]["not_run"] == IDS[2:5]
    verdicts = [line.split()[2] for line in out.splitlines() if line.startswith("cachecheck verdict")]
    assert verdicts == ["FAIL"]
    check_second_signals(run, points, "keyboard_interrupt")


def test_a_run_not_interrupted_puts_the_handlers_back(pytester):
    """In process (pytester's inline run), the handlers found are back once pytest is done."""
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    pytester.makepyfile(test_handler=textwrap.dedent("""
        import signal

        def test_handler():
            assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    """))
    result = pytester.runpytest_inprocess("--cachecheck-url=http://127.0.0.1:9", "-k", "test_handler", *FAST)
    result.assert_outcomes(passed=1, deselected=20)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


# -- Ctrl-C while the server is being detected ------------------------------------------------------------
#: detection (before the header, in the plugin's pytest_sessionstart) made to take 30 s, saying when it starts
SLOW_DETECTION = """
    import time

    import pytest_cachecheck.servers as servers

    real = servers.detect_server

    def slow(*args, **kwargs):
        open("detecting", "w").close()
        time.sleep(30)
        return real(*args, **kwargs)

    servers.detect_server = slow
"""


def interrupt_detection(pytester: Any, emulator: Any, signum: int, conftest: str = "") -> Tuple[Run, str, Any]:
    pytester.makeconftest(textwrap.dedent(SLOW_DETECTION) + textwrap.dedent(conftest))
    emu = emulator()
    run = Run(pytester.path, emu, "--cachecheck-n=4")
    deadline = time.monotonic() + 60
    while not (pytester.path / "detecting").exists():
        assert time.monotonic() < deadline and run.proc.poll() is None, "detection never started"
        time.sleep(0.02)
    run.signal(signum)
    out = run.finish()
    data = run.data()
    assert run.proc.returncode == pytest.ExitCode.INTERRUPTED, out + run.err
    assert "Traceback" not in out + run.err, out + run.err
    assert data["summary"]["status"] == "interrupted" and data["summary"]["exit_status"] == 2
    assert "while the server was being detected" in data["summary"]["why"]
    assert data["probes"] == [] and data["summary"]["not_run"] == IDS[:4]
    assert "cachecheck verdict: FAIL (interrupted)" in out and run.html.is_file()
    assert emu.requests_log == []
    return run, out, emu


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_during_server_detection_writes_the_report(pytester, emulator, signum):
    interrupt_detection(pytester, emulator, signum)


@pytest.mark.parametrize("points", [["sessionstart"], ["keyboard_interrupt"], ["unconfigure-last"],
                                    [p for p in POINTS if p != "sessionfinish"]],
                         ids=["before-the-report", "after-the-report", "unconfigure-last", "at-every-point"])
def test_a_double_ctrl_c_during_server_detection(pytester, emulator, points):
    """The same during server detection, where the plugin's sessionstart wrapper writes the report (pytest
    runs no sessionfinish then)."""
    run, _, _ = interrupt_detection(pytester, emulator, signal.SIGINT, SIGNAL_AT.format(points=points))
    check_second_signals(run, points, "sessionstart")


def test_ctrl_c_during_the_setup_check_writes_the_report(pytester, emulator):
    """The setup checks that generate run once the selection is known (after the header): a signal there is
    an interrupted run too, and says so."""
    emu = emulator(fault={1: "slow:30"})  # the setup check's one-token request hangs
    run = Run(pytester.path, emu, "--cachecheck-n=4")
    run.wait_for_requests(1)
    run.signal(signal.SIGINT)
    out = run.finish()
    data = run.data()
    assert run.proc.returncode == pytest.ExitCode.INTERRUPTED, out + run.err
    assert "Traceback" not in out + run.err
    assert data["summary"]["status"] == "interrupted"
    assert "while the server setup was being checked" in data["summary"]["why"]
    assert data["probes"] == [] and data["summary"]["not_run"] == IDS[:4]


# -- pytest-xdist ------------------------------------------------------------------------------------------
SLOW_CONTROLLER = textwrap.dedent("""
    import time

    CONTROLLER = []

    def pytest_configure(config):
        if not hasattr(config, "workerinput"):
            CONTROLLER.append(True)

    def pytest_runtest_logreport(report):
        if CONTROLLER and report.when == "setup":
            time.sleep(0.6)  # the controller falls behind its worker: reports wait in its queue
""")


@needs_xdist
@pytest.mark.parametrize("signum, group",
                         [(signal.SIGTERM, False), (signal.SIGINT, True), (signal.SIGTERM, True)],
                         ids=["SIGTERM-to-controller", "ctrl-c", "SIGTERM-to-group"])
def test_xdist_every_record_the_controller_received_counts(pytester, emulator, signum, group):
    """The worker measures four probes quickly and hangs in the fifth; the controller, slowed down, has
    handled fewer of their reports when the signal comes. Every record it received is in the report, and
    only the probes without one are listed as not run, the hanging one named as being measured."""
    pytester.makeconftest(SLOW_CONTROLLER)
    emu = emulator(fault={SETUP + 25: "slow:30"})  # probe 5 (houseplant-watering) hangs on its first request
    run = Run(pytester.path, emu, "--cachecheck-n=8", "-n", "2")
    run.wait_for_requests(SETUP + 25)
    run.signal(signum, group)
    out = run.finish(90)
    data = run.data()
    check_interrupted(run, out, data, "SIGTERM" if signum == signal.SIGTERM else "interrupted")
    assert measured(data) == IDS[:4], (measured(data), out)
    assert data["summary"]["not_run"] == IDS[4:8]
    assert "while houseplant-watering was being measured" in data["summary"]["why"]
