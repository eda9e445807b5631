"""Every line the plugin prints: the header, the session summary, the matrix table, the baseline
comparison and the shareable result block. Functions return lines; the reporter writes them (through
the redactor). Knows nothing about pytest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from . import __version__, attribution
from .kinds import BATCH, EPISODE, LOADED, ORDER, PROBE, Kind
from .model import (STILL_SAME, CheckTally, Comparison, ProbeSet, RunReport, Setup, Tally, TargetReport, Verdict,
                    shown)
from .redact import display_url
from .session import CheckSession
from .settings import reproduce_args
from .stats import format_p
from .text import counted, printable


@dataclass
class Line:
    text: str
    markup: Dict[str, bool] = field(default_factory=dict)


@dataclass
class Sep:
    char: str
    title: str


Out = Union[Line, Sep]
#: the most rows of a comparison table printed (the JSON report and the HTML page hold every row)
TABLE_ROWS = 50


def divergence_line(t: Tally) -> str:
    if not t.valid:
        return "no valid probe: no turn-2 answers could be compared."
    return (f"{t.different} of {counted(t.valid, 'valid probe')} gave a different turn-2 answer on the cache "
            f"path.")


def rate_line(t: Tally, kind: Kind = PROBE) -> Optional[str]:
    """The rate of a kind's valid items that differed, with its 95% Wilson interval (None: none valid)."""
    rate = t.rate
    if rate is None:
        return None
    lo, hi = rate.ci95
    return (f"{kind.rate_name} {rate.value:.1%} (95% Wilson interval {lo:.1%} to {hi:.1%}, "
            f"{counted(t.valid, 'valid ' + kind.unit)})")


def check_lines(t: Optional[CheckTally], unit: str = "probe", ids: bool = True) -> List[str]:
    """The outcome checks: each path's accuracy, the flips each way with the exact McNemar p, (``ids``) which
    items flipped, and the items whose check could not be evaluated. Nothing when no item had checks."""
    if t is None:
        return []
    if not t.items:
        return [f"outcome checks: no valid {unit} with checks"
                + (f" ({counted(t.check_errors, 'check error')})" if t.check_errors else "")]
    acc = [f"{path} path {passed}/{t.items} ({passed / t.items:.1%})"
           for path, passed in (("cache", t.cache_passed), ("recompute", t.recompute_passed))]
    out = [f"outcome checks: {counted(t.items, 'valid ' + unit)} with checks | accuracy: {acc[0]}, {acc[1]} | "
           f"flips: {t.cache_fails} cache fails, {t.cache_passes} cache passes (exact McNemar p = "
           f"{format_p(t.mcnemar_p)})"]
    if ids and t.flipped:
        out.append(f"flipped: {', '.join(t.flipped[:10])}" + (f" and {len(t.flipped) - 10} more" if t.flipped[10:]
                                                             else ""))
    if t.check_errors:
        out.append(f"outcome checks: {counted(t.check_errors, unit)} whose check could not be evaluated")
    return out


