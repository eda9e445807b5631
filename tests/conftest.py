"""Shared fixtures: the vLLM/SGLang emulation, real SGLang servers, and a clean environment for pytester
runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Generator, Iterator, List

import pytest
import requests  # noqa: F401 - imported before any in-process pytester run, see below

# pytester's in-process runs drop the modules a run imported; the plugin imports requests only when it
# is enabled, so without this a second run in one process would mix two copies of http.cookiejar

from pytest_cachecheck.llama_server import cache_dir
from tests.support.emulator import Emulator, EmulatorConfig
from tests.support.sglang_server import configured_server as configured_sglang
from tests.support.sglang_server import ensure_sglang
from tests.support.venv_server import ServerPool, ServerProcess, tiny_model_dir


def pytest_configure(config: pytest.Config) -> None:
    # pytester points HOME at a temporary folder; keep the llama-server build and the tiny models in
    # the real cache, resolved once here, for this process and every subprocess it starts
    os.environ.setdefault("CACHECHECK_CACHE_DIR", str(cache_dir()))


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


# -- real SGLang servers (tests/support/sglang_server.py) ----------------------------------------------------


def _log(message: str) -> None:
    sys.stderr.write(message + "\n")


def _obtain(what: str, make: Callable[[], Any]) -> Any:
    """``make()``, or skip (fail when CI is set: a CI run must not pass by skipping the real servers)."""
    try:
        return make()
    except Exception as exc:  # noqa: BLE001 - any failure to obtain it
        if os.environ.get("CI"):
            pytest.fail(f"{what} could not be obtained in CI: {exc}", pytrace=False)
        pytest.skip(f"{what} not available: {exc}")


@pytest.fixture(scope="session")
def sglang_python() -> Path:
    """A Python with SGLang 0.5.23 (``$CACHECHECK_SGLANG_PYTHON``, or the cached venv, installed on first
    use)."""
    python: Path = _obtain("SGLang", lambda: ensure_sglang(_log))
    return python


@pytest.fixture(scope="session")
def sglang_model(sglang_python: Path) -> Path:
    """The tiny random-weight Qwen2 model directory, written on first use with SGLang's Python."""
    model: Path = _obtain("the tiny Qwen2 model", lambda: tiny_model_dir(sglang_python, _log))
    return model


class SglangServers:
    """Real SGLang servers by configuration name (``tests.support.sglang_server.CONFIGS``), each started once
    per session; at most 2 alive at once (~3.5 GB each). A server that fails to start fails the test with its
    log."""

    def __init__(self, pool: ServerPool) -> None:
        self.pool = pool
        self.used: Dict[str, List[ServerProcess]] = {}  # test node id -> servers it asked for

    def __call__(self, *names: str) -> List[ServerProcess]:
        try:
            servers = self.pool.get(*names)
        except Exception as exc:  # noqa: BLE001
            pytest.fail(f"SGLang server {', '.join(names)} did not start: {exc}", pytrace=False)
        test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
        self.used.setdefault(test, []).extend(servers)
        return servers

    def url(self, name: str) -> str:
        return self(name)[0].url


@pytest.fixture(scope="session")
def sglang_servers(sglang_python: Path, sglang_model: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[SglangServers]:
    log_dir = tmp_path_factory.mktemp("sglang-logs")
    pool = ServerPool(lambda name: configured_sglang(name, sglang_python, sglang_model, log_dir), max_alive=2,
                      log=_log, timeout=900)
    servers = SglangServers(pool)
    yield servers
    pool.stop_all()
    if pool.startups:
        _log("SGLang start-up seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in pool.startups.items()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Generator[None, Any, None]:
    # a failing test that used real SGLang servers shows the end of their logs
    outcome = yield
    report = outcome.get_result()
    servers = getattr(item, "funcargs", {}).get("sglang_servers")
    if report.failed and isinstance(servers, SglangServers):
        for server in dict.fromkeys(servers.used.get(item.nodeid, [])):
            report.sections.append((f"SGLang log {server.log_path}", server.log_tail(40)))
