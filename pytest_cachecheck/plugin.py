"""pytest glue: options, the session, probe items, fixtures, and the hooks that delegate to them.

Everything that measures or decides lives in plain modules (``session``, ``protocol``, ``run``,
``terminal``); the controller's ``reporter`` writes the summary and the files; ``_collect`` holds the
probe module and the xdist placement. State lives on ``config.stash``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Union

import pytest

from . import _collect, _items
from .errors import ConfigError, RequestError
from .episodes import Episode
from .interrupts import Interrupts
from .model import EpisodeRecord, Outcome, ProbeRecord, record_key
from .probes import Probe, parse_probe
from .redact import display_url
from .reporter import CHECK_RECORD, EPISODE_CHECK_RECORD, EPISODE_RECORD, RECORD, Reporter
from .session import CheckSession, open_session
from .settings import OPTIONS, Settings, ini_paths, lookup

if TYPE_CHECKING:  # the measurement (and requests) are imported only when the plugin is enabled
    from .protocol import Runner
    from .serve import Served


class _State:
    """The session and, under pytest-xdist, the placement of its tests."""

    def __init__(self, session: CheckSession, controller_of_workers: bool,
                 placement: Optional[_collect.Placement], interrupts: Interrupts) -> None:
        self.session = session
        self.interrupts = interrupts
        #: an xdist controller: its workers probe, so it sends no request that generates
        self.controller_of_workers = controller_of_workers
        self.placement = placement
        #: target -> why its server setup is not usable (None: it is), once pytest_sessionstart resolved it
        self.setup_errors: Dict[Optional[str], Optional[str]] = {}


STATE = pytest.StashKey[Optional[_State]]()


def _session(config: pytest.Config) -> Optional[CheckSession]:
    state = config.stash.get(STATE, None)
    return state.session if state is not None else None


# -- options and the session ------------------------------------------------------------------------
def server_args_mistake(argv: Sequence[str]) -> Optional[str]:
    """The usage error for ``--cachecheck-server-args "-c 8192"``: a separate value starting with '-' reads
    as an option of pytest's own (``-c`` its config file, ``-n`` xdist's), and argparse fails before any
    hook of the plugin runs, so the command line is read here, as the plugin registers its options."""
    for flag, value in zip(argv, argv[1:]):
        if flag == "--cachecheck-server-args" and value.startswith("-"):
            return (f"cachecheck: --cachecheck-server-args: the value {value!r} starts with '-', so pytest "
                    f"reads it as an option of its own; write it with '=': "
                    f"--cachecheck-server-args={shlex.quote(value)}")
    return None


def pytest_addoption(parser: pytest.Parser) -> None:
    try:
        argv = shlex.split(os.environ.get("PYTEST_ADDOPTS", "")) + sys.argv[1:]
    except ValueError:
        argv = sys.argv[1:]
    mistake = server_args_mistake(argv)
    if mistake:
        raise pytest.UsageError(mistake)
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
    workerinput: Dict[str, Any] = getattr(config, "workerinput", {})
    probes = _probes_from(workerinput.get("cachecheck_probes"))  # a worker's, from its controller
    different = _different_from(workerinput.get("cachecheck_baseline_different"))
    episodes = _episodes_from(workerinput.get("cachecheck_episodes"))
    # ini paths are relative to the ini file's folder, as pytest's own (else to the invocation folder)
    ini_base = config.inipath.parent if config.inipath is not None else Path(config.invocation_params.dir)
    try:
        raw = lookup(lambda n: config.getoption("cachecheck_" + n),
                     lambda n: ini_paths(n, _ini(config, "cachecheck_" + n), ini_base), os.environ)
        if not _is_worker(config) and (raw.get("url") or raw.get("target") or raw.get("serve")):
            _collect.check_dist(getattr(config.option, "dist", "no"))
        session = open_session(raw, Path(config.invocation_params.dir),
                               served_url=workerinput.get("cachecheck_served_url"),
                               probes=probes, baseline_different=different, episodes=episodes,
                               start_server=None if _is_worker(config) else _start_served,
                               own_replica=lambda s: _collect.own_replica(
                                   s, _collect.worker_id(config), getattr(config.option, "numprocesses", None)
                               ), other_outputs={"--junitxml": _junitxml(config)})
    except ConfigError as exc:
        raise pytest.UsageError(f"cachecheck: {exc}") from None
    if session is None:
        return
    controller = not _is_worker(config) and getattr(config.option, "dist", "no") not in (None, "no")
    placement = None
    if controller or _is_worker(config):
        settings = session.settings
        first = settings.targets[0][0] if settings.targets else None
        replicas = len(settings.replicas) > 1
        folder = workerinput.get("cachecheck_placement")
        placement = (_collect.Placement(folder, first, replicas) if folder
                     else _collect.new_placement(first, replicas) if controller else None)
    # SIGTERM ends the run as Ctrl-C does; the process that writes the report also guards it from a second
    interrupts = Interrupts(hold_after_first=not _is_worker(config))
    interrupts.install(sigint=not _is_worker(config))
    config.stash[STATE] = _State(session, controller, placement, interrupts)
    if not _is_worker(config):
        config.pluginmanager.register(Reporter(config, session, interrupts, controller), "cachecheck-reporter")


def _ini(config: pytest.Config, name: str) -> Any:
    """An ini value. pytest 9's native TOML table keeps TOML's types, and getini refuses a number, a bool or
    a list for an option declared as a string: those are read from the file as TOML typed them, and the
    plugin validates them as it validates strings."""
    try:
        return config.getini(name)
    except (TypeError, pytest.UsageError) as exc:  # pytest 9.0 raises the first, later ones the second
        table = _native_table(config.inipath)
        if not isinstance(table, dict) or name not in table:
            raise ConfigError(f"ini {name}: {exc}") from None
        return table[name]


def _native_table(path: Optional[Path]) -> Any:
    """``[tool.pytest]`` of a pyproject.toml, ``[pytest]`` of a pytest.toml; None when there is none."""
    if path is None or path.suffix != ".toml":
        return None
    try:
        try:
            import tomllib
        except ImportError:  # Python < 3.11, where pytest itself reads TOML with tomli
            import tomli as tomllib  # type: ignore[no-redef]
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (ImportError, OSError, ValueError):
        return None
    table = data.get("tool", {}).get("pytest") if path.name == "pyproject.toml" else data.get("pytest")
    return table if isinstance(table, dict) else None


def _probes_from(given: Optional[List[Any]]) -> Optional[List[Probe]]:
    """The probes a worker got from its controller (pytest_configure_node); None on the controller."""
    if given is None:
        return None
    return [Probe(pid, tuple(tuple(m) for m in messages), followup, source)
            for pid, messages, followup, source in given]


def _different_from(given: Optional[List[Any]]) -> Optional[Dict[str, Dict[str, str]]]:
    return None if given is None else {key: dict(different) for key, different in given}


def _episodes_from(given: Optional[List[Any]]) -> Optional[List[Episode]]:
    """The episodes a worker got from its controller; None on the controller."""
    if given is None:
        return None
    from .episodes import parse_episode

    out = []
    for source, obj in given:
        path, _, line = str(source).rpartition(":")
        out.append(parse_episode(obj, path=path, line=int(line) if line.isdigit() else 0, default_id=obj["id"]))
    return out


def _junitxml(config: pytest.Config) -> Optional[str]:
    """The --junitxml file as pytest's junitxml plugin resolves it (from the invocation folder)."""
    path = getattr(config.option, "xmlpath", None)
    if not path:
        return None
    return str(Path(config.invocation_params.dir) / os.path.expanduser(os.path.expandvars(path)))