# -- the header ---------------------------------------------------------------------------------------------
def header(session: CheckSession, setup_errors: Mapping[Optional[str], Optional[str]]) -> List[str]:
    """The plugin's lines in pytest's header: servers, the setup of each, the probes, how to reproduce.
    ``setup_errors``: target -> why its setup is not usable; a target missing from it was not contacted."""
    s = session.settings
    lines = [f"cachecheck: note: {note}" for note in s.notes]
    if len(s.replicas) > 1:
        lines.append(f"cachecheck: {len(s.replicas)} servers given: with -n N each xdist worker owns one; "
                     f"without -n only the first is used")
    if s.targets:
        lines.append(f"cachecheck: target matrix of {len(s.targets)}: every probe runs on "
                     + ", ".join(f"{n} ({display_url(u)})" for n, u in s.targets))
    if session.served is not None:
        served = session.served
        if served.tools:
            what = (f"the tool-call demo model ({served.model.name}, with Qwen2.5's chat template, as the "
                    "episodes call tools): tiny, RANDOM weights generated on this machine, shaped to make "
                    "real tool calls to the built-in episodes' tools; without tools it answers with "
                    "<tool_call> markers over and over, so its probes and plain episodes show little; the "
                    "prompt cache it exercises is real")
        elif served.demo:
            what = (f"the demo model ({served.model.name}): tiny, RANDOM weights generated on this machine, "
                    "so its answers are word salad; the prompt cache it exercises is real")
        else:
            what = served.model.name
        lines.append(f"cachecheck: serving {what}")
        if served.demo:
            lines.append("cachecheck: expect the demo to end red: on random weights the cache path and the "
                         f"recompute path part ways on some {'episodes' if served.tools else 'probes'} "
                         "(failed items, verdict FAIL); that is the measurement working, not a fault of your "
                         "setup")
        lines.append(f"cachecheck: llama-server at {served.server.url}, log {served.server.log_path}")
    tolerances = set()
    for name, runner in session.runners.items():
        label = "cachecheck: " + (f"target {name}: " if name is not None else "")
        error = setup_errors.get(name, NOT_CONTACTED)
        setup = runner.setup if not error else None
        tolerances.add(setup.tolerance(s.hit_tolerance) if setup is not None else s.hit_tolerance)
        lines += [printable(session.redactor.scrub(line), 4000)
                  for line in setup_line(label, s.mode, setup, error, s.hit_tolerance)]
    tolerance = str(tolerances.pop()) if len(tolerances) == 1 else "per target (see above)"
    lines += [f"cachecheck: {counted(len(session.probes), 'probe')} ({session.probe_set.name}) | max_tokens "
              f"{s.max_tokens} | hit_tolerance {tolerance}",
              "cachecheck: reproduce with: pytest " + session.redactor.scrub(" ".join(reproduce_args(s)))]
    shape = session.batch_shape
    if shape is not None:
        lines.insert(-1, f"cachecheck: {shape.label()}: each probe is measured again, its turn 2 alone and "
                         f"amid those requests in flight (items cachecheck::batch[...])")
        if s.load_cache:
            lines.insert(-1, f"cachecheck: {shape.load_label()}: each probe's cache and recompute paths are "
                             f"measured again, every turn 2 amid those requests in flight (items "
                             f"cachecheck::loaded[...])")
    conditions = session.order_conditions
    if conditions is not None:
        lines.insert(-1, f"cachecheck: {conditions.label()}: the probe set is sent twice as an application "
                         f"would, in file order, then reversed (items cachecheck::order[...])")
    return lines


NOT_CONTACTED = "not contacted (--collect-only)"


def setup_line(label: str, configured_mode: str, setup: Optional[Any], error: Optional[str],
               configured_tolerance: Optional[int] = None) -> List[str]:
    """Header lines for one target: mode, server, model, a raised tolerance and setup warnings.
    ``setup`` is the resolved ``servers.ServerSetup`` (None with ``error``)."""
    if setup is None:
        if error == NOT_CONTACTED:
            return [f"{label}mode {configured_mode} | server {error}"]
        return [f"{label}mode {configured_mode} | server not usable: {error}"]
    server = setup.cache.info
    how = " (auto-detected)" if configured_mode == "auto" else ""
    desc = (f"{label}mode {setup.mode}{how} | server {server.kind} {shown(server.build or '')} | model "
            f"{shown(server.model or '?')}")
    if setup.hit_tolerance is not None:
        desc += (f" | hit_tolerance {setup.hit_tolerance} (raised"
                 + (f" from {configured_tolerance}" if configured_tolerance is not None else "")
                 + f" for the server's {setup.hit_tolerance + 1}-token cache blocks)")
    return [desc] + setup_check_lines(label, setup, None)


def setup_check_lines(label: str, setup: Optional[Any], error: Optional[str],
                      skip: Sequence[str] = ()) -> List[str]:
    """What the setup checks that generate found for one target: the error that makes its server unusable,
    else their warnings (but those in ``skip``: the header showed them)."""
    if error:
        return [f"{label}server not usable: {error}"]
    return [f"{label}warning: {w}" for w in (setup.warnings if setup is not None else []) if w not in skip]


