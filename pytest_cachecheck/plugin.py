"""pytest glue: options, probe items, fixtures, the session summary and the JSON report.

Everything that measures lives in plain modules (``protocol``, ``clients``, ``report``); this module only
maps it onto pytest. State lives on ``config.stash``; the reporter is registered on the controller only.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

import pytest

from . import _items
from .errors import ConfigError, RequestError, ServerSetupError
from .outcomes import ERROR
from .probes import Probe, ProbeFileError, builtin_probes, load_probes, parse_probe, probe_set_fingerprint
from .redact import Redactor, display_url
from .report import Tally, Verdict, build_matrix_report, build_report, combine_verdicts, divergence_line, \
    judge, matrix_lines, max_rate_gate, rate_line, recompute_reuse_cause, result_block, write_json_atomic
from .settings import OPTIONS, Settings, lookup, reproduce_args, resolve

if TYPE_CHECKING:  # the measurement (and requests) are imported only when the plugin is enabled
    from .baseline import Comparison
    from .protocol import ProbeResult, Runner
    from .serve import Served

RECORD = "cachecheck"  # user_properties key of a probe record
CHECK_RECORD = "cachecheck_check"  # user_properties key of a cachecheck.check() record
XDIST_GROUP = "cachecheck"


def record_key(probe_id: str, target: Optional[str]) -> str:
    """How a probe item is named among the session's records: its probe id, and in a target matrix
    ``<probe id>@<target>`` (target names cannot contain '@')."""
    return probe_id if target is None else f"{probe_id}@{target}"


class _State:
    def __init__(self, settings: Settings, probes: List[Probe], probe_set: Dict[str, Any]) -> None:
        self.settings = settings
        self.probes = probes
        self.probe_set = probe_set
        from .protocol import Runner

        self.redactor = Redactor()
        for _, url in settings.targets:
            self.redactor.add_url(url)
        #: one runner per target of a matrix; one runner, under the name None, otherwise
        self.runners: Dict[Optional[str], Runner] = {}
        for name, url in settings.targets or ((None, settings.url),):
            own = settings if name is None else dataclasses.replace(settings, url=url)
            self.runners[name] = Runner(own, self.redactor)
        self.served: Optional[Served] = None
        self.baselines: Dict[Optional[str], Dict[str, Any]] = {}  # target -> the baseline it is compared with
        #: an xdist controller: its workers probe, so it sends no request that generates
        self.controller_of_workers = False

    @property
    def targets(self) -> List[Optional[str]]:
        return list(self.runners)

    def runner(self, target: Optional[str] = None) -> Runner:
        return self.runners[target]

    def keys(self) -> List[str]:
        """Every probe item's record key, in run order (target by target)."""
        return [record_key(p.id, t) for t in self.targets for p in self.probes]

    def baseline_different(self, target: Optional[str]) -> Dict[str, str]:
        """id -> conversation fingerprint of the probes that differed in the target's baseline."""
        baseline = self.baselines.get(target)
        if baseline is None:
            return {}
        return {p["id"]: p.get("fingerprint", "") for p in baseline.get("probes", [])
                if isinstance(p, dict) and p.get("outcome") == "different"}


STATE = pytest.StashKey[Optional[_State]]()


