"""The controller's reporter: collects the probe records (also from xdist workers), then gives the session
its verdict, writes the JSON report and the HTML page, and prints the summary. Registered only when the
plugin is on, and only on the controller.

The verdict is also a test item, ``cachecheck::gate``, run after the test loop when a probe or an episode
was selected (under xdist by the controller, after every worker has finished; the workers never see it), so
it always judges every probe. It is never collected: no selection can pick it alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, Generator, List, Optional, Set, Tuple, Union

import pytest

from . import _collect, _items, terminal
from ._api import PROPERTIES, State
from .files import write_report
from .kinds import KINDS
from .model import BatchRecord, EpisodeRecord, LoadedRecord, OrderRecord, ProbeRecord, RunReport, Status, Verdict
from .run import KindInput, RunResult, summarise
from .session import CheckSession
from .text import printable

TERMINAL_LINE = 4000  # the longest summary line printed


class JsonRecord(Dict[str, Any]):
    """A record in a report's user_properties: still a dict (pytest-json-report writes it as an object),
    but JSON where a writer takes its str() (JUnit XML's property values)."""

    def __str__(self) -> str:
        return json.dumps(self)


Record = Union[ProbeRecord, EpisodeRecord, BatchRecord, LoadedRecord, OrderRecord]


@dataclass
class Collected:
    """What arrived of one kind: the items' records by record key, the tests' own measurements, and the
    record keys of the items selected to run (None until the selection is known)."""

    records: Dict[str, Record] = field(default_factory=dict)
    checks: List[Record] = field(default_factory=list)
    selected: Optional[List[str]] = None


class Reporter:
    def __init__(self, config: pytest.Config, state: State) -> None:
        self.config = config
        self.session: CheckSession = state.session
        self.interrupts = state.interrupts
        self.controller_of_workers = state.controller_of_workers  # under xdist: the workers run the probes
        #: what the plugin was doing outside the probes, for the verdict of a run interrupted then
        self.stage: Optional[str] = None
        self.kinds: Dict[str, Collected] = {k.name: Collected() for k in KINDS}
        self.started: Dict[str, None] = {}  # record keys of the items that started, in order
        self._keys: Optional[Dict[str, Tuple[str, str]]] = None  # item node id -> (kind, record key)
        self.report_errors: List[str] = []
        self.unwritten: Set[str] = set()  # the output files that could not be written
        self.result: Optional[RunResult] = None
        self.report: Optional[RunReport] = None
        self.printed = False

    # -- the gate item ------------------------------------------------------------------------------------
    def gate_verdict(self) -> Verdict:
        """The session verdict on the results so far (a selected probe or episode without a result fails it)."""
        verdict = self._summarise(False).verdict
        return Verdict(status=verdict.status, ok=verdict.ok, why=self.session.redactor.scrub(verdict.why))

    def _summarise(self, interrupted: Any) -> RunResult:
        s = self.session
        kinds = [(kind, s.item_set(kind), s.cases(kind)) for kind in KINDS]
        inputs = [KindInput(kind, item_set, [i.id for i in items or ()], got.records, got.checks, got.selected)
                  for kind, item_set, items in kinds for got in [self.kinds[kind.name]]]
        return summarise(s.settings, inputs, s.target_inputs(), s.baselines, interrupted)

    @property
    def _selection_known(self) -> bool:
        return all(c.selected is not None for c in self.kinds.values())

    def _any_selected(self) -> bool:
        return any(c.selected for c in self.kinds.values())

    def measured_nothing(self) -> bool:
        """Whether this run set out to measure nothing: --collect-only, or a selection (-k, -m, --deselect)
        without a probe, an episode or a measured check. Such a run writes no report: an earlier one stays."""
        if self.config.option.collectonly:
            return True
        if not self._selection_known:
            return False  # stopped before its selection was known: it set out to measure
        return not any(c.selected or c.records or c.checks for c in self.kinds.values())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, Any, None]:
        """The gate, by one path in every mode: after the loop (under xdist: on the controller, once every
        worker has finished), so it judges every selected probe and episode, whatever reordered the items."""
        outcome = yield
        if (not self._any_selected() or outcome.excinfo is not None
                or session.shouldfail or session.shouldstop or self.config.option.collectonly):
            return
        gate = _items.GateItem.from_parent(session, name=_items.GATE, nodeid=_collect.GATE_NODEID,
                                           verdict=self.gate_verdict)
        session.testscollected += 1
        gate.ihook.pytest_runtest_protocol(item=gate, nextitem=None)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        items = [] if self.config.option.collectonly else session.items  # --collect-only runs nothing
        self._select([key for key in map(_collect.item_key, items) if key is not None])

    def _select(self, keys: List[Tuple[str, str]]) -> None:
        """The items selected to run, from (kind, record key) pairs in run order."""
        for name, got in self.kinds.items():
            got.selected = [key for kind, key in keys if kind == name]

    def _nodeids(self) -> Dict[str, Tuple[str, str]]:
        if self._keys is None:
            self._keys = _collect.nodeids(self.session)
        return self._keys

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: List[str]) -> None:
        if not self._selection_known:
            by_id = self._nodeids()
            self._select([by_id[n] for n in ids if n in by_id])

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        found = self._nodeids().get(nodeid) if nodeid.startswith(_collect.MODULE + "::") else None
        if found is not None:
            self.started[found[1]] = None

    @pytest.hookimpl(tryfirst=True)  # before anything that prints the outcome: a signal may come between
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # before junitxml reads them; under xdist the controller gets plain dicts back, so wrap here
        report.user_properties = [(name, JsonRecord(value) if name in PROPERTIES and isinstance(value, dict)
                                   else value)
                                  for name, value in report.user_properties]
        for name, value in report.user_properties:
            if name not in PROPERTIES or not isinstance(value, dict):
                continue
            kind, check, cls = PROPERTIES[name]
            got = self.kinds[kind]
            if not check:
                record = cls.from_json(value)
                got.records[record.key] = record
            elif report.when == "call":
                got.checks.append(cls.from_json(value))

    def _drain_xdist(self) -> None:
        """Take the reports xdist workers sent that the controller had not handled when the run stopped (an
        interrupt leaves them in its queue): a record that reached this process counts."""
        dsession = self.config.pluginmanager.getplugin("dsession")
        queue = getattr(dsession, "queue", None)
        if queue is None:
            return
        events = []
        while True:
            try:
                events.append(queue.get_nowait())
            except Exception:  # queue.Empty
                break
        for event in events:
            name, kwargs = event if isinstance(event, tuple) and len(event) == 2 else (None, {})
            if name == "logstart" and isinstance(kwargs.get("nodeid"), str):  # as WorkerController names them
                self.pytest_runtest_logstart(kwargs["nodeid"])
            elif name == "testreport" and isinstance(kwargs.get("rep"), pytest.TestReport):
                self.pytest_runtest_logreport(kwargs["rep"])
            queue.put(event)  # left for xdist, as it was

    def _interruption(self) -> str:
        """The verdict of an interrupted run: how, and what was being done."""
        how = self.interrupts.describe()
        text = "the run was interrupted" + (f" {how}" if how else "")
        in_flight = [k for k in self.started if not any(k in c.records for c in self.kinds.values())]
        if self.stage:
            text += f" {self.stage}"
        elif in_flight:
            shown = ", ".join(in_flight[:5]) + (f" and {len(in_flight) - 5} more" if in_flight[5:] else "")
            text += (f" while {shown} {'was' if len(in_flight) == 1 else 'were'} being measured (listed as "
                     f"not run)")
        return text + "; the report holds what was measured"

    @pytest.hookimpl(hookwrapper=True)
    def pytest_sessionstart(self, session: pytest.Session) -> Any:
        """A signal before the session started (while the server is detected, or xdist starts its workers)
        ends pytest without pytest_sessionfinish: write the report and the summary here."""
        outcome = yield
        interrupted = outcome.excinfo is not None and issubclass(outcome.excinfo[0], KeyboardInterrupt)
        if interrupted and self.result is None:
            self.stage = self.stage or "before the first probe"
            self.pytest_sessionfinish(session, pytest.ExitCode.INTERRUPTED)
            terminalreporter = self.config.pluginmanager.getplugin("terminalreporter")
            if terminalreporter is not None:
                self.pytest_terminal_summary(terminalreporter)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        with self.interrupts.hold():
            self._finish(session, exitstatus)

    def _finish(self, session: pytest.Session, exitstatus: int) -> None:
        self._drain_xdist()
        interrupted = int(exitstatus) == int(pytest.ExitCode.INTERRUPTED) or self.interrupts.interrupted
        if interrupted and int(session.exitstatus) in (0, 1, 5):
            # a second Ctrl-C inside pytest's handling of the first leaves the status at 0
            session.exitstatus = pytest.ExitCode.INTERRUPTED
        self.result = result = self._summarise(self._interruption() if interrupted else False)
        self._settle(session)
        if not self.measured_nothing():
            self._write_outputs(result, session)
        self.report = result.report(int(session.exitstatus))

    def _settle(self, session: pytest.Session) -> None:
        """pytest's exit status and ``--lf`` from the verdict: a failed verdict never exits 0."""
        assert self.result is not None
        if not self.result.verdict.ok:
            self._rerun_with_last_failed()
            if int(session.exitstatus) in (0, int(pytest.ExitCode.NO_TESTS_COLLECTED)):
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _write_outputs(self, result: RunResult, session: pytest.Session) -> None:
        """The JSON report and the HTML page, from one verdict: when a file cannot be written, the verdict
        fails and the files that were written are written again to say so."""
        scrub = self.session.redactor.scrub
        pending = [(path, write) for path, _, write in self._outputs()]
        while pending:
            report = result.report(int(session.exitstatus))
            failed = []
            for path, write in pending:
                try:
                    write(path, report, scrub)
                except OSError as exc:
                    failed.append(path)
                    self.unwritten.add(path)
                    self.report_errors.append(f"{path}: {exc}")
            if not failed:
                break
            result.fail(Status.UNWRITTEN, "could not write " + ", ".join(failed))
            self._settle(session)
            pending = [(path, write) for path, _, write in self._outputs() if path not in self.unwritten]

    def _outputs(self) -> List[Tuple[str, str, Any]]:
        """The plugin's output files asked for: (path, what it is, its writer)."""
        from .htmlreport import write_html

        settings = self.session.settings
        return [(path, what, write) for path, what, write in ((settings.report, "JSON report", write_report),
                                                               (settings.html, "HTML page", write_html)) if path]

    def _rerun_with_last_failed(self) -> None:
        """A failed verdict marks every selected probe and episode item as failed for ``--lf``, so a rerun
        with ``--lf`` measures them again with the gate, instead of running the gate alone."""
        lf = self.config.pluginmanager.getplugin("lfplugin")
        lastfailed = getattr(lf, "lastfailed", None)
        if not isinstance(lastfailed, dict):
            return
        for kind, got in self.kinds.items():
            for key in got.selected or []:
                lastfailed.setdefault(_collect.nodeid(kind, key), True)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.result is None or self.report is None or self.printed:
            return
        self.printed = True
        with self.interrupts.hold():
            self._print_summary(terminalreporter)

    def _print_summary(self, terminalreporter: Any) -> None:
        assert self.result is not None and self.report is not None
        tr = terminalreporter

        def scrub(text: str) -> str:  # no secret, and no server text that could forge a line
            return printable(self.session.redactor.scrub(text), TERMINAL_LINE)

        files = [(path, what) for path, what, _ in self._outputs()]
        if self.measured_nothing():
            left = f"; no report was written, left as they were: {', '.join(scrub(p) for p, _ in files)}" if files else ""
            if not self.result.verdict.ok:
                tr.write_line(f"cachecheck verdict: FAIL ({self.result.verdict.status}): {scrub(self.result.verdict.why)}",
                              red=True)
            tr.write_line("cachecheck: nothing was measured (--collect-only, or no probe, episode or check "
                          "selected)" + left)
            return

        lines = terminal.summary(self.report, self.result.verdict, self.session.settings.baseline,
                                 self.config.option.verbose > 0)
        for out in lines:
            if isinstance(out, terminal.Sep):
                tr.write_sep(out.char, scrub(out.title))
            else:
                tr.write_line(scrub(out.text), **out.markup)
        for error in self.report_errors:
            tr.write_line(f"cachecheck: could not write {scrub(error)}", red=True)
        for path, what in files:
            if path not in self.unwritten:
                tr.write_line(f"cachecheck: {what} written to {scrub(path)}")
