"""End to end against real llama-servers with tiny generated models (no mocks, no emulation).

The llama-server binary is found or built once (cached under ~/.cache/pytest-cachecheck); with ``CI`` set,
failing to obtain it fails these tests instead of skipping them. What the server does (same or
different) is recorded and reported, never assumed.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest

import pytest_cachecheck.tinymodel  # noqa: F401  numpy must be imported before pytester snapshots sys.modules
from pytest_cachecheck.llama_server import LlamaServer
from pytest_cachecheck.serve import demo_model, ensure_llama_server

pytestmark = pytest.mark.e2e


def _log(message: str) -> None:
    sys.stderr.write(message + "\n")


@pytest.fixture(scope="session")
def llama_binary() -> str:
    try:
        return str(ensure_llama_server(_log))
    except Exception as exc:  # noqa: BLE001 - any failure to obtain the binary
        if os.environ.get("CI"):
            pytest.fail(f"llama-server could not be obtained in CI: {exc}", pytrace=False)
        pytest.skip(f"llama-server not available: {exc}")


@pytest.fixture(scope="session")
def llama_servers(llama_binary: str) -> Iterator[Callable[..., LlamaServer]]:
    """Start (once per session and configuration) a llama-server on a tiny model."""
    started: Dict[Tuple[str, Tuple[str, ...], int], LlamaServer] = {}

    def get(ftype: str = "f32", *args: str, copy: int = 0) -> LlamaServer:
        key = (ftype, args, copy)
        if key not in started:
            model = demo_model(_log, ftype)
            server = LlamaServer(llama_binary, model, extra_args=args)
            try:
                server.start(timeout=180)
            except Exception:
                _log(server.log_tail(80))
                server.stop()
                raise
            started[key] = server
        assert started[key].is_alive(), started[key].log_tail(80)
        return started[key]

    yield get
    for server in started.values():
        server.stop()


def run_plugin(pytester: pytest.Pytester, *args: str) -> Tuple[Any, Dict[str, Any]]:
    report = pytester.path / "report.json"
    result = pytester.runpytest(*args, f"--cachecheck-report={report}", "-p", "no:cacheprovider", "-rfs")
    return result, json.loads(report.read_text())


def outcome_counts(data: Dict[str, Any]) -> Dict[str, int]:
    counts: Dict[str, int] = {}
    for p in data["probes"]:
        counts[p["outcome"]] = counts.get(p["outcome"], 0) + 1
    return counts


def assert_hits_cover_turn1(probe: Dict[str, Any], exact: bool) -> None:
    for hit in probe["checks"]["cache_hits"]:
        assert hit["cached_tokens"] > hit["turn1_prompt_tokens"], probe["id"]
        if exact:  # llama-server reuses token by token: prompt + answer - 1, nothing less
            assert hit["cached_tokens"] == hit["full_reuse"], (probe["id"], hit)
    for req in probe["requests"]:
        if req["step"].startswith("recompute") or req["step"].endswith("turn-1"):
            assert req["cached_tokens"] == 0, (probe["id"], req)


def report_figures(label: str, data: Dict[str, Any]) -> None:
    s = data["summary"]
    print(f"\nMEASURED {label}: {s['different']} of {s['valid']} valid probes differed "
          f"({s['inconclusive']} inconclusive, {s['errors']} errors), server {data['server']['build']}")


@pytest.mark.parametrize("ftype", ["f32", "q4_0"])
def test_llama_cpp_mode_builtin_probes(pytester, llama_servers, ftype):
    server = llama_servers(ftype)
    result, data = run_plugin(pytester, f"--cachecheck-url={server.url}")
    report_figures(f"llama.cpp mode, tiny {ftype}", data)
    counts = outcome_counts(data)
    assert counts.get("error", 0) == 0 and counts.get("inconclusive", 0) == 0, result.stdout.str()[-3000:]
    assert len(data["probes"]) == 20
    result.assert_outcomes(passed=counts.get("same", 0), failed=counts.get("different", 0))
    assert result.ret == (1 if counts.get("different") else 0)
    assert data["mode"] == "llama.cpp" and data["server"]["kind"] == "llama.cpp"
    assert data["server"]["build"] and data["server"]["details"]["total_slots"] == 1
    for probe in data["probes"]:
        assert_hits_cover_turn1(probe, exact=True)
        assert len(probe["requests"]) == 6
        if probe["outcome"] == "different":
            assert probe["divergence"]["token"] is not None  # llama-server can say which token
    result.stdout.fnmatch_lines([f"{counts.get('different', 0)} of 20 valid probes gave a different turn-2 "
                                 f"answer on the cache path."])


def test_two_servers_mode(pytester, llama_servers):
    cache = llama_servers("f32")
    nocache = llama_servers("f32", "--no-cache-prompt")
    result, data = run_plugin(pytester, f"--cachecheck-url={cache.url}", f"--cachecheck-nocache-url={nocache.url}",
                              "--cachecheck-n=8")
    report_figures("two-servers mode, tiny f32", data)
    counts = outcome_counts(data)
    assert counts.get("error", 0) == 0 and counts.get("inconclusive", 0) == 0, result.stdout.str()[-3000:]
    assert data["mode"] == "two-servers" and data["nocache_server"]["kind"] == "llama.cpp"
    for probe in data["probes"]:
        assert_hits_cover_turn1(probe, exact=True)
        assert [r["server"] for r in probe["requests"]][-2:] == ["nocache", "nocache"]


def test_both_caches_off_control(pytester, llama_servers):
    first = llama_servers("f32", "--no-cache-prompt")
    second = llama_servers("f32", "--no-cache-prompt", copy=1)
    result, data = run_plugin(pytester, f"--cachecheck-url={first.url}", f"--cachecheck-nocache-url={second.url}",
                              "--cachecheck-skip-hit-check", "--cachecheck-n=8")
    report_figures("both caches off (control), tiny f32", data)
    assert outcome_counts(data) == {"same": 8}, result.stdout.str()[-3000:]
    for probe in data["probes"]:
        assert all(r["cached_tokens"] == 0 for r in probe["requests"])  # really no cache anywhere
    result.assert_outcomes(passed=8)
    assert result.ret == 0


def test_two_urls_reaching_one_server(pytester, llama_servers):
    server = llama_servers("f32")
    other = server.url.replace("127.0.0.1", "localhost")
    result, data = run_plugin(pytester, f"--cachecheck-url={server.url}", f"--cachecheck-nocache-url={other}",
                              "--cachecheck-n=3")
    assert outcome_counts(data) == {"inconclusive": 3}
    assert "both URLs reach the same server" in data["summary"]["recompute_reuse_cause"]
    result.stdout.fnmatch_lines(["cause: *likely both URLs reach the same server*"])
    assert result.ret != 0


def test_serve_demo(pytester, llama_binary):
    result, data = run_plugin(pytester, "--cachecheck-serve=demo", "--cachecheck-n=2")
    result.stdout.fnmatch_lines(["cachecheck: serving the demo model: tiny, RANDOM weights*",
                                 "cachecheck: mode llama.cpp (auto-detected)*"])
    assert data["served"]["demo"] is True and data["served"]["log_tail"]
    assert sum(outcome_counts(data).get(k, 0) for k in ("same", "different")) == 2
    assert result.ret in (0, 1)
