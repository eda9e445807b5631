"""One real ``pytest`` run of the plugin in an empty folder (a subprocess), as the e2e tests make them.

``run_plugin`` starts it with the caller's arguments, a JSON report and the environment cleaned of any
``CACHECHECK_URL*``/``CACHECHECK_API*`` a developer may have set; ``Run`` holds what came back. The
``plugin_run`` fixture in tests/conftest.py memoizes these per set of arguments, so tests that read one run
share it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Tuple

from pytest_cachecheck.episodes import builtin_episodes
from pytest_cachecheck.model import Tally


@dataclass
class Run:
    ret: int
    out: str
    data: Dict[str, Any]
    report: Path
    seconds: float

    @property
    def target(self) -> Dict[str, Any]:
        """The report's only target (a run without a matrix): its setup, summary, comparisons."""
        assert len(self.data["targets"]) == 1, [t["name"] for t in self.data["targets"]]
        return self.data["targets"][0]

    def counts(self) -> Dict[str, int]:
        return dict(Counter(p["outcome"] for p in self.data["probes"]))

    def probes(self, target: str = "") -> List[Dict[str, Any]]:
        return [p for p in self.data["probes"] if not target or p.get("target") == target]

    @property
    def episodes(self) -> List[Dict[str, Any]]:
        return self.data["episodes"]

    def outcomes(self) -> Counter:
        """Episode outcomes."""
        return Counter(e["outcome"] for e in self.episodes)

    def episode_figures(self, label: str) -> None:
        s = self.target["episode_summary"]
        firsts = [e["parting"]["step"] for e in self.episodes if e["outcome"] == "different"]
        print(f"\nMEASURED episodes, {label}: trajectories changed {s['changed']} of {s['valid']} valid "
              f"({s['inconclusive']} inconclusive, {s['errors']} errors) in {self.seconds:.0f} s; first parting "
              f"steps {sorted(firsts)}; changed {[e['id'] for e in self.episodes if e['outcome'] == 'different']}")

    def figures(self, label: str) -> None:
        s = self.data["summary"]
        print(f"\nMEASURED {label}: {s['different']} of {s['valid']} valid probes differed "
              f"({s['inconclusive']} inconclusive, {s['errors']} errors) in {self.seconds:.0f} s "
              f"{[p['id'] for p in self.data['probes'] if p['outcome'] == 'different']}")


def run_plugin(folder: Path, *args: str, timeout: float = 1800) -> Run:
    """``pytest *args`` in ``folder`` with the plugin's JSON report written there; the report must exist."""
    report = folder / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CACHECHECK_URL", "CACHECHECK_API"))}
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", *args, f"--cachecheck-report={report}",
                           "-p", "no:cacheprovider", "-rfEs"], cwd=folder, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    assert report.is_file(), proc.stdout[-4000:]
    return Run(proc.returncode, proc.stdout, json.loads(report.read_text()), report, time.monotonic() - began)


#: the plain built-in episodes (multi-turn chats, no tools)
PLAIN_EPISODES = tuple(e.id for e in builtin_episodes() if not e.tools)


def some_plain_episodes(default: Tuple[str, ...]) -> Tuple[str, ...]:
    """``default``, or all ten plain episodes with ``CACHECHECK_E2E_EPISODES=all`` (for a measurement)."""
    return PLAIN_EPISODES if os.environ.get("CACHECHECK_E2E_EPISODES") == "all" else default


def episode_args(ids: Tuple[str, ...], max_tokens: int = 64) -> Tuple[str, ...]:
    """Built-in episodes ``ids`` (and the gate item), ``max_tokens`` a step (64: the study's harness).

    ``--cachecheck-min-valid 0.5``: an empty answer (the end token first) leaves a step with nothing for the
    next hit to reach into, which makes an episode inconclusive on purpose."""
    return ("--cachecheck-episodes=builtin", "-k", " or ".join(ids + ("gate",)),
            f"--cachecheck-max-tokens={max_tokens}", "--cachecheck-min-valid=0.5")