# -- the summary --------------------------------------------------------------------------------------------
def comparison_lines(c: Comparison, verbose: bool = False, unit: str = "probe") -> List[str]:
    """A table (id, before, after, status), most important first and at most TABLE_ROWS rows, then the
    verdict, the rates and the environment notes and warnings. Unless ``verbose``, "still same" rows are
    folded into one line. ``unit``: what was compared, ``probe`` or ``episode``."""
    rate = "divergence rate" if unit == "probe" else "trajectory change rate"
    listed = [r for r in c.rows if verbose or r.status != STILL_SAME]
    folded = len(c.rows) - len(listed)
    shown = listed[:TABLE_ROWS]
    title = "comparison with the baseline"
    if c.baseline_created:
        title += f" of {c.baseline_created}"
    out = [title]
    if shown:
        w_id = max(2, min(40, max(len(r.id) for r in shown)))
        w_b = max(6, *(len(r.before or "-") for r in shown))
        w_a = max(5, *(len(r.after or "-") for r in shown))
        out.append(f"  {'id':<{w_id}}  {'before':<{w_b}}  {'after':<{w_a}}  status")
        for r in shown:
            ident = r.id if len(r.id) <= w_id else r.id[:w_id - 3] + "..."
            before, after = r.before or "-", r.after or "-"
            out.append(f"  {ident:<{w_id}}  {before:<{w_b}}  {after:<{w_a}}  {r.status}")
        if len(listed) > len(shown):
            out.append(f"  ... and {len(listed) - len(shown)} more (see the JSON report)")
    if folded:
        out.append(f"  ({counted(folded, unit)} still same" + ("" if verbose else "; -v lists them") + ")")
    if not c.rows:
        out.append(f"  (no {unit}s in either run)")
    out.append("counts: " + " | ".join(f"{s} {n}" for s, n in c.counts.items() if n))
    out.append(f"baseline verdict: {c.verdict} ({c.why}; exact McNemar p = {format_p(c.mcnemar_p)})")
    base = c.baseline_rate.text() if c.baseline_rate else f"n/a (no valid {unit}s)"
    cur = c.current_rate.text() if c.current_rate else f"n/a (no valid {unit}s)"
    out.append(f"{rate}: baseline {base} -> now {cur}")
    out.extend(c.env_warnings)
    return out


def matrix_lines(targets: Sequence[TargetReport]) -> List[str]:
    """The side-by-side table of a target matrix: counts, rate with its 95% interval, and the paired
    comparison of each target with the first (probes that diverged on one only, exact McNemar p)."""
    ref = str(targets[0].name)
    header = ("target", "server", "valid", "same", "diff", "inconcl", "errors", "rate", "95% interval", f"vs {ref}")
    rows = [header]
    for i, t in enumerate(targets):
        tally, rate, cmp = t.summary.tally, t.summary.rate, t.vs_reference
        vs = "(reference)"
        if not tally.probes:
            vs = "not run (no probe of this target was selected)"
        elif i and not targets[0].summary.tally.probes:
            vs = f"n/a ({ref} ran no probe)"
        elif i and cmp is not None:
            vs = (f"{cmp.b} diverged only here, {cmp.c} only on {ref}; McNemar p = {format_p(cmp.mcnemar_p)}")
        server = t.setup.server
        rows.append((str(t.name), server.label() if server else "?", str(tally.valid), str(tally.same),
                     str(tally.different), str(tally.inconclusive), str(tally.errors),
                     f"{rate.value:.1%}" if rate else "n/a",
                     f"{rate.ci95[0]:.1%} to {rate.ci95[1]:.1%}" if rate else "n/a", vs))
    widths = [min(48, max(len(r[c]) for r in rows)) for c in range(len(header) - 1)]
    out = []
    for r in rows:
        cells = [(r[c] if len(r[c]) <= widths[c] else r[c][:widths[c] - 3] + "...").ljust(widths[c])
                 for c in range(len(widths))]
        out.append("  ".join(cells + [r[-1]]).rstrip())
    return out


def result_block(t: Tally, setup: Setup, settings: Mapping[str, Any], probe_set: ProbeSet,
                 counts: bool = True) -> List[str]:
    """Lines meant for sharing: counts and settings, no URL, no key, no conversation text; the probes' counts
    and rate only with ``counts`` (not when only other kinds ran)."""
    server = setup.server
    tolerance = setup.hit_tolerance if setup.hit_tolerance is not None else settings.get("hit_tolerance")
    lines = [
        f"pytest-cachecheck {__version__} | mode {setup.mode or '?'} | server {server.kind if server else '?'}"
        f" {shown((server.build if server else None) or '')}".rstrip()
        + f" | model {shown((server.model if server else None) or '?')}",
        f"probe set {probe_set.name} ({probe_set.fingerprint[:19]}) | max_tokens {settings.get('max_tokens')} | "
        f"hit_tolerance {tolerance}" + (" | skip_hit_check" if settings.get("skip_hit_check") else ""),
    ]
    if not counts:
        return lines
    lines += [f"probes {t.probes} | valid {t.valid} | same {t.same} | different {t.different} | "
              f"inconclusive {t.inconclusive} | errors {t.errors}", divergence_line(t)]
    rate = rate_line(t)
    if rate:
        lines.append(rate)
    return lines


