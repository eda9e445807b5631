"""Shared fixtures: the vLLM/SGLang emulation, and a clean environment for pytester runs."""

from __future__ import annotations

from typing import Any, Callable, Iterator, List

import pytest

from tests.support.emulator import Emulator, EmulatorConfig


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
