"""The session's verdict: collect the probe records per target, decide which probes were selected and
which did not run, apply the gates (minimum valid share, max rate, baseline policy), check that no two
processes measured one server, pair every matrix target with the first, and build the run report.

Knows nothing about pytest: the reporter feeds it records and asks for the verdict, then the report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .baseline import Baseline, compare, env_of, should_fail
from .identity import server_groups
from .model import (CheckTally, Comparison, EpisodeRecord, EpisodeSummary, Outcome, ProbeRecord, ProbeSet, RunReport,
                    Setup, Status, Summary, Tally, TargetReport, Verdict, record_key)
from .redact import display_url
from .settings import Settings
from .text import counted

Gate = Tuple[bool, str]  # (fails?, why)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _rate_gate(hits: int, total: int, limit: float, what: str, flag: str, nothing: str) -> Gate:
    """A rate gate: fail when hits / total exceeds ``limit`` (``nothing``: why it passes with no total)."""
    if not total:
        return False, nothing
    rate = hits / total
    if rate > limit:
        return True, f"{what} {rate:.1%} ({hits} of {total}) exceeds {flag} {limit:g}"
    return False, f"{what} {rate:.1%} is within {flag} {limit:g}"


def max_rate_gate(t: Tally, max_rate: float, what: str = "divergence rate", unit: str = "probe") -> Gate:
    """--cachecheck-max-rate: fail when different / valid exceeds max_rate."""
    return _rate_gate(t.different, t.valid, max_rate, what, "--cachecheck-max-rate",
                      f"no valid {unit} to measure a rate on")


def max_flip_rate_gate(t: Optional[CheckTally], max_rate: float, unit: str = "probe") -> Gate:
    """--cachecheck-max-flip-rate: fail when flips / valid items with checks exceeds max_rate."""
    return _rate_gate(t.flips if t is not None else 0, t.items if t is not None else 0, max_rate,
                      f"{unit} flip rate", "--cachecheck-max-flip-rate",
                      f"no valid {unit} with checks to measure a flip rate on")


def flips_gate(probes: Optional[CheckTally], episodes: Optional[CheckTally], divergences: int) -> Gate:
    """--cachecheck-gate-on flips: fails when no valid item has checks (nothing for the gate to judge), else
    says what it judged (each flip fails the run by itself, see :func:`expectation`)."""
    items = sum(t.items for t in (probes, episodes) if t is not None)
    if not items:
        return True, ("--cachecheck-gate-on flips: no valid probe or episode has outcome checks ('expect') that "
                      "could be evaluated, so no flip could be seen")
    flips = sum(t.flips for t in (probes, episodes) if t is not None)
    return False, (f"gated on flips: {counted(flips, 'flip')} in {counted(items, 'valid item')} with checks; "
                   f"{counted(divergences - flips, 'divergence')} flipped no outcome")


def record_gate(t: Tally, episodes: Optional[Tally] = None) -> Gate:
    """--cachecheck-record: divergences are what a baseline records, never a failure."""
    what = f"{t.different} of {counted(t.valid, 'valid probe')} differed"
    if episodes is not None:
        what += f", {episodes.different} of {counted(episodes.valid, 'valid episode')} changed trajectory"
    return False, (f"baseline recorded: {what} (expected when recording; later runs compare with it "
                   f"through --cachecheck-baseline)")


def expectation(record: Union[ProbeRecord, EpisodeRecord], settings: Settings,
                known_different: Mapping[str, str]) -> Optional[str]:
    """Why a valid record that differed does not fail the run by itself (its item is an xfail), or None when
    it does (or did not differ). The one place this is decided: set on the record where it is made, and read
    from there by the item, the verdict and every report. ``known_different``: id -> conversation fingerprint
    of the probes (or episodes) that differed in this target's baseline.

    Recording a baseline expects every divergence. Gated on flips (``--cachecheck-gate-on flips``), a
    divergence that flipped no outcome check is expected. Under a baseline, one that also differed there (the
    same conversation) is expected; under the default policy ``new-divergence`` any other fails, whatever
    else is set. Otherwise a rate gate (``--cachecheck-max-flip-rate`` for a flip, ``--cachecheck-max-rate``)
    or another baseline policy decides at the end of the session, and without either, any divergence
    fails. A flip is always a divergence (the paths' answers differ); under the default gate it fails as
    any divergence does, its message naming the flip first."""
    if record.outcome != Outcome.DIFFERENT:
        return None
    if settings.record:
        return "diverged; recorded as the baseline (--cachecheck-record)"
    if settings.gate_on == "flips" and not record.flip:
        why = ("no outcome check changed its result" if record.check_results is not None
               else "it has no outcome checks ('expect')")
        return f"a divergence that flipped no outcome ({why}); the gate is on flips (--cachecheck-gate-on flips)"
    if known_different.get(record.id) == record.fingerprint:
        return "also differed in the baseline"
    if settings.baseline is not None and settings.fail_on == "new-divergence":
        return None
    if settings.max_flip_rate is not None:
        return "flipped; the flip-rate gate decides (--cachecheck-max-flip-rate)"
    if settings.max_rate is not None:
        return "diverged; the rate gate decides (--cachecheck-max-rate)"
    if settings.baseline is not None:
        return f"diverged; the baseline policy {settings.fail_on} decides (--cachecheck-fail-on)"
    return None


def judge(t: Tally, min_valid: float, interrupted: Union[bool, str] = False,
          gates: Optional[Sequence[Gate]] = None, unreliable: Optional[str] = None,
          episodes: Optional[Tally] = None, unexpected: Tuple[int, int] = (0, 0),
          not_measured: Sequence[str] = (), check_errors: int = 0, flips: Tuple[int, int] = (0, 0)) -> Verdict:
    """One target's verdict over its probes (and episodes). ``unexpected``: how many valid probes and episodes
    differed without a reason to expect it (:func:`expectation`): each fails the run. ``gates`` (max rate,
    baseline policy, recording) decide the rest. ``unreliable`` says why no outcome can be trusted (it
    overrides everything). ``interrupted`` may be the text saying how. ``not_measured``: the record keys of
    the selected probes and episodes that ended without a record; a run with any never passes, nor does one
    without a valid probe or episode. ``check_errors``: the tests' own ``cachecheck.check()`` and
    ``cachecheck.episode()`` measurements that failed with a request error (an error, never a pass).
    ``flips``: how many of the ``unexpected`` probes and episodes flipped the outcome of their checks."""
    total = t + episodes if episodes is not None else t
    items = "probes" if episodes is None else "probes and episodes"
    if unreliable:
        return Verdict(status=Status.UNRELIABLE, ok=False, why=unreliable)
    if interrupted:
        return Verdict(status=Status.INTERRUPTED, ok=False, why=interrupted if isinstance(interrupted, str) else
                       "the run was interrupted; the report holds what was measured")
    if total.probes == 0 and not not_measured and not check_errors:
        return Verdict(status=Status.NO_PROBES, ok=True, why="no probe ran")
    failing = [why for fail, why in gates or () if fail]
    if failing:
        return Verdict(status=Status.GATE_FAILED, ok=False, why="; ".join(failing))
    if any(unexpected):
        why = []
        for n, flipped, unit, what in ((unexpected[0], flips[0], "valid probe", "gave a different turn-2 answer"),
                                       (unexpected[1], flips[1], "valid episode", "changed trajectory")):
            if n and flipped == n:
                why.append(f"{counted(n, unit)} flipped the outcome of {'its' if n == 1 else 'their'} checks")
            elif n:
                whose = "its" if flipped == 1 else "their"
                why.append(f"{counted(n, unit)} {what}" + (f" ({flipped} flipped the outcome of {whose} checks)"
                                                           if flipped else ""))
        return Verdict(status=Status.DIVERGED, ok=False, why="; ".join(why))
    if total.errors or check_errors:
        what = "probe" if episodes is None else "probe or episode"
        why = [f"{counted(total.errors, what)} failed with a request or server error"] if total.errors else []
        if check_errors:
            why.append(f"{counted(check_errors, 'check of a test', 'checks of tests')} (cachecheck.check() or "
                       f".episode()) failed with a request or server error")
        return Verdict(status=Status.ERRORS, ok=False, why="; ".join(why))
    if not_measured:
        shown = ", ".join(not_measured[:5]) + (f" and {len(not_measured) - 5} more" if not_measured[5:] else "")
        return Verdict(status=Status.NOT_MEASURED, ok=False, why=
                       f"{counted(len(not_measured), 'selected probe or episode', 'selected probes or episodes')} "
                       f"ended without a measurement ({shown}): cut by a timeout, a crash, -x/--maxfail or "
                       f"another plugin; a probe that was not measured is never a pass")
    if total.valid == 0:
        unit = "probe" if episodes is None else "probe or episode"
        return Verdict(status=Status.TOO_FEW_VALID, ok=False, why=
                       f"no {unit} was valid (of {counted(total.probes, unit)}), so nothing was measured; "
                       f"see the inconclusive reasons")
    if total.valid < min_valid * total.probes:
        return Verdict(status=Status.TOO_FEW_VALID, ok=False, why=
                       f"only {total.valid} of {total.probes} {items} were valid, fewer than --cachecheck-min-valid "
                       f"{min_valid:g} requires; see the inconclusive reasons")
    if gates:
        return Verdict(status=Status.PASSED, ok=True, why="; ".join(why for _, why in gates))
    return Verdict(status=Status.PASSED, ok=True, why="no valid probe differed" + (
        "" if episodes is None else " and no valid episode changed trajectory"))


def combine_verdicts(named: Sequence[Tuple[str, Verdict]]) -> Verdict:
    """A target matrix passes when every target passes; otherwise it takes the first failing target's
    status and names every failing target with its reason."""
    failing = [(name, v) for name, v in named if not v.ok]
    if not failing:
        ran = [(name, v) for name, v in named if v.status != Status.NO_PROBES]
        if not ran:
            return Verdict(status=Status.NO_PROBES, ok=True, why="no probe ran")
        return Verdict(status=Status.PASSED, ok=True, why="; ".join(f"{name}: {v.why}" for name, v in ran))
    if all(v.status == Status.INTERRUPTED for _, v in failing):
        return failing[0][1]
    return Verdict(status=failing[0][1].status, ok=False, why="; ".join(f"{name}: {v.why}" for name, v in failing))


def placement_problem(records: Sequence[Union[ProbeRecord, EpisodeRecord]], target: Optional[str] = None
                      ) -> Optional[str]:
    """Why ``target``'s outcomes cannot be trusted when two processes (xdist workers) sent probes or checks
    to a server it was measured on, in one session, else None. ``records``: the session's, of every target
    (two targets may reach one server); URLs that reach one server (:mod:`.identity`) count as one."""
    sent = [r for r in records if not (r.outcome == Outcome.ERROR and not r.requests)]  # else sent nothing
    if len({r.worker for r in sent}) < 2:
        return None
    urls = list(dict.fromkeys(str(r.server_url) for r in sent))
    server = {urls[i]: tuple(urls[j] for j in group) for group in server_groups(urls) for i in group}
    workers: Dict[Tuple[str, ...], set] = {}
    for r in sent:
        workers.setdefault(server[str(r.server_url)], set()).add(r.worker or "the main process")
    mine = {server[str(r.server_url)] for r in sent if r.target == target}
    shared = {group: sorted(w) for group, w in workers.items() if len(w) > 1 and group in mine}
    if not shared:
        return None
    group, names = next(iter(shared.items()))
    where = " and ".join(group) + (" (one server)" if len(group) > 1 else "")
    return (f"probes against {where} were measured by {len(names)} processes ({', '.join(names)}): requests "
            f"sent to one server in parallel are batched together, which changes answers by itself, so "
            f"no outcome of this run can be trusted; run without -n, or report this placement as a bug")


def recompute_reuse_cause(records: Sequence[ProbeRecord], mode: Optional[str]) -> Optional[str]:
    """When the recompute path reused cached tokens on every measured probe, name the likely causes."""
    measured = [r for r in records if r.outcome != Outcome.ERROR and r.checks is not None]
    if not measured or not all(r.checks.recompute_reused for r in measured if r.checks is not None):
        return None
    causes = {
        "one-server": "the server ignores cache_salt (a build or fork without salt support); use "
                      "two-servers mode with a second server that has prefix caching off",
        "two-servers": "both URLs reach the same server (a proxy or port forward answering for the second "
                       "port), or the nocache server was started with prefix caching on",
        "llama.cpp": "the server ignores cache_prompt: false (not a stock llama-server?)",
    }
    return ("the recompute path reused cached tokens on every probe: likely "
            + causes.get(mode or "", "the server does not honour the cache controls"))


@dataclass
class TargetInput:
    """What the session knows of one target before its records arrive."""

    name: Optional[str]  # None without a matrix
    url: str
    setup: Optional[Setup]  # as this process resolved it, if it did
    served: Optional[Dict[str, object]] = None


@dataclass
class EpisodeInput:
    """What the session collected of its episodes (records keyed by ``record_key``)."""

    episode_set: ProbeSet
    ids: Sequence[str]
    records: Mapping[str, EpisodeRecord]
    selected: Optional[Sequence[str]] = None  # record keys of the episode items selected to run


@dataclass
class EpisodeResult:
    records: List[EpisodeRecord]
    selected: List[str]
    tally: Tally
    comparison: Optional[Comparison]


@dataclass
class TargetResult:
    """One target's records, selection, comparison and verdict."""

    input: TargetInput
    records: List[ProbeRecord]
    selected: List[str]  # probe ids selected to run
    setup: Setup
    tally: Tally
    verdict: Verdict
    comparison: Optional[Comparison]
    episodes: Optional[EpisodeResult] = None

    @property
    def name(self) -> Optional[str]:
        return self.input.name

    def report(self, exit_status: Optional[int]) -> TargetReport:
        done = {r.id for r in self.records}
        summary = Summary(tally=self.tally, status=self.verdict.status, why=self.verdict.why, exit_status=exit_status,
                          not_run=[pid for pid in self.selected if pid not in done],
                          recompute_reuse_cause=recompute_reuse_cause(self.records, self.setup.mode))
        out = TargetReport(name=self.name, url=display_url(self.input.url), setup=self.setup, served=self.input.served,
                           summary=summary, probes=list(self.records), baseline=self.comparison)
        if self.episodes is not None:
            e = self.episodes
            ran = {r.id for r in e.records}
            out.episodes = list(e.records)
            out.episode_summary = EpisodeSummary.of(e.records, [i for i in e.selected if i not in ran])
            out.episode_baseline = e.comparison
        return out


@dataclass
class RunResult:
    """Every target's result and the session verdict; ``report()`` builds the run report."""

    settings: Settings
    probe_set: ProbeSet
    targets: List[TargetResult]
    verdict: Verdict
    checks: List[ProbeRecord] = field(default_factory=list)
    episodes: Optional[EpisodeInput] = None
    episode_checks: List[EpisodeRecord] = field(default_factory=list)

    @property
    def matrix(self) -> bool:
        return bool(self.settings.targets)

    def fail(self, status: Status, why: str) -> None:
        """Fail a verdict that passed, for a reason outside the records (the gate selected alone, a report
        that could not be written); a failing verdict keeps its status, with the reason added."""
        targets = [] if self.matrix else self.targets
        for holder in [self, *targets]:
            v = holder.verdict
            holder.verdict = (Verdict(status=status, ok=False, why=why) if v.ok
                              else Verdict(status=v.status, ok=False, why=f"{v.why}; {why}"))

    def report(self, exit_status: Optional[int]) -> RunReport:
        created = now()
        episode_set = self.episodes.episode_set if self.episodes is not None else None
        episode_checks = list(self.episode_checks)
        if not self.matrix:
            t = self.targets[0].report(exit_status)
            return RunReport(created=created, settings=self.settings.public(), probe_set=self.probe_set,
                             summary=t.summary, targets=[t], checks=list(self.checks), episode_set=episode_set,
                             episode_checks=episode_checks)
        targets = [t.report(None) for t in self.targets]
        first = self.targets[0]
        for result, target in zip(self.targets[1:], targets[1:]):
            # each target against the first, probe by probe, as against a baseline (where both ran)
            if result.records and first.records:
                target.vs_reference = compare(Baseline(first.records, self._env(first), created),
                                              result.records, self._env(result))
            if result.episodes and first.episodes and result.episodes.records and first.episodes.records:
                target.episode_vs_reference = compare(
                    Baseline(first.episodes.records, self._env(first, episode_set), created), result.episodes.records,
                    self._env(result, episode_set), unit="episode")
        total = Tally()
        for result in self.targets:
            total = total + result.tally
        summary = Summary(tally=total, status=self.verdict.status, why=self.verdict.why, exit_status=exit_status,
                          not_run=[record_key(pid, t.name) for t, r in zip(self.targets, targets)
                                   for pid in r.summary.not_run], per_target=True)
        return RunReport(created=created, settings=self.settings.public(), probe_set=self.probe_set, summary=summary,
                         targets=targets, checks=list(self.checks), episode_set=episode_set,
                         episode_checks=episode_checks)

    def _env(self, t: TargetResult, sample: Optional[ProbeSet] = None) -> Mapping[str, object]:
        return env_of(self.settings.public(), t.setup, sample or self.probe_set)


def _unexpected(record: Union[ProbeRecord, EpisodeRecord]) -> bool:
    """A valid record that differed with no reason to expect it: it fails the run (see :func:`expectation`)."""
    return record.outcome == Outcome.DIFFERENT and not record.expected


def summarise(settings: Settings, probe_set: ProbeSet, probe_ids: Sequence[str], targets: Sequence[TargetInput],
              records: Mapping[str, ProbeRecord], checks: Sequence[ProbeRecord], selected: Optional[Sequence[str]],
              baselines: Mapping[Optional[str], Baseline], interrupted: Union[bool, str],
              episodes: Optional[EpisodeInput] = None, episode_checks: Sequence[EpisodeRecord] = ()) -> RunResult:
    """The verdict of every target and of the session. ``records`` are keyed by ``record_key``;
    ``selected`` holds the record keys of the probe items selected to run (None: all); ``interrupted``
    may be the text of the verdict saying how the run was interrupted."""
    chosen = set(selected) if selected is not None else None
    chosen_episodes = set(episodes.selected) if episodes is not None and episodes.selected is not None else None
    every: List[Union[ProbeRecord, EpisodeRecord]] = [*records.values(), *checks, *episode_checks]
    if episodes is not None:
        every += episodes.records.values()  # every target's: two targets may reach one server
    results = []
    for target in targets:
        keys = [(pid, record_key(pid, target.name)) for pid in probe_ids]
        mine = [records[k] for _, k in keys if k in records]
        picked = [pid for pid, k in keys if chosen is None or k in chosen]
        setup = next((r.run for r in mine if r.run is not None), None) or target.setup \
            or Setup(mode=None, server=None)
        tally = Tally.of(mine)
        gates: List[Gate] = []
        if settings.max_rate is not None:
            gates.append(max_rate_gate(tally, settings.max_rate))
        comparison = None
        baseline = baselines.get(target.name)
        if baseline is not None and (mine or target.name is None):  # a deselected matrix target compares nothing
            comparison = compare(baseline, mine, env_of(settings.public(), setup, probe_set))
            gates.append(should_fail(comparison, settings.fail_on, unexpected=[r.id for r in mine if _unexpected(r)]))
        episode_result = None
        if episodes is not None:
            ekeys = [(eid, record_key(eid, target.name)) for eid in episodes.ids]
            emine = [episodes.records[k] for _, k in ekeys if k in episodes.records]
            epicked = [eid for eid, k in ekeys if chosen_episodes is None or k in chosen_episodes]
            setup = setup if setup.mode is not None else next(
                (r.run for r in emine if r.run is not None), None) or setup
            etally = Tally.of(emine)
            if settings.max_rate is not None and emine:
                gates.append(max_rate_gate(etally, settings.max_rate, "trajectory change rate", "episode"))
            ecomparison = None
            if baseline is not None and baseline.episodes is not None and (emine or target.name is None):
                ecomparison = compare(Baseline(baseline.episodes, baseline.episode_env, baseline.created),
                                      emine, env_of(settings.public(), setup, episodes.episode_set),
                                      unit="episode")
                gates.append(should_fail(ecomparison, settings.fail_on, unit="episode",
                                         unexpected=[r.id for r in emine if _unexpected(r)]))
            episode_result = EpisodeResult(emine, epicked, etally, ecomparison)
        if settings.gate_on == "flips":
            checked = (CheckTally.of(mine), CheckTally.of(episode_result.records) if episode_result else None)
            if settings.max_flip_rate is not None:
                gates += [max_flip_rate_gate(t, settings.max_flip_rate, unit)
                          for t, unit in zip(checked, ("probe", "episode")) if t is not None]
            if mine or (episode_result and episode_result.records):
                gates.append(flips_gate(*checked, tally.different + (episode_result.tally.different
                                                                     if episode_result else 0)))
        if settings.record:
            gates.append(record_gate(tally, episode_result.tally if episode_result is not None else None))
        erecords = episode_result.records if episode_result is not None else []
        unexpected = (sum(1 for r in mine if _unexpected(r)), sum(1 for r in erecords if _unexpected(r)))
        flipped = (sum(1 for r in mine if _unexpected(r) and r.flip), sum(1 for r in erecords if _unexpected(r) and r.flip))
        not_measured = [k for pid, k in keys if k not in records and (chosen is None or k in chosen)]
        if episodes is not None:
            not_measured += [k for _, k in ekeys if k not in episodes.records
                             and (chosen_episodes is None or k in chosen_episodes)]
        verdict = judge(tally, settings.min_valid, interrupted, gates or None,
                        placement_problem(every, target.name),
                        episode_result.tally if episode_result is not None else None, unexpected, not_measured,
                        sum(1 for c in [*checks, *episode_checks]
                            if c.target == target.name and c.outcome == Outcome.ERROR), flipped)
        results.append(TargetResult(target, mine, picked, setup, tally, verdict, comparison, episode_result))
    if settings.targets:
        verdict = combine_verdicts([(str(t.name), t.verdict) for t in results])
    else:
        verdict = results[0].verdict
    result = RunResult(settings, probe_set, results, verdict, list(checks), episodes, list(episode_checks))
    return result
