"""pytest glue: options, the session, probe items, fixtures, and the hooks that delegate to them.

Everything that measures or decides lives in plain modules (``session``, ``protocol``, ``run``,
``terminal``); the controller's ``reporter`` writes the summary and the files; ``_collect`` holds the
probe module and the xdist placement. State lives on ``config.stash``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import pytest

from . import _collect, _items, hookspecs
from ._api import ITEM_RECORDS, STATE, CacheCheck, State, measure_item
from ._collect import Role
from .episodes import Episode
from .errors import ConfigError
from .kinds import BATCH, KINDS, LOADED, ORDER
from .model import BatchRecord, EpisodeRecord, LoadedRecord, OrderRecord, ProbeRecord, record_key
from .probes import Probe
from .reporter import Reporter
from .session import CheckSession, Host, open_session
from .settings import OPTIONS, ini_paths, lookup, native_toml_table, server_args_mistake, space_form_paths
from .text import printable

if TYPE_CHECKING:  # the measurement (and requests) are imported only when the plugin is enabled
    from .serve import Served


def _session(config: pytest.Config) -> Optional[CheckSession]:
    state = config.stash.get(STATE, None)
    return state.session if state is not None else None


# -- options and the session ------------------------------------------------------------------------
def _argv() -> List[str]:
    """The command line as pytest reads it: PYTEST_ADDOPTS, then the arguments."""
    try:
        return shlex.split(os.environ.get("PYTEST_ADDOPTS", "")) + sys.argv[1:]
    except ValueError:
        return sys.argv[1:]


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    mistake = server_args_mistake(_argv())
    if mistake:
        raise pytest.UsageError(mistake)
    group = parser.getgroup("cachecheck", "prompt-cache divergence (pytest-cachecheck)")
    for spec in OPTIONS:  # every option as settings.OPTIONS declares it
        text = spec.help + (f" [env {spec.env}]" if spec.env else "") + f" [ini {spec.ini}]"
        shown: Dict[str, Any] = {"help": text if spec.public else argparse.SUPPRESS}
        if spec.kind != "bool":
            shown["metavar"] = spec.metavar
        action = {"bool": "store_true", "list": "append"}.get(spec.kind, "store")
        default = False if spec.kind == "bool" else None
        group.addoption(spec.flag, dest=spec.ini, action=action, default=default, **shown)
        many = spec.kind == "list"  # the plugin validates each ini value, a bool's too
        parser.addini(spec.ini, spec.help + (" (true or false)" if spec.kind == "bool" else ""),
                      type="linelist" if many else None, default=[] if many else "")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cachecheck: a prompt-cache divergence probe (pytest-cachecheck)")
    config.stash[STATE] = None
    role = Role.of(config)
    host = _host(config, role)
    try:
        session = open_session(_raw_options(config, role), Path(config.invocation_params.dir), host)
    except ConfigError as exc:
        raise pytest.UsageError(f"cachecheck: {exc}") from None
    if session is None:
        return
    state = config.stash[STATE] = State(session, role, _collect.placement_for(role, session.settings, host.handoff))
    state.interrupts.install(sigint=role is not Role.WORKER)  # SIGTERM ends the run as Ctrl-C does
    config.add_cleanup(state.interrupts.restore)  # after every pytest_unconfigure, pytest's own included
    if role is not Role.WORKER:
        config.pluginmanager.register(Reporter(config, state), "cachecheck-reporter")


def _host(config: pytest.Config, role: Role) -> Host:
    """What pytest gives the session: a worker's handoff, how the controller starts a served server, this
    process's replica, the files other plugins write, the server kinds hook."""
    return Host(handoff=_collect.Handoff.from_config(config),
                start_server=_start_served if role is not Role.WORKER else None,
                own_replica=lambda s: _collect.own_replica(s, _collect.worker_id(config),
                                                           getattr(config.option, "numprocesses", None)),
                other_outputs={"--junitxml": _junitxml(config), "--json-report-file": _json_report_file(config)},
                server_kinds=lambda: config.hook.pytest_cachecheck_server_kinds(config=config))


def _raw_options(config: pytest.Config, role: Role) -> Dict[str, Any]:
    """The raw option values: command line over ini over environment; ini paths are relative to the ini
    file's folder, as pytest's own (else to the invocation folder)."""
    ini_base = config.inipath.parent if config.inipath is not None else Path(config.invocation_params.dir)
    raw = lookup(lambda n: config.getoption("cachecheck_" + n),
                 lambda n: ini_paths(n, _ini(config, "cachecheck_" + n), ini_base), os.environ)
    if role is not Role.WORKER and (raw.get("url") or raw.get("target") or raw.get("serve")):
        _collect.check_dist(getattr(config.option, "dist", "no"))
    return raw