def check_episode_hits(episode: Dict[str, Any], tolerance: int, over: int = 0) -> None:
    """Every cache-path step after the first reused the previous step's prompt and answer (at most
    ``tolerance`` short of prompt + answer - 1, ``over`` more where the server counts one token more, and
    past the previous prompt); every recompute step and every first step reused nothing."""
    for path in episode["paths"]:
        steps = path["steps"]
        where = (episode["id"], path["path"])
        if path["path"].startswith("recompute"):
            assert all(s["cached_tokens"] == 0 for s in steps), where
            continue
        assert steps[0]["cached_tokens"] == 0, where
        for prev, cur in zip(steps, steps[1:]):
            full = prev["prompt_tokens"] + prev["completion_tokens"] - 1
            assert full - tolerance <= cur["cached_tokens"] <= full + over, (*where, cur["step"], full)
            assert cur["cached_tokens"] > prev["prompt_tokens"], (*where, cur["step"])


def check_episode_run(run: Run, ids: Tuple[str, ...], over: int = 0, besides: Tuple[str, ...] = ()) -> None:
    """A run of plain built-in episodes ``ids`` (and ``besides``, checked by the caller): one record each, no
    errors, at least half valid, every valid one multi-turn with hits as :func:`check_episode_hits` says,
    the summary and the exit status agreeing."""
    episodes = {e["id"]: e for e in run.episodes}
    assert sorted(episodes) == sorted(ids + besides) and run.data["probes"] == [], run.out[-3000:]
    episodes = {k: v for k, v in episodes.items() if k in ids}
    outcomes = [e["outcome"] for e in episodes.values()]
    assert "error" not in outcomes, run.out[-3000:]
    assert outcomes.count("same") + outcomes.count("different") >= (len(outcomes) + 1) // 2, run.out[-3000:]
    for e in episodes.values():
        if e["outcome"] == "inconclusive":
            assert "step" in e["reason"] and e["reason"].startswith("inconclusive:"), e["reason"]
            continue
        check_episode_hits(e, e["hit_tolerance"], over)
        assert all(len(p["steps"]) >= 4 for p in e["paths"]), e["id"]  # multi-turn: the user turns ran
        if e["outcome"] == "different":
            parting = e["parting"]
            assert parting["step"] >= 1 and parting["what"] == "text"  # no tools in these episodes
            assert f"episode[{e['id']}]" in run.out and f"parted at step {parting['step']}" in run.out
    s = run.target["episode_summary"]
    different = outcomes.count("different")
    assert s["valid"] == outcomes.count("same") + different and s["changed"] == different
    assert f"{different} of {s['valid']} valid episodes took a different trajectory" in run.out
    assert run.ret == (1 if different else 0)


#: the batch kind in the e2e tests on the real vLLM and SGLang servers: few probes, short answers, 3
#: background requests of 60 words, and only the batch items (``-k batch``; the gate still judges them)
BATCH_N = 3


def batch_args(background_tokens: int) -> Tuple[str, ...]:
    """The arguments of a batch run whose background requests answer ``background_tokens`` each: chosen per
    server, longer than the tiny model's answer to them (so ``ignore_eos`` matters) and lasting longer than
    a measured answer (so the background is still running when it comes)."""
    return (f"--cachecheck-n={BATCH_N}", "--cachecheck-batch=3", "--cachecheck-batch-prompt-words=60",
            f"--cachecheck-batch-max-tokens={background_tokens}", "--cachecheck-max-tokens=64", "-k", "batch",
            "-p", "no:randomly")