# -- options ----------------------------------------------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cachecheck", "prompt-cache divergence (pytest-cachecheck)")
    for spec in OPTIONS:
        dest = "cachecheck_" + spec.name
        text = spec.help + (f" [env {spec.env}]" if spec.env else "") + f" [ini {spec.ini}]"
        if spec.kind == "bool":
            group.addoption(spec.flag, action="store_true", dest=dest, default=False, help=text)
            parser.addini(spec.ini, spec.help + " (true or false)", default="")  # validated by the plugin
        elif spec.kind == "list":
            group.addoption(spec.flag, action="append", dest=dest, default=None, metavar=spec.metavar,
                            help=text)
            parser.addini(spec.ini, spec.help, type="linelist", default=[])
        else:
            group.addoption(spec.flag, action="store", dest=dest, default=None, metavar=spec.metavar,
                            help=text)
            parser.addini(spec.ini, spec.help, default="")


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cachecheck: a prompt-cache divergence probe (pytest-cachecheck)")
    config.stash[STATE] = None
    base = Path(config.invocation_params.dir)
    try:
        raw = lookup(lambda n: config.getoption("cachecheck_" + n),
                     lambda n: config.getini("cachecheck_" + n), os.environ)
        serving = bool(raw.get("serve"))
        if serving:
            if raw.get("url") or raw.get("nocache_url") or raw.get("target"):
                raise ConfigError("--cachecheck-serve starts its own llama-server; it conflicts with "
                                  "--cachecheck-url, --cachecheck-target and --cachecheck-nocache-url (ini or "
                                  "CACHECHECK_URL)")
            from .serve import check_serve_args

            check_serve_args(raw["serve"], raw.get("server_args"))
            # a worker is told the controller's server; the controller starts it once all else is valid
            served_url = getattr(config, "workerinput", {}).get("cachecheck_served_url", "http://127.0.0.1:1")
            raw["url"] = [served_url]
        settings = resolve(raw, base_dir=base)
    except ConfigError as exc:
        raise pytest.UsageError(f"cachecheck: {exc}") from None
    if settings is None:
        return
    settings = _own_replica(config, settings)
    try:
        probes = load_probes(settings.probe_files) if settings.probe_files else builtin_probes()
    except ProbeFileError as exc:
        raise pytest.UsageError(f"cachecheck: --cachecheck-probes: bad probe file: {exc}") from None
    if settings.n is not None:
        probes = probes[: settings.n]
    name = "builtin" if not settings.probe_files else "+".join(Path(p).name for p in settings.probe_files)
    probe_set = {"name": name, "count": len(probes), "fingerprint": probe_set_fingerprint(probes)}
    _check_xdist(config)
    baselines: Dict[Optional[str], Dict[str, Any]] = {}
    if settings.baseline:
        from .baseline import BaselineError, baseline_for, load_baseline

        try:
            loaded = load_baseline(settings.baseline)
            names: List[Optional[str]] = [n for n, _ in settings.targets] or [None]
            for target_name in names:
                baselines[target_name] = baseline_for(loaded, target_name, settings.baseline)
        except BaselineError as exc:
            raise pytest.UsageError(f"cachecheck: --cachecheck-baseline: {exc}") from None
    served = None
    if serving and not _is_worker(config):
        assert settings.serve is not None
        served = _start_served(config, settings.serve, settings.server_args)
        settings = dataclasses.replace(settings, url=served.server.url, replicas=(served.server.url,))
    state = _State(settings, probes, probe_set)
    state.served = served
    state.baselines = baselines
    state.controller_of_workers = not _is_worker(config) and getattr(config.option, "dist", "no") not in (None, "no")
    config.stash[STATE] = state
    if not _is_worker(config):
        config.pluginmanager.register(Reporter(config, state), "cachecheck-reporter")


def _start_served(config: pytest.Config, model: str, server_args: Optional[str]) -> Served:
    def log(message: str) -> None:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()

    from .llama_server import LlamaServerError
    from .serve import start

    try:
        served = start(model, server_args, log)
    except (LlamaServerError, OSError, subprocess.CalledProcessError) as exc:
        raise pytest.UsageError(f"cachecheck: --cachecheck-serve could not start llama-server: {exc}") from None
    return served


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is not None and state.served is not None:
        state.served.server.stop()
        state.served = None


def _worker_index(config: pytest.Config) -> Optional[int]:
    workerid = getattr(config, "workerinput", {}).get("workerid", "")
    return int(workerid[2:]) if workerid.startswith("gw") and workerid[2:].isdigit() else None