def _ini(config: pytest.Config, name: str) -> Any:
    """An ini value. pytest 9's native TOML table keeps TOML's types, and getini refuses a number, a bool or
    a list for an option declared as a string: those are read from the file as TOML typed them, and the
    plugin validates them as it validates strings."""
    try:
        return config.getini(name)
    except (TypeError, pytest.UsageError) as exc:  # pytest 9.0 raises the first, later ones the second
        table = native_toml_table(config.inipath)
        if not isinstance(table, dict) or name not in table:
            raise ConfigError(f"ini {name}: {exc}") from None
        return table[name]


def _junitxml(config: pytest.Config) -> Optional[str]:
    """The --junitxml file as pytest's junitxml plugin resolves it (from the invocation folder)."""
    path = getattr(config.option, "xmlpath", None)
    if not path:
        return None
    return str(Path(config.invocation_params.dir) / os.path.expanduser(os.path.expandvars(path)))


def _json_report_file(config: pytest.Config) -> Optional[str]:
    """The file pytest-json-report writes (with --json-report), as it resolves it (from the invocation folder)."""
    path = getattr(config.option, "json_report_file", None)
    if not getattr(config.option, "json_report", False) or not path or path == "none":
        return None
    return str(Path(config.invocation_params.dir) / path)


def _start_served(model: str, server_args: Optional[str], tools: bool, cache_ram: int = 0) -> Served:
    def log(message: str) -> None:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()

    from .llama_server import LlamaServerError
    from .serve import start

    try:
        return start(model, server_args, log, tools=tools, cache_ram=cache_ram)
    except (LlamaServerError, OSError, subprocess.CalledProcessError) as exc:
        raise ConfigError(f"--cachecheck-serve could not start llama-server: {exc}") from None


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is None:
        return
    if state.session.served is not None:
        state.session.served.server.stop()
        state.session.served = None
    if state.placement is not None and state.role is not Role.WORKER:
        state.placement.close()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    state = node.config.stash.get(STATE, None)
    if state is not None:
        node.workerinput[_collect.Handoff.KEY] = _collect.Handoff.of(state.session, state.placement).to_json()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    state = config.stash.get(STATE, None)
    if state is None or state.placement is None:
        return None
    return _collect.make_scheduler(config, log, state.placement)