def _start_served(model: str, server_args: Optional[str]) -> Served:
    def log(message: str) -> None:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()

    from .llama_server import LlamaServerError
    from .serve import start

    try:
        return start(model, server_args, log)
    except (LlamaServerError, OSError, subprocess.CalledProcessError) as exc:
        raise ConfigError(f"--cachecheck-serve could not start llama-server: {exc}") from None


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is None:
        return
    state.interrupts.restore()
    if state.session.served is not None:
        state.session.served.server.stop()
        state.session.served = None
    if state.placement is not None and not _is_worker(config):
        state.placement.close()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    state = node.config.stash.get(STATE, None)
    if state is not None:
        if state.placement is not None:
            node.workerinput["cachecheck_placement"] = state.placement.folder
        if state.session.served is not None:
            node.workerinput["cachecheck_served_url"] = state.session.served.server.url
        # the probes as the controller read them: a worker may not be able to read the files again (a pipe
        # such as <(cat f) is the controller's and drained, a FIFO would block), nor see the same content
        node.workerinput["cachecheck_probes"] = [[p.id, [list(m) for m in p.messages], p.followup, p.source]
                                                 for p in state.session.probes]
        cs = state.session
        node.workerinput["cachecheck_baseline_different"] = [
            [f"{kind}@{t}", cs.baseline_different(t, episodes=kind == "episode")]
            for t in cs.targets for kind in ("probe", "episode")]
        node.workerinput["cachecheck_episodes"] = [[e.source, e.to_json()] for e in cs.episodes]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    state = config.stash.get(STATE, None)
    if state is None or state.placement is None:
        return None
    return _collect.make_scheduler(config, log, state.placement)