def _own_replica(config: pytest.Config, settings: Settings) -> Settings:
    """With several URLs, each xdist worker owns one server; no two workers send to the same one."""
    if len(settings.replicas) < 2:
        return settings
    index = _worker_index(config)
    if index is not None:
        return dataclasses.replace(settings, url=settings.replicas[index])
    workers = getattr(config.option, "numprocesses", None) or 0
    if isinstance(workers, int) and workers > len(settings.replicas):
        raise pytest.UsageError(f"cachecheck: -n {workers} workers but {len(settings.replicas)} "
                                f"--cachecheck-url servers: each worker needs a server of its own")
    return settings


def _check_xdist(config: pytest.Config) -> None:
    """All probes against one server must run in one worker: parallel requests batch and change answers."""
    if _is_worker(config):
        # workers re-parse the command line; the controller tells them about the switch below
        if config.workerinput.get("cachecheck_dist") == "loadgroup":  # type: ignore[attr-defined]
            config.option.loadgroup = True
        return
    dist = getattr(config.option, "dist", "no")
    if dist in (None, "no"):
        return
    if dist == "load":
        # loadgroup distributes ungrouped tests exactly as load does and keeps our xdist_group together
        config.option.dist = "loadgroup"
    elif dist not in ("loadgroup", "loadfile", "loadscope"):
        raise pytest.UsageError(
            f"cachecheck: --dist {dist} would send probes to one server from several workers at once, "
            f"which batches requests and changes answers; use --dist loadgroup (the default with -n is "
            f"switched to it) or loadfile/loadscope")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    state = node.config.stash.get(STATE, None)
    if state is not None:
        node.workerinput["cachecheck_dist"] = node.config.option.dist
        if state.served is not None:
            node.workerinput["cachecheck_served_url"] = state.served.server.url


def _describe_target(state: _State, name: Optional[str]) -> List[str]:
    """Header lines for one target: mode, server, model, a raised tolerance and setup warnings."""
    s = state.settings
    label = "cachecheck: " + (f"target {name}: " if name is not None else "")
    try:
        target = state.runner(name).target(send=not state.controller_of_workers)
    except (RequestError, ServerSetupError) as exc:
        return [f"{label}mode {s.mode} | server not usable: {exc}"]
    server = target.cache.info
    how = " (auto-detected)" if s.mode == "auto" else ""
    desc = f"{label}mode {target.mode}{how} | server {server.kind} {server.build or ''} | model {server.model or '?'}"
    if target.hit_tolerance is not None:
        desc += (f" | hit_tolerance raised to {target.hit_tolerance} for the server's "
                 f"{target.hit_tolerance + 1}-token cache blocks")
    return [desc] + [f"{label}warning: {w}" for w in target.warnings]


def pytest_report_header(config: pytest.Config) -> Optional[List[str]]:
    state = config.stash.get(STATE, None)
    if state is None:
        return None
    s = state.settings
    lines = []
    if len(s.replicas) > 1:
        lines.append(f"cachecheck: {len(s.replicas)} servers given: with -n N each xdist worker owns one; "
                     f"without -n only the first is used")
    if s.targets:
        lines.append(f"cachecheck: target matrix of {len(s.targets)}: every probe runs on "
                     + ", ".join(f"{n} ({display_url(u)})" for n, u in s.targets))
    if state.served is not None:
        served = state.served
        what = ("the demo model: tiny, RANDOM weights generated on this machine, so its answers are word "
                "salad; the prompt cache it exercises is real" if served.demo else served.model.name)
        lines.append(f"cachecheck: serving {what}")
        lines.append(f"cachecheck: llama-server at {served.server.url}, log {served.server.log_path}")
    for name in state.targets:
        lines += [state.redactor.scrub(line) for line in _describe_target(state, name)]
    lines += [f"cachecheck: {len(state.probes)} probes ({state.probe_set['name']}) | max_tokens {s.max_tokens} "
              f"| hit_tolerance {s.hit_tolerance}",
              "cachecheck: reproduce with: pytest " + state.redactor.scrub(" ".join(reproduce_args(s)))]
    return lines