# -- the server setup, before the header --------------------------------------------------------------
@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Resolve each server before the header, sending nothing that generates; not at all for
    --collect-only. The checks that generate wait for the selection (``pytest_collection_finish``)."""
    state = session.config.stash.get(STATE, None)
    if state is None or state.role is Role.WORKER or session.config.option.collectonly:
        return
    reporter = session.config.pluginmanager.getplugin("cachecheck-reporter")
    reporter.stage = "while the server was being detected"  # the verdict of a run interrupted here
    try:
        state.setup_errors = state.session.prepare(send=False)
    except ConfigError as exc:  # a model the server does not serve: before any probe request, and any worker
        raise pytest.UsageError(f"cachecheck: {state.session.redactor.scrub(str(exc))}") from None
    reporter.stage = None  # (an interrupt leaves it for the verdict)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """The setup checks that generate, once the selection is known and only when a selected item will send
    (a probe, an episode or a test using the fixture): a run that deselected them sends nothing that
    generates. Under xdist each worker checks its own servers before its first probe."""
    state = session.config.stash.get(STATE, None)
    if (state is None or state.role is not Role.ALONE
            or session.config.option.collectonly
            or not any(_collect.sends(item) for item in session.items)):
        return
    reporter = session.config.pluginmanager.getplugin("cachecheck-reporter")
    reporter.stage = "while the server setup was being checked"
    shown = {name: list(r.setup.warnings) if r.setup is not None else []  # in the header already
             for name, r in state.session.runners.items()}
    errors = state.session.prepare(send=True)
    reporter.stage = None
    terminal = session.config.pluginmanager.getplugin("terminalreporter")
    if terminal is None:
        return
    from .terminal import setup_check_lines

    for name, runner in state.session.runners.items():
        if state.setup_errors.get(name):
            continue  # the header said why already
        label = "cachecheck: " + (f"target {name}: " if name is not None else "")
        for line in setup_check_lines(label, runner.setup, errors.get(name), skip=shown.get(name, [])):
            terminal.write_line(printable(state.session.redactor.scrub(line), 4000))


def pytest_report_header(config: pytest.Config) -> Optional[List[str]]:
    from .terminal import header

    state = config.stash.get(STATE, None)
    if state is None:
        return None
    notes = space_form_paths(_argv(), str(config.rootpath), str(config.inipath) if config.inipath else None)
    return notes + header(state.session, state.setup_errors)


# -- items ------------------------------------------------------------------------------------------
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: List[pytest.Item]) -> None:
    state = config.stash.get(STATE, None)
    if state is None:
        return
    items.extend(_collect.collect_probe_items(session, [k.name for k in KINDS if state.session.runs(k)]))
    worker = _collect.worker_id(config)
    if worker is not None and state.placement is not None:
        state.placement.write_fixture_users(worker, items)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.function is _items.probe:
        argname = "cachecheck_probe"
    elif metafunc.function is _items.episode:
        argname = "cachecheck_episode"
    elif metafunc.function is _items.batch:
        argname = "cachecheck_batch"  # a batch item's case is a probe
    elif metafunc.function is _items.loaded:
        argname = "cachecheck_loaded"  # so is a loaded item's
    elif metafunc.function is _items.order:
        argname = "cachecheck_order"  # so is an order item's
    else:
        return
    cs = _session(metafunc.config)
    cases: List[Any] = [] if cs is None else cs.episodes if argname == "cachecheck_episode" else cs.probes
    if cs is not None and cs.settings.targets:
        # the target matrix: every probe on every target, target by target; ids <probe id>@<target>
        pairs = [(p, name) for name in cs.targets for p in cases]
        metafunc.parametrize((argname, "cachecheck_target"), pairs, ids=[record_key(p.id, name) for p, name in pairs])
    else:
        metafunc.parametrize(argname, cases, ids=[p.id for p in cases])


# -- fixtures ---------------------------------------------------------------------------------------
@pytest.fixture
def cachecheck_target() -> Optional[str]:
    """The target-matrix target a probe item runs on (``--cachecheck-target NAME=URL``); None without a
    matrix. The plugin parametrizes it for its probe items."""
    return None


@pytest.fixture
def cachecheck_probe_result(request: pytest.FixtureRequest, cachecheck_probe: Probe,
                            cachecheck_target: Optional[str]) -> ProbeRecord:
    """Measure the item's probe (six requests); a failed request errors the item here, in setup."""
    return measure_item(request, cachecheck_probe, cachecheck_target)


@pytest.fixture
def cachecheck_episode_result(request: pytest.FixtureRequest, cachecheck_episode: Episode,
                              cachecheck_target: Optional[str]) -> EpisodeRecord:
    """Measure the item's episode (each path twice); a failed request errors the item here, in setup."""
    return measure_item(request, cachecheck_episode, cachecheck_target)


@pytest.fixture
def cachecheck_batch_result(request: pytest.FixtureRequest, cachecheck_batch: Probe,
                            cachecheck_target: Optional[str]) -> BatchRecord:
    """Measure the item's probe alone and amid background requests (five measured requests, each load run's
    background beside); a failed request errors the item here, in setup."""
    return measure_item(request, cachecheck_batch, cachecheck_target, BATCH)


@pytest.fixture
def cachecheck_order_result(request: pytest.FixtureRequest, cachecheck_order: Probe,
                            cachecheck_target: Optional[str]) -> OrderRecord:
    """The item's probe as the order kind measured it: the first order item of a server sends the whole
    selected set (pass A in order, pass B reversed with other conversations between); a failed request errors
    the item here, in setup."""
    return measure_item(request, cachecheck_order, cachecheck_target, ORDER)


@pytest.fixture
def cachecheck_loaded_result(request: pytest.FixtureRequest, cachecheck_loaded: Probe,
                             cachecheck_target: Optional[str]) -> LoadedRecord:
    """Measure the item's probe on both paths with every turn-2 request amid background requests (six measured
    requests, four load runs); a failed request errors the item here, in setup."""
    return measure_item(request, cachecheck_loaded, cachecheck_target, LOADED)


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
    """The item's record (as in the plugin's JSON report, scrubbed where it was made) as ``metadata.cachecheck``
    of pytest-json-report's test entry, with ``kind``: ``probe``, ``episode``, ``batch``, ``loaded`` or ``order``."""
    if call.when != "call" and call.when != "setup":
        return None
    kinds = {key: name for name, (key, _) in ITEM_RECORDS.items()}
    for name, value in getattr(item, "user_properties", []):
        if name in kinds:
            return {"cachecheck": {"kind": kinds[name], **value}}
    return None