def check_batch_run(run: Run, background_tokens: int, concurrent: int = 3, words: int = 60,
                    alone: bool = True) -> Tally:
    """A run of :func:`batch_args`' batch items alone (``alone``; else a run of :func:`deployed_args`, whose
    probe records and exit status :func:`check_deployed_run` checks): one batch record for each of the first
    ``BATCH_N`` (else the run's) built-in probes and no probe record, every batch record valid (the counters trusted, the two alone runs
    the same, no measured request reused a cached token: the cache really off; each load run's ``concurrent``
    background requests in flight when its measured request was sent), some background still running when a
    measured answer came (batched), the conditions asked for, and the batch summary, result line and exit
    status a recount of the records. Returns the tally."""
    from pytest_cachecheck.model import BatchRecord, BatchShape
    from pytest_cachecheck.probes import builtin_probes

    records = [BatchRecord.from_json(b) for b in run.data["batches"]]
    n = BATCH_N if alone else len(run.data["probes"])
    assert [r.id for r in records] == [p.id for p in builtin_probes()[:n]], run.out[-4000:]
    assert (run.data["probes"] == []) == alone
    assert all(r.valid for r in records), [r.reason for r in records if not r.valid]
    shape = BatchShape(concurrent=concurrent, prompt_words=words, max_tokens=background_tokens)
    for r in records:
        assert r.shape == shape, r.id
        assert [q.step for q in r.requests] == ["turn-1", "alone-1/turn-2", "load-1/turn-2", "alone-2/turn-2",
                                                "load-2/turn-2"], r.id
        assert all(q.cached_tokens == 0 for q in r.requests), r.id
        assert [(x.background, x.in_flight_at_send >= 1) for x in r.loads] == [(concurrent, True)] * 2, r.id
    # batched: some background was still running when a measured answer came (vLLM and SGLang batch
    # continuously; a server that queued the measured request would answer it after every background one)
    assert any(x.in_flight_at_answer > 0 for r in records for x in r.loads), run.data["batches"]
    t = Tally.of(records)  # type: ignore[arg-type]
    s = run.target["batch_summary"]
    assert (s["probes"], s["valid"], s["same"], s["different"], s["inconclusive"], s["errors"]) == (
        t.probes, t.valid, t.same, t.different, t.inconclusive, t.errors)
    assert t.different <= t.valid
    said = f"{t.different} of {t.valid} valid batch probes answered differently amid other requests."
    assert f"{shape.label()}: {said}" in run.out, run.out[-4000:]
    if alone:
        assert run.ret == (1 if t.different else 0), run.out[-4000:]
        assert f"{t.same + (not t.different)} passed" in run.out  # and cachecheck::gate, if it passes
    return t


def batch_figures(run: Run, server: str, tally: Tally) -> None:
    """``MEASURED batch on <server>: ...``: the counts, and how often the background was still running when a
    measured answer came (the measured request was batched with it)."""
    loads = [x for b in run.data["batches"] for x in b["loads"]]
    batched = sum(1 for x in loads if x["in_flight_at_answer"] > 0)
    alone = [s for b in run.data["batches"] for s in b["alone_s"]]
    print(f"\nMEASURED batch on {server}: {tally.different} different of {tally.valid} valid batch probes "
          f"({tally.inconclusive} inconclusive, {tally.errors} errors); background still running at the "
          f"measured answer in {batched} of {len(loads)} load runs; measured request "
          f"{sum(alone) / len(alone):.2f} s alone, {sum(x['measured_s'] for x in loads) / len(loads):.2f} s "
          f"amid the background (mean); {run.seconds:.0f} s "
          f"{[b['id'] for b in run.data['batches'] if b['outcome'] == 'different']}")


def check_no_early_stop(url: str, shape_words: int, max_tokens: int) -> str:
    """The server honours the background requests' ``no_early_stop`` fields (``ignore_eos``): one background
    request, sent as the batch kind sends it, answers its whole ``max_tokens``; and one asked for more tokens
    than the same request answers without the field goes on past its end token. Returns what was seen."""
    from pytest_cachecheck.batch import BatchRunner
    from pytest_cachecheck.clients import detect_server
    from pytest_cachecheck.clients.http import Http
    from pytest_cachecheck.model import BatchShape

    client = detect_server(Http(url, timeout=600), None)
    runner = BatchRunner(client, BatchShape(concurrent=1, prompt_words=shape_words, max_tokens=max_tokens),
                         max_tokens=max_tokens)
    messages = runner.shape.messages()[0]
    background = {**runner.fields(), **client.no_early_stop()}
    assert background.get("ignore_eos") is True, background
    whole = client.chat(messages, max_tokens=max_tokens, cache=background)
    assert (whole.completion_tokens, whole.finish_reason) == (max_tokens, "length"), whole
    plain = client.chat(messages, max_tokens=512, cache=runner.fields())
    seen = f"without ignore_eos {plain.completion_tokens} tokens ({plain.finish_reason})"
    if plain.finish_reason == "stop" and plain.completion_tokens is not None:  # past the end token
        more = plain.completion_tokens + 16
        past = client.chat(messages, max_tokens=more, cache=background)
        assert (past.completion_tokens, past.finish_reason) == (more, "length"), past
        assert past.content.startswith(plain.content), (past.content[:200], plain.content[:200])
        seen += f", with it {more} of {more} (length)"
    return seen