# -- items ------------------------------------------------------------------------------------------
class _ProbeModule(pytest.Module):
    """The plugin's own module of probe items; only its ``probe`` function is collected."""

    def funcnamefilter(self, name: str) -> bool:
        return name == "probe"

    def classnamefilter(self, name: str) -> bool:
        return False


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: List[pytest.Item]) -> None:
    if config.stash.get(STATE, None) is None:
        return
    module = _ProbeModule.from_parent(session, path=Path(_items.__file__), nodeid="cachecheck",
                                      name="cachecheck")
    new: List[pytest.Item] = [i for i in module.collect() if isinstance(i, pytest.Item)]
    servers = len(config.stash[STATE].settings.replicas) or 1  # type: ignore[union-attr]
    for k, item in enumerate(new):
        # one group per server: a worker runs its groups one probe at a time, each on its own server
        target = _item_target(item)
        if target is not None:
            group = f"{XDIST_GROUP}-{target}"
        else:
            group = XDIST_GROUP if servers == 1 else f"{XDIST_GROUP}-{k % servers}"
        item.add_marker(pytest.mark.xdist_group(group))
    config.hook.pytest_collectreport(report=pytest.CollectReport(module.nodeid, "passed", None, list(new)))
    items.extend(new)


def _item_target(item: pytest.Item) -> Optional[str]:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("cachecheck_target") if callspec is not None else None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.function is not _items.probe:
        return
    state = metafunc.config.stash.get(STATE, None)
    probes = state.probes if state is not None else []
    if state is not None and state.settings.targets:
        # the target matrix: every probe on every target, target by target; ids <probe id>@<target>
        pairs = [(p, name) for name in state.targets for p in probes]
        metafunc.parametrize(("cachecheck_probe", "cachecheck_target"), pairs,
                             ids=[record_key(p.id, name) for p, name in pairs])
    else:
        metafunc.parametrize("cachecheck_probe", probes, ids=[p.id for p in probes])


# -- fixtures ---------------------------------------------------------------------------------------
def _record(result: ProbeResult, runner: Runner, target: Optional[str]) -> Dict[str, Any]:
    record = result.to_dict()
    if target is not None:
        record["target"] = target
    record["server_url"] = display_url(runner.settings.url)
    record["worker"] = os.environ.get("PYTEST_XDIST_WORKER")
    if runner._target is not None:
        record["run"] = runner._target.describe()
    return record


@pytest.fixture
def cachecheck_target() -> Optional[str]:
    """The target-matrix target a probe item runs on (``--cachecheck-target NAME=URL``); None without a
    matrix. The plugin parametrizes it for its probe items."""
    return None


@pytest.fixture
def cachecheck_probe_result(request: pytest.FixtureRequest, cachecheck_probe: Probe,
                            cachecheck_target: Optional[str]) -> ProbeResult:
    """Measure the item's probe (six requests); a failed request errors the item here, in setup."""
    state = request.config.stash[STATE]
    assert state is not None
    runner = state.runner(cachecheck_target)
    result = runner.run(cachecheck_probe)
    request.node.user_properties.append((RECORD, _record(result, runner, cachecheck_target)))
    if result.outcome == ERROR:
        pytest.fail(f"cachecheck: {result.reason}", pytrace=False)
    return result


@pytest.fixture
def cachecheck_expected_divergence(request: pytest.FixtureRequest, cachecheck_target: Optional[str]
                                   ) -> Callable[[ProbeResult], Optional[str]]:
    """Why a divergence is expected (reported as xfail), or None when it is a plain failure."""
    state = request.config.stash[STATE]
    assert state is not None
    before = state.baseline_different(cachecheck_target)

    def expected(result: ProbeResult) -> Optional[str]:
        if before.get(result.probe.id) == result.probe.fingerprint:
            return "also differed in the baseline"
        if state.settings.gated:
            return "diverged; the session gate decides (--cachecheck-max-rate / --cachecheck-fail-on)"
        return None

    return expected


