"""The controller's reporter: collects the probe records (also from xdist workers), then gives the session
its verdict, writes the JSON report and the HTML page, and prints the summary. Registered only when the
plugin is on, and only on the controller.

The verdict is also a test item, ``cachecheck::gate``, added after the last selected probe: without xdist
it runs last in the ordinary loop; under xdist the controller runs it after every worker has finished
(the workers never see it), so it always judges every probe.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Generator, List, Optional, Tuple

import pytest

from . import _collect, _items, terminal
from ._api import CHECK_RECORD, EPISODE_CHECK_RECORD, EPISODE_RECORD, RECORD
from .files import write_report
from .episodes import Episode
from .interrupts import Interrupts
from .model import EpisodeRecord, ProbeRecord, RunReport, Verdict, record_key
from .probes import Probe
from .run import EpisodeInput, RunResult, summarise
from .session import CheckSession
from .text import printable

TERMINAL_LINE = 4000  # the longest summary line printed


class JsonRecord(Dict[str, Any]):
    """A record in a report's user_properties: still a dict (pytest-json-report writes it as an object),
    but JSON where a writer takes its str() (JUnit XML's property values)."""

    def __str__(self) -> str:
        return json.dumps(self)


def _probe_key(item: pytest.Item) -> Optional[str]:
    params = getattr(getattr(item, "callspec", None), "params", {})
    if isinstance(params.get("cachecheck_probe"), Probe):
        return record_key(params["cachecheck_probe"].id, _collect.item_target(item))
    return None


def _episode_key(item: pytest.Item) -> Optional[str]:
    params = getattr(getattr(item, "callspec", None), "params", {})
    if isinstance(params.get("cachecheck_episode"), Episode):
        return record_key(params["cachecheck_episode"].id, _collect.item_target(item))
    return None


class Reporter:
    def __init__(self, config: pytest.Config, session: CheckSession, interrupts: Interrupts,
                 controller_of_workers: bool = False) -> None:
        self.config = config
        self.session = session
        self.interrupts = interrupts
        self.controller_of_workers = controller_of_workers  # under xdist: the workers run the probes
        #: what the plugin was doing outside the probes, for the verdict of a run interrupted then
        self.stage: Optional[str] = None
        self.records: Dict[str, ProbeRecord] = {}  # by record key
        self.started: Dict[str, None] = {}  # record keys of the probe items that started, in order
        self._keys: Optional[Dict[str, str]] = None  # probe item node id -> record key
        self.checks: List[ProbeRecord] = []
        self.selected: Optional[List[str]] = None  # record keys of the items selected to run
        self.episodes: Dict[str, EpisodeRecord] = {}
        self.episode_checks: List[EpisodeRecord] = []
        self.selected_episodes: Optional[List[str]] = None
        self.report_errors: List[str] = []
        self.result: Optional[RunResult] = None
        self.report: Optional[RunReport] = None
        self.printed = False

    # -- the gate item ------------------------------------------------------------------------------------
    def gate_verdict(self) -> Tuple[List[str], Verdict]:
        """The selected probes and episodes without a result yet, and the session verdict on the results
        so far."""
        missing = [k for k in self.selected or [] if k not in self.records]
        missing += [k for k in self.selected_episodes or [] if k not in self.episodes]
        verdict = self._summarise(False).verdict
        return missing, Verdict(verdict.status, verdict.ok, self.session.redactor.scrub(verdict.why))

    def _summarise(self, interrupted: Any) -> RunResult:
        s = self.session
        episodes = None
        if s.episode_set is not None:
            episodes = EpisodeInput(s.episode_set, [e.id for e in s.episodes], self.episodes,
                                    self.selected_episodes)
        return summarise(s.settings, s.probe_set, [p.id for p in s.probes], s.target_inputs(), self.records,
                         self.checks, self.selected, s.baselines, interrupted, episodes, self.episode_checks)

    def _gate(self, parent: Any, **kwargs: Any) -> _items.GateItem:
        return _items.GateItem.from_parent(parent, name=_items.GATE, verdict=self.gate_verdict, **kwargs)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, items: List[pytest.Item]) -> None:
        """Without xdist: the gate goes after the items selected (-k, -m, ...) when a probe or an episode is
        among them."""
        probes = [i for i in items if _probe_key(i) is not None or _episode_key(i) is not None]
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
        if (not self.controller_of_workers or not (self.selected or self.selected_episodes)
                or outcome.excinfo is not None
                or session.shouldfail or session.shouldstop or self.config.option.collectonly):
            return
        gate = self._gate(session, nodeid=f"{_collect.MODULE}::{_items.GATE}")
        session.testscollected += 1
        gate.ihook.pytest_runtest_protocol(item=gate, nextitem=None)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.selected = [k for k in map(_probe_key, session.items) if k is not None]
        self.selected_episodes = [k for k in map(_episode_key, session.items) if k is not None]

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: List[str]) -> None:
        if self.selected is not None:
            return
        by_name = {_collect.probe_nodeid(k): k for k in self.session.keys()}
        self.selected = [by_name[n] for n in ids if n in by_name]
        by_episode = {_collect.episode_nodeid(k): k for k in self.session.episode_keys()}
        self.selected_episodes = [by_episode[n] for n in ids if n in by_episode]

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        if nodeid.startswith(_collect.PROBE_PREFIX):
            if self._keys is None:
                self._keys = {_collect.probe_nodeid(k): k for k in self.session.keys()}
            key = self._keys.get(nodeid)
            if key is not None:
                self.started[key] = None

    @pytest.hookimpl(tryfirst=True)  # before anything that prints the outcome: a signal may come between
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # before junitxml reads them; under xdist the controller gets plain dicts back, so wrap here
        report.user_properties = [(name, JsonRecord(value) if name in (RECORD, CHECK_RECORD)
                                   and isinstance(value, dict) else value)
                                  for name, value in report.user_properties]
        for name, value in report.user_properties:
            if name == RECORD and isinstance(value, dict):
                record = ProbeRecord.from_json(value)
                self.records[record.key] = record
            elif name == CHECK_RECORD and isinstance(value, dict) and report.when == "call":
                self.checks.append(ProbeRecord.from_json(value))
            elif name == EPISODE_RECORD and isinstance(value, dict):
                episode = EpisodeRecord.from_json(value)
                self.episodes[episode.key] = episode
            elif name == EPISODE_CHECK_RECORD and isinstance(value, dict) and report.when == "call":
                self.episode_checks.append(EpisodeRecord.from_json(value))

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
        in_flight = [k for k in self.started if k not in self.records]
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
        from .htmlreport import write_html

        s = self.session
        self._drain_xdist()
        interrupted = int(exitstatus) == int(pytest.ExitCode.INTERRUPTED) or self.interrupts.interrupted
        if interrupted and int(session.exitstatus) in (0, 1, 5):
            # a second Ctrl-C inside pytest's handling of the first leaves the status at 0
            session.exitstatus = pytest.ExitCode.INTERRUPTED
        self.result = result = self._summarise(self._interruption() if interrupted else False)
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