def deployed_args(background_tokens: int) -> Tuple[str, ...]:
    """The arguments of a run of every deployed kind on 2 probes: the quiet probes, the batch kind, the cache
    under load (the batch shape of :func:`batch_args`) and order and state."""
    return ("--cachecheck-n=2", "--cachecheck-batch=3", "--cachecheck-batch-prompt-words=60",
            f"--cachecheck-batch-max-tokens={background_tokens}", "--cachecheck-max-tokens=64",
            "--cachecheck-load-cache", "--cachecheck-order", "-p", "no:randomly")


def _cached(record: Dict[str, Any], step: str) -> int:
    return next(q["cached_tokens"] for q in record["requests"] if q["step"] == step)


def check_deployed_run(run: Run, background_tokens: int) -> Dict[str, Tally]:
    """A run of :func:`deployed_args`: every kind's summary a recount of its records (``different <= valid``)
    and the exit status what the counts say. The loaded records: each valid, or inconclusive for the probe
    rules' reasons (the hit, the recompute path's reuse); each of the four turn-2 requests sent with the whole
    background in flight; the recompute path reused nothing; a valid one's hits covered turn 1; ``load_alone``
    the batch record's outcome. The order records: each valid, every request with its cached-token counter.
    Returns each kind's tally (``probe``, ``batch``, ``loaded``, ``order``)."""
    from pytest_cachecheck.model import (
        LOADED_STEPS,
        BatchRecord,
        BatchShape,
        LoadedRecord,
        OrderConditions,
        OrderRecord,
        Outcome,
        ProbeRecord,
    )

    ids = [p["id"] for p in run.data["probes"]]
    assert len(ids) == 2 and [b["id"] for b in run.data["batches"]] == ids, run.out[-4000:]
    shape = BatchShape(concurrent=3, prompt_words=60, max_tokens=background_tokens)
    batch = {b["id"]: b["outcome"] for b in run.data["batches"]}
    loaded = [LoadedRecord.from_json(x) for x in run.data["loaded"]]
    assert [r.id for r in loaded] == ids, run.out[-4000:]
    for r in loaded:
        assert r.outcome != Outcome.ERROR and r.shape == shape, (r.id, r.reason)
        assert [q.step for q in r.requests if q.step in LOADED_STEPS] == list(LOADED_STEPS), r.id
        assert [(x.background, x.in_flight_at_send >= 1) for x in r.loads] == [(3, True)] * 4, (r.id, r.loads)
        assert all(q.cached_tokens == 0 for q in r.requests if q.step.startswith("recompute")), r.id
        if r.outcome == Outcome.INCONCLUSIVE:
            assert "cache hit was" in r.reason or "reused" in r.reason, r.reason
        else:
            assert r.checks is not None and len(r.checks.cache_hits) == 2 and not r.checks.recompute_reused
            for h in r.checks.cache_hits:  # the hit covered turn 1: past its prompt, within the tolerance
                assert h.cached_tokens is not None, (r.id, h)
                assert h.turn1_prompt_tokens < h.cached_tokens, (r.id, h)
                assert h.expected_at_least <= h.cached_tokens, (r.id, h)
        assert r.load_alone == (batch[r.id] if batch[r.id] in ("same", "different") else "not measured"), r.id
    orders = [OrderRecord.from_json(x) for x in run.data["orders"]]
    assert sorted(r.id for r in orders) == sorted(ids), run.out[-4000:]
    for r in orders:
        assert r.outcome in (Outcome.SAME, Outcome.DIFFERENT), (r.id, r.reason)
        assert [q.step for q in r.requests] == ["A/turn-1", "A/turn-2", "B/turn-1", "B/turn-2"], r.id
        assert all(q.cached_tokens is not None for q in r.requests), r.id  # the state evidence
    tallies = {"probe": Tally.of([ProbeRecord.from_json(p) for p in run.data["probes"]]),
               "batch": Tally.of([BatchRecord.from_json(b) for b in run.data["batches"]]),  # type: ignore
               "loaded": Tally.of(loaded), "order": Tally.of(orders)}  # type: ignore[arg-type]
    t = run.target
    for kind, key in (("probe", "summary"), ("batch", "batch_summary"), ("loaded", "loaded_summary"),
                      ("order", "order_summary")):
        s, n = t[key], tallies[kind]
        assert (s["probes"], s["valid"], s["same"], s["different"], s["inconclusive"], s["errors"]) == (
            n.probes, n.valid, n.same, n.different, n.inconclusive, n.errors), (kind, s)
        assert n.different <= n.valid
    s = t["loaded_summary"]
    diverged = [r for r in loaded if r.outcome == Outcome.DIFFERENT]
    assert (s["load_alone_different"], s["load_alone_same"]) == (
        sum(r.load_alone == "different" for r in diverged), sum(r.load_alone == "same" for r in diverged))
    lt, ot = tallies["loaded"], tallies["order"]
    order_label = OrderConditions.from_json(t["order_summary"]["conditions"]).label()
    for label, what, n in ((shape.load_label(), "loaded probes", lt), (order_label, "order probes", ot)):
        said = (f"{label}: {what} {n.probes} | valid {n.valid} (same {n.same}, different {n.different}) | "
                f"inconclusive {n.inconclusive} | errors {n.errors}")
        assert said in run.out, (said, run.out[-4000:])
    total = sum(tallies.values(), Tally())
    ok = not total.different and not total.errors and total.valid >= 0.8 * total.probes
    assert run.ret == (0 if ok else 1), (run.ret, tallies, run.out[-4000:])
    return tallies