# -- the server setup, before the header --------------------------------------------------------------
@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Resolve and check each server before the first test: on the controller of xdist workers without
    sending anything that generates (its workers check their own servers before their first probe), and
    not at all for --collect-only."""
    state = session.config.stash.get(STATE, None)
    if state is None or _is_worker(session.config) or session.config.option.collectonly:
        return
    reporter = session.config.pluginmanager.getplugin("cachecheck-reporter")
    reporter.stage = "while the server was being detected"  # the verdict of a run interrupted here
    try:
        state.setup_errors = state.session.prepare(send=not state.controller_of_workers)
    except ConfigError as exc:  # a model the server does not serve: before any probe request, and any worker
        raise pytest.UsageError(f"cachecheck: {state.session.redactor.scrub(str(exc))}") from None
    reporter.stage = None  # (an interrupt leaves it for the verdict)


def pytest_report_header(config: pytest.Config) -> Optional[List[str]]:
    from .terminal import header

    state = config.stash.get(STATE, None)
    return header(state.session, state.setup_errors) if state is not None else None


# -- items ------------------------------------------------------------------------------------------
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: List[pytest.Item]) -> None:
    state = config.stash.get(STATE, None)
    if state is None:
        return
    items.extend(_collect.collect_probe_items(session, episodes=bool(state.session.episodes)))
    worker = _collect.worker_id(config)
    if worker is not None and state.placement is not None:
        state.placement.write_fixture_users(worker, items)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.function is _items.probe:
        argname = "cachecheck_probe"
    elif metafunc.function is _items.episode:
        argname = "cachecheck_episode"
    else:
        return
    cs = _session(metafunc.config)
    cases: List[Any] = [] if cs is None else cs.probes if argname == "cachecheck_probe" else cs.episodes
    if cs is not None and cs.settings.targets:
        # the target matrix: every probe on every target, target by target; ids <probe id>@<target>
        pairs = [(p, name) for name in cs.targets for p in cases]
        metafunc.parametrize((argname, "cachecheck_target"), pairs, ids=[record_key(p.id, name) for p, name in pairs])
    else:
        metafunc.parametrize(argname, cases, ids=[p.id for p in cases])


# -- fixtures ---------------------------------------------------------------------------------------
def _measure(config: pytest.Config, state: _State, runner: Runner, case: Union[Probe, Episode],
             target: Optional[str]) -> Any:
    """Measure one probe (or episode); under pytest-xdist only once this worker owns its servers. The
    record names the server that measured it and the process."""
    worker = _collect.worker_id(config)
    kind = ProbeRecord if isinstance(case, Probe) else EpisodeRecord
    record: Any = None
    if worker is not None and state.placement is not None:
        for url in (runner.settings.url, runner.settings.nocache_url):
            owner = state.placement.claim(url, worker) if url else None
            if owner is not None and url is not None:
                record = kind(case.id, case.source, case.fingerprint, Outcome.ERROR, reason=(
                    f"not measured: xdist worker {owner} already sends to {display_url(url)} in this session, "
                    f"and requests sent to one server in parallel change answers; the plugin's placement of "
                    f"this test failed (another plugin's scheduler?)"))
                break
    if record is None:
        if isinstance(case, Probe):
            record = runner.run(case)
        else:
            from .trajectory import measure_episode

            record = measure_episode(runner, case)
    record.target = target
    record.server_url = display_url(runner.settings.url)
    record.worker = worker
    record.run = runner.setup.describe() if runner.setup is not None else None
    return record


@pytest.fixture
def cachecheck_target() -> Optional[str]:
    """The target-matrix target a probe item runs on (``--cachecheck-target NAME=URL``); None without a
    matrix. The plugin parametrizes it for its probe items."""
    return None


@pytest.fixture
def cachecheck_probe_result(request: pytest.FixtureRequest, cachecheck_probe: Probe,
                            cachecheck_target: Optional[str]) -> ProbeRecord:
    """Measure the item's probe (six requests); a failed request errors the item here, in setup."""
    state = request.config.stash[STATE]
    assert state is not None
    record = _measure(request.config, state, state.session.runner(cachecheck_target), cachecheck_probe,
                      cachecheck_target)
    request.node.user_properties.append((RECORD, record.to_json()))
    if record.outcome == Outcome.ERROR:
        pytest.fail(f"cachecheck: {record.reason}", pytrace=False)
    return record


@pytest.fixture
def cachecheck_episode_result(request: pytest.FixtureRequest, cachecheck_episode: Episode,
                              cachecheck_target: Optional[str]) -> EpisodeRecord:
    """Measure the item's episode (each path twice); a failed request errors the item here, in setup."""
    state = request.config.stash[STATE]
    assert state is not None
    record = _measure(request.config, state, state.session.runner(cachecheck_target), cachecheck_episode,
                      cachecheck_target)
    request.node.user_properties.append((EPISODE_RECORD, record.to_json()))
    if record.outcome == Outcome.ERROR:
        pytest.fail(f"cachecheck: {record.reason}", pytrace=False)
    return record


