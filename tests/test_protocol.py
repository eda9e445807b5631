"""Validity rules and verdicts of the six-request protocol, with a scripted client (no HTTP)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import pytest

from pytest_cachecheck.clients import CLIENTS
from pytest_cachecheck.clients.base import ChatClient, Reply, ServerInfo
from pytest_cachecheck.clients.http import Http
from pytest_cachecheck.errors import RequestError
from pytest_cachecheck.probes import parse_probe
from pytest_cachecheck.protocol import Runner, excerpt, first_difference
from pytest_cachecheck.servers import ServerSetup
from pytest_cachecheck.settings import Settings

PROBE = parse_probe({"id": "p1", "turn1": "Tell me about tea.", "turn2": "Shorter."}, path="t.jsonl",
                    line=1, default_id="x")


class _Scripted(ChatClient):
    """Answers from a list of (content, prompt_tokens, completion_tokens, cached_tokens) in order."""

    def __init__(self, kind: str, script: List[Any], pieces: bool = False) -> None:
        super().__init__(Http("http://127.0.0.1:9"), ServerInfo(kind=kind, model="m"))
        self.script = list(script)
        self.calls: List[Dict[str, Any]] = []
        self.pieces = pieces

    def chat(self, messages: List[Dict[str, str]], *, max_tokens: int, cache: Dict[str, Any],
             logprobs: bool = False) -> Reply:
        self.calls.append({"messages": messages, "cache": dict(cache), "logprobs": logprobs})
        item = self.script.pop(0)
        if isinstance(item, Exception):
            raise item
        content, prompt, completion, cached = item[:4]
        # like a real server, logprobs come back only when asked for
        given = item[4] if len(item) > 4 and logprobs else None
        return Reply(content, "stop", prompt, completion, cached, given)

    def token_pieces(self, text: str) -> Optional[List[str]]:
        return text.split(" ") if self.pieces else None


def Scripted(kind: str, script: List[Any], pieces: bool = False) -> _Scripted:
    """A scripted client of the given server kind (its cache controls are that kind's own)."""
    cls = type(f"Scripted{CLIENTS[kind].__name__}", (_Scripted, CLIENTS[kind]), {})
    return cls(kind, script, pieces)


STEPS = ["cache-1/turn-1", "cache-1/turn-2", "recompute-1/turn-2",
         "cache-2/turn-1", "cache-2/turn-2", "recompute-2/turn-2"]  # the order they are sent in


def good_script(t2_cache: str = "short tea", t2_re: str = "short tea", hit: int = 59) -> List[Any]:
    # turn-1: prompt 20, answer 40 -> full reuse 59; in the order of STEPS
    return [("tea is nice", 20, 40, 0), (t2_cache, 70, 5, hit), (t2_re, 70, 5, 0),
            ("tea is nice", 20, 40, 0), (t2_cache, 70, 5, hit), (t2_re, 70, 5, 0)]


def split(script: List[Any]) -> Dict[str, List[Any]]:
    """A script in the order of STEPS as the two-servers mode sends it: cache server, nocache server."""
    return {"script": [script[i] for i in (0, 1, 3, 4)], "nocache_script": [script[i] for i in (2, 5)]}


def run(mode: str, script: List[Any], nocache_script: Optional[List[Any]] = None,
        cache_kind: Optional[str] = None, **kw: Any):
    settings = Settings(url="http://127.0.0.1:9", mode=mode,
                        nocache_url="http://127.0.0.1:10" if mode == "two-servers" else None, **kw)
    runner = Runner(settings)
    kind = cache_kind or ("llama.cpp" if mode == "llama.cpp" else "vllm")
    cache = Scripted(kind, script, pieces=True)
    nocache = Scripted("vllm", nocache_script) if nocache_script is not None else None
    runner.setup = ServerSetup(mode, cache, nocache, checked=True)  # the setup checks have their own tests
    return runner.run(PROBE), cache, nocache


def test_same_is_valid_and_uses_llama_cache_fields():
    result, client, _ = run("llama.cpp", good_script())
    assert result.outcome == "same", result.reason
    assert [c["cache"] for c in client.calls] == [
        {"cache_prompt": False}, {"cache_prompt": True}, {"cache_prompt": False},
        {"cache_prompt": False}, {"cache_prompt": True}, {"cache_prompt": False}]
    assert [r["step"] for r in result.to_json()["requests"]] == STEPS
    # turn 2 carries the turn-1 answer verbatim, then the follow-up
    assert client.calls[1]["messages"][-2:] == [{"role": "assistant", "content": "tea is nice"},
                                                {"role": "user", "content": "Shorter."}]
    assert client.calls[2]["messages"] == client.calls[1]["messages"] == client.calls[5]["messages"]
    assert len(result.to_json()["requests"]) == 6


def test_different_names_character_token_and_excerpts():
    result, _, _ = run("llama.cpp", good_script(t2_cache="short green tea", t2_re="short black tea"))
    assert result.outcome == "different"
    assert result.divergence.char == 6
    assert result.divergence.token == 1
    assert "green" in result.message() and "black" in result.message()
    assert "character 6 (token 1)" in result.message()


def test_one_server_salts_turns_together_and_recompute_apart():
    result, client, _ = run("one-server", good_script())
    assert result.outcome == "same", result.reason
    salts = [c["cache"]["cache_salt"] for c in client.calls]
    assert salts[0] == salts[1] and salts[3] == salts[4]
    assert len(set(salts)) == 4  # run 1, run 2, and one per recompute request
    assert all(0 < len(s) <= 128 and not set("@/\\\0") & set(s) for s in salts)


@pytest.mark.parametrize("kind", ["llama.cpp", "vllm", "openai"])
def test_two_servers_sends_recompute_to_the_nocache_server(kind):
    result, cache, nocache = run("two-servers", cache_kind=kind, **split(good_script()))
    assert result.outcome == "same", result.reason
    assert len(cache.calls) == 4 and len(nocache.calls) == 2
    assert all(c["cache"] == {} for c in nocache.calls)
    fields = [c["cache"] for c in cache.calls]
    if kind == "llama.cpp":  # clean turn 1; turn 2 follows the server's own setting (both-off control)
        assert fields == [{"cache_prompt": False}, {}] * 2
    elif kind == "vllm":
        assert fields[0] == fields[1] != fields[2] == fields[3] and "cache_salt" in fields[0]
    else:
        assert fields == [{}] * 4
    assert [s["server"] for s in result.to_json()["requests"]] == ["cache", "cache", "nocache"] * 2


@pytest.mark.parametrize("hit, tolerance, words", [
    (26, 32, "expected at least 27"),  # 20 + 40 - 1 - 32 = 27
    (20, 50, "not past the turn-1 prompt"),
])
def test_short_hit_is_inconclusive(hit, tolerance, words):
    result, _, _ = run("llama.cpp", good_script(hit=hit), hit_tolerance=tolerance)
    assert result.outcome == "inconclusive"
    assert result.reason.startswith("inconclusive: ") and words in result.reason


def test_tolerance_zero_needs_full_reuse():
    result, _, _ = run("llama.cpp", good_script(hit=58), hit_tolerance=0)
    assert result.outcome == "inconclusive" and "expected at least 59" in result.reason
    result, _, _ = run("llama.cpp", good_script(hit=59), hit_tolerance=0)
    assert result.outcome == "same"


def test_recompute_reuse_is_inconclusive():
    script = good_script()
    script[2] = ("short tea", 70, 5, 64)
    result, _, _ = run("one-server", script)
    assert result.outcome == "inconclusive"
    assert "recompute run 1 reused 64 cached tokens" in result.reason
    assert result.checks.recompute_reused is True


def test_turn1_reuse_is_inconclusive_in_llama_mode_but_not_two_servers():
    script = good_script()
    script[3] = ("tea is nice", 20, 40, 19)
    result, _, _ = run("llama.cpp", script)
    assert result.outcome == "inconclusive" and "turn 1 reused 19" in result.reason
    result, _, _ = run("two-servers", cache_kind="openai", **split(script))
    assert result.outcome == "same"  # no clean-start control exists for a generic server


@pytest.mark.parametrize("index, words", [
    (3, "different turn-1 answers"), (4, "cache runs gave different turn-2"), (5, "two recompute runs"),
])
def test_paths_must_repeat(index, words):
    script = good_script()
    content, p, c, h = script[index]
    script[index] = (content + " extra", p, c, h)
    result, _, _ = run("llama.cpp", script)
    assert result.outcome == "inconclusive" and words in result.reason


def test_missing_counter_is_an_error_naming_the_flag():
    script = good_script()
    script[1] = ("short tea", 70, 5, None)
    result, _, _ = run("one-server", script)
    assert result.outcome == "error"
    assert "--enable-prompt-tokens-details" in result.reason
    assert "cache-1/turn-2" in result.reason


def test_skip_hit_check_tolerates_no_hit():
    result, _, _ = run("two-servers", skip_hit_check=True, **split(good_script(hit=0)))
    assert result.outcome == "same"


def test_failed_request_is_an_error_never_a_divergence():
    script = good_script()
    script[4] = RequestError("POST /v1/chat/completions: HTTP 503: busy", status=503)
    result, _, _ = run("llama.cpp", script)
    assert result.outcome == "error" and "HTTP 503" in result.reason
    assert [r.step for r in result.requests] == STEPS[:4]  # what was measured before the failure is kept


def test_first_difference_and_excerpt():
    assert first_difference("abc", "abc") is None
    assert first_difference("abc", "abd") == 2
    assert first_difference("ab", "abc") == 2
    text = "x" * 100 + "\nEND"
    shown = excerpt(text, 100)
    assert shown.startswith("...") and "\\n" in shown and ">>>" in shown


CACHE_LP = [("short", -0.1, 2.0), (" green", -0.70, 0.05), (" tea", -0.1, 3.0)]
RE_LP = [("short", -0.1, 2.0), (" black", -0.69, 0.02), (" tea", -0.1, 3.0)]


def parted_script(cache_lp: Any = CACHE_LP, re_lp: Any = RE_LP) -> List[Any]:
    """Run 1's paths part; every turn-2 reply has logprobs to give, which a reply carries only if asked."""
    script = good_script(t2_cache="short green tea", t2_re="short black tea")
    for i, lp in ((1, cache_lp), (4, cache_lp), (2, re_lp), (5, re_lp)):
        script[i] = script[i] + (lp,)
    return script


def asked(client: _Scripted) -> List[bool]:
    return [c["logprobs"] for c in client.calls]


def test_same_asks_for_no_logprobs():
    script = good_script()
    for i in (1, 2, 4, 5):
        script[i] = script[i] + (CACHE_LP,)
    result, client, _ = run("llama.cpp", script)
    assert result.outcome == "same" and not any(asked(client))


def test_parted_asks_for_logprobs_on_run_2_turn_2_only_and_reads_the_anatomy_there():
    result, client, _ = run("llama.cpp", parted_script())
    assert asked(client) == [False, False, False, False, True, True]  # cache-2/turn-2, recompute-2/turn-2
    assert result.outcome == "different", result.reason
    d = result.divergence
    assert (d.char, d.token, d.cache_token, d.recompute_token) == (6, 1, " green", " black")
    assert (d.cache_margin, d.recompute_margin) == (0.05, 0.02)
    assert d.kind == "near-tie" and d.to_json()["kind"] == "near-tie"
    assert "cache ' green' vs recompute ' black'" in result.message() and "near-tie" in result.message()
    sure = [("short", -0.1, 2.0), (" green", -0.01, 4.0), (" tea", -0.1, 3.0)]
    result, _, _ = run("llama.cpp", parted_script(cache_lp=sure))
    assert result.divergence.kind == "large-gap" and result.divergence.cache_margin == 4.0


def test_two_servers_asks_the_nocache_server_for_run_2_logprobs():
    result, cache, nocache = run("two-servers", **split(parted_script()))
    assert asked(cache) == [False, False, False, True] and asked(nocache) == [False, True]
    assert result.outcome == "different" and result.divergence.recompute_margin == 0.02


def test_a_run_2_that_logprobs_changed_is_inconclusive_not_an_anatomy():
    script = parted_script()
    script[4] = ("short red tea", 70, 5, 59, CACHE_LP)  # asked for logprobs, the cache path answered apart
    result, client, _ = run("llama.cpp", script)
    assert asked(client)[4:] == [True, True]
    assert result.outcome == "inconclusive" and result.divergence is None
    assert "the two cache runs gave different turn-2 answers" in result.reason


def test_run_2_parting_alone_asks_for_nothing_and_is_inconclusive():
    script = good_script()
    script[5] = ("short black tea", 70, 5, 0, RE_LP)
    result, client, _ = run("llama.cpp", script)
    assert not any(asked(client))
    assert result.outcome == "inconclusive" and "two recompute runs gave different answers" in result.reason


def test_no_logprobs_setting():
    result, client, _ = run("llama.cpp", parted_script(), logprobs=False)
    assert not any(asked(client))
    d = result.divergence
    assert result.outcome == "different" and d.token == 1  # from the server's tokenizer (here: on spaces)
    assert d.cache_token is None and d.cache_margin is None and d.kind is None
