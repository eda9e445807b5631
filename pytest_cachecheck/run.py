"""The session's verdict: collect the probe records per target, decide which probes were selected and
which did not run, apply the gates (minimum valid share, max rate, baseline policy), check that no two
processes measured one server, pair every matrix target with the first, and build the run report.

Knows nothing about pytest: the reporter feeds it records and asks for the verdict, then the report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .baseline import Baseline, compare, env_of, should_fail
from .identity import server_groups
from .kinds import BATCH, EPISODE, LOADED, ORDER, PROBE, Kind, all_of, any_of
from .model import (BatchRecord, BatchShape, BatchSummary, CheckTally, Comparison, EpisodeRecord,
                    EpisodeSummary, LoadedRecord, LoadedSummary, OrderConditions, OrderRecord, OrderSummary,
                    Outcome, ProbeRecord, ProbeSet, RunReport, Setup, Status, Summary, Tally, TargetReport, Verdict,
                    record_key)
from .redact import display_url
from .settings import Settings
from .text import counted

Gate = Tuple[bool, str]  # (fails?, why)
Record = Union[ProbeRecord, EpisodeRecord, BatchRecord, LoadedRecord, OrderRecord]


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


def max_rate_gate(t: Tally, max_rate: float, kind: Kind = PROBE) -> Gate:
    """--cachecheck-max-rate: fail when different / valid exceeds max_rate."""
    return _rate_gate(t.different, t.valid, max_rate, kind.rate_name, "--cachecheck-max-rate",
                      f"no valid {kind.unit} to measure a rate on")


def max_flip_rate_gate(t: Optional[CheckTally], max_rate: float, unit: str = "probe") -> Gate:
    """--cachecheck-max-flip-rate: fail when flips / valid items with checks exceeds max_rate."""
    return _rate_gate(t.flips if t is not None else 0, t.items if t is not None else 0, max_rate,
                      f"{unit} flip rate", "--cachecheck-max-flip-rate",
                      f"no valid {unit} with checks to measure a flip rate on")


def flips_gate(checked: Sequence[Optional[CheckTally]], divergences: int) -> Gate:
    """--cachecheck-gate-on flips: fails when no valid item has checks (nothing for the gate to judge), else
    says what it judged (each flip fails the run by itself, see :func:`expectation`). ``checked``: each kind's
    outcome checks (None where no item had any)."""
    items = sum(t.items for t in checked if t is not None)
    if not items:
        return True, ("--cachecheck-gate-on flips: no valid probe or episode has outcome checks ('expect') that "
                      "could be evaluated, so no flip could be seen")
    flips = sum(t.flips for t in checked if t is not None)
    return False, (f"gated on flips: {counted(flips, 'flip')} in {counted(items, 'valid item')} with checks; "
                   f"{counted(divergences - flips, 'divergence')} flipped no outcome")


def record_gate(tallies: Sequence[Tuple[Kind, Tally]]) -> Gate:
    """--cachecheck-record: divergences are what a baseline records, never a failure."""
    what = ", ".join(f"{t.different} of {counted(t.valid, 'valid ' + k.unit)} {k.changed}"
                     for k, t in tallies)
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


@dataclass
class Count:
    """One kind's part of a verdict: its tally, how many of its valid items differed with no reason to
    expect it (:func:`expectation`: each fails the run), and how many of those flipped an outcome check."""

    kind: Kind
    tally: Tally
    unexpected: int = 0
    flipped: int = 0
    conditions: str = ""  # what the kind measured under, named after its divergences: the batch shape


def judge(counts: Union[Tally, Sequence[Count]], min_valid: float, interrupted: Union[bool, str] = False,
          gates: Optional[Sequence[Gate]] = None, unreliable: Optional[str] = None,
          not_measured: Sequence[str] = (), check_errors: int = 0) -> Verdict:
    """One target's verdict over its items, of every kind configured (``counts``: one per kind; a bare
    Tally: probes only). ``gates`` (max rate, baseline policy, recording) decide what the unexpected
    divergences do not. ``unreliable`` says why no outcome can be trusted (it overrides everything).
    ``interrupted`` may be the text saying how. ``not_measured``: the record keys of the selected items that
    ended without a record; a run with any never passes, nor does one without a valid item.
    ``check_errors``: the tests' own ``cachecheck.check()`` and ``cachecheck.episode()`` measurements that
    failed with a request error (an error, never a pass)."""
    if isinstance(counts, Tally):
        counts = [Count(PROBE, counts)]
    kinds = [c.kind for c in counts]
    total = Tally()
    for c in counts:
        total = total + c.tally
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
    if any(c.unexpected for c in counts):
        why = []
        for c in counts:
            n, flipped, unit = c.unexpected, c.flipped, f"valid {c.kind.unit}"
            if n and flipped == n:
                why.append(f"{counted(n, unit)} flipped the outcome of {'its' if n == 1 else 'their'} checks")
            elif n:
                whose = "its" if flipped == 1 else "their"
                why.append(f"{counted(n, unit)} {c.kind.differed}" + (
                    f" ({flipped} flipped the outcome of {whose} checks)" if flipped else "")
                    + (f" ({c.conditions})" if c.conditions else ""))
        return Verdict(status=Status.DIVERGED, ok=False, why="; ".join(why))
    if total.errors or check_errors:
        why = [f"{counted(total.errors, any_of(kinds))} failed with a request or server error"] if total.errors else []
        if check_errors:
            why.append(f"{counted(check_errors, 'check of a test', 'checks of tests')} (cachecheck.check() or "
                       f".episode()) failed with a request or server error")
        return Verdict(status=Status.ERRORS, ok=False, why="; ".join(why))
    if not_measured:
        shown = ", ".join(not_measured[:5]) + (f" and {len(not_measured) - 5} more" if not_measured[5:] else "")
        return Verdict(Status.NOT_MEASURED, False,
                       f"{counted(len(not_measured), 'selected probe or episode', 'selected probes or episodes')} "
                       f"ended without a measurement ({shown}): cut by a timeout, a crash, -x/--maxfail or "
                       f"another plugin; a probe that was not measured is never a pass")
    if total.valid == 0:
        unit = any_of(kinds)
        return Verdict(Status.TOO_FEW_VALID, False,
                       f"no {unit} was valid (of {counted(total.probes, unit)}), so nothing was measured; "
                       f"see the inconclusive reasons")
    if total.valid < min_valid * total.probes:
        return Verdict(Status.TOO_FEW_VALID, False,
                       f"only {total.valid} of {total.probes} {all_of(kinds)} were valid, fewer than "
                       f"--cachecheck-min-valid {min_valid:g} requires; see the inconclusive reasons")
    if gates:
        return Verdict(status=Status.PASSED, ok=True, why="; ".join(why for _, why in gates))
    return Verdict(status=Status.PASSED, ok=True, why=" and ".join(k.none_differed for k in kinds))


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
    return Verdict(failing[0][1].status, False, "; ".join(f"{name}: {v.why}" for name, v in failing))


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
class KindInput:
    """What the session collected of one kind of item: its set (None: the run has no items of this kind,
    only perhaps the tests' own measurements), the ids in order, the records by ``record_key``, the tests' own
    measurements of this kind (``cachecheck.check()`` / ``.episode()``) and the record keys of the items
    selected to run (None: all)."""

    kind: Kind
    item_set: Optional[ProbeSet]
    ids: Sequence[str]
    records: Mapping[str, Record]
    checks: Sequence[Record] = ()
    selected: Optional[Sequence[str]] = None


@dataclass
class KindResult:
    """One target's items of one kind: their records, the ids selected to run, the tally, the comparison
    with the baseline."""

    kind: Kind
    records: List[Record]
    selected: List[str]
    tally: Tally
    comparison: Optional[Comparison]

    @property
    def not_run(self) -> List[str]:
        ran = {r.id for r in self.records}
        return [i for i in self.selected if i not in ran]


@dataclass
class TargetResult:
    """One target's results, one per kind configured (the probes always), its setup and verdict."""

    input: TargetInput
    setup: Setup
    verdict: Verdict
    kinds: Dict[str, KindResult]

    @property
    def name(self) -> Optional[str]:
        return self.input.name

    @property
    def probes(self) -> KindResult:
        return self.kinds[PROBE.name]

    @property
    def episodes(self) -> Optional[KindResult]:
        return self.kinds.get(EPISODE.name)

    @property
    def batches(self) -> Optional[KindResult]:
        return self.kinds.get(BATCH.name)

    @property
    def loaded(self) -> Optional[KindResult]:
        return self.kinds.get(LOADED.name)

    @property
    def orders(self) -> Optional[KindResult]:
        return self.kinds.get(ORDER.name)

    def report(self, exit_status: Optional[int], shape: Optional[BatchShape] = None,
               order: Optional[OrderConditions] = None) -> TargetReport:
        p = self.probes
        summary = Summary(tally=p.tally, status=self.verdict.status, why=self.verdict.why, exit_status=exit_status,
                          not_run=p.not_run,
                          recompute_reuse_cause=recompute_reuse_cause(p.records, self.setup.mode))  # type: ignore[arg-type]
        out = TargetReport(name=self.name, url=display_url(self.input.url), setup=self.setup, served=self.input.served,
                           summary=summary, probes=list(p.records), baseline=p.comparison)  # type: ignore[arg-type]
        e = self.episodes
        if e is not None:
            out.episodes = list(e.records)  # type: ignore[arg-type]
            out.episode_summary = EpisodeSummary.of(e.records, e.not_run)  # type: ignore[arg-type]
            out.episode_baseline = e.comparison
        b = self.batches
        if b is not None:
            out.batches = list(b.records)  # type: ignore[arg-type]
            out.batch_summary = BatchSummary.of(out.batches, shape or BatchShape(), b.not_run)
        x = self.loaded
        if x is not None:
            out.loaded = list(x.records)  # type: ignore[arg-type]
            out.loaded_summary = LoadedSummary.of(out.loaded, shape or BatchShape(), x.not_run)
        o = self.orders
        if o is not None:
            out.orders = list(o.records)  # type: ignore[arg-type]
            out.order_summary = OrderSummary.of(out.orders, order or OrderConditions(), o.not_run)
        return out


@dataclass
class RunResult:
    """Every target's result and the session verdict; ``report()`` builds the run report."""

    settings: Settings
    inputs: List[KindInput]  # the probes' first
    targets: List[TargetResult]
    verdict: Verdict

    @property
    def matrix(self) -> bool:
        return bool(self.settings.targets)

    @property
    def probe_set(self) -> ProbeSet:
        assert self.inputs[0].item_set is not None
        return self.inputs[0].item_set

    def _input(self, kind: Kind) -> Optional[KindInput]:
        return next((i for i in self.inputs if i.kind == kind), None)

    def fail(self, status: Status, why: str) -> None:
        """Fail a verdict that passed, for a reason outside the records (a report that could not be
        written); a failing verdict keeps its status, with the reason added."""
        targets = [] if self.matrix else self.targets
        for holder in [self, *targets]:
            v = holder.verdict
            holder.verdict = Verdict(status, False, why) if v.ok else Verdict(v.status, False, f"{v.why}; {why}")

    def report(self, exit_status: Optional[int]) -> RunReport:
        created = now()
        episodes = self._input(EPISODE)
        episode_set = episodes.item_set if episodes is not None else None  # None: no episode items
        checks = list(self.inputs[0].checks)
        episode_checks = list(episodes.checks) if episodes is not None else []
        shape, order = BatchShape.of(self.settings), OrderConditions.of(self.settings)
        if not self.matrix:
            t = self.targets[0].report(exit_status, shape, order)
            return RunReport(created=created, settings=self.settings.public(), probe_set=self.probe_set,
                             summary=t.summary, targets=[t], checks=checks, episode_set=episode_set,
                             episode_checks=episode_checks)  # type: ignore[arg-type]
        targets = [t.report(None, shape, order) for t in self.targets]
        first = self.targets[0]
        for result, target in zip(self.targets[1:], targets[1:]):
            # each target against the first, item by item, as against a baseline (where both ran)
            if result.probes.records and first.probes.records:
                target.vs_reference = compare(Baseline(first.probes.records, self._env(first), created),
                                              result.probes.records, self._env(result))
            e, e0 = result.episodes, first.episodes
            if e is not None and e0 is not None and e.records and e0.records:
                target.episode_vs_reference = compare(
                    Baseline(e0.records, self._env(first, episode_set), created), e.records,
                    self._env(result, episode_set), unit="episode")
        total = Tally()
        for result in self.targets:
            total = total + result.probes.tally
        summary = Summary(tally=total, status=self.verdict.status, why=self.verdict.why, exit_status=exit_status,
                          not_run=[record_key(pid, t.name) for t, r in zip(self.targets, targets)
                                   for pid in r.summary.not_run], per_target=True)
        return RunReport(created=created, settings=self.settings.public(), probe_set=self.probe_set, summary=summary,
                         targets=targets, checks=checks, episode_set=episode_set,
                         episode_checks=episode_checks)  # type: ignore[arg-type]

    def _env(self, t: TargetResult, sample: Optional[ProbeSet] = None) -> Mapping[str, object]:
        return env_of(self.settings.public(), t.setup, sample or self.probe_set)


def _unexpected(record: Record) -> bool:
    """A valid record that differed with no reason to expect it: it fails the run (see :func:`expectation`)."""
    return record.outcome == Outcome.DIFFERENT and not record.expected


def _baseline_of(baseline: Optional[Baseline], kind: Kind) -> Optional[Baseline]:
    """The baseline's side of one kind (None when it measured none of them)."""
    if baseline is None or kind == PROBE:
        return baseline
    if kind == EPISODE and baseline.episodes is not None:
        return Baseline(records=baseline.episodes, env=baseline.episode_env, created=baseline.created)
    return None


def _conditions(kind: Kind, settings: Settings) -> str:
    """What a kind measured under, as its verdict names it: the batch kind's and the cache under load's
    background, the order kind's passes; nothing for the others."""
    shape, order = BatchShape.of(settings), OrderConditions.of(settings)
    if kind == ORDER:
        return order.label() if order is not None else ""
    if shape is None:
        return ""
    return shape.label() if kind == BATCH else shape.load_label() if kind == LOADED else ""


def summarise(settings: Settings, inputs: Sequence[KindInput], targets: Sequence[TargetInput],
              baselines: Mapping[Optional[str], Baseline], interrupted: Union[bool, str]) -> RunResult:
    """The verdict of every target and of the session, from what each kind measured (``inputs``, the
    probes' first) and what was selected but not measured; ``interrupted`` may be the text of the verdict
    saying how the run was interrupted. A kind without an item set counts only its tests' measurements."""
    every = [r for i in inputs for r in [*i.records.values(), *i.checks]]  # every target's: two may share a server
    checks = [c for i in inputs for c in i.checks]
    inputs, kind_inputs = list(inputs), [i for i in inputs if i.item_set is not None]
    results = []
    for target in targets:
        baseline = baselines.get(target.name)
        mine: Dict[str, List[Record]] = {}
        keys: Dict[str, List[Tuple[str, str]]] = {}
        for i in kind_inputs:
            keys[i.kind.name] = [(id_, record_key(id_, target.name)) for id_ in i.ids]
            mine[i.kind.name] = [i.records[k] for _, k in keys[i.kind.name] if k in i.records]
        runs = [next((r.run for r in mine[i.kind.name] if r.run is not None), None) for i in kind_inputs]
        setup = runs[0] or target.setup or Setup(mode=None, server=None)
        if setup.mode is None:
            setup = next((r for r in runs[1:] if r is not None), setup)
        gates: List[Gate] = []
        kinds: Dict[str, KindResult] = {}
        not_measured: List[str] = []
        for i in kind_inputs:
            k, records = i.kind, mine[i.kind.name]
            chosen = set(i.selected) if i.selected is not None else None
            tally = Tally.of(records)
            # the probes' rate gate judges even a run without one (it says so); another kind's, when it ran
            if settings.max_rate is not None and (k == PROBE or records):
                gates.append(max_rate_gate(tally, settings.max_rate, k))
            comparison = None
            base = _baseline_of(baseline, k)
            if base is not None and (records or target.name is None):  # a deselected target compares nothing
                comparison = compare(base, records, env_of(settings.public(), setup, i.item_set), unit=k.name)
                gates.append(should_fail(comparison, settings.fail_on, unit=k.name,
                                         unexpected=[r.id for r in records if _unexpected(r)]))
            kinds[k.name] = KindResult(kind=k, records=records, tally=tally, comparison=comparison,
                                       selected=[id_ for id_, key in keys[k.name] if chosen is None or key in chosen])
            not_measured += [key for _, key in keys[k.name] if key not in i.records and (chosen is None or key in chosen)]
        results_of = list(kinds.values())
        if settings.gate_on == "flips":
            checked = [CheckTally.of(kr.records) for kr in results_of]
            if settings.max_flip_rate is not None:
                gates += [max_flip_rate_gate(t, settings.max_flip_rate, kr.kind.unit)
                          for t, kr in zip(checked, results_of) if t is not None]
            if any(kr.records for kr in results_of):
                gates.append(flips_gate(checked, sum(kr.tally.different for kr in results_of)))
        if settings.record:
            gates.append(record_gate([(kr.kind, kr.tally) for kr in results_of]))
        counts = [Count(kind=kr.kind, tally=kr.tally, unexpected=sum(1 for r in kr.records if _unexpected(r)),
                        flipped=sum(1 for r in kr.records if _unexpected(r) and r.flip),
                        conditions=_conditions(kr.kind, settings))
                  for kr in results_of]
        verdict = judge(counts, settings.min_valid, interrupted, gates or None, placement_problem(every, target.name),
                        not_measured, sum(1 for c in checks if c.target == target.name and c.outcome == Outcome.ERROR))
        results.append(TargetResult(input=target, setup=setup, verdict=verdict, kinds=kinds))
    verdict = (combine_verdicts([(str(t.name), t.verdict) for t in results]) if settings.targets
               else results[0].verdict)
    return RunResult(settings=settings, inputs=inputs, targets=results, verdict=verdict)