@pytest.fixture
def cachecheck_expected_divergence(request: pytest.FixtureRequest, cachecheck_target: Optional[str]
                                   ) -> Callable[[Any], Optional[str]]:
    """Why a divergence (or changed trajectory) is expected (reported as xfail), or None when it is a plain
    failure."""
    state = request.config.stash[STATE]
    assert state is not None
    before = state.session.baseline_different(cachecheck_target)
    before_episodes = state.session.baseline_different(cachecheck_target, episodes=True)
    gated = state.session.settings.gated

    def expected(record: Any) -> Optional[str]:
        if state.session.settings.record:
            return "diverged; recorded as the baseline (--cachecheck-record)"
        known = before_episodes if isinstance(record, EpisodeRecord) else before
        if known.get(record.id) == record.fingerprint:
            return "also differed in the baseline"
        if gated:
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
        return self._state.session.settings

    @property
    def targets(self) -> List[str]:
        """The names of the target matrix (empty without one)."""
        return [n for n, _ in self.settings.targets]

    def check(self, turn1: Optional[str] = None, turn2: Optional[str] = None, *,
              messages: Optional[List[Dict[str, str]]] = None, followup: Optional[str] = None,
              id: Optional[str] = None, target: Optional[str] = None) -> ProbeRecord:
        """Measure one conversation; returns its record (.same, .different, .valid, .reason, answers).

        ``target`` names the server of a target matrix to measure on (default: the first).
        Raises ValueError for a malformed conversation or an unknown target, and RequestError when a
        request fails.
        """
        __tracebackhide__ = True  # its locals (the runner, the state) lead to the settings and URLs
        names = self._state.session.targets
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
        record = _measure(self._node.config, self._state, self._state.session.runner(target), probe, target)
        record.test = self._node.nodeid
        self._node.user_properties.append((CHECK_RECORD, record.to_json()))
        if record.outcome == Outcome.ERROR:
            raise RequestError(record.reason)
        return record

    def episode(self, messages: List[Dict[str, str]], user_turns: Optional[List[str]] = None, *,
                tools: Optional[List[Dict[str, Any]]] = None, tool_results: Optional[Dict[str, Any]] = None,
                tool_choice: Any = None, max_steps: Optional[int] = None, id: Optional[str] = None,
                target: Optional[str] = None) -> EpisodeRecord:
        """Measure one episode (the fields of an episode file); returns its record (.same, .changed,
        .valid, .reason, .parting, .paths). Raises ValueError for a malformed episode or an unknown
        target, and RequestError when a request fails."""
        __tracebackhide__ = True
        from .episodes import parse_episode

        target = self._target(target)
        obj: Dict[str, Any] = {"messages": messages, "user_turns": user_turns or []}
        obj.update({k: v for k, v in (("tools", tools), ("tool_results", tool_results), ("tool_choice", tool_choice),
                                      ("max_steps", max_steps), ("id", id)) if v is not None})
        case = parse_episode(obj, path=f"cachecheck.episode() in {self._node.nodeid}", line=1,
                             default_id=self._node.name)
        record = _measure(self._node.config, self._state, self._state.session.runner(target), case, target)
        record.test = self._node.nodeid
        self._node.user_properties.append((EPISODE_CHECK_RECORD, record.to_json()))
        if record.outcome == Outcome.ERROR:
            raise RequestError(record.reason)
        return record

    def _target(self, target: Optional[str]) -> Optional[str]:
        names = self._state.session.targets
        if target is None:
            return names[0]
        if target not in names:
            raise ValueError(f"cachecheck: target {target!r} is not one of the targets: "
                             + (", ".join(str(n) for n in names) if names != [None] else
                                "none (no --cachecheck-target was given)"))
        return target


@pytest.fixture
def cachecheck(request: pytest.FixtureRequest) -> CacheCheck:
    """Run your own prompt-cache checks: ``cachecheck.check(turn1=..., turn2=...)``."""
    state = request.config.stash.get(STATE, None)
    if state is None:
        pytest.skip("cachecheck: no server given (--cachecheck-url, ini cachecheck_url or CACHECHECK_URL)")
    return CacheCheck(state, request.node)


# -- pytest-json-report ---------------------------------------------------------------------------------
@pytest.hookimpl(optionalhook=True)
def pytest_json_runtest_metadata(item: pytest.Item, call: pytest.CallInfo) -> Optional[Dict[str, Any]]:
    if call.when != "call" and call.when != "setup":
        return None
    for name, value in getattr(item, "user_properties", []):
        if name in (RECORD, EPISODE_RECORD):
            meta = {"id": value["id"], "outcome": value["outcome"], "reason": value["reason"]}
            if name == EPISODE_RECORD:
                meta["kind"] = "episode"
            if value.get("target") is not None:
                meta["target"] = value["target"]
            return {"cachecheck": meta}
    return None
