"""The public API: the names ``pytest_cachecheck`` exports (imported on first use, so that importing the
package loads nothing else), the one written version, and the ``pytest_cachecheck_server_kinds`` hook
through real plugin runs against the vLLM emulation."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pytest_cachecheck

REPO = Path(__file__).resolve().parents[1]
needs_xdist = pytest.mark.skipif(importlib.util.find_spec("xdist") is None,
                                 reason="pytest-xdist is not installed")


def test_every_public_name_imports_from_its_module():
    assert {"CacheCheck", "ProbeRecord", "EpisodeRecord", "Outcome", "Status", "RequestError", "__version__",
            "ChatClient", "ServerInfo", "CachePlan", "VllmClient"} <= set(pytest_cachecheck.__all__)
    namespace: dict = {}
    exec("from pytest_cachecheck import *", namespace)  # noqa: S102 - the star import users may write
    for name in pytest_cachecheck.__all__:
        assert namespace[name] is getattr(pytest_cachecheck, name), name
        if name != "__version__":
            module = importlib.import_module(pytest_cachecheck._LAZY[name], "pytest_cachecheck")
            assert getattr(module, name) is namespace[name] and namespace[name].__name__ == name
    with pytest.raises(AttributeError, match="no attribute 'NotAName'"):
        pytest_cachecheck.NotAName  # noqa: B018
    assert set(pytest_cachecheck.__all__) <= set(dir(pytest_cachecheck))


def test_type_checkers_see_the_same_names():
    """``__all__`` and the ``TYPE_CHECKING`` imports (what type checkers, linters and editors read) name the
    lazy names, each from its module."""
    assert pytest_cachecheck.__all__ == ["__version__", *pytest_cachecheck._LAZY]
    tree = ast.parse((REPO / "pytest_cachecheck" / "__init__.py").read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.dump(n.test))
    seen = {a.asname: "." * n.level + (n.module or "") for n in block.body if isinstance(n, ast.ImportFrom)
            for a in n.names if a.asname == a.name}
    assert seen == pytest_cachecheck._LAZY


def test_importing_the_package_loads_nothing_else():
    code = ("import sys, pytest_cachecheck as p; print(p.__file__); "
            "print(sorted(m for m in sys.modules if m.startswith('pytest_cachecheck.') "
            "or m.split('.')[0] in ('requests', 'pytest', '_pytest')))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    where, loaded = proc.stdout.splitlines()
    assert Path(where).parent == REPO / "pytest_cachecheck"
    assert loaded == "[]", loaded  # neither requests nor pytest nor any module of the package
    code = "import pytest_cachecheck, sys; assert 'requests' not in sys.modules"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_version_is_written_once():
    """pyproject.toml reads the version from the package, as setuptools expands it when it builds."""
    pyprojecttoml = pytest.importorskip("setuptools.config.pyprojecttoml")
    import setuptools
    # a setuptools older than the build's (77, PEP 639's license expression) cannot validate the license; the
    # version still has to expand (tests/support/release.py checks the built wheel's version as well)
    old = int(setuptools.__version__.split(".")[0]) < 77
    config = pyprojecttoml.read_configuration(REPO / "pyproject.toml", expand=True, ignore_option_errors=old)
    assert "version" in config["project"]["dynamic"]
    assert config["project"]["version"] == pytest_cachecheck.__version__


# -- the server kinds hook ------------------------------------------------------------------------------
ACME = textwrap.dedent("""
    from pytest_cachecheck import ChatClient, VllmClient

    class AcmeClient(VllmClient):
        '''A vLLM fork that says "+acme" in its /version, and names its requests.'''

        kind = "acme"

        @classmethod
        def detect(cls, http):
            info = super().detect(http)
            return info if info is not None and info.build.endswith("+acme") else None

        def body(self, messages, max_tokens):
            return {**super().body(messages, max_tokens), "user": "acme-client"}

    class Unused(ChatClient):
        kind = "unused"  # detect() of the base recognises nothing

    def pytest_cachecheck_server_kinds(config):
        return [Unused]

    class Late:
        '''A plugin registered after the cachecheck plugin's pytest_configure: its kinds count too.'''

        def pytest_cachecheck_server_kinds(self):
            return [AcmeClient]

    def pytest_configure(config):
        config.pluginmanager.register(Late(), "acme-late")
""")


def _sent(emu):
    return [r for r in emu.requests_log if "messages" in r]


@pytest.mark.parametrize("xdist", [[], pytest.param(["-n", "2"], marks=needs_xdist)], ids=["plain", "xdist"])
def test_a_plugin_server_kind_is_detected_and_used(pytester, emulator, xdist):
    emu = emulator(version="0.34.0+acme")
    pytester.makeconftest(ACME)
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", "--cachecheck-n=3", *xdist,
                                           "--cachecheck-report=report.json", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)  # and the gate
    result.stdout.fnmatch_lines(["cachecheck: mode one-server (auto-detected) | server acme 0.34.0+acme | "
                                 "model emu/tiny-chat"])
    sent = _sent(emu)
    assert len(sent) == 1 + 18  # the setup check of cached-token reporting, and six requests a probe
    assert all(r.get("user") == "acme-client" for r in sent)
    probes = json.loads((pytester.path / "report.json").read_text())["probes"]
    assert [p["run"]["server"]["kind"] for p in probes] == ["acme"] * 3
    assert all(p["outcome"] == "same" for p in probes)


def test_a_plugin_kind_that_does_not_recognise_the_server_leaves_it_to_the_built_in_ones(pytester, emulator):
    emu = emulator()  # a plain vLLM: AcmeClient.detect returns None
    pytester.makeconftest(ACME)
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", "--cachecheck-n=1",
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["cachecheck: mode one-server (auto-detected) | server vllm 0.34.0 | *"])
    assert _sent(emu) and not any("user" in r for r in _sent(emu))


def test_a_server_kind_that_is_not_a_client_class_is_a_usage_error(pytester, emulator):
    emu = emulator()
    pytester.makeconftest("def pytest_cachecheck_server_kinds():\n    return ['VllmClient']\n")
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*cachecheck: pytest_cachecheck_server_kinds returned 'VllmClient' (str); "
                                 "it must return a list of ChatClient subclasses "
                                 "(pytest_cachecheck.ChatClient)"])
    assert emu.every_request == []  # before any request