def _target_lines(t: TargetReport, label: str, baseline_path: Optional[str], verbose: bool) -> List[Out]:
    """Errors, the likely cause of recompute reuse, setup warnings and the baseline comparison."""
    out: List[Out] = []
    errored = [r.reason for r in t.probes if r.outcome == "error"]
    if errored:
        out.append(Line(f"{label}errors: {len(errored)}; the first: {errored[0][:240]}", {"red": True}))
    if t.summary.recompute_reuse_cause:
        out.append(Line(f"{label}cause: " + t.summary.recompute_reuse_cause, {"yellow": True}))
    for warning in t.setup.setup_warnings:
        out.append(Line(f"{label}setup warning: " + warning, {"yellow": True}))
    if t.baseline is not None:
        out.append(Sep("-", f"cachecheck baseline comparison ({baseline_path})"
                       + (f", target {t.name}" if t.name is not None else "")))
        out += [Line(line) for line in comparison_lines(t.baseline, verbose)]
    return out


def trajectory_line(t: Tally) -> str:
    return f"{t.different} of {t.valid} valid episodes took a different trajectory on the cache path."


def trajectory_rate_line(t: Tally) -> Optional[str]:
    return rate_line(t, EPISODE)


def _episode_lines(t: TargetReport, label: str, baseline_path: Optional[str], verbose: bool) -> List[Out]:
    """The episodes of one target: counts, the rate with its interval, where trajectories parted, both
    rates side by side, the first error and the baseline comparison of the episodes."""
    s = t.episode_summary
    if s is None or not s.tally.probes:
        return []
    e = s.tally
    out: List[Out] = [
        Line(f"{label}episodes: {e.probes} | valid: {e.valid} (same {e.same}, changed {e.different}) | "
             f"inconclusive: {e.inconclusive} | errors: {e.errors}"),
        Line(label + trajectory_line(e), {"bold": True, "red": bool(e.different)})]
    rate = trajectory_rate_line(e)
    if rate:
        out.append(Line(label + rate))
    if s.parting_steps:
        out.append(Line(f"{label}first parting step: "
                        + ", ".join(f"step {k}: {v}" for k, v in s.parting_steps.items())))
    out += [Line(label + line) for line in check_lines(t.check_tallies()[1], "episode")]
    probes = t.summary.tally.rate
    if probes is not None and e.rate is not None:
        out.append(Line(f"{label}side by side: two-turn probes {probes.text()}; episodes {e.rate.text()}"))
    errored = [r.reason for r in t.episodes or [] if r.outcome == "error"]
    if errored:
        out.append(Line(f"{label}episode errors: {len(errored)}; the first: {errored[0][:240]}", {"red": True}))
    if t.episode_baseline is not None:
        out.append(Sep("-", f"cachecheck baseline comparison of the episodes ({baseline_path})"
                       + (f", target {t.name}" if t.name is not None else "")))
        out += [Line(line) for line in comparison_lines(t.episode_baseline, verbose, unit="episode")]
    return out


def kind_count_line(s: Optional[Any], kind: Kind) -> Optional[str]:
    """A conditioned kind's counts (``s``: its summary, a BatchSummary or OrderSummary), naming the
    conditions; None when the kind is off or none ran."""
    if s is None or not s.tally.probes:
        return None
    b = s.tally
    return (f"{s.label()}: {kind.plural} {b.probes} | valid {b.valid} (same {b.same}, different "
            f"{b.different}) | inconclusive {b.inconclusive} | errors {b.errors}")


def kind_rate_line(s: Optional[Any], kind: Kind) -> Optional[str]:
    """The rate of a conditioned kind's items that differed, with its 95% Wilson interval, the conditions."""
    line = rate_line(s.tally, kind) if s is not None else None
    return f"{s.label()}: {line}" if s is not None and line else None


def batch_count_line(t: TargetReport) -> Optional[str]:
    """The batch probes' counts, naming the conditions; None when the kind is off or none ran."""
    return kind_count_line(t.batch_summary, BATCH)