class CacheCheck:
    """What the ``cachecheck`` fixture gives a test: run your own probe and assert on the result."""

    def __init__(self, state: _State, node: pytest.Item) -> None:
        self._state = state
        self._node = node

    @property
    def settings(self) -> Settings:
        return self._state.settings

    @property
    def targets(self) -> List[str]:
        """The names of the target matrix (empty without one)."""
        return [n for n, _ in self._state.settings.targets]

    def check(self, turn1: Optional[str] = None, turn2: Optional[str] = None, *,
              messages: Optional[List[Dict[str, str]]] = None, followup: Optional[str] = None,
              id: Optional[str] = None, target: Optional[str] = None) -> ProbeResult:
        """Measure one conversation; returns a ProbeResult (.same, .different, .valid, .reason, answers).

        ``target`` names the server of a target matrix to measure on (default: the first).
        Raises ValueError for a malformed conversation or an unknown target, and RequestError when a
        request fails.
        """
        __tracebackhide__ = True  # its locals (the runner, the state) lead to the settings and URLs
        names = self._state.targets
        if target is None:
            target = names[0]
        elif target not in names:
            raise ValueError(f"cachecheck.check(target={target!r}): the targets are "
                             + (", ".join(str(n) for n in names) if names != [None] else
                                "none (no --cachecheck-target was given)"))
        obj: Dict[str, Any] = {}
        if messages is not None or followup is not None:
            obj.update({"messages": messages, "followup": followup})
        if turn1 is not None or turn2 is not None:
            obj.update({"turn1": turn1, "turn2": turn2})
        if id is not None:
            obj["id"] = id
        probe = parse_probe(obj, path=f"cachecheck.check() in {self._node.nodeid}", line=1,
                            default_id=self._node.name)
        runner = self._state.runner(target)
        result = runner.run(probe)
        record = _record(result, runner, target)
        record["test"] = self._node.nodeid
        self._node.user_properties.append((CHECK_RECORD, record))
        if result.outcome == ERROR:
            raise RequestError(result.reason)
        return result


@pytest.fixture
def cachecheck(request: pytest.FixtureRequest) -> CacheCheck:
    """Run your own prompt-cache checks: ``cachecheck.check(turn1=..., turn2=...)``."""
    state = request.config.stash.get(STATE, None)
    if state is None:
        pytest.skip("cachecheck: no server given (--cachecheck-url, ini cachecheck_url or CACHECHECK_URL)")
    return CacheCheck(state, request.node)


# -- JSON report metadata ---------------------------------------------------------------------------
@pytest.hookimpl(optionalhook=True)
def pytest_json_runtest_metadata(item: pytest.Item, call: pytest.CallInfo) -> Optional[Dict[str, Any]]:
    if call.when != "call" and call.when != "setup":
        return None
    for name, value in getattr(item, "user_properties", []):
        if name == RECORD:
            meta = {"id": value["id"], "outcome": value["outcome"], "reason": value["reason"]}
            if value.get("target") is not None:
                meta["target"] = value["target"]
            return {"cachecheck": meta}
    return None


# -- the controller's reporter ----------------------------------------------------------------------
def _escaped(probe_id: str) -> str:
    # how pytest shows a parametrize id in node ids
    return probe_id.encode("unicode_escape").decode("ascii")


