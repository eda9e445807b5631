"""The controller's reporter: collects the probe records (also from xdist workers), then gives the session
its verdict, writes the JSON report and the HTML page, and prints the summary. Registered only when the
plugin is on, and only on the controller.

The verdict is also a test item, ``cachecheck::gate``, added after the last selected probe: without xdist
it runs last in the ordinary loop; under xdist the controller runs it after every worker has finished
(the workers never see it), so it always judges every probe.
"""

from __future__ import annotations

from typing import Any, Dict, Generator, List, Optional, Tuple

import pytest

from . import _collect, _items, terminal
from .files import write_report
from .model import ProbeRecord, RunReport, Verdict, record_key
from .probes import Probe
from .run import RunResult, summarise
from .session import CheckSession
from .text import printable

RECORD = "cachecheck"  # user_properties key of a probe record
CHECK_RECORD = "cachecheck_check"  # user_properties key of a cachecheck.check() record
TERMINAL_LINE = 4000  # the longest summary line printed


def _probe_key(item: pytest.Item) -> Optional[str]:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and isinstance(callspec.params.get("cachecheck_probe"), Probe):
        return record_key(callspec.params["cachecheck_probe"].id, _collect.item_target(item))
    return None


class Reporter:
    def __init__(self, config: pytest.Config, session: CheckSession,
                 controller_of_workers: bool = False) -> None:
        self.config = config
        self.session = session
        self.controller_of_workers = controller_of_workers  # under xdist: the workers run the probes
        self.records: Dict[str, ProbeRecord] = {}  # by record key
        self.checks: List[ProbeRecord] = []
        self.selected: Optional[List[str]] = None  # record keys of the items selected to run
        self.report_errors: List[str] = []
        self.result: Optional[RunResult] = None
        self.report: Optional[RunReport] = None

    # -- the gate item ------------------------------------------------------------------------------------
    def gate_verdict(self) -> Tuple[List[str], Verdict]:
        """The selected probes without a result yet, and the session verdict on the results so far."""
        s = self.session
        missing = [k for k in self.selected or [] if k not in self.records]
        verdict = summarise(s.settings, s.probe_set, [p.id for p in s.probes], s.target_inputs(),
                            self.records, self.checks, self.selected, s.baselines, False).verdict
        return missing, Verdict(verdict.status, verdict.ok, s.redactor.scrub(verdict.why))

    def _gate(self, parent: Any, **kwargs: Any) -> _items.GateItem:
        return _items.GateItem.from_parent(parent, name=_items.GATE, verdict=self.gate_verdict, **kwargs)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, items: List[pytest.Item]) -> None:
        """Without xdist: the gate goes after the items selected (-k, -m, ...) when a probe is among them."""
        probes = [i for i in items if _probe_key(i) is not None]
        if self.controller_of_workers or not probes:
            return
        gate = self._gate(probes[0].parent)
        items.append(gate)
        report = pytest.CollectReport(_collect.MODULE, "passed", None, [gate])
        self.config.hook.pytest_collectreport(report=report)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, Any, None]:
        """Under xdist: the gate, on the controller, once every worker has finished."""
        outcome = yield
        if (not self.controller_of_workers or not self.selected or outcome.excinfo is not None
                or session.shouldfail or session.shouldstop or self.config.option.collectonly):
            return
        gate = self._gate(session, nodeid=f"{_collect.MODULE}::{_items.GATE}")
        session.testscollected += 1
        gate.ihook.pytest_runtest_protocol(item=gate, nextitem=None)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.selected = [k for k in map(_probe_key, session.items) if k is not None]

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: List[str]) -> None:
        if self.selected is not None:
            return
        by_name = {_collect.probe_nodeid(k): k for k in self.session.keys()}
        self.selected = [by_name[n] for n in ids if n in by_name]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for name, value in report.user_properties:
            if name == RECORD and isinstance(value, dict):
                record = ProbeRecord.from_json(value)
                self.records[record.key] = record
            elif name == CHECK_RECORD and isinstance(value, dict) and report.when == "call":
                self.checks.append(ProbeRecord.from_json(value))

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        from .htmlreport import write_html

        s = self.session
        interrupted = int(exitstatus) == int(pytest.ExitCode.INTERRUPTED)
        self.result = result = summarise(s.settings, s.probe_set, [p.id for p in s.probes], s.target_inputs(),
                                         self.records, self.checks, self.selected, s.baselines, interrupted)
        if not result.verdict.ok and int(session.exitstatus) == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        self.report = report = result.report(int(session.exitstatus))
        scrub = s.redactor.scrub
        for path, write in ((s.settings.report, lambda p: write_report(p, report, scrub)),
                            (s.settings.html, lambda p: write_html(p, report, scrub))):
            if path:
                try:
                    write(path)
                except OSError as exc:
                    self.report_errors.append(f"{path}: {exc}")
        if self.report_errors and int(session.exitstatus) == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a lost report is not a pass

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.result is None or self.report is None:
            return
        tr = terminalreporter

        def scrub(text: str) -> str:  # no secret, and no server text that could forge a line
            return printable(self.session.redactor.scrub(text), TERMINAL_LINE)

        lines = terminal.summary(self.report, self.result.verdict, self.session.settings.baseline,
                                 self.config.option.verbose > 0)
        for out in lines:
            if isinstance(out, terminal.Sep):
                tr.write_sep(out.char, scrub(out.title))
            else:
                tr.write_line(scrub(out.text), **out.markup)
        for error in self.report_errors:
            tr.write_line(f"cachecheck: could not write {scrub(error)}", red=True)
        settings = self.session.settings
        for path, what in ((settings.report, "JSON report"), (settings.html, "HTML page")):
            if path and not any(e.startswith(path + ":") for e in self.report_errors):
                tr.write_line(f"cachecheck: {what} written to {path}")