def batch_rate_line(t: TargetReport) -> Optional[str]:
    """The rate of batch probes answered differently, with its 95% Wilson interval and the conditions."""
    return kind_rate_line(t.batch_summary, BATCH)


def order_count_line(t: TargetReport) -> Optional[str]:
    return kind_count_line(t.order_summary, ORDER)


def order_rate_line(t: TargetReport) -> Optional[str]:
    return kind_rate_line(t.order_summary, ORDER)


#: a conditioned kind -> what its items compare, said when none was valid
_COMPARED = {BATCH.name: "no answer alone and amid other requests could be compared",
             LOADED.name: "no cache path and recompute path under load could be compared",
             ORDER.name: "no answer of the two passes could be compared"}


def _conditioned_lines(s: Optional[Any], records: Optional[Sequence[Any]], kind: Kind, label: str
                       ) -> List[Out]:
    """The items of a kind measured under conditions (batch, loaded, order) of one target, each line naming the
    conditions: counts, how many differed, the rate with its interval, the first error."""
    counts = kind_count_line(s, kind)
    if s is None or counts is None:
        return []
    b, shape = s.tally, s.label()
    out: List[Out] = [Line(label + counts)]
    if b.valid:
        said = (s.attribution() if kind == LOADED  # how many of its divergences the load alone explains
                else f"{b.different} of {counted(b.valid, 'valid ' + kind.unit)} {kind.differed}")
        out.append(Line(f"{label}{shape}: {said}.", {"bold": True, "red": bool(b.different)}))
    else:
        out.append(Line(f"{label}{shape}: no valid {kind.unit}: {_COMPARED[kind.name]}."))
    rate = kind_rate_line(s, kind)
    if rate:
        out.append(Line(label + rate))
    errored = [r.reason for r in records or [] if r.outcome == "error"]
    if errored:
        out.append(Line(f"{label}{shape}: {kind.name} errors: {len(errored)}; the first: {errored[0][:240]}",
                        {"red": True}))
    return out


def _batch_lines(t: TargetReport, label: str) -> List[Out]:
    return _conditioned_lines(t.batch_summary, t.batches, BATCH, label)


def loaded_count_line(t: TargetReport) -> Optional[str]:
    return kind_count_line(t.loaded_summary, LOADED)


def loaded_rate_line(t: TargetReport) -> Optional[str]:
    return kind_rate_line(t.loaded_summary, LOADED)


def _loaded_lines(t: TargetReport, label: str) -> List[Out]:
    return _conditioned_lines(t.loaded_summary, t.loaded, LOADED, label)


def _order_lines(t: TargetReport, label: str) -> List[Out]:
    return _conditioned_lines(t.order_summary, t.orders, ORDER, label)


def own_lines(report: RunReport) -> List[Out]:
    """The tests' own measurements (``cachecheck.check()``, ``.episode()``): how they came out, and their
    outcome checks with the flips (each test decides its own pass or fail; these lines count them)."""
    own = [*report.checks, *report.episode_checks]
    if not own:
        return []
    t = Tally.of(own)
    out: List[Out] = [Line(f"tests' own measurements (cachecheck.check(), .episode()): {t.probes} | valid: "
                           f"{t.valid} (same {t.same}, different {t.different}) | inconclusive: "
                           f"{t.inconclusive} | errors: {t.errors}")]
    return out + [Line(line, {"red": "flipped: " in line})
                  for line in check_lines(report.own_check_summary, "measurement")]


def _attribution_lines(t: TargetReport, label: str, verbose: bool) -> List[Out]:
    """The causes this target measured side by side (attribution.py), when it measured more than one."""
    found = attribution.lines(t, None if verbose else 10)
    if not found:
        return []
    head = "cachecheck attribution: each cause measured apart, on the same probes"
    return [Sep("-", head + (f", target {t.name}" if t.name is not None else ""))] + [
        Line(label + line) for line in found]