@dataclasses.dataclass
class _TargetResult:
    """What one target (the only one, without a matrix) measured, and its own verdict."""

    name: Optional[str]
    url: str
    records: List[Dict[str, Any]]
    selected: List[str]
    run: Dict[str, Any]
    tally: Tally
    verdict: Verdict
    comparison: Optional[Comparison]

    def report(self, exit_status: Optional[int]) -> Dict[str, Any]:
        data = build_report(self.run, self.records, self.selected, self.verdict, exit_status)
        if self.comparison is not None:
            data["baseline"] = self.comparison.to_dict()
        if self.name is not None:
            data = {"name": self.name, "url": display_url(self.url), **data}
        return data


class Reporter:
    """Collects probe records (also from xdist workers), then writes the summary and the JSON report."""

    def __init__(self, config: pytest.Config, state: _State) -> None:
        self.config = config
        self.state = state
        self.records: Dict[str, Dict[str, Any]] = {}  # by record_key
        self.checks: List[Dict[str, Any]] = []
        self.selected: Optional[List[str]] = None  # record keys of the items selected to run
        self.report_errors: List[str] = []
        self.results: List[_TargetResult] = []
        self.verdict: Optional[Verdict] = None
        self.data: Dict[str, Any] = {}  # the JSON report, once the session finished

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        keys = []
        for item in session.items:
            callspec = getattr(item, "callspec", None)
            if callspec is not None and isinstance(callspec.params.get("cachecheck_probe"), Probe):
                keys.append(record_key(callspec.params["cachecheck_probe"].id, _item_target(item)))
        self.selected = keys

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: List[str]) -> None:
        if self.selected is not None:
            return
        by_name = {f"cachecheck::probe[{_escaped(k)}]": k for k in self.state.keys()}
        self.selected = [by_name[n] for n in ids if n in by_name]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for name, value in report.user_properties:
            if name == RECORD and isinstance(value, dict):
                self.records[record_key(value["id"], value.get("target"))] = value
            elif name == CHECK_RECORD and isinstance(value, dict) and report.when == "call":
                self.checks.append(value)

    def _target_result(self, name: Optional[str], interrupted: bool) -> _TargetResult:
        from .baseline import compare, should_fail

        settings, runner = self.state.settings, self.state.runner(name)
        records = [self.records[k] for k in (record_key(p.id, name) for p in self.state.probes)
                   if k in self.records]
        selected_keys = self.selected if self.selected is not None else self.state.keys()
        selected = [p.id for p in self.state.probes if record_key(p.id, name) in set(selected_keys)]
        run: Dict[str, Any] = {"settings": settings.public(), "probe_set": self.state.probe_set,
                               "mode": None, "server": None, "nocache_server": None}
        described = next((r["run"] for r in records if r.get("run")), None)
        if described is None and runner._target is not None:
            described = runner._target.describe()
        if described:
            run.update(described)
        if self.state.served is not None:
            run["served"] = self.state.served.describe()
        tally = Tally.of(records)
        gates = []
        if settings.max_rate is not None:
            gates.append(max_rate_gate(tally, settings.max_rate))
        comparison = None
        baseline = self.state.baselines.get(name)
        # a matrix target that ran no probe (deselected) has nothing to compare
        if baseline is not None and (records or name is None):
            comparison = compare(baseline, run, records)
            gates.append(should_fail(comparison, settings.fail_on))
        verdict = judge(tally, settings.min_valid, interrupted, gates or None)
        return _TargetResult(name, runner.settings.url, records, selected, run, tally, verdict, comparison)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        from .baseline import compare
        from .htmlreport import write_html

        settings = self.state.settings
        interrupted = int(exitstatus) == int(pytest.ExitCode.INTERRUPTED)
        self.results = [self._target_result(name, interrupted) for name in self.state.targets]
        matrix = bool(settings.targets)
        self.verdict = (combine_verdicts([(str(t.name), t.verdict) for t in self.results]) if matrix
                        else self.results[0].verdict)
        if not self.verdict.ok and int(session.exitstatus) == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        exit_status = int(session.exitstatus)
        if matrix:
            reports = [t.report(None) for t in self.results]
            for t, data_t in zip(self.results[1:], reports[1:]):
                # each target against the first, probe by probe, as against a baseline (where both ran)
                if t.records and self.results[0].records:
                    data_t["vs_reference"] = compare(reports[0], t.run, t.records).to_dict()
            data = build_matrix_report(reports, self.verdict, exit_status)
            comparison = None
        else:
            data = self.results[0].report(exit_status)
            comparison = self.results[0].comparison
        if self.checks:
            data["checks"] = self.checks
        self.data = data
        for path, write in ((settings.report, lambda p: write_json_atomic(p, data, self.state.redactor.scrub)),
                            (settings.html, lambda p: write_html(p, data, comparison,
                                                                 scrub=self.state.redactor.scrub))):
            if path:
                try:
                    write(path)
                except OSError as exc:
                    self.report_errors.append(f"{path}: {exc}")
        if self.report_errors and int(session.exitstatus) == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a lost report is not a pass

    def _target_lines(self, tr: Any, t: _TargetResult, label: str) -> None:
        """Errors, the likely cause of recompute reuse, setup warnings and the baseline comparison."""
        scrub = self.state.redactor.scrub
        errored = [r["reason"] for r in t.records if r["outcome"] == "error"]
        if errored:
            tr.write_line(f"{label}errors: {len(errored)}; the first: {scrub(errored[0][:240])}", red=True)
        cause = recompute_reuse_cause(t.records, t.run.get("mode"))
        if cause:
            tr.write_line(f"{label}cause: " + cause, yellow=True)
        for warning in t.run.get("setup_warnings") or []:
            tr.write_line(f"{label}setup warning: " + scrub(warning), yellow=True)
        if t.comparison is not None:
            tr.write_sep("-", f"cachecheck baseline comparison ({self.state.settings.baseline})"
                         + (f", target {t.name}" if t.name is not None else ""))
            for line in t.comparison.lines(verbose=self.config.option.verbose > 0):
                tr.write_line(scrub(line))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.verdict is None:
            return
        tr = terminalreporter
        scrub = self.state.redactor.scrub
        tr.write_sep("=", "cachecheck summary")
        matrix = bool(self.state.settings.targets)
        total = sum(t.tally.probes for t in self.results)
        if total == 0:
            tr.write_line("cachecheck: no probe ran")
        elif matrix:
            for line in matrix_lines(self.data["targets"]):
                tr.write_line(scrub(line))
            for t in self.results:
                self._target_lines(tr, t, f"{t.name}: ")
        else:
            t = self.results[0]
            tally = t.tally
            tr.write_line(f"probes: {tally.probes} | valid: {tally.valid} (same {tally.same}, different "
                          f"{tally.different}) | inconclusive: {tally.inconclusive} | errors: {tally.errors}")
            tr.write_line(divergence_line(tally), bold=True, red=bool(tally.different))
            rate = rate_line(tally)
            if rate:
                tr.write_line(rate)
            self._target_lines(tr, t, "")
        if total:
            status = "PASS" if self.verdict.ok else "FAIL"
            tr.write_line(f"cachecheck verdict: {status} ({self.verdict.status}): {scrub(self.verdict.why)}",
                          green=self.verdict.ok, red=not self.verdict.ok)
            tr.write_sep("-", "cachecheck result (to share: no URL, key or conversation text)")
            for t in self.results:
                prefix = f"[{t.name}] " if matrix else ""
                if matrix and not t.tally.probes:
                    tr.write_line(prefix + "no probe ran")
                    continue
                for line in result_block(t.tally, t.run):
                    tr.write_line(prefix + scrub(line))
        for error in self.report_errors:
            tr.write_line(f"cachecheck: could not write {scrub(error)}", red=True)
        for path, what in ((self.state.settings.report, "JSON report"), (self.state.settings.html, "HTML page")):
            if path and not any(e.startswith(path + ":") for e in self.report_errors):
                tr.write_line(f"cachecheck: {what} written to {path}")