def deployed_figures(run: Run, server: str, tallies: Dict[str, Tally]) -> None:
    """``MEASURED cache under load on <server>: ...`` and ``MEASURED order on <server>: ...``: the counts, the
    turn-2 hits under load, and every order request's cached tokens (pass A against pass B)."""
    lt, ot = tallies["loaded"], tallies["order"]
    hits = [[(h["cached_tokens"], h["full_reuse"]) for h in (r["checks"] or {}).get("cache_hits", [])]
            for r in run.data["loaded"]]
    alone = [r["load_alone"] for r in run.data["loaded"]]
    at_answer = [[x["in_flight_at_answer"] for x in r["loads"]] for r in run.data["loaded"]]
    why = [r["reason"][:200] for r in run.data["loaded"] if r["outcome"] == "inconclusive"]
    print(f"\nMEASURED cache under load on {server}: {lt.different} of {lt.valid} valid loaded probes "
          f"diverged under load ({lt.inconclusive} inconclusive, {lt.errors} errors; load alone {alone}); "
          f"hits (cached, full) {hits}; background in flight at each answer {at_answer}; inconclusive {why}")
    reuse = "; ".join(f"{r['id']} " + ", ".join(f"{q['step']} {q['cached_tokens']}/{q['prompt_tokens']}"
                                                for q in r["requests"]) for r in run.data["orders"])
    print(f"MEASURED order on {server}: {ot.different} of {ot.valid} valid order probes answered differently "
          f"({ot.inconclusive} inconclusive, {ot.errors} errors); cached tokens: {reuse}")
    print(f"MEASURED deployed run on {server}: quiet probes {tallies['probe']}, batch {tallies['batch']}; "
          f"{run.seconds:.0f} s")


def order_restored(run: Run) -> bool:
    """Some pass B turn 1 reused more cached tokens than its pass A turn 1 (the same prompt, sent again)."""
    return any(_cached(r, "B/turn-1") > _cached(r, "A/turn-1") for r in run.data["orders"])