def summary(report: RunReport, verdict: Verdict, baseline_path: Optional[str], verbose: bool) -> List[Out]:
    """The session summary: counts, rate, causes and warnings, comparisons, the verdict, the result block."""
    out: List[Out] = [Sep("=", "cachecheck summary")]
    probes = sum(t.summary.tally.probes for t in report.targets)
    episodes = sum(t.episode_summary.tally.probes for t in report.targets if t.episode_summary is not None)
    batches = sum(t.batch_summary.tally.probes for t in report.targets if t.batch_summary is not None)
    batches += sum(t.order_summary.tally.probes for t in report.targets if t.order_summary is not None)
    batches += sum(t.loaded_summary.tally.probes for t in report.targets if t.loaded_summary is not None)
    total = probes + episodes + batches
    if total == 0:
        out.append(Line("cachecheck: no probe ran"))
    elif report.matrix:
        if probes:
            out += [Line(line) for line in matrix_lines(report.targets)]
        for t in report.targets:
            out += [Line(f"{t.name}: {line}") for line in check_lines(t.check_tallies()[0])]
            out += _target_lines(t, f"{t.name}: ", baseline_path, verbose)
            out += _episode_lines(t, f"{t.name}: ", baseline_path, verbose)
            out += _batch_lines(t, f"{t.name}: ")
            out += _loaded_lines(t, f"{t.name}: ")
            out += _order_lines(t, f"{t.name}: ")
            out += _attribution_lines(t, f"{t.name}: ", verbose)
    else:
        t = report.targets[0]
        tally = t.summary.tally
        if tally.probes or not (episodes or batches):
            out.append(Line(f"probes: {tally.probes} | valid: {tally.valid} (same {tally.same}, different "
                            f"{tally.different}) | inconclusive: {tally.inconclusive} | errors: {tally.errors}"))
            out.append(Line(divergence_line(tally), {"bold": True, "red": bool(tally.different)}))
            rate = rate_line(tally)
            if rate:
                out.append(Line(rate))
            out += [Line(line, {"red": "flipped: " in line}) for line in check_lines(t.check_tallies()[0])]
        out += _target_lines(t, "", baseline_path, verbose)
        out += _episode_lines(t, "", baseline_path, verbose)
        out += _batch_lines(t, "")
        out += _loaded_lines(t, "")
        out += _order_lines(t, "")
        out += _attribution_lines(t, "", verbose)
    out += own_lines(report)
    if total or not verdict.ok:  # an interrupted run says so even before its first probe
        word = "PASS" if verdict.ok else "FAIL"
        out.append(Line(f"cachecheck verdict: {word} ({verdict.status}): {verdict.why}",
                        {"green": verdict.ok, "red": not verdict.ok}))
    if total:
        out.append(Sep("-", "cachecheck result (to share: no URL, key or conversation text)"))
        for t in report.targets:
            prefix = f"[{t.name}] " if report.matrix else ""
            ran_episodes = t.episode_summary is not None and t.episode_summary.tally.probes > 0
            conditioned = (t.batch_summary, t.loaded_summary, t.order_summary)
            ran_batches = any(s is not None and s.tally.probes > 0 for s in conditioned)
            if report.matrix and not t.summary.tally.probes and not ran_episodes and not ran_batches:
                out.append(Line(prefix + "no probe ran"))
                continue
            counts = bool(t.summary.tally.probes) or not (ran_episodes or ran_batches)
            for line in result_block(t.summary.tally, t.setup, report.settings, report.probe_set, counts):
                out.append(Line(prefix + line))
            out += [Line(prefix + line) for line in check_lines(t.check_tallies()[0], ids=False)]
            if ran_episodes and t.episode_summary is not None and report.episode_set is not None:
                e, es = t.episode_summary.tally, report.episode_set
                out.append(Line(prefix + f"episode set {es.name} ({es.fingerprint[:19]}) | episodes {e.probes} | valid "
                                f"{e.valid} | same {e.same} | changed {e.different} | inconclusive {e.inconclusive} | "
                                f"errors {e.errors}"))
                rate = trajectory_rate_line(e)
                if rate:
                    out.append(Line(prefix + rate))
                out += [Line(prefix + line) for line in check_lines(t.check_tallies()[1], "episode", ids=False)]
            out += [Line(prefix + line) for line in (batch_count_line(t), batch_rate_line(t),
                                                     loaded_count_line(t), loaded_rate_line(t),
                                                     order_count_line(t), order_rate_line(t)) if line]
    if any((t.served or {}).get("demo") for t in report.targets):
        out.append(Line("cachecheck: that was the demo (random weights: its divergences say nothing "
                        "about real models); measure your own server with: "
                        "pytest --cachecheck-url http://HOST:PORT",
                        {"bold": True}))
    return out
