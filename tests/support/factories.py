"""Factories for tests: real probe records and run reports, built the way the plugin builds them.

``record()`` makes a :class:`ProbeRecord` with its six requests (so its answers are real), a divergence
located by the measurement's own ``first_difference`` when the answers differ; ``run()`` feeds records
through :func:`pytest_cachecheck.run.summarise` (gates, verdicts, matrix pairing, baselines) and
``report()`` returns the run report the plugin would write.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from pytest_cachecheck.baseline import Baseline, env_of, known_different
from pytest_cachecheck.model import (Checks, Divergence, HitCheck, Outcome, ProbeRecord, ProbeSet, Request,
                                     RunReport, ServerDescription, Setup)
from pytest_cachecheck.protocol import divergence_message, excerpt, first_difference
from pytest_cachecheck.kinds import PROBE
from pytest_cachecheck.run import KindInput, RunResult, TargetInput, expectation, summarise
from pytest_cachecheck.settings import Settings

URL = "http://127.0.0.1:8000"
PROBE_SET = ProbeSet("builtin", 20, "sha256:" + "ab" * 32)


def setup(kind: str = "vllm", build: Optional[str] = "0.34.0", model: Optional[str] = "emu/tiny-chat",
          mode: str = "one-server", **fields: Any) -> Setup:
    return Setup(mode, ServerDescription(kind, build, model, {}), **fields)


def record(pid: str, outcome: str, *, fingerprint: Optional[str] = None, cache: Optional[str] = "the same answer",
           recompute: Optional[str] = "the same answer", turn1: str = "turn one", reason: str = "",
           target: Optional[str] = None, worker: Optional[str] = None, url: str = URL,
           margins: Optional[Sequence[float]] = None, run: Optional[Setup] = None) -> ProbeRecord:
    """A record as the measurement makes it. ``cache``/``recompute`` None: the request was never answered."""
    o = Outcome(outcome)
    requests: List[Request] = []
    for step, server, text, prompt in (("cache-1/turn-1", "cache", turn1, 20), ("cache-1/turn-2", "cache", cache, 40),
                                       ("cache-2/turn-1", "cache", turn1, 20), ("cache-2/turn-2", "cache", cache, 40),
                                       ("recompute-1/turn-2", "cache", recompute, 40),
                                       ("recompute-2/turn-2", "cache", recompute, 40)):
        if text is None:
            break
        cached = 0 if step.endswith("turn-1") or step.startswith("recompute") else prompt - 1
        requests.append(Request(step, server, text, "stop", prompt, 10, cached))
    rec = ProbeRecord(pid, "test:1", fingerprint or f"sha256:{pid}", o, reason, requests=requests, duration_s=0.25,
                      target=target, server_url=url, worker=worker, run=run)
    if o.valid:
        rec.checks = Checks(32, False, [HitCheck(r, 39, 20, 10, 0, 29) for r in (1, 2)], False)
    if o == Outcome.DIFFERENT and cache is not None and recompute is not None:
        at = first_difference(cache, recompute)
        assert at is not None, "a different record needs different answers"
        d = Divergence(at, 3, excerpt(cache, at), excerpt(recompute, at))
        if margins is not None:
            d.cache_token, d.recompute_token = "a", "b"
            d.cache_margin, d.recompute_margin = margins
        rec.divergence = d
        rec.reason = reason or divergence_message(d)
    elif not reason and o == Outcome.INCONCLUSIVE:
        rec.reason = "inconclusive: the two cache runs gave different turn-2 answers (from character 0)"
    elif not reason and o == Outcome.ERROR:
        rec.reason = "POST /v1/chat/completions to http://127.0.0.1:8000: connection failed (connection refused)"
    return rec


def settings(**overrides: Any) -> Settings:
    base: Dict[str, Any] = {"url": URL, "replicas": (URL,)}
    base.update(overrides)
    return Settings(**base)


def baseline(records: Sequence[ProbeRecord], setup_: Optional[Setup] = None, s: Optional[Settings] = None,
             probe_set: ProbeSet = PROBE_SET, created: Optional[str] = "2026-12-01T00:00:00Z") -> Baseline:
    return Baseline(list(records), env_of((s or settings()).public(), setup_ or setup(), probe_set), created)


def run(records: Sequence[ProbeRecord] = (), *, s: Optional[Settings] = None,
        targets: Optional[Mapping[str, Sequence[ProbeRecord]]] = None, setup_: Optional[Setup] = None,
        baselines: Optional[Mapping[Optional[str], Baseline]] = None, checks: Sequence[ProbeRecord] = (),
        selected: Optional[Sequence[str]] = None, interrupted: bool = False,
        probe_set: ProbeSet = PROBE_SET) -> RunResult:
    """The verdict of a run of these records: one server (``records``) or a matrix (``targets``)."""
    if targets is not None:
        s = s or settings(targets=tuple((name, f"http://{name}:8000") for name in targets))
        inputs = [TargetInput(name, f"http://{name}:8000", setup_ or setup()) for name in targets]
        by_key = {r.key: r for name, recs in targets.items() for r in recs}
        ids = list(dict.fromkeys(r.id for recs in targets.values() for r in recs))
    else:
        s = s or settings()
        inputs = [TargetInput(None, s.url, setup_ or setup())]
        by_key = {r.key: r for r in records}
        ids = [r.id for r in records]
    for r in by_key.values():  # as the plugin does where it makes a record
        r.expected = expectation(r, s, known_different((baselines or {}).get(r.target)))
    return summarise(s, [KindInput(PROBE, probe_set, ids, by_key, list(checks), selected)], inputs, baselines or {},
                     interrupted)


def report(records: Sequence[ProbeRecord] = (), exit_status: int = 0, **kwargs: Any) -> RunReport:
    """The run report of these records (see ``run``)."""
    rep = run(records, **kwargs).report(exit_status)
    rep.created = "2026-12-05T00:00:00Z"
    return rep
