"""Shared fixtures: the vLLM/SGLang emulation, and a clean environment for pytester runs."""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator, List

import pytest
import requests  # noqa: F401 - imported before any in-process pytester run, see below

# pytester's in-process runs drop the modules a run imported; the plugin imports requests only when it
# is enabled, so without this a second run in one process would mix two copies of http.cookiejar

from pytest_cachecheck.llama_server import cache_dir
from tests.support.emulator import Emulator, EmulatorConfig


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
