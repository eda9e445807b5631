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
